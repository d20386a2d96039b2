"""A placed step's real timeline, read from RunMetadata, beside its
simulation."""

from tfopt import zoo
from tfopt.cost.profile import profile_step
from tfopt.graph import capture_train_step
from tfopt.graph.capture import opgraph_from_graphdef
from tfopt.passes import PassContext, PassManager
from tfopt.passes.place import step_costs
from tfopt.runtime import compare_timeline, local_cluster, measure_timeline
from tfopt.runtime.prediction import placement_of
from tfopt.simulate import simulate


def test_a_placed_steps_ops_are_read_back_where_they_ran():
  model = zoo.mlp(input_dim=32, hidden=(64, 64))
  x, y = model.batch(16)
  step = capture_train_step(model.model, x=x, y=y)
  costs = profile_step(step, inputs=[x, y], steps=3, warmup=1)
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
  assert sum(measured.busy_us(2)) > 0
  graph = opgraph_from_graphdef(placed, inline=False, batch_size=16)
  # The control pass's gates are new ops: estimated.
  schedule = simulate(graph, placement, step_costs(graph, PassContext(
      costs=costs)), cluster)
  comparison = compare_timeline(schedule, measured)
  assert comparison.simulated_us == schedule.makespan_us
  assert comparison.transfers_simulated == len(schedule.transfers) > 0
  table = comparison.table()
  assert "busy per device" in table and "not observable" in table


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
