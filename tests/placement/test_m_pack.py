"""m-pack: layers packed onto devices by their liveness peaks, where
contiguous stages and the static placers find nothing. The oracle: every
assignment of whole layers to devices tried by brute force."""

import itertools

import pytest

from tfopt import Cluster, OpCost
from tfopt.graph import Edge, Op, OpGraph, load_workload
from tfopt.graph.analysis import live_memory_bound
from tfopt.placement import InfeasiblePlacement, make_problem, place
from tfopt.placement import m_pack as m_pack_module
from tfopt.placement import m_stage as m_stage_module
from tfopt.placement.m_pack import m_pack
from tfopt.placement.m_stage import m_stage
from tfopt.placement.placement import Placement
from tfopt.simulate import simulate

A = 10  # bytes of an activation
# Weight bytes per layer: contiguous stages on 2 devices hold 12 | 4 at
# best; layers 0 + 2 | 1 + 3 hold 8 | 8.
SIZES = (6000, 6000, 2000, 2000)


def _training_graph(sizes=SIZES):
  """x -> F0 -> ... -> loss and the backward pass: D_i (input gradient),
  G_i (weight gradient), U_i = update(G_i, W_i) assigned by A_i; W_i with
  its read R_i and assign A_i is one colocation group."""
  ops = [Op("x", "Placeholder", output_bytes=(A,)),
         Op("loss", "X", output_bytes=(A,))]
  edges = []
  layers = len(sizes)
  for i, w in enumerate(sizes):
    group = f"loc:@W{i}"
    ops += [Op(f"W{i}", "VarHandleOp", output_bytes=(0,), colocation=group),
            Op(f"R{i}", "ReadVariableOp", output_bytes=(w,),
               colocation=group),
            Op(f"A{i}", "AssignSubVariableOp", colocation=group),
            Op(f"F{i}", "MatMul", output_bytes=(A,)),
            Op(f"D{i}", "MatMul", output_bytes=(A,), backward=True),
            Op(f"G{i}", "MatMul", output_bytes=(w,), backward=True),
            Op(f"U{i}", "Mul", output_bytes=(w,))]
    prev = "x" if i == 0 else f"F{i - 1}"
    upstream = "loss" if i == layers - 1 else f"D{i + 1}"
    edges += [Edge(f"W{i}", f"R{i}", 0, 0, 0), Edge(prev, f"F{i}", 0, 0, A),
              Edge(f"R{i}", f"F{i}", 0, 1, w),
              Edge(upstream, f"D{i}", 0, 0, A), Edge(f"R{i}", f"D{i}", 0, 1, w),
              Edge(prev, f"G{i}", 0, 0, A), Edge(upstream, f"G{i}", 0, 1, A),
              Edge(f"G{i}", f"U{i}", 0, 0, w), Edge(f"R{i}", f"U{i}", 0, 1, w),
              Edge(f"W{i}", f"A{i}", 0, 0, 0), Edge(f"U{i}", f"A{i}", 0, 1, w)]
  edges.append(Edge(f"F{layers - 1}", "loss", 0, 0, A))
  graph = OpGraph(ops, edges, name="training")
  weight = dict(enumerate(sizes))
  costs = {op.name: OpCost(0.0 if op.type == "VarHandleOp" else 1.0,
                           persistent_bytes=weight[int(op.name[1:])]
                           if op.type == "VarHandleOp" else 0)
           for op in ops}
  return graph, costs


def _layer_plan(graph, assign):
  """Layer i's ops on assign[i]; x and loss with the layer they touch."""
  table = {"x": assign[0], "loss": assign[-1]}
  for op in graph.ops:
    if op.name not in table:
      table[op.name] = assign[int(op.name[1:])]
  return Placement(table, max(assign) + 1)


def _brute_force_peak(graph, costs, devices=2):
  """The lowest largest-device peak over every whole-layer assignment."""
  best = None
  for assign in itertools.product(range(devices), repeat=len(SIZES)):
    if len(set(assign)) < devices:
      continue
    schedule = simulate(graph, _layer_plan(graph, assign), costs,
                        Cluster.uniform(devices))
    peak = max(schedule.peak_bytes)
    best = peak if best is None else min(best, peak)
  return best


