"""Several hosts on one machine (`tfopt.scale.hosts.LocalHosts`): placement
measured against prediction per link rate, and the placer's cost as the
cluster grows.

    python -m benchmarks.hosts                      # both parts
    python -m benchmarks.hosts --parts=scaling      # simulation only

Part "placement" (needs root): for each rate of --rates, 2 hosts x 2
server tasks, each host's two tasks pinned to one core of its own (a host
is a core here); `tfopt-calibrate --cluster` measures both levels of links
from the client's place; then, from there, a 256-512x4-10 MLP trained with
Adam whose state (11 MB, 13 MB live at once) does not fit one host's two
tasks of 6 MB is trained with plain Keras and through `tfopt.compile(
placement="auto", devices=<the 4 tasks>, cluster=hosts.spec, calibration=
<that file>)`: the losses side by side, the step measured (the median of
every step's time in --rounds clocked fits of 24 steps; beside it the
earlier measure, the minimum over rounds of the difference between
unclocked fits of 24 and 4 steps; benchmarks/_timing.py) against the
report's prediction (the simulated plan plus the calibrated step
dispatch to the tasks it uses and the batch's feed,
`tfopt.runtime.dispatch`), and how many tensors and bytes the plan sends
between hosts.

Part "scaling" (simulation): the shipped workloads on 2-16 hosts x 2-8
devices (inside a host Baechi's PCIe-like link, between hosts 1 Gbit/s
plus 200 us), each device's cap the whole graph's memory / 4 when that
binds; `auto`'s placement time, its plan against the proven lower bound
and against one device, and the bytes it sends between hosts.

Writes benchmarks/results/hosts.json. The network faults (a partition, a
host lost) are rows of `benchmarks.scale`'s fault matrix (its
network_faults part).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("parts", ["placement", "scaling"], "Which parts to run.")
flags.DEFINE_list("rates", ["1gbit", "100mbit"], "Link rates between hosts.")
flags.DEFINE_integer("rounds", 5, "Timed rounds of the placed step.")
flags.DEFINE_list("workloads", None, "Shipped workloads (default: all).")
flags.DEFINE_list("hosts", ["2", "4", "8", "16"], "Host counts (scaling).")
flags.DEFINE_list("per_host", ["2", "4", "8"], "Devices per host (scaling).")
flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "results",
                                        "hosts.json"), "Results JSON.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAP_BYTES = 6_000_000


def _placement_row(rate: str) -> dict:
  from tfopt.scale.hosts import LocalHosts  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as tmp, LocalHosts(
      2, 2, link_rate=rate, cpus=[[0], [0], [1], [1]]) as hosts:
    calibration = os.path.join(tmp, "hosts.json")
    began = time.perf_counter()
    done = hosts.run_client(
        [sys.executable, "-m", "tfopt.cli.calibrate",
         f"--cluster={json.dumps(hosts.spec)}", f"--out={calibration}",
         "--repeats=3"], capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
      raise RuntimeError(f"tfopt-calibrate failed: {done.stderr[-3000:]}")
    calibrate_s = time.perf_counter() - began
    with open(calibration, encoding="utf-8") as f:
      made = json.load(f)
    done = hosts.run_client(
        [sys.executable, "-m", "benchmarks._hosts_client",
         json.dumps(hosts.spec), json.dumps(hosts.device_names),
         str(CAP_BYTES), calibration, str(FLAGS.rounds)],
        capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
      raise RuntimeError(f"the placed run failed: {done.stderr[-3000:]}")
  row = json.loads(done.stdout.strip().splitlines()[-1])
  max_loss_diff = max(abs(a - b) for a, b in zip(row["losses"],
                                                  row["plain_losses"]))
  return dict(row, rate=rate, cap_bytes=CAP_BYTES,
              calibrate_seconds=calibrate_s,
              link_inside={k: made["link"][k] for k in
                           ("latency_us", "bandwidth_gbps")},
              link_between={k: made["host_link"][k] for k in
                            ("latency_us", "bandwidth_gbps")},
              dispatch_us=made["dispatch_us"], feed_gbps=made["feed_gbps"],
              hosts_share_cores=made["hosts_share_cores"],
              max_loss_diff=max_loss_diff,
              measured_over_predicted=row["measured_ms"] / row["predicted_ms"],
              difference_over_predicted=(row["difference_ms"]
                                         / row["predicted_ms"]))


def _two_level_cluster(hosts: int, per_host: int, cap):
  from tfopt import Cluster  # pylint: disable=import-outside-toplevel
  from tfopt.cost.comm import CommModel, Link  # pylint: disable=import-outside-toplevel
  from tfopt.scale.hosts import INTER_HOST_LATENCY_US  # pylint: disable=import-outside-toplevel
  num = hosts * per_host
  return Cluster.uniform(num, cap, comm=CommModel.two_level(
      [d // per_host for d in range(num)], Link(),
      Link(INTER_HOST_LATENCY_US, 1e9 / 8 / 1e9)))


def _scaling_rows(bar) -> list[dict]:
  from tfopt.graph import load_workload, workload_names  # pylint: disable=import-outside-toplevel
  from tfopt.graph.synthetic import total_memory  # pylint: disable=import-outside-toplevel
  from tfopt.placement import InfeasiblePlacement, place  # pylint: disable=import-outside-toplevel
  rows = []
  for name in FLAGS.workloads or workload_names():
    workload = load_workload(name)
    graph, costs = workload.graph, workload.costs
    cap = int(total_memory(graph, costs) / 4)
    for hosts in map(int, FLAGS.hosts):
      for per_host in map(int, FLAGS.per_host):
        cluster = _two_level_cluster(hosts, per_host, cap)
        row = {"workload": name, "ops": len(graph), "hosts": hosts,
               "per_host": per_host, "devices": hosts * per_host,
               "cap_bytes": cap}
        try:
          result = place(graph, cluster, costs)
        except InfeasiblePlacement as err:
          rows.append(dict(row, feasible=False, error=str(err)[:300]))
          bar.add(1)
          continue
        across = [t for t in result.schedule.transfers
                  if t.src_device // per_host != t.dst_device // per_host]
        rows.append(dict(
            row, feasible=True, placer=result.placer,
            placement_seconds=result.placement_seconds,
            makespan_us=result.makespan_us,
            lower_bound_us=result.lower_bound_us,
            vs_lower_bound=result.makespan_us / result.lower_bound_us,
            vs_single=result.makespan_us / result.single_device_us,
            devices_used=len(set(result.placement.values())),
            hosts_used=len({d // per_host
                            for d in result.placement.values()}),
            bytes_across_hosts=sum(t.bytes for t in across)))
        bar.add(1)
  return rows


def main(argv):
  del argv
  import keras  # pylint: disable=import-outside-toplevel
  out = {"benchmark": "hosts",
         "machine": f"{platform.machine()}, {os.cpu_count()} cpus"}
  if os.path.exists(FLAGS.out):  # the parts not run now stay as they were
    with open(FLAGS.out, encoding="utf-8") as f:
      kept = json.load(f)
    kept = {part: kept[part] for part in ("placement", "scaling")
            if part in kept and part not in FLAGS.parts}
    out.update(kept)
    if kept:  # measured by an earlier run, maybe on another machine
      out["kept_from_earlier_run"] = sorted(kept)
  if "placement" in FLAGS.parts:
    bar = keras.utils.Progbar(len(FLAGS.rates), unit_name="rate")
    out["placement"] = []
    for rate in FLAGS.rates:
      out["placement"].append(_placement_row(rate))
      bar.add(1)
    print(f"\n{'rate':<9}{'placer':<18}{'simulated':>10}{'+ disp+feed':>12}"
          f"{'predicted ms':>13}{'measured ms':>12}"
          f"{'meas/pred':>10}{'tensors x':>10}{'kB x':>8}{'loss diff':>10}")
    for r in out["placement"]:
      print(f"{r['rate']:<9}{r['placer']:<18}{r['simulated_ms']:>10.1f}"
            f"{r['dispatch_ms']:>12.1f}{r['predicted_ms']:>13.1f}"
            f"{r['measured_ms']:>12.1f}{r['measured_over_predicted']:>10.2f}"
            f"{r['tensors_across_hosts']:>10}"
            f"{r['bytes_across_hosts'] / 1e3:>8.0f}"
            f"{r['max_loss_diff']:>10.1e}")
    print("(x: between hosts, in the predicted plan; measured: the median "
          "step in fits of 24 steps)")
  if "scaling" in FLAGS.parts:
    from tfopt.graph import workload_names  # pylint: disable=import-outside-toplevel
    total = (len(FLAGS.workloads or workload_names()) * len(FLAGS.hosts) *
             len(FLAGS.per_host))
    bar = keras.utils.Progbar(total, unit_name="cluster")
    out["scaling"] = _scaling_rows(bar)
    print(f"\n{'workload':<34}{'hosts':>6}{'x dev':>6}{'place s':>9}"
          f"{'plan/bound':>11}{'plan/one':>9}{'used':>6}{'MB x':>7}")
    for r in out["scaling"]:
      if not r["feasible"]:
        print(f"{r['workload']:<34}{r['hosts']:>6}{r['per_host']:>6}  "
              f"no plan")
        continue
      print(f"{r['workload']:<34}{r['hosts']:>6}{r['per_host']:>6}"
            f"{r['placement_seconds']:>9.2f}{r['vs_lower_bound']:>11.2f}"
            f"{r['vs_single']:>9.2f}{r['devices_used']:>6}"
            f"{r['bytes_across_hosts'] / 1e6:>7.1f}")
  os.makedirs(os.path.dirname(FLAGS.out), exist_ok=True)
  with open(FLAGS.out + ".tmp", "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1)
  os.replace(FLAGS.out + ".tmp", FLAGS.out)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
