"""Coarsening before placement: propose groups, contract them, expand back.

`propose_groups` merges an op into its neighbour along an edge u -> v when
the merge can never create a cycle: u has no other successor, or v no other
predecessor (then the edge is the only path between them). It repeats on the
merged graph until nothing changes, never letting a group's compute or
memory exceed a cap (large groups would serialize work the devices could
share, or not fit) and never merging different device-type constraints.
Merging ops of two colocation groups joins the groups. Members of a
colocation group that cannot be merged safely (a variable and its update are
joined by the whole forward and backward path) stay separate coarse ops that
share the group's colocation label, so they still land on one device.

`contract` builds the coarse OpGraph and CostModel. A coarse op carries
  * compute: the sum of its members';
  * persistent bytes: the sum of its members';
  * outputs: one port per member tensor read outside the group;
  * temp bytes: its *internal* liveness peak beyond those outputs, running
    the members in topological order (a tensor read only inside is freed
    after its last reader), so memory inside a group is never lost.
`expand` maps a coarse placement back onto every original op.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from tfopt._errors import invalid_argument
from tfopt.cost.cost_model import CostModel, OpCost
from tfopt.graph import aliasing
from tfopt.graph.opgraph import CONTROL, Edge, Op, OpGraph, topological_order
from tfopt.placement.placement import Placement


@dataclasses.dataclass(frozen=True)
class Coarsening:
  """A coarse graph, its costs, and the member -> coarse op map."""
  graph: OpGraph
  costs: CostModel
  group_of: Mapping[str, str]
  original_ops: int
  original_edges: int

  @property
  def reduction(self) -> float:
    """original ops / coarse ops."""
    return self.original_ops / max(1, len(self.graph))

  def describe(self) -> str:
    return (f"coarsened {self.original_ops} ops / {self.original_edges} "
            f"edges to {len(self.graph)} / {len(self.graph.edges)} "
            f"({self.reduction:.1f}x fewer ops)")

  def expand(self, placement: Placement) -> Placement:
    """The placement of every original op from the coarse `placement`."""
    return Placement({m: placement[g] for m, g in self.group_of.items()},
                     placement.num_devices)


def propose_groups(graph: OpGraph, costs, *,
                   max_group_us: float | None = None,
                   max_group_bytes: float | None = None
                   ) -> tuple[dict[str, str], dict[str, str]]:
  """(op -> representative op of its group, colocation label -> label).

  Merging ops of two colocation groups joins the groups (a stronger, still
  valid constraint); the second map sends each original label to the label
  of the joined group. A merge is refused when a group -- or a joined
  colocation group -- would exceed `max_group_us` of compute (default 2 %
  of the graph's total) or `max_group_bytes` of static memory (default 2 %
  of the graph's total).
  """
  times = {op.name: costs[op.name].compute_us for op in graph.ops}
  memory = {op.name: costs[op.name].persistent_bytes +
            costs[op.name].temp_bytes + aliasing.allocated_output_bytes(op)
            for op in graph.ops}
  if max_group_us is None:
    max_group_us = 0.02 * sum(times.values())
  if max_group_bytes is None:
    max_group_bytes = 0.02 * sum(memory.values())
  if not max_group_us >= 0:
    raise invalid_argument("max_group_us", "a number >= 0", max_group_us)
  if not max_group_bytes >= 0:
    raise invalid_argument("max_group_bytes", "a number >= 0",
                           max_group_bytes)
  merger = _Merger(graph, times, memory, max_group_us, max_group_bytes)
  merger.merge_until_fixed_point()
  return ({op.name: merger.find(op.name) for op in graph.ops},
          {lab: merger.lab_find(lab) for lab in merger.lab_parent})


class _Merger:
  """`propose_groups`' state: two union-finds (ops into groups, colocation
  labels into joined labels), each group's compute and bytes, and the
  coarse graph's adjacency, kept current as groups merge."""

  def __init__(self, graph: OpGraph, times: dict[str, float],
               memory: dict[str, float], max_us: float, max_bytes: float):
    self.max_us, self.max_bytes = max_us, max_bytes
    self.parent = {op.name: op.name for op in graph.ops}
    # Colocation labels form their own union-find: joined groups share one.
    self.lab_parent: dict[str, str] = {}
    self.lab_us: dict[str, float] = {}
    self.lab_bytes: dict[str, float] = {}
    for op in graph.ops:
      lab = op.colocation
      if lab is not None:
        self.lab_parent[lab] = lab
        self.lab_us[lab] = self.lab_us.get(lab, 0.0) + times[op.name]
        self.lab_bytes[lab] = self.lab_bytes.get(lab, 0.0) + memory[op.name]
    self.group_us = dict(times)
    self.group_bytes = dict(memory)
    self.label = {op.name: op.colocation for op in graph.ops}
    self.dtypes = {op.name: op.device_types for op in graph.ops}
    self.order = {n: i for i, n in enumerate(topological_order(graph))}
    self.succ: dict[str, set] = {op.name: set() for op in graph.ops}
    self.pred: dict[str, set] = {op.name: set() for op in graph.ops}
    for e in graph.edges:
      self.succ[e.src].add(e.dst)
      self.pred[e.dst].add(e.src)
    self.edges = sorted({(e.src, e.dst) for e in graph.edges},
                        key=lambda sd: (self.order[sd[0]], self.order[sd[1]]))

  def find(self, x: str) -> str:
    return _root(self.parent, x)

  def lab_find(self, x: str) -> str:
    return _root(self.lab_parent, x)

  def merge_until_fixed_point(self) -> None:
    """Merges along edges, in topological order, until no merge is left."""
    changed = True
    while changed:
      changed = False
      for src, dst in self.edges:
        a, b = self.find(src), self.find(dst)
        if self.may_merge(a, b):
          self.merge(a, b)
          changed = True

  def may_merge(self, a: str, b: str) -> bool:
    """Whether groups a -> b may merge: the edge is the only path between
    them, their device types agree, and neither the group nor a joined
    colocation group would exceed the caps."""
    if a == b or b not in self.succ[a]:
      return False
    if len(self.succ[a]) != 1 and len(self.pred[b]) != 1:
      return False
    if self.dtypes[a] and self.dtypes[b] and self.dtypes[a] != self.dtypes[b]:
      return False
    if (self.group_us[a] + self.group_us[b] > self.max_us or
        self.group_bytes[a] + self.group_bytes[b] > self.max_bytes):
      return False
    la, lb = self.label[a], self.label[b]
    if la is not None and lb is not None:
      ra, rb = self.lab_find(la), self.lab_find(lb)
      if ra != rb and (self.lab_us[ra] + self.lab_us[rb] > self.max_us or
                       self.lab_bytes[ra] + self.lab_bytes[rb] >
                       self.max_bytes):
        return False
    return True

  def merge(self, a: str, b: str) -> None:
    """Joins groups a and b (and their colocation labels) into the one
    earlier in topological order."""
    root, other = (a, b) if self.order[a] < self.order[b] else (b, a)
    self.parent[other] = root
    self.group_us[root] += self.group_us[other]
    self.group_bytes[root] += self.group_bytes[other]
    la, lb = self.label[root], self.label[other]
    if la is not None and lb is not None:
      ra, rb = self.lab_find(la), self.lab_find(lb)
      if ra != rb:
        self.lab_parent[rb] = ra
        self.lab_us[ra] += self.lab_us[rb]
        self.lab_bytes[ra] += self.lab_bytes[rb]
    elif la is None:
      self.label[root] = lb
    self.dtypes[root] = self.dtypes[root] or self.dtypes[other]
    self._relink(root, other)

  def _relink(self, root: str, other: str) -> None:
    """Keeps the coarse graph's adjacency current: `other` becomes
    `root`."""
    succ, pred = self.succ, self.pred
    for x in succ.pop(other):
      pred[x].discard(other)
      if x != root:
        pred[x].add(root)
        succ[root].add(x)
    for x in pred.pop(other):
      succ[x].discard(other)
      if x != root:
        succ[x].add(root)
        pred[root].add(x)
    succ[root].discard(root)
    pred[root].discard(root)