def test_packs_layers_where_contiguous_stages_do_not_fit():
  graph, costs = _training_graph()
  cap = _brute_force_peak(graph, costs)
  problem = make_problem(graph, Cluster.uniform(2, cap), costs)
  with pytest.raises(InfeasiblePlacement, match="contiguous"):
    m_stage(problem)
  plan = m_pack(problem)
  schedule = simulate(graph, plan, costs, problem.cluster)
  assert schedule.feasible, schedule.peak_bytes
  assert max(schedule.peak_bytes) <= cap
  # Each layer's weight, read, update and gradient stay together, and the
  # two heavy layers are apart (the only way under this cap).
  for i in range(len(SIZES)):
    assert len({plan[f"{k}{i}"] for k in "WRAGU"}) == 1
  assert plan["W0"] != plan["W1"]


def test_the_start_recuts_by_the_measured_peaks():
  # The heavy first layer's update holds its gradient and new value (2 x
  # 5000 bytes) at its device's peak: no cut of equal weights, statics or
  # compute fits the cap of the best contiguous cut, the re-cut by the
  # peaks each cut measured does. The oracle: every contiguous cut.
  sizes = (5000, 1000, 1000, 2000, 2000, 1000)
  graph, costs = _training_graph(sizes)
  cap = min(max(simulate(graph, _layer_plan(graph, [0] * k + [1] * (
      len(sizes) - k)), costs, Cluster.uniform(2)).peak_bytes)
            for k in range(1, len(sizes)))
  problem = make_problem(graph, Cluster.uniform(2, cap), costs)
  blocks = m_stage_module.layer_blocks(problem)
  packing = m_pack_module._Packing(problem, blocks, budget=1000)
  for weights in m_stage_module.block_weights(problem, blocks).values():
    even = m_pack_module._stages(problem, blocks, weights)
    assert packing.score(even)[0][0] > 0, weights
  starts = m_pack_module._starts(packing, blocks)
  assert len(starts) == 2  # the even cut least over, then the re-cut
  assert packing.score(starts[1])[0][0] == 0
  # m-pack with one plan per descent (no move tried) and none to refine
  # with: only a descent from the re-cut can return a plan, and does.
  plan = m_pack(problem, op_simulations=len(graph),
                finish_op_simulations=len(graph))
  schedule = simulate(graph, plan, costs, problem.cluster)
  assert schedule.feasible and max(schedule.peak_bytes) <= cap


def test_below_every_packing_it_refuses_naming_the_excess():
  graph, costs = _training_graph()
  cap = _brute_force_peak(graph, costs)
  problem = make_problem(graph, Cluster.uniform(2, int(cap * 0.8)), costs)
  with pytest.raises(InfeasiblePlacement, match=r"m-pack found no packing"
                     r".*over by device \d"):
    m_pack(problem)


def test_auto_reaches_the_packing_and_names_it():
  graph, costs = _training_graph()
  cap = _brute_force_peak(graph, costs)
  result = place(graph, Cluster.uniform(2, cap), costs)
  assert result.schedule.feasible
  assert result.placer.startswith("m-pack"), [
      (c.placer, c.error) for c in result.candidates]


def test_inception_fits_four_devices_at_1_15x_its_live_bound():
  # The shipped Inception-V3 layer graph: every other placer dead-ends at
  # caps adding up to 1.15x the bytes live at once in any schedule.
  workload = load_workload("msr_inceptionv3_training_layers")
  graph, costs = workload.graph, workload.costs
  bound = live_memory_bound(graph, costs).bytes
  cluster = Cluster.uniform(4, int(bound * 1.15 / 4))
  result = place(graph, cluster, costs)
  assert result.placer.startswith("m-pack"), result.placer
  # Re-simulated from the plan alone: every device within its cap.
  schedule = simulate(graph, result.placement, costs, cluster)
  assert schedule.feasible
  assert max(schedule.peak_bytes) <= bound * 1.15 / 4
