"""m-stage on a hand-built training graph: each layer's forward op, its
gradients, weight and update together, stages contiguous, memory by the
simulator's liveness."""

import pytest

from tfopt import Cluster, OpCost
from tfopt.graph import Edge, Op, OpGraph
from tfopt.placement import InfeasiblePlacement, make_problem, place
from tfopt.placement.m_stage import (even_cuts, m_stage, positions,
                                     stage_bounds)
from tfopt.simulate import simulate

W = 1000  # bytes of a weight (and of its gradient and update)
A = 10  # bytes of an activation


def _training_graph(layers: int = 3):
  """x -> F0 -> F1 -> ... -> loss, then the backward pass: D_i (input
  gradient, reads W_i) and G_i (weight gradient), U_i = update(G_i, W_i)
  assigned by A_i. W_i, its read R_i and its assign A_i are one group."""
  ops = [Op("x", "Placeholder", output_bytes=(A,)),
         Op("loss", "X", output_bytes=(A,))]
  edges = []
  for i in range(layers):
    group = f"loc:@W{i}"
    ops += [Op(f"W{i}", "VarHandleOp", output_bytes=(0,), colocation=group),
            Op(f"R{i}", "ReadVariableOp", output_bytes=(W,),
               colocation=group),
            Op(f"A{i}", "AssignSubVariableOp", colocation=group),
            Op(f"F{i}", "MatMul", output_bytes=(A,)),
            Op(f"D{i}", "MatMul", output_bytes=(A,), backward=True),
            Op(f"G{i}", "MatMul", output_bytes=(W,), backward=True),
            Op(f"U{i}", "Mul", output_bytes=(W,))]
    prev = "x" if i == 0 else f"F{i - 1}"
    upstream = "loss" if i == layers - 1 else f"D{i + 1}"
    edges += [Edge(f"W{i}", f"R{i}", 0, 0, 0), Edge(prev, f"F{i}", 0, 0, A),
              Edge(f"R{i}", f"F{i}", 0, 1, W),
              Edge(upstream, f"D{i}", 0, 0, A), Edge(f"R{i}", f"D{i}", 0, 1, W),
              Edge(prev, f"G{i}", 0, 0, A), Edge(upstream, f"G{i}", 0, 1, A),
              Edge(f"G{i}", f"U{i}", 0, 0, W), Edge(f"R{i}", f"U{i}", 0, 1, W),
              Edge(f"W{i}", f"A{i}", 0, 0, 0), Edge(f"U{i}", f"A{i}", 0, 1, W)]
  edges.append(Edge(f"F{layers - 1}", "loss", 0, 0, A))
  graph = OpGraph(ops, edges, name="training")
  costs = {op.name: OpCost(0.0 if op.type == "VarHandleOp" else 1.0,
                           persistent_bytes=W if op.type == "VarHandleOp"
                           else 0) for op in ops}
  return graph, costs


def test_positions_pair_each_layer_with_its_gradients_and_weights():
  graph, costs = _training_graph()
  pos = positions(make_problem(graph, Cluster.uniform(1), costs))
  for i in range(3):
    layer = {pos[f"{k}{i}"] for k in "WRAFDGU"}
    assert len(layer) == 1, (i, {k: pos[f"{k}{i}"] for k in "WRAFDGU"})
  assert pos["F0"] < pos["F1"] < pos["F2"]


def test_cuts_layers_onto_devices_where_static_accounting_refuses():
  graph, costs = _training_graph()
  # One layer's liveness peak: W (1000) + its gradient (1000) + the
  # update, written into the gradient's buffer, + activations: 2,020-2,030
  # bytes. Statically a layer holds over 3,000 (W, G and U all step long).
  cluster = Cluster.uniform(3, 2200)
  placement = m_stage(make_problem(graph, cluster, costs))
  for i in range(3):
    assert len({placement[f"{k}{i}"] for k in "WRAFDGU"}) == 1
  assert sorted({placement[f"F{i}"] for i in range(3)}) == [0, 1, 2]
  schedule = simulate(graph, placement, costs, cluster)
  assert schedule.feasible and max(schedule.peak_bytes) <= 2200
  with pytest.raises(InfeasiblePlacement):
    place(graph, cluster, costs, "m-topo")
  auto = place(graph, cluster, costs, "auto")
  assert auto.schedule.feasible


def test_uses_the_fewest_stages_that_fit():
  graph, costs = _training_graph()
  # Two layers fit one device's cap (3,040 bytes; all three: 4,060): two
  # stages, not three.
  placement = m_stage(make_problem(graph, Cluster.uniform(3, 3100), costs))
  assert len(set(placement.values())) == 2
  # Everything fits one device: one stage.
  placement = m_stage(make_problem(graph, Cluster.uniform(3), costs))
  assert len(set(placement.values())) == 1


def test_refuses_when_no_cut_fits():
  graph, costs = _training_graph()
  with pytest.raises(InfeasiblePlacement, match="m-stage found no cut"):
    m_stage(make_problem(graph, Cluster.uniform(3, 1500), costs))


def test_even_cuts_and_their_stage_ranges():
  # prefix sums 1, 2, 5, 6, 7, 10 after blocks 1..6: the half (5) falls
  # after 3 blocks; the thirds (3.33, 6.67) at the nearest prefix: 2 (1.33
  # below, 5 is 1.67 above) after 2 blocks, 7 (0.33 above) after 5
  weights = [1, 1, 3, 1, 1, 3]
  assert even_cuts(weights, 2) == [3]
  assert even_cuts(weights, 3) == [2, 5]
  assert stage_bounds([2, 5], 6) == [(0, 2), (2, 5), (5, 6)]
  assert stage_bounds([], 4) == [(0, 4)]
  assert stage_bounds([0, 3], 3) == [(0, 0), (0, 3), (3, 3)]
