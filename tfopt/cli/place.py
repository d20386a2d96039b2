"""Place a costgraph on memory-limited devices and report the plan.

    tfopt-place \
        --costgraph=msr_gnmt_training_layers \
        --devices=4 --memory_fraction=0.35 --placer=auto --gantt=/tmp/gnmt.png

prints placement seconds, makespan, single-device makespan, the lower bound,
per-device peak memory and feasibility, and every candidate of the "auto"
portfolio. Expected on that command: m-sct/coarse+refine chosen, 374.1 ms
against 520.5 ms on one device (which does not fit), lower bound 337.4 ms
(the critical path), plan / bound 1.109.
`--time_limit_s` bounds "auto" once a plan fits (default 10 s).

`--json` prints one JSON object instead (keys placer, placement_seconds,
makespan_us, single_device_us, lower_bound_us -- proven: no plan on these
devices and caps simulates faster -- lower_bound_term (which term gave it:
critical path, work / devices or memory LP), lower_bound_terms (each
term's value), plan_over_bound, peak_bytes, feasible);
`--out=PLAN.json` writes {"placement": {op: device}, ...} for every op. The
communication model defaults to the published GPU fit, 134 us + bytes /
5.7 GB/s; `--calibration=FILE` (from `tfopt-calibrate`)
uses a machine's fitted link and core sharing instead. `--memory_fraction` is a fraction of the graph's total memory
(persistent + temp + output bytes) per device.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags
from tfopt.cli._main import run_main

from tfopt.cli._config import (apply_config, define_config_flag,
                              load_calibration_flag)

from tfopt import Cluster
from tfopt._io import atomic_write_text
from tfopt.cost.comm import PCIE_BANDWIDTH_GBPS, PCIE_LATENCY_US, CommModel
from tfopt.graph import load_workload, workload_names
from tfopt.graph.synthetic import total_memory
from tfopt.placement import PLACERS, InfeasiblePlacement, place
from tfopt.placement.api import DEFAULT_TIME_LIMIT_S

FLAGS = flags.FLAGS
define_config_flag()
flags.DEFINE_string("costgraph", None, "A tfopt.costgraph/1 file.")
flags.DEFINE_integer("devices", 4, "Number of devices.")
flags.DEFINE_integer("memory_per_device", None, "Cap per device, in bytes.")
flags.DEFINE_float("memory_fraction", None, "Cap per device as a fraction of "
                   "the graph's total memory.")
flags.DEFINE_enum("placer", "auto", ["auto", "exact", *PLACERS], "Placer.")
flags.DEFINE_float("headroom", 0.0, "Fraction of each cap kept free.")
flags.DEFINE_float("time_limit_s", DEFAULT_TIME_LIMIT_S, "auto: start no new "
                   "candidate after this many seconds once a plan fits.",
                   lower_bound=1e-9)
flags.DEFINE_float("comm_latency_us", PCIE_LATENCY_US, "Transfer latency.")
flags.DEFINE_float("comm_bandwidth_gbps", PCIE_BANDWIDTH_GBPS,
                   "Transfer bandwidth, GB/s.")
flags.DEFINE_string("calibration", None, "A calibration file (python -m "
                    "tfopt-calibrate): the devices' fitted link and "
                    "core sharing instead of --comm_*.")
flags.DEFINE_bool("json", False, "Print one JSON object.")
flags.DEFINE_string("out", None, "Write the plan as JSON here.")
flags.DEFINE_string("gantt", None, "Draw the schedule's Gantt chart (PNG).")
flags.DEFINE_bool("overwrite", False, "Replace --out / --gantt if they exist.")


def main(argv):
  del argv
  apply_config()
  _check_flags()
  try:
    cg = load_workload(FLAGS.costgraph)
  except (OSError, ValueError) as err:  # missing file, bad name or document
    raise app.UsageError(f"--costgraph: {err}") from None
  graph, costs = cg.graph, cg.costs
  cap, cluster = _cluster(graph, costs)
  try:
    result = place(graph, cluster, costs, FLAGS.placer,
                   headroom=FLAGS.headroom, time_limit_s=FLAGS.time_limit_s)
  except InfeasiblePlacement as err:
    if FLAGS.json:
      print(json.dumps({"placer": FLAGS.placer, "feasible": False,
                        "error": str(err)}))
    else:
      print(f"infeasible: {err}", file=sys.stderr)
    return 1
  summary = {
      "placer": result.placer,
      "placement_seconds": result.placement_seconds,
      "makespan_us": result.makespan_us,
      "single_device_us": result.single_device_us,
      "lower_bound_us": result.lower_bound_us,
      "lower_bound_term": result.lower_bound_term,
      "lower_bound_terms": dict(result.bound.terms),
      "plan_over_bound": result.over_bound,
      "peak_bytes": list(result.schedule.peak_bytes),
      "feasible": result.schedule.feasible,
  }
  _write_outputs(graph, cap, result, summary)
  if FLAGS.json:
    print(json.dumps(summary))
  else:
    _print_report(graph, cap, cluster, result)
  return 0


def _check_flags() -> None:
  """Usage errors for flags that name no workload or contradict."""
  if not FLAGS.costgraph:
    raise app.UsageError("--costgraph is required (a shipped workload: "
                         f"{', '.join(workload_names())}; or a "
                         "tfopt.costgraph/1 file), on the command line or in "
                         "--config.")
  if FLAGS.memory_per_device is not None and FLAGS.memory_fraction is not None:
    raise app.UsageError("Give --memory_per_device or --memory_fraction, not "
                         "both.")
  if FLAGS.memory_fraction is not None and not FLAGS.memory_fraction > 0:
    raise app.UsageError(f"--memory_fraction must be > 0. Received: "
                         f"{FLAGS.memory_fraction}")
  if FLAGS.devices <= 0:
    raise app.UsageError(f"--devices must be a positive integer. Received: "
                         f"{FLAGS.devices}")


def _cluster(graph, costs):
  """(cap per device, Cluster) from the flags and, with --calibration, the
  calibration file."""
  cap = FLAGS.memory_per_device
  if FLAGS.memory_fraction is not None:
    cap = int(total_memory(graph, costs) * FLAGS.memory_fraction)
  comm = CommModel.uniform(FLAGS.comm_latency_us, FLAGS.comm_bandwidth_gbps)
  cluster = Cluster.uniform(FLAGS.devices, cap, comm=comm)
  if FLAGS.calibration:
    calibration = load_calibration_flag(FLAGS.calibration)
    cluster = calibration.applied_to(cluster)
    if not FLAGS.json:
      print(calibration.describe())
  return cap, cluster


def _write_outputs(graph, cap, result, summary) -> None:
  """--out (the plan as JSON) and --gantt (its chart)."""
  if FLAGS.out:
    plan = dict(summary, graph=graph.name, devices=FLAGS.devices,
                memory_per_device=cap,
                placement=dict(result.placement))
    atomic_write_text(FLAGS.out, json.dumps(plan, indent=1) + "\n",
                      overwrite=FLAGS.overwrite)
  if FLAGS.gantt:
    from tfopt.simulate.gantt import draw_gantt
    draw_gantt(result.schedule, FLAGS.gantt, overwrite=FLAGS.overwrite,
               title=f"{graph.name}: {result.placer} on {FLAGS.devices} "
               f"devices")


def _print_report(graph, cap, cluster, result) -> None:
  mb = lambda b: f"{b / 1e6:,.0f} MB"
  print(f"graph             {graph.name} ({len(graph)} ops)")
  link = cluster.comm.default
  print(f"cluster           {FLAGS.devices} devices, cap "
        f"{'none' if cap is None else mb(cap)} each, comm "
        f"{link.latency_us:g} us + bytes / {link.bandwidth_gbps:g} GB/s"
        + (" (calibrated)" if FLAGS.calibration else ""))
  print(f"placer            {result.placer}"
        + (f" (portfolio of {', '.join(c.placer for c in result.candidates)})"
           if FLAGS.placer == "auto" else ""))
  print(f"placement time    {result.placement_seconds:.3f} s")
  print(f"makespan          {result.makespan_us / 1e3:,.2f} ms")
  print(f"single device     {result.single_device_us / 1e3:,.2f} ms")
  print(f"lower bound       {result.bound.describe()}")
  print(f"plan / bound      {result.over_bound:.3f}" if result.over_bound
        else "plan / bound      --")
  print(f"peak per device   "
        f"{', '.join(mb(p) for p in result.schedule.peak_bytes)}")
  print(f"feasible          {result.schedule.feasible}")
  print()
  print(result.table())


def run() -> None:
  """The console script's entry point (main's value is the exit status)."""
  run_main(main, __doc__)


if __name__ == "__main__":
  run()