def _root(parent: dict[str, str], x: str) -> str:
  """`x`'s representative in the union-find `parent` (path halving)."""
  while parent[x] != x:
    parent[x] = parent[parent[x]]
    x = parent[x]
  return x


def contract(graph: OpGraph, costs, group_of: Mapping[str, str],
             labels: Mapping[str, str] | None = None) -> Coarsening:
  """The coarse graph and costs for `group_of` (see module doc); `labels`
  maps original colocation labels to joined ones."""
  labels = labels or {}
  members: dict[str, list[str]] = {}
  for name in topological_order(graph):
    members.setdefault(group_of[name], []).append(name)
  # External tensors: (member, port) read by an op of another group.
  external: dict[str, list[tuple[str, int]]] = {g: [] for g in members}
  ext_index: dict[tuple[str, int], int] = {}
  ext_bytes: dict[tuple[str, int], int] = {}
  for e in graph.edges:
    if e.is_control or group_of[e.src] == group_of[e.dst]:
      continue
    key = (e.src, e.src_output)
    if key not in ext_index:
      ext_index[key] = len(external[group_of[e.src]])
      external[group_of[e.src]].append(key)
    ext_bytes[key] = max(ext_bytes.get(key, 0), e.bytes)
  ops, coarse_costs = [], {}
  for g, names in members.items():
    first = graph[names[0]]
    colocation = next((graph[n].colocation for n in names
                       if graph[n].colocation), None)
    if colocation is not None:
      colocation = labels.get(colocation, colocation)
    device_types = next((graph[n].device_types for n in names
                         if graph[n].device_types), None)
    # What each external output allocates (a member's view or variable
    # read allocates nothing); its edges keep the bytes a copy moves.
    outputs = tuple(ext_bytes[(src, port)] if aliasing.allocates(
        graph[src], port) else 0 for src, port in external[g])
    peak = _internal_peak(graph, costs, names, set(names))
    ops.append(Op(g, first.type if len(names) == 1 else "Coarse",
                  output_bytes=outputs, colocation=colocation,
                  device_types=device_types,
                  backward=all(graph[n].backward for n in names)))
    coarse_costs[g] = OpCost(
        compute_us=sum(costs[n].compute_us for n in names),
        temp_bytes=max(0, peak - sum(outputs)),
        persistent_bytes=sum(costs[n].persistent_bytes for n in names),
        profiled=all(costs[n].profiled for n in names))
  edges, seen_control = [], set()
  for e in graph.edges:
    a, b = group_of[e.src], group_of[e.dst]
    if a == b:
      continue
    if e.is_control:
      if (a, b) not in seen_control:
        seen_control.add((a, b))
        edges.append(Edge(a, b, CONTROL, None, 0))
      continue
    edges.append(Edge(a, b, ext_index[(e.src, e.src_output)], None, e.bytes))
  coarse = OpGraph(ops, edges, name=f"{graph.name}/coarse")
  return Coarsening(coarse, CostModel(coarse_costs, source="coarsened"),
                    dict(group_of), len(graph), len(graph.edges))


