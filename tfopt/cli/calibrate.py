"""Fit the simulator's cluster model on this machine and save it.

    tfopt-calibrate --devices=logical:2 \
        --out=/tmp/calibration.json

`--devices=KIND:N` names the devices: `logical` (N logical CPU devices of
one process), `processes` (N server processes on loopback) or `pinned` (N
server processes, each pinned to a core of its own, one intra-op thread).
It measures tensor copies of 1 B to 64 MiB between two of them (latency and
bandwidth), batches of small copies issued together (the overhead that
holds the channels: how far transfers overlap) and chains of MatMuls on one
and on two devices at once (whether they share cores, and how well), prints
the fit with its residuals, and writes a `tfopt.calibration/1` file that
`tfopt-place --calibration`, `tfopt-run-placed --calibration`,
`tfopt.compile(calibration=...)` and `benchmarks.runtime` read.

Expected on the command above (2-core VM, about 10 s): a hand-over of about
5-20 us with no bandwidth term, an overhead of a few us, shared cores with
a capacity of 1.1-1.7. `--devices=processes:2`: about 500-800 us + bytes /
~1 GB/s, 20-60 us of overhead (transfers overlap), capacity 1.1-1.4.
`--devices=pinned:2`: a similar link, each task on its own core.

`--cluster=SPEC` (a {job: ["host:port", ...]} JSON, or TF_CONFIG for the
environment variable) measures the running server tasks of a cluster
instead: on tasks of several hosts (`tfopt.scale.hosts.LocalHosts`, or a
real cluster) two links, one inside a host and one between hosts, and
whether different hosts' tasks share cores; `tfopt.compile` charges each
transfer by the link it crosses. On a running cluster it also measures
what a step costs beyond its ops when this process drives the tasks
(`tfopt.runtime.dispatch`: the call to 1..N tasks, the batch's feed), which
tfopt.compile adds to its prediction. Run it where the tasks are reachable
(for LocalHosts: `hosts.run_client([...])`). `--pinned`: the tasks are
pinned to a core each.
"""

from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402
from tfopt.cli._main import run_main  # noqa: E402

from tfopt.cli._config import apply_config, define_config_flag  # noqa: E402

FLAGS = flags.FLAGS
define_config_flag()
flags.DEFINE_string("devices", "logical:2", "KIND:N with KIND logical, "
                    "processes or pinned, N >= 2.")
flags.DEFINE_string("cluster", None, "Measure the running tasks of this "
                    "cluster (JSON spec, or TF_CONFIG) instead of starting "
                    "--devices.")
flags.DEFINE_bool("pinned", False, "With --cluster: its tasks are pinned to "
                  "a core each.")
flags.DEFINE_integer("repeats", 5, "Timed runs per measurement (median).")
flags.DEFINE_string("out", "calibration.json", "The calibration file.")
flags.DEFINE_bool("overwrite", False, "Replace --out if it exists.")
flags.DEFINE_bool("json", False, "Print the file's JSON instead of the "
                  "summary.")


def parse_devices(text: str) -> tuple[str, int]:
  """("kind", n) from "kind:n"; app.UsageError says what is wrong."""
  from tfopt.calibration import KINDS  # pylint: disable=g-import-not-at-top
  kind, _, count = (text or "").partition(":")
  if kind not in KINDS or not count.isdigit() or int(count) < 2:
    raise app.UsageError(f"--devices must be KIND:N with KIND one of "
                         f"{list(KINDS)} and N >= 2. Received: {text!r}")
  return kind, int(count)


