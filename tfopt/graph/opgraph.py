"""OpGraph: the frozen, cost-free structure of one step.

An OpGraph holds ops, tensor edges (with output port and bytes), control
edges and colocation groups. It never carries compute times or a placement:
those are tables keyed by op name (see `tfopt.cost.CostModel`). It is
validated once, on construction: unique names, edges between known ops,
ports within range, no cycle.

>>> g = OpGraph([Op("a", "Const", output_bytes=(8,)), Op("b", "Neg",
...             output_bytes=(8,))], [Edge("a", "b", 0, 0, 8)])
>>> g.successors("a"), g.predecessors("b")
(('b',), ('a',))
"""

from __future__ import annotations

import dataclasses
import heapq
import types
from typing import Any, Iterable, Iterator, Mapping, Sequence

from tfopt._errors import GraphError

CONTROL = -1
"""`Edge.src_output` of a control dependency (no data moves)."""

FUNCTIONAL_OPS = frozenset({"Case", "StatelessCase", "If", "StatelessIf",
                            "While", "StatelessWhile"})
"""Op types whose bodies are functions of the GraphDef's library. Each is
one atomic op of an OpGraph: costed as a whole (its lowered body's runtime
nodes add up to it), placed whole with the variables it captures (resource
inputs colocate), and its library functions travel with every rewrite."""


@dataclasses.dataclass(frozen=True)
class Op:
  """One op of a step.

  Attributes:
    name: unique name (the TF NodeDef name where there is one).
    type: op type ("MatMul", ...), or "Layer" for layer-level graphs.
    output_bytes: size in bytes of each output port's tensor.
    output_shapes: static shape of each output (a tuple of ints, or None
      where unknown); empty when the graph came without shapes.
    output_dtypes: dtype name of each output ("float32", ...); may be empty.
    colocation: colocation group; ops sharing a group must share a device.
    device_types: device types the op can run on (e.g. ("CPU",)); None = any.
    backward: True for ops of the backward pass.
    requested_device: the device string the source graph asked for, if any.
    attrs: the few NodeDef attributes cost estimates need (transpose flags,
      einsum equation, ...), as plain Python values.
  """
  name: str
  type: str
  output_bytes: tuple[int, ...] = ()
  output_shapes: tuple[tuple[int, ...] | None, ...] = ()
  output_dtypes: tuple[str, ...] = ()
  colocation: str | None = None
  device_types: tuple[str, ...] | None = None
  backward: bool = False
  requested_device: str = ""
  attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def num_outputs(self) -> int:
    return len(self.output_bytes)

  def __hash__(self) -> int:
    # `attrs` is a dict; equal ops have equal names and types, so hashing
    # those keeps hash consistent with equality.
    return hash((self.name, self.type))


@dataclasses.dataclass(frozen=True)
class Edge:
  """A tensor (or control) dependency from `src` to `dst`.

  `src_output` is the producing port, or CONTROL (-1) for a control edge.
  `dst_input` is the consuming input index where known (None otherwise).
  `bytes` is what moves if the two ops sit on different devices.
  """
  src: str
  dst: str
  src_output: int = 0
  dst_input: int | None = None
  bytes: int = 0

  @property
  def is_control(self) -> bool:
    return self.src_output == CONTROL


