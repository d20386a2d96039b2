"""Placement quality and speed on real and synthetic training graphs.

    python -m benchmarks.placement
    python -m benchmarks.placement --synthetic=1000 --devices=4 --fractions=0.35

For every workload (the shared MSR costgraphs, synthetic layered DAGs of 1k,
4k and 20k ops), 2/4/8 devices and memory caps of 1.0/0.6/0.35 of the
graph's total memory per device, one `place(..., "auto")` run scores every
candidate with the simulator. The table shows the chosen plan against two
baselines measured in the same run: one device (where it fits) and plain
balanced m-TOPO (Baechi's published rule). Ratios below 1 are better. `/LB`
is the plan over its proven lower bound (tfopt.placement.bound: critical
path, work / devices or the memory LP, whichever is largest; the row
records which): the plan is at most that far from optimal.
The Baechi reference implementation's results (tfopt.placement.reference:
its placers run on the same workloads on 4 devices under the same PCIe
model, each plan re-scored by a liveness simulator; measured elsewhere, not
re-run here) are printed beside the matching rows: its best valid plan, our
makespan as a ratio of it, and our `auto` seconds as a ratio of its fastest
placer's (m-ETF) on that workload; on the synthetic rows, its m-ETF's
seconds at that size (its own generator's graphs).
Writes benchmarks/results/placement.json.
"""

from __future__ import annotations

import json
import os
import platform

from absl import app, flags

from tfopt import Cluster
from tfopt.graph import load_workload, workload_names
from tfopt.graph.analysis import live_memory_bound
from tfopt.graph.synthetic import layered_dag, total_memory
from tfopt.placement import InfeasiblePlacement, place, reference

FLAGS = flags.FLAGS
flags.DEFINE_list("costgraphs", list(workload_names()), "Workloads: shipped "
                  "names (tfopt.graph.workload_names) or costgraph files.")
flags.DEFINE_list("synthetic", ["1000", "4000", "20000"], "Synthetic sizes.")
flags.DEFINE_list("devices", ["2", "4", "8"], "Device counts.")
flags.DEFINE_list("fractions", ["1.0", "0.6", "0.35"], "Memory fractions.")
flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "results",
                                        "placement.json"), "Results JSON.")

def _workloads():
  for name in FLAGS.costgraphs:
    cg = load_workload(name)
    yield cg.graph.name, cg.graph, cg.costs
  for size in FLAGS.synthetic:
    graph, costs = layered_dag(int(size), seed=0)
    yield f"synthetic_{size}", graph, costs


_BOUNDS: dict = {}


def _row(name, graph, costs, devices, fraction):
  cap = int(total_memory(graph, costs) * fraction)
  cluster = Cluster.uniform(devices, cap)
  total = total_memory(graph, costs)
  bound = _BOUNDS.setdefault(name, live_memory_bound(graph, costs))
  row = {"workload": name, "ops": len(graph), "devices": devices,
         "memory_fraction": fraction, "cap_bytes": cap,
         # Bytes live at once in any schedule, as a fraction of the total:
         # above devices x fraction, no plan exists.
         "live_bound_fraction": bound.bytes / total}
  try:
    result = place(graph, cluster, costs)
  except InfeasiblePlacement as err:
    return dict(row, feasible=False, error=str(err),
                proven_infeasible=bound.bytes > devices * cap)
  single = next(c for c in result.candidates if c.placer == "single")
  # The baseline, run on its own: inside "auto" m-TOPO's plan is not
  # simulated when it cannot win.
  try:
    topo = place(graph, cluster, costs, "m-topo").candidates[0]
  except InfeasiblePlacement:
    topo = None
  row.update(
      feasible=True, placer=result.placer,
      placement_seconds=result.placement_seconds,
      makespan_us=result.makespan_us,
      # Proven (tfopt.placement.bound): no plan on these devices and caps
      # simulates faster; the term that gave it and each term's value.
      lower_bound_us=result.lower_bound_us,
      lower_bound_term=result.lower_bound_term,
      lower_bound_terms=dict(result.bound.terms),
      lower_bound_note=result.bound.note,
      single_device_us=result.single_device_us,
      single_device_fits=single.feasible,
      m_topo_us=topo.makespan_us if topo and topo.feasible else None,
      vs_lower_bound=result.makespan_us / result.lower_bound_us,
      vs_single=(result.makespan_us / single.makespan_us
                 if single.feasible else None),
      vs_m_topo=(result.makespan_us / topo.makespan_us
                 if topo and topo.feasible else None),
      peak_bytes=list(result.schedule.peak_bytes),
      candidates=[{"placer": c.placer, "seconds": c.seconds,
                   "makespan_us": c.makespan_us, "feasible": c.feasible,
                   "error": c.error, "note": c.note}
                  for c in result.candidates])
  row.update(_reference(name, devices, fraction, result))
  return row


