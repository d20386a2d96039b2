"""m-branch on a hand-built two-branch training graph and on the zoo's
towers model: each branch with its gradients, weights, slots and updates on
its own device, the trunk on device 0; a chain has no branches."""

import pytest

from tfopt import Cluster, CommModel, OpCost, zoo
from tfopt.graph import Edge, Op, OpGraph, capture_train_step
from tfopt.graph.capture import opgraph_from_graphdef
from tfopt.passes import PassContext, PassManager
from tfopt.placement import InfeasiblePlacement, make_problem, place
from tfopt.placement.m_branch import branches, m_branch, op_classes
from tfopt.simulate import simulate

W, A = 1000, 10  # bytes of a weight, of an activation
FREE = CommModel.uniform(0.0, 1e9)


def _two_branch_graph():
  """x -> {a1 -> a2, b1 -> b2} -> join -> loss, then the backward pass:
  gjoin splits the gradient, g<k>2 and g<k>1 walk each branch back, w<k>
  is branch k's weight (read by <k>1, its gradient gw<k> updates it)."""
  ops = [Op("x", "Placeholder", output_bytes=(A,)),
         Op("join", "ConcatV2", output_bytes=(2 * A,)),
         Op("loss", "X", output_bytes=(A,)),
         Op("gjoin", "Slice", output_bytes=(A, A), backward=True)]
  edges = [Edge("join", "loss", 0, 0, 2 * A), Edge("loss", "gjoin", 0, 0, A)]
  for k, port in (("a", 0), ("b", 1)):
    group = f"loc:@w{k}"
    ops += [Op(f"w{k}", "VarHandleOp", output_bytes=(0,), colocation=group),
            Op(f"r{k}", "ReadVariableOp", output_bytes=(W,),
               colocation=group),
            Op(f"{k}1", "MatMul", output_bytes=(A,)),
            Op(f"{k}2", "Relu", output_bytes=(A,)),
            Op(f"g{k}2", "ReluGrad", output_bytes=(A,), backward=True),
            Op(f"gw{k}", "MatMul", output_bytes=(W,), backward=True),
            Op(f"u{k}", "AssignSubVariableOp", colocation=group)]
    edges += [Edge(f"w{k}", f"r{k}", 0, 0, 0), Edge("x", f"{k}1", 0, 0, A),
              Edge(f"r{k}", f"{k}1", 0, 1, W), Edge(f"{k}1", f"{k}2", 0, 0, A),
              Edge(f"{k}2", "join", 0, port, A),
              Edge("gjoin", f"g{k}2", port, 0, A),
              Edge(f"{k}2", f"g{k}2", 0, 1, A),
              Edge("x", f"gw{k}", 0, 0, A), Edge(f"g{k}2", f"gw{k}", 0, 1, A),
              Edge(f"w{k}", f"u{k}", 0, 0, 0), Edge(f"gw{k}", f"u{k}", 0, 1, W)]
  graph = OpGraph(ops, edges, name="two_branches")
  costs = {op.name: OpCost(
      0.0 if op.type == "VarHandleOp" else
      10.0 if op.name[0] in "abg" else 1.0) for op in ops}
  return graph, costs


def test_each_branch_goes_whole_to_its_own_device():
  graph, costs = _two_branch_graph()
  problem = make_problem(graph, Cluster.uniform(2, comm=FREE), costs)
  classes = op_classes(problem)
  assert classes["ra"] == "param" and classes["gwa"] == "backward"
  assert classes["ua"] == "update" and classes["a1"] == "forward"
  forks = branches(problem, classes)
  assert [sorted(map(sorted, fork)) for fork in forks] == [
      [["a1", "a2"], ["b1", "b2"]]]
  plan = m_branch(problem)
  side = {k: plan[f"{k}1"] for k in "ab"}
  assert sorted(side.values()) == [0, 1]
  for k in "ab":  # forward, gradients, weight, its read and its update
    assert {plan[n] for n in (f"{k}1", f"{k}2", f"g{k}2", f"gw{k}", f"w{k}",
                              f"r{k}", f"u{k}")} == {side[k]}
  # The trunk: input, join, loss and the gradient's split on device 0.
  assert {plan[n] for n in ("x", "join", "loss", "gjoin")} == {0}
  one = simulate(graph, {n: 0 for n in plan}, costs, problem.cluster)
  split = simulate(graph, plan, costs, problem.cluster)
  # A branch's work (2 forward + 2 backward ops of 10 us, its weight's
  # read and update of 1 us) runs beside the other's: 42 us saved.
  assert one.makespan_us - split.makespan_us == pytest.approx(42.0)


def test_a_chain_has_no_branches():
  graph, costs = _two_branch_graph()
  chain = OpGraph([op for op in graph.ops],
                  list(graph.edges) + [Edge("a2", "b1", 0, 2, A)])
  problem = make_problem(chain, Cluster.uniform(2, comm=FREE), costs)
  with pytest.raises(InfeasiblePlacement, match="no parallel branches"):
    m_branch(problem)


def test_a_branch_over_its_device_cap_is_refused():
  # Device 1 holds 100 B: a branch's 500 B of scratch does not fit there.
  from tfopt import Device
  graph, costs = _two_branch_graph()
  costs = dict(costs, a1=OpCost(10.0, temp_bytes=500),
               b1=OpCost(10.0, temp_bytes=500))
  cluster = Cluster((Device("d0", "CPU"), Device("d1", "CPU", 100)), FREE)
  with pytest.raises(InfeasiblePlacement, match="over the memory caps"):
    m_branch(make_problem(graph, cluster, costs))


def test_zoo_towers_go_to_their_own_devices_with_slots_and_updates():
  model = zoo.towers(input_dim=16, towers=2, depth=2, width=32)
  x, y = model.batch(8)
  step = capture_train_step(model.model, x=x, y=y)
  graph_def = PassManager("prune,identity").run(
      step.graph_def, PassContext.for_step(step)).graph
  graph = opgraph_from_graphdef(graph_def, inline=False, batch_size=8)
  costs = {op.name: OpCost(100.0 if op.type == "MatMul" else 1.0)
           for op in graph.ops}
  result = place(graph, Cluster.uniform(2, comm=FREE), costs, "m-branch")
  plan = result.placement
  # Every variable's group (weights, Adam's moments) sits with its tower.
  device_of = {}
  for group, members in graph.colocation_groups.items():
    tower = next((t for t in ("tower0", "tower1") if t in group), None)
    if tower is not None:
      device_of.setdefault(tower, set()).update(plan[m] for m in members)
  assert len(device_of["tower0"]) == len(device_of["tower1"]) == 1
  assert device_of["tower0"] != device_of["tower1"]
  # Gradient MatMuls run with their tower's forward ops.
  for op in graph.ops:
    if op.type == "MatMul" and "tower" in op.name:
      tower = "tower0" if "tower0" in op.name else "tower1"
      assert {plan[op.name]} == device_of[tower], op.name
  single = result.single_device_us
  assert result.makespan_us < single
  # In the portfolio it is one candidate among the others.
  auto = place(graph, Cluster.uniform(2, comm=FREE), costs, "auto")
  assert "m-branch" in [c.placer for c in auto.candidates]