class OpGraph:
  """An immutable, validated DAG of ops. See the module docstring."""

  __slots__ = ("_name", "_ops", "_edges", "_index", "_in", "_out",
               "_preds", "_succs", "_colocation_groups", "_topological")

  def __init__(self, ops: Iterable[Op], edges: Iterable[Edge], *,
               name: str = "graph"):
    ops = tuple(ops)
    edges = tuple(edges)
    index: dict[str, int] = {}
    for i, op in enumerate(ops):
      if not isinstance(op, Op):
        raise GraphError(f"Argument `ops` must contain Op objects. "
                         f"Received: ops[{i}]={op!r}")
      if not op.name:
        raise GraphError(f"Argument `ops` must have non-empty names. "
                         f"Received: ops[{i}].name={op.name!r}")
      if op.name in index:
        raise GraphError(f"Argument `ops` must have unique names. Received: "
                         f"duplicate name {op.name!r} at ops[{index[op.name]}]"
                         f" and ops[{i}]")
      for j, nbytes in enumerate(op.output_bytes):
        if nbytes < 0:
          raise GraphError(f"Op output bytes must be >= 0. Received: "
                           f"{op.name}.output_bytes[{j}]={nbytes}")
      index[op.name] = i
    ins: list[list[Edge]] = [[] for _ in ops]
    outs: list[list[Edge]] = [[] for _ in ops]
    for k, e in enumerate(edges):
      for end in ("src", "dst"):
        if getattr(e, end) not in index:
          raise GraphError(f"Argument `edges` must connect known ops. "
                           f"Received: edges[{k}].{end}={getattr(e, end)!r}, "
                           f"which names no op")
      if e.bytes < 0:
        raise GraphError(f"Edge bytes must be >= 0. Received: edges[{k}]"
                         f".bytes={e.bytes} ({e.src} -> {e.dst})")
      src_op = ops[index[e.src]]
      if e.src_output < CONTROL or (
          e.src_output >= 0 and src_op.output_bytes
          and e.src_output >= src_op.num_outputs):
        raise GraphError(
            f"Edge source port must be -1 (control) or below the number of "
            f"outputs of {e.src!r} ({src_op.num_outputs}). Received: "
            f"edges[{k}].src_output={e.src_output}")
      outs[index[e.src]].append(e)
      ins[index[e.dst]].append(e)
    self._name = name
    self._ops = ops
    self._edges = edges
    self._topological: tuple[str, ...] | None = None  # topological_order
    self._index = types.MappingProxyType(index)
    self._in = tuple(tuple(x) for x in ins)
    self._out = tuple(tuple(x) for x in outs)
    self._preds = tuple(_unique(e.src for e in x) for x in ins)
    self._succs = tuple(_unique(e.dst for e in x) for x in outs)
    groups: dict[str, list[str]] = {}
    for op in ops:
      if op.colocation is not None:
        groups.setdefault(op.colocation, []).append(op.name)
    self._colocation_groups = types.MappingProxyType(
        {k: tuple(v) for k, v in groups.items()})
    self._check_acyclic()

  # -- structure -------------------------------------------------------------
  @property
  def name(self) -> str:
    return self._name

  @property
  def ops(self) -> tuple[Op, ...]:
    return self._ops

  @property
  def edges(self) -> tuple[Edge, ...]:
    return self._edges

  @property
  def colocation_groups(self) -> Mapping[str, tuple[str, ...]]:
    """Group name -> member op names, in op order."""
    return self._colocation_groups

  def __len__(self) -> int:
    return len(self._ops)

  def __contains__(self, name: object) -> bool:
    return name in self._index

  def __iter__(self) -> Iterator[Op]:
    return iter(self._ops)

  def __getitem__(self, name: str) -> Op:
    try:
      return self._ops[self._index[name]]
    except KeyError:
      raise KeyError(f"No op named {name!r} in graph {self._name!r}") from None

  def __repr__(self) -> str:
    return (f"OpGraph(name={self._name!r}, ops={len(self._ops)}, "
            f"edges={len(self._edges)})")

  def index(self, name: str) -> int:
    """Position of op `name` in `ops` (the deterministic tie-break key)."""
    return self._index[name]

  def in_edges(self, name: str) -> tuple[Edge, ...]:
    return self._in[self._index[name]]

  def out_edges(self, name: str) -> tuple[Edge, ...]:
    return self._out[self._index[name]]

  def predecessors(self, name: str) -> tuple[str, ...]:
    return self._preds[self._index[name]]

  def successors(self, name: str) -> tuple[str, ...]:
    return self._succs[self._index[name]]

  def sources(self) -> tuple[str, ...]:
    return tuple(op.name for i, op in enumerate(self._ops) if not self._in[i])

  def sinks(self) -> tuple[str, ...]:
    return tuple(op.name for i, op in enumerate(self._ops) if not self._out[i])

  def with_name(self, name: str) -> "OpGraph":
    return OpGraph(self._ops, self._edges, name=name)

  def subgraph(self, names: Iterable[str]) -> "OpGraph":
    """The graph induced by `names` (kept in this graph's op order)."""
    keep = set(names)
    unknown = keep - set(self._index)
    if unknown:
      raise GraphError(f"Argument `names` must name ops of the graph. "
                       f"Received unknown names: {sorted(unknown)[:5]}")
    return OpGraph([op for op in self._ops if op.name in keep],
                   [e for e in self._edges if e.src in keep and e.dst in keep],
                   name=self._name)

  # -- validation --------------------------------------------------------------
  def _check_acyclic(self) -> None:
    indegree = [len(p) for p in self._preds]
    ready = [i for i, d in enumerate(indegree) if d == 0]
    seen = 0
    while ready:
      i = ready.pop()
      seen += 1
      for s in self._succs[i]:
        j = self._index[s]
        indegree[j] -= 1
        if indegree[j] == 0:
          ready.append(j)
    if seen != len(self._ops):
      cycle = self._find_cycle([i for i, d in enumerate(indegree) if d > 0])
      raise GraphError(f"Argument `edges` must form an acyclic graph. "
                       f"Received a cycle: {' -> '.join(cycle)}")

  def _find_cycle(self, remaining: Sequence[int]) -> list[str]:
    """A cycle among the ops Kahn's algorithm could not remove."""
    left = set(remaining)
    start = remaining[0]
    path, position = [], {}
    node = start
    # Every remaining op has a remaining predecessor, so walking backwards
    # must revisit an op: that revisit closes a cycle.
    while node not in position:
      position[node] = len(path)
      path.append(node)
      node = next(self._index[p] for p in self._preds[node]
                  if self._index[p] in left)
    cycle = path[position[node]:]
    cycle.reverse()
    first = cycle.index(min(cycle))  # start at the earliest op: deterministic
    cycle = cycle[first:] + cycle[:first]
    names = [self._ops[i].name for i in cycle]
    return names + [names[0]]


def _unique(items: Iterable[str]) -> tuple[str, ...]:
  return tuple(dict.fromkeys(items))


def topological_order(graph: OpGraph) -> list[str]:
  """Op names in a deterministic topological order.

  Among ready ops the one earliest in `graph.ops` goes first, so the order is
  a function of the graph alone.

  >>> g = OpGraph([Op("c", "X"), Op("a", "X"), Op("b", "X")],
  ...             [Edge("a", "b"), Edge("c", "b")])
  >>> topological_order(g)
  ['c', 'a', 'b']
  """
  # Computed once per graph (it is immutable): the simulator and every
  # placer ask for it, often many times per `place` call.
  if graph._topological is None:  # pylint: disable=protected-access
    graph._topological = tuple(_topological_order(graph))  # pylint: disable=protected-access
  return list(graph._topological)  # pylint: disable=protected-access


def _topological_order(graph: OpGraph) -> list[str]:
  ops = graph.ops
  indegree = [len(graph.predecessors(op.name)) for op in ops]
  heap = [i for i, d in enumerate(indegree) if d == 0]
  heapq.heapify(heap)
  order = []
  while heap:
    i = heapq.heappop(heap)
    order.append(ops[i].name)
    for s in graph.successors(ops[i].name):
      j = graph.index(s)
      indegree[j] -= 1
      if indegree[j] == 0:
        heapq.heappush(heap, j)
  return order
