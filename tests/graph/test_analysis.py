"""Critical paths and lower bounds against hand-computed answers."""

import pytest

from tfopt.cost import CommModel, CostModel, OpCost
from tfopt.graph import (Edge, Op, OpGraph, critical_path, format_summary,
                         graph_summary, makespan_lower_bound)


def _graph(names, edges):
  return OpGraph([Op(n, "X", output_bytes=(1000,)) for n in names],
                 [Edge(s, d, 0, 0, b) for s, d, b in edges])


# Diamond: a -> {b, c} -> d with costs a=1, b=5, c=2, d=1.
DIAMOND = _graph("abcd", [("a", "b", 1000), ("a", "c", 1000),
                          ("b", "d", 1000), ("c", "d", 1000)])
DIAMOND_COSTS = {"a": 1.0, "b": 5.0, "c": 2.0, "d": 1.0}


def test_diamond_critical_path():
  cp = critical_path(DIAMOND, DIAMOND_COSTS)
  assert cp.length_us == 7.0 and cp.ops == ("a", "b", "d")


def test_diamond_critical_path_with_communication():
  # Every edge pays 10 us + 1000 B / (1 GB/s = 1000 B/us) = 11 us.
  comm = CommModel.uniform(latency_us=10.0, bandwidth_gbps=1.0)
  cp = critical_path(DIAMOND, DIAMOND_COSTS, comm)
  assert cp.length_us == pytest.approx(1 + 11 + 5 + 11 + 1)
  assert cp.ops == ("a", "b", "d")


def test_communication_can_change_the_critical_path():
  # a -> b carries 1 MB, a -> c nothing: without comm b wins, with comm too,
  # but the c branch is longer in compute.
  g = OpGraph([Op(n, "X", (1,)) for n in "abc"],
              [Edge("a", "b", 0, 0, 1_000_000), Edge("a", "c", 0, 0, 0)])
  costs = {"a": 1.0, "b": 1.0, "c": 50.0}
  assert critical_path(g, costs).ops == ("a", "c")
  comm = CommModel.uniform(latency_us=0.0, bandwidth_gbps=1.0)  # 1000 us
  assert critical_path(g, costs, comm).ops == ("a", "b")
  assert critical_path(g, costs, comm).length_us == pytest.approx(1002.0)


def test_control_edges_cost_no_transfer():
  g = OpGraph([Op("a", "X", (8,)), Op("b", "X", (8,))],
              [Edge("a", "b", -1, None, 0)])
  cp = critical_path(g, {"a": 2.0, "b": 3.0}, CommModel())
  assert cp.length_us == 5.0


def test_fork_join_lower_bound_is_work_over_devices():
  # Fork-join: s -> 6 branches of 10 us -> t; s = t = 1 us. Total work 62.
  names = ["s", *(f"b{i}" for i in range(6)), "t"]
  edges = [("s", f"b{i}", 8) for i in range(6)]
  edges += [(f"b{i}", "t", 8) for i in range(6)]
  g = _graph(names, edges)
  costs = {n: 10.0 for n in names} | {"s": 1.0, "t": 1.0}
  assert critical_path(g, costs).length_us == 12.0
  assert makespan_lower_bound(g, costs, 2) == 31.0
  assert makespan_lower_bound(g, costs, 4) == 15.5
  assert makespan_lower_bound(g, costs, 8) == 12.0  # critical path binds


def test_cost_model_input_and_degenerate_graphs():
  costs = CostModel({k: OpCost(v) for k, v in DIAMOND_COSTS.items()})
  assert critical_path(DIAMOND, costs).length_us == 7.0
  assert critical_path(OpGraph([], []), {}).length_us == 0.0
  one = _graph("a", [])
  assert makespan_lower_bound(one, {"a": 3.0}, 4) == 3.0


def test_bad_costs_and_device_counts_are_named():
  with pytest.raises(ValueError, match="missing op 'd'"):
    critical_path(DIAMOND, {"a": 1.0, "b": 1.0, "c": 1.0})
  with pytest.raises(ValueError, match=r"costs\['a'\].*Received"):
    critical_path(DIAMOND, {**DIAMOND_COSTS, "a": -1.0})
  with pytest.raises(ValueError, match="num_devices=0"):
    makespan_lower_bound(DIAMOND, DIAMOND_COSTS, 0)


def test_summary_totals():
  costs = CostModel({"a": OpCost(1.0, 10, 100), "b": OpCost(5.0),
                     "c": OpCost(2.0), "d": OpCost(1.0, profiled=False)})
  s = graph_summary(DIAMOND, costs, num_devices=2)
  assert s["total_compute_us"] == 9.0 and s["critical_path_us"] == 7.0
  assert s["lower_bound_us"] == 7.0 and s["profiled_ops"] == 3
  assert s["output_bytes"] == 4000 and s["persistent_bytes"] == 100
  assert s["total_memory_bytes"] == 4110
  # While d (reading b and c) runs: a's persistent 100, b's and c's outputs
  # and d's own; a's output is dead by then (b and c read it).
  out = {op.name: sum(op.output_bytes) for op in DIAMOND.ops}
  assert s["live_memory_bound_bytes"] == 100 + out["b"] + out["c"] + \
      out["d"]
  assert "live at once" in format_summary(s)
