"""Memory of ops that allocate nothing new (views, variable reads,
element-wise forwards): the simulator, the live-memory bound and static
accounting against peaks computed by hand."""

import pytest

from tfopt import Cluster, CommModel, OpCost
from tfopt.graph import Edge, Op, OpGraph, aliasing
from tfopt.graph.analysis import live_memory_bound
from tfopt.placement.placement import Placement
from tfopt.placement.problem import make_problem
from tfopt.simulate.simulator import simulate

COMM = CommModel.uniform(latency_us=10.0, bandwidth_gbps=1.0)


def _one(graph, costs):
  return simulate(graph, Placement.single_device(graph), costs,
                  Cluster.uniform(1, comm=COMM)).peak_bytes[0]


def test_a_view_shares_its_input_and_keeps_it_alive():
  # a (100 B) -> r = Reshape(a) -> c (10 B) -> e; a is also read by e.
  # r is a: while e runs, a (100) + c (10) + e's output (1) = 111; charged
  # as a tensor of its own, r would add 100 while c runs (a, r, c: 210).
  g = OpGraph([Op("a", "X", output_bytes=(100,)),
               Op("r", "Reshape", output_bytes=(100,)),
               Op("c", "X", output_bytes=(10,)),
               Op("e", "X", output_bytes=(1,))],
              [Edge("a", "r", 0, 0, 100), Edge("r", "c", 0, 0, 100),
               Edge("c", "e", 0, 0, 10), Edge("a", "e", 0, 1, 100)])
  assert _one(g, {n: 1.0 for n in "arce"}) == 111
  assert live_memory_bound(g, {n: 1.0 for n in "arce"}).bytes == 111


def test_identity_n_outputs_are_its_inputs():
  g = OpGraph([Op("g1", "X", output_bytes=(40,)),
               Op("g2", "X", output_bytes=(60,)),
               Op("ids", "IdentityN", output_bytes=(40, 60)),
               Op("u1", "X", output_bytes=(1,)),
               Op("u2", "X", output_bytes=(1,))],
              [Edge("g1", "ids", 0, 0, 40), Edge("g2", "ids", 0, 1, 60),
               Edge("ids", "u1", 0, 0, 40), Edge("ids", "u2", 1, 0, 60)])
  costs = {n: 1.0 for n in ("g1", "g2", "ids", "u1", "u2")}
  # g1 (40) + g2 (60) live until u1 / u2; IdentityN adds nothing; u1 adds 1
  # while g2 still waits for u2: 40 + 60 + 1.
  assert _one(g, costs) == 101
  # Static accounting charges IdentityN nothing: only 40 + 60 + 1 + 1.
  problem = make_problem(g, Cluster.uniform(1), costs)
  assert sum(problem.memory.values()) == 102
  assert aliasing.allocated_output_bytes(g["ids"]) == 0


def test_variable_reads_and_constants_are_persistent_memory():
  g = OpGraph([Op("v", "VarHandleOp", output_bytes=(0,)),
               Op("read", "ReadVariableOp", output_bytes=(800,)),
               Op("k", "Const", output_bytes=(16,)),
               Op("m", "X", output_bytes=(8,))],
              [Edge("v", "read", 0, 0, 0), Edge("read", "m", 0, 0, 800),
               Edge("k", "m", 0, 1, 16)])
  costs = {"v": OpCost(0.0, persistent_bytes=800), "read": OpCost(1.0),
           "k": OpCost(0.0, persistent_bytes=16), "m": OpCost(1.0)}
  # The variable and the constant once, plus m's output.
  assert _one(g, costs) == 800 + 16 + 8
  assert live_memory_bound(g, costs).bytes == 824


def test_element_wise_ops_write_into_a_last_use_input():
  # x -> a = Relu(x) -> b = Neg(a) -> c; each 100 B. x is read only by a, a
  # only by b: each forwards its input. One buffer for the whole chain.
  g = OpGraph([Op("x", "X", output_bytes=(100,)),
               Op("a", "Relu", output_bytes=(100,)),
               Op("b", "Neg", output_bytes=(100,)),
               Op("c", "X", output_bytes=(1,))],
              [Edge("x", "a", 0, 0, 100), Edge("a", "b", 0, 0, 100),
               Edge("b", "c", 0, 0, 100)])
  costs = {n: 1.0 for n in "xabc"}
  assert _one(g, costs) == 101
  # x read again after a: a must allocate; then b still takes a's buffer.
  g2 = OpGraph(list(g.ops), list(g.edges) + [Edge("x", "c", 0, 1, 100)])
  assert _one(g2, costs) == 201
  # The bound may only count what every schedule holds: the same numbers.
  assert live_memory_bound(g, costs).bytes == 101
  assert live_memory_bound(g2, costs).bytes == 201