def main(argv):
  del argv
  apply_config()
  kind, count = parse_devices(FLAGS.devices)
  if FLAGS.pinned and not FLAGS.cluster:
    raise app.UsageError("--pinned describes the tasks of --cluster; "
                         "without it use --devices=pinned:N.")
  if FLAGS.cluster and FLAGS["devices"].present:
    raise app.UsageError("Pass --devices or --cluster, not both: --cluster "
                         "measures the cluster's running tasks.")
  if FLAGS.repeats <= 0:
    raise app.UsageError(f"--repeats must be positive. Received: "
                         f"{FLAGS.repeats}")
  if os.path.exists(FLAGS.out) and not FLAGS.overwrite:
    raise app.UsageError(f"{FLAGS.out} exists; pass --overwrite to replace "
                         f"it.")
  import tfopt  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from tfopt.runtime.calibrate import fit_cluster  # pylint: disable=g-import-not-at-top
  if kind == "pinned" and count > len(os.sched_getaffinity(0)):
    raise app.UsageError(f"--devices={FLAGS.devices}: pinned tasks need a "
                         f"core each; this process may use "
                         f"{len(os.sched_getaffinity(0))}.")
  calibration = (_fit_running(FLAGS.cluster, FLAGS.pinned, FLAGS.repeats)
                 if FLAGS.cluster else
                 fit_cluster(kind, count, repeats=FLAGS.repeats))
  calibration.save(FLAGS.out, overwrite=FLAGS.overwrite)
  if FLAGS.json:
    print(json.dumps(calibration.to_json(), indent=1))
    return
  from tfopt.calibration import load_calibration  # pylint: disable=g-import-not-at-top
  fit = calibration.fit
  print(f"\n{load_calibration(FLAGS.out).describe()}")
  print(f"link: {fit['link']}")
  print("batches of small copies issued together (n: us): " + ", ".join(
      f"{n}: {t:.0f}" for n, t in fit["batches"]) + (
          f"; overhead fit relative rms {100 * fit['overhead_relative_rms']:.1f}"
          f" %" if fit.get("overhead_relative_rms") is not None else ""))
  print(f"MatMul chains: {fit['chain_alone_us'] / 1e3:.2f} ms alone, "
        f"{fit['chains_together_us'] / 1e3:.2f} ms two at once on two devices"
        f" -> capacity {fit['capacity_measured']:.2f}"
        + ("" if calibration.shared else " (each pinned task has a core of "
           "its own: capacity 1 per task)"))
  between = fit.get("between_hosts")
  if between:
    print(f"between hosts: {between.get('link', 'the link above')}; MatMul "
          f"chains on two hosts at once -> capacity "
          f"{between['capacity_measured']:.2f} ("
          f"{'sharing' if calibration.hosts_share_cores else 'own'} cores)")
  if calibration.dispatch_us:
    print("a step of one trivial op per task, called from here (tasks: ms): "
          + ", ".join(f"{k}: {t / 1e3:.2f}" for k, t in
                      enumerate(calibration.dispatch_us, 1))
          + "; the batch fed at " + (
              f"{calibration.feed_gbps:.3g} GB/s" if calibration.feed_gbps
              else "no measurable cost"))
  print(f"wrote {FLAGS.out}")


def _fit_running(cluster: str, pinned: bool, repeats: int):
  """The calibration of a running cluster's tasks (two levels where they
  are on several hosts)."""
  from tfopt.runtime import remote  # pylint: disable=g-import-not-at-top
  from tfopt.runtime.calibrate import calibrate_devices, calibrate_hosts  # pylint: disable=g-import-not-at-top
  try:
    spec = remote.parse_cluster(None if cluster == "TF_CONFIG" else cluster)
  except ValueError as err:
    raise app.UsageError(f"--cluster: {err}") from None
  names = [f"/job:{job}/task:{i}/device:CPU:0"
           for job, addrs in spec.items() for i in range(len(addrs))]
  if len(names) < 2:
    raise app.UsageError(f"--cluster must have at least two tasks. "
                         f"Received: {cluster}")
  target = remote.session_target(spec, names[0])
  hosts = remote.task_hosts(spec, names)
  kind = "pinned" if pinned else "processes"
  if len(set(hosts)) > 1:
    calibration = calibrate_hosts(names, hosts, target=target, kind=kind,
                                  repeats=repeats, progress=True)
  else:
    calibration = calibrate_devices(kind, names, target=target,
                                    repeats=repeats, progress=True)
  # Last: it connects this process's eager runtime to the tasks.
  from tfopt.runtime.dispatch import measure_dispatch  # pylint: disable=g-import-not-at-top
  dispatch = measure_dispatch(spec, names)
  return dataclasses.replace(
      calibration, dispatch_us=tuple(dispatch["dispatch_us"]),
      feed_gbps=dispatch["feed_gbps"],
      fit={**calibration.fit, "feed_points": dispatch["feed_points"]})


def run() -> None:
  """The console script's entry point."""
  run_main(main, __doc__)


if __name__ == "__main__":
  run()