def _internal_peak(graph, costs, names, inside) -> int:
  """Liveness peak of temp + outputs while `names` run in order on one
  device; tensors read outside the group stay live to the end."""
  last_reader: dict[tuple[str, int], int] = {}
  escapes = set()
  position = {n: i for i, n in enumerate(names)}
  for n in names:
    for e in graph.out_edges(n):
      if e.is_control:
        continue
      key = (n, e.src_output)
      if e.dst in inside:
        last_reader[key] = max(last_reader.get(key, -1), position[e.dst])
      else:
        escapes.add(key)
  level = peak = 0
  frees: dict[int, int] = {}
  for i, n in enumerate(names):
    op = graph[n]
    level += aliasing.allocated_output_bytes(op) + costs[n].temp_bytes
    peak = max(peak, level)
    level -= costs[n].temp_bytes
    for port in range(op.num_outputs):
      nbytes = aliasing.allocated_bytes(op, port)
      key = (n, port)
      if key in escapes:
        continue
      frees[last_reader.get(key, i)] = frees.get(last_reader.get(key, i),
                                                 0) + nbytes
    level -= frees.pop(i, 0)
  return peak


def coarsen(graph: OpGraph, costs, *,
            max_group_us: float | None = None) -> Coarsening:
  """propose_groups then contract."""
  group_of, labels = propose_groups(graph, costs, max_group_us=max_group_us)
  return contract(graph, costs, group_of, labels)
