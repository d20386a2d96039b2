"""A placed step's real timeline, read from RunMetadata, beside its
simulation."""

import re

import pytest

from tfopt import zoo
from tfopt.cost.profile import profile_step
from tfopt.graph import capture_train_step
from tfopt.graph.capture import opgraph_from_graphdef
from tfopt.passes import PassContext, PassManager
from tfopt.passes.place import step_costs
from tfopt.runtime import compare_timeline, local_cluster, measure_timeline
from tfopt.runtime.prediction import placement_of
from tfopt.simulate import simulate


# Timing bands: alone, not beside another test loading the second core.
@pytest.mark.serial
def test_a_placed_steps_ops_are_read_back_where_they_ran():
  model = zoo.mlp(input_dim=32, hidden=(64, 64))
  x, y = model.batch(16)
  step = capture_train_step(model.model, x=x, y=y)
  # Kernel times as traced (clock=False: not scaled up to the untraced
  # step, whose per-op dispatch the kernels' intervals do not hold), the
  # kind of interval the timeline reads back.
  costs = profile_step(step, inputs=[x, y], steps=3, warmup=1, clock=False)
  cluster = local_cluster(2)
  ctx = PassContext.for_step(step, costs=costs, cluster=cluster,
                             placer="m-etf")
  placed = PassManager("place,control").run(step.graph_def, ctx).graph
  names = [d.name for d in cluster.devices]
  measured = measure_timeline(step, placed, [x, y], names, warmup=2)
  placement = placement_of(placed, names)
  ran = {n: d for n, (d, _, _) in measured.ops.items()}
  # Every op recorded is on the device the plan gave it, with a kernel
  # interval inside the step.
  assert len(ran) > len(placed.node) // 2
  assert all(ran[n] == placement[n] for n in ran)
  assert all(0 <= s <= e <= measured.wall_us
             for _, s, e in measured.ops.values())
  assert measured.transfers is None  # in-process hand-overs are not RPCs
  graph = opgraph_from_graphdef(placed, inline=False, batch_size=16)
  # Both devices really ran the plan's share: m-ETF put 24-245 of the
  # step's 320 ops on each in 15 plans here, and every op but the two fed
  # inputs (no kernel) was read back on the device planned.
  for d in range(2):
    planned = {op.name for op in graph.ops if placement[op.name] == d}
    assert len(planned) >= 10, (d, len(planned))
    assert planned - set(step.input_names) <= {
        n for n in ran if ran[n] == d}, d
  # The control pass's gates are new ops: estimated.
  table_costs = step_costs(graph, PassContext(costs=costs))
  schedule = simulate(graph, placement, table_costs, cluster)
  # Each device's busy time against the profile of the ops it ran (one
  # device, one op at a time): 0.49-0.95 of it over 15 runs here (busy
  # 0.09-0.28 ms a device; the two logical devices share two cores), and
  # 2.02 once in CI's serial pass: the profile taken in a fast phase of
  # this VM's ~1.7x speed jumps, the timeline in a slow one. The band keeps
  # what breaks it on purpose (zero-length intervals: 0).
  busy = measured.busy_us(2)
  profiled = [sum(table_costs[n].compute_us for n in ran if ran[n] == d)
              for d in range(2)]
  for d in range(2):
    assert 0.25 < busy[d] / profiled[d] < 3.0, (d, busy, profiled)
  # The step's wall time against the simulated makespan: 0.13-0.52 of it
  # over 15 runs (1.0-1.7 ms for 2.8-9.0 ms): the uncalibrated cluster
  # charges each of the 50-70 hand-overs Baechi's link latency (134 us),
  # which in-process costs next to nothing.
  assert 0.05 < measured.wall_us / schedule.makespan_us < 1.0, (
      measured.wall_us, schedule.makespan_us)
  comparison = compare_timeline(schedule, measured)
  assert comparison.simulated_us == schedule.makespan_us
  assert comparison.measured_us == measured.wall_us
  assert comparison.busy_measured == busy
  assert comparison.transfers_simulated == len(schedule.transfers) > 0
  # The table prints the comparison's own numbers.
  table = comparison.table()
  step_line = re.search(r"step: measured ([\d.]+) ms, simulated ([\d.]+) "
                        r"ms \(ratio ([\d.]+)\)", table)
  assert step_line, table
  assert float(step_line[1]) == pytest.approx(measured.wall_us / 1e3,
                                              abs=0.006)
  assert float(step_line[2]) == pytest.approx(schedule.makespan_us / 1e3,
                                              abs=0.006)
  assert float(step_line[3]) == pytest.approx(
      measured.wall_us / schedule.makespan_us, abs=0.006)
  busy_line = re.search(r"busy per device \(ms\): measured ([\d.]+)/"
                        r"([\d.]+), simulated ([\d.]+)/([\d.]+); kernels "
                        r"ran ([\d.]+)x", table)
  assert busy_line, table
  shown = [float(v) for v in busy_line.groups()]
  expected = [v / 1e3 for v in (*busy, *comparison.busy_simulated)]
  assert shown[:4] == pytest.approx(expected, abs=0.006)
  assert shown[4] == pytest.approx(comparison.stretch, abs=0.006)
  assert "not observable" in table
  counts = [sum(1 for n in ran if ran[n] == d) for d in range(2)]
  print(table, f"\nbusy / profiled per device: {busy[0] / profiled[0]:.3f} "
        f"{busy[1] / profiled[1]:.3f}; ops read back per device: {counts}")


def test_busy_time_counts_ops_side_by_side_once():
  from tfopt.runtime.timeline import MeasuredStep
  # Device 0: a [0, 4] and b [2, 6] side by side (two inter-op threads),
  # then c [8, 9]: busy 7 us, not 9. Device 1: d [1, 3].
  ops = {"a": (0, 0.0, 4.0), "b": (0, 2.0, 6.0), "c": (0, 8.0, 9.0),
         "d": (1, 1.0, 3.0)}
  assert MeasuredStep(ops, None, 9.0).busy_us(2) == (7.0, 2.0)
  # Intervals already cut to core shares (a pinned task's one core): their
  # sum is the core time used.
  assert MeasuredStep(ops, None, 9.0, cores_per_device=1).busy_us(2) == (
      9.0, 2.0)
  assert MeasuredStep(ops, None, 9.0).busy_us(3) == (7.0, 2.0, 0.0)