def _reference(name, devices, fraction, result) -> dict:
  """The reference's numbers for this row, and ours as ratios of them."""
  if devices != reference.DEVICES:
    return {}
  ref = reference.row(name, fraction)
  if ref is not None:
    return {"reference_best_ms": ref.best_ms,
            "reference_placer": ref.best_placer,
            "vs_reference": (result.makespan_us / 1e3 / ref.best_ms
                             if ref.best_ms else None),
            "reference_seconds": ref.fastest_s,
            "seconds_vs_reference": (result.placement_seconds / ref.fastest_s
                                     if ref.fastest_s else None)}
  size = int(name.split("_")[1]) if name.startswith("synthetic_") else None
  if size in reference.M_ETF_SECONDS:
    low, high = reference.M_ETF_SECONDS[size]
    return {"reference_seconds": (low + high) / 2,
            "reference_placer": "m-ETF",
            "seconds_vs_reference": result.placement_seconds /
                                    ((low + high) / 2)}
  return {}


def _line(name, devices, fraction, r) -> str:
  head = f"{name:<34}{r['ops']:>6}{devices:>3}{fraction:>6.2f}  "
  if not r["feasible"]:
    why = ("no plan exists: live bound "
           f"{r['live_bound_fraction']:.3f} > {devices * fraction:.2f}"
           if r["proven_infeasible"] else
           f"none found (live bound {r['live_bound_fraction']:.3f} "
           f"<= {devices * fraction:.2f})")
    return head + f"infeasible, {why}"
  return (head + f"{r['placer']:<24}{r['placement_seconds']:>7.2f}"
          f"{r['makespan_us'] / 1e3:>13.1f}{r['vs_lower_bound']:>7.2f}"
          f"{_fmt(r['vs_single'], '>9.2f')}{_fmt(r['vs_m_topo'], '>9.2f')}"
          f"{_fmt(r.get('reference_best_ms'), '>9.1f')}"
          f"{_fmt(r.get('vs_reference'), '>7.2f')}"
          f"{_fmt(r.get('reference_seconds'), '>9.2f')}"
          f"{_fmt(r.get('seconds_vs_reference'), '>9.2f')}")


def _fmt(value, spec):
  width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
  return format(value, spec) if value is not None else "-".rjust(width)


def main(argv):
  del argv
  rows = []
  print(f"{'workload':<34}{'ops':>6}{'D':>3}{'mem':>6}  {'placer':<24}"
        f"{'sec':>7}{'makespan ms':>13}{'/LB':>7}{'/single':>9}{'/m-topo':>9}"
        f"{'ref ms':>9}{'/ref':>7}{'ref sec':>9}{'sec/ref':>9}")
  for name, graph, costs in _workloads():
    for devices in (int(d) for d in FLAGS.devices):
      for fraction in (float(f) for f in FLAGS.fractions):
        r = _row(name, graph, costs, devices, fraction)
        rows.append(r)
        print(_line(name, devices, fraction, r), flush=True)
  os.makedirs(os.path.dirname(FLAGS.out), exist_ok=True)
  with open(FLAGS.out + ".tmp", "w") as f:
    json.dump({"benchmark": "placement",
               "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
               "comm": "134 us + bytes / 5.7 GB/s", "rows": rows}, f, indent=1)
  os.replace(FLAGS.out + ".tmp", FLAGS.out)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