def test_no_forward_into_a_differently_sized_or_fed_input():
  g = OpGraph([Op("x", "Placeholder", output_bytes=(100,)),
               Op("a", "Relu", output_bytes=(100,)),
               Op("s", "X", output_bytes=(50,)),
               Op("b", "Neg", output_bytes=(100,)),
               Op("c", "X", output_bytes=(1,))],
              [Edge("x", "a", 0, 0, 100), Edge("a", "s", 0, 0, 100),
               Edge("s", "b", 0, 0, 50), Edge("b", "c", 0, 0, 100)])
  costs = {n: 1.0 for n in "xasbc"}
  # a cannot take the fed x: 200 while a runs; b cannot take s (50 B).
  assert _one(g, costs) == 200


def test_a_view_of_a_received_copy_keeps_the_copy():
  # a on device 0; r = Identity(a) and its reader c on device 1: the copy
  # of a (100 B) stays on device 1 until c has run, r adds nothing.
  g = OpGraph([Op("a", "X", output_bytes=(100,)),
               Op("r", "Identity", output_bytes=(100,)),
               Op("c", "X", output_bytes=(1,))],
              [Edge("a", "r", 0, 0, 100), Edge("r", "c", 0, 0, 100)])
  s = simulate(g, Placement({"a": 0, "r": 1, "c": 1}, 2), {
      n: 1.0 for n in "arc"}, Cluster.uniform(2, comm=COMM))
  assert s.peak_bytes == (100, 101)


def test_a_handed_over_buffer_stays_on_the_sender():
  # CPU devices of one process: TensorFlow hands a's buffer to device 1
  # without a copy. a (100 B, t 0-1) on device 0, read there by b (t 1-2,
  # 10 B) and on device 1 by c (1 B) after the transfer (t 1-11 at 10 us
  # latency; 100 B at 1 GB/s adds 0.1 us): a stays on device 0 until c ran
  # (t 11.1-12.1), so device 0 holds a + b = 110, device 1 only c's output.
  g = OpGraph([Op("a", "X", output_bytes=(100,)),
               Op("b", "X", output_bytes=(10,)),
               Op("c", "X", output_bytes=(1,))],
              [Edge("a", "b", 0, 0, 100), Edge("a", "c", 0, 0, 100)])
  plan = Placement({"a": 0, "b": 0, "c": 1}, 2)
  costs = {n: 1.0 for n in "abc"}
  copied = simulate(g, plan, costs, Cluster.uniform(2, comm=COMM))
  assert copied.peak_bytes == (110, 101)
  shared = simulate(g, plan, costs, Cluster.uniform(
      2, comm=CommModel.uniform(10.0, 1.0, shared_buffers=True)))
  assert shared.peak_bytes == (110, 1)
  # And it is held there while c runs: with b taking 14 us (t 1-15), d
  # (50 B, t 15-16) after it and c taking 10 us (t 11.1-21.1), a copied is
  # freed at t 15 (b's end; its transfer ended at 11.1), so d's time holds
  # b + d = 60 and the peak is a + b = 110; a handed over lives until
  # t 21.1: a + b + d = 160 on device 0.
  g2 = OpGraph(list(g.ops) + [Op("d", "X", output_bytes=(50,))],
               list(g.edges) + [Edge("b", "d", 0, 0, 10)])
  plan2 = Placement({"a": 0, "b": 0, "c": 1, "d": 0}, 2)
  costs2 = {"a": 1.0, "b": 14.0, "c": 10.0, "d": 1.0}
  assert simulate(g2, plan2, costs2, Cluster.uniform(2, comm=COMM)
                  ).peak_bytes == (110, 101)
  assert simulate(g2, plan2, costs2, Cluster.uniform(
      2, comm=CommModel.uniform(10.0, 1.0, shared_buffers=True))
                  ).peak_bytes == (160, 1)


@pytest.mark.parametrize("op_type", ["Identity", "Reshape", "StopGradient",
                                     "ExpandDims", "Squeeze"])
def test_view_types(op_type):
  assert aliasing.view_input(Op("v", op_type, output_bytes=(4,)), 0) == 0
  assert not aliasing.allocates(Op("v", op_type, output_bytes=(4,)), 0)
  assert aliasing.allocates(Op("m", "MatMul", output_bytes=(4,)), 0)
