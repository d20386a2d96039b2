"""OpGraph construction, validation and deterministic order."""

import pytest

from tfopt._errors import GraphError
from tfopt.graph import CONTROL, Edge, Op, OpGraph, topological_order


def _ops(*names):
  return [Op(n, "X", output_bytes=(4,)) for n in names]


def test_adjacency_and_colocation_groups():
  ops = _ops("a", "b", "c")
  ops[0] = Op("a", "VarHandleOp", (0,), colocation="loc:@a")
  ops[2] = Op("c", "AssignVariableOp", (), colocation="loc:@a")
  g = OpGraph(ops, [Edge("a", "b", 0, 0, 4), Edge("b", "c", 0, 0, 4),
                    Edge("a", "c", CONTROL)])
  assert g.successors("a") == ("b", "c")
  assert g.predecessors("c") == ("b", "a")
  assert g.sources() == ("a",) and g.sinks() == ("c",)
  assert dict(g.colocation_groups) == {"loc:@a": ("a", "c")}
  assert [e.is_control for e in g.in_edges("c")] == [False, True]
  assert len(g) == 3 and "b" in g and g["b"].type == "X"
  assert len({*g.ops, Op("a", "VarHandleOp", (0,), colocation="loc:@a")}) == 3


def test_duplicate_names_are_refused():
  with pytest.raises(GraphError, match="unique names.*'a'"):
    OpGraph(_ops("a", "b", "a"), [])


def test_edge_to_unknown_op_is_refused():
  with pytest.raises(GraphError, match=r"edges\[0\].dst='zz'"):
    OpGraph(_ops("a"), [Edge("a", "zz")])


def test_cycle_is_named():
  with pytest.raises(GraphError, match="a -> b -> c -> a"):
    OpGraph(_ops("a", "b", "c", "d"),
            [Edge("a", "b"), Edge("b", "c"), Edge("c", "a"), Edge("d", "a")])


def test_negative_bytes_and_bad_ports_are_refused():
  with pytest.raises(GraphError, match="bytes must be >= 0"):
    OpGraph(_ops("a", "b"), [Edge("a", "b", 0, 0, -1)])
  with pytest.raises(GraphError, match="src_output=3"):
    OpGraph(_ops("a", "b"), [Edge("a", "b", 3, 0, 4)])
  with pytest.raises(GraphError, match="output_bytes"):
    OpGraph([Op("a", "X", output_bytes=(-5,))], [])


def test_topological_order_is_deterministic_by_op_index():
  g = OpGraph(_ops("d", "c", "b", "a"),
              [Edge("d", "a"), Edge("c", "a"), Edge("b", "a")])
  assert topological_order(g) == ["d", "c", "b", "a"]
  # Same DAG, ops listed in another order: ties follow that order.
  g2 = OpGraph(_ops("b", "c", "d", "a"),
               [Edge("d", "a"), Edge("c", "a"), Edge("b", "a")])
  assert topological_order(g2) == ["b", "c", "d", "a"]


def test_empty_graph_and_subgraph():
  assert topological_order(OpGraph([], [])) == []
  g = OpGraph(_ops("a", "b", "c"), [Edge("a", "b"), Edge("b", "c")])
  sub = g.subgraph(["a", "b"])
  assert [op.name for op in sub] == ["a", "b"] and len(sub.edges) == 1
  with pytest.raises(GraphError, match="unknown names"):
    g.subgraph(["q"])
