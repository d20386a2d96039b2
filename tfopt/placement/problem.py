"""PlacementProblem: a graph, its costs and a cluster, with every constraint
resolved once, for all placers.

Constraints:
  * colocation: ops sharing `Op.colocation` form one group and one device;
  * device types: an op with `device_types` may only go to devices of those
    types; a group may go where all its members may;
  * pins: user pins (op name -> device index) pin the op's whole group;
  * memory: each device's cap, less a headroom fraction.

Placers account memory statically: an op holds its persistent, temp and
output bytes, plus one received copy per remote tensor it reads, on its
device for the whole step. That bounds the simulator's liveness peak from
above, so a plan that fits statically is feasible; `simulate` then reports
the (lower) liveness peak.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from tfopt._errors import invalid_argument
from tfopt.cluster import Cluster
from tfopt.cost.cost_model import OpCost, op_costs
from tfopt.graph import aliasing
from tfopt.graph.analysis import format_bytes
from tfopt.graph.opgraph import OpGraph, topological_order


class InfeasiblePlacement(ValueError):
  """No plan satisfying the memory caps and constraints was found."""


@dataclasses.dataclass(frozen=True)
class PlacementProblem:
  """Everything a placer needs, validated. Build with `make_problem`."""
  graph: OpGraph
  costs: Mapping[str, OpCost]
  cluster: Cluster
  order: tuple[str, ...]             # deterministic topological order
  rank: Mapping[str, int]            # op -> position in `order`
  group_of: Mapping[str, str]        # op -> group id (op name if alone)
  members: Mapping[str, tuple[str, ...]]  # group id -> ops in topo order
  allowed: Mapping[str, tuple[int, ...]]  # group id -> allowed devices
  memory: Mapping[str, int]          # op -> static bytes (no copies)
  group_memory: Mapping[str, int]    # group id -> sum of member memory
  caps: tuple[float, ...]            # per device, after headroom (inf = none)

  @property
  def num_devices(self) -> int:
    return len(self.cluster)

  def compute_us(self, name: str) -> float:
    return self.costs[name].compute_us


def make_problem(graph: OpGraph, cluster: Cluster, costs, *,
                 pins: Mapping[str, int] | None = None,
                 headroom: float = 0.0) -> PlacementProblem:
  """Validates the inputs and resolves constraints (see module doc)."""
  if not isinstance(graph, OpGraph):
    raise invalid_argument("graph", "an OpGraph", graph)
  if not len(graph):
    raise invalid_argument("graph", "a graph with at least one op",
                           f"<{graph!r}>")
  if not isinstance(cluster, Cluster):
    raise invalid_argument("cluster", "a tfopt.Cluster", cluster)
  if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or \
      not 0 <= headroom < 1:
    raise invalid_argument("headroom", "a fraction in [0, 1)", headroom)
  table = op_costs(graph, costs)
  num = len(cluster)
  pins = dict(pins or {})
  for name, d in pins.items():
    if name not in graph:
      raise invalid_argument("pins", f"a mapping of op names of the graph to "
                             f"device indices (no op is named {name!r})", pins)
    if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < num:
      raise invalid_argument(f"pins[{name!r}]", f"a device index in [0, "
                             f"{num})", d)
  order = tuple(topological_order(graph))
  rank = {n: i for i, n in enumerate(order)}
  group_of, members = {}, {}
  for name in order:
    gid = graph[name].colocation or name
    group_of[name] = gid
    members.setdefault(gid, []).append(name)
  types = [d.device_type for d in cluster.devices]
  allowed = {}
  for gid, names in members.items():
    devices = set(range(num))
    reasons = []
    for n in names:
      op = graph[n]
      if op.device_types is not None:
        devices &= {i for i, t in enumerate(types) if t in op.device_types}
        reasons.append(f"{n!r} runs only on {list(op.device_types)}")
      if n in pins:
        devices &= {pins[n]}
        reasons.append(f"{n!r} is pinned to device {pins[n]}")
    if not devices:
      raise invalid_argument(
          "graph", "constraints that leave some device for every colocation "
          "group", f"<group {gid!r}: {'; '.join(reasons)}; the cluster's "
          f"device types are {types}>")
    allowed[gid] = tuple(sorted(devices))
  # Static accounting: every allocated output held all step (views and
  # variable reads allocate nothing: tfopt.graph.aliasing).
  memory = {op.name: table[op.name].persistent_bytes +
            table[op.name].temp_bytes + aliasing.allocated_output_bytes(op)
            for op in graph.ops}
  group_memory = {gid: sum(memory[n] for n in names)
                  for gid, names in members.items()}
  caps = tuple(float("inf") if d.memory_bytes is None else
               d.memory_bytes * (1.0 - headroom) for d in cluster.devices)
  for gid, need in group_memory.items():
    largest = max(caps[d] for d in allowed[gid])
    if need > largest:
      what = (f"op {gid!r}" if len(members[gid]) == 1 else
              f"colocation group {gid!r} ({len(members[gid])} ops)")
      raise InfeasiblePlacement(
          f"{what} needs {format_bytes(need)}; the largest device cap it may "
          f"use is {format_bytes(largest)}.")
  return PlacementProblem(
      graph, table, cluster, order, rank, group_of,
      {g: tuple(v) for g, v in members.items()}, allowed, memory,
      group_memory, caps)


def new_copies(problem: PlacementProblem, name: str, device: int,
               placed: Mapping[str, int],
               resident: set) -> dict[tuple[str, int], int]:
  """Tensors op `name` would need copied to `device`: (src, port) -> bytes.

  `resident` holds (src, port, device) triples already copied there; control
  edges move nothing.
  """
  copies: dict[tuple[str, int], int] = {}
  for e in problem.graph.in_edges(name):
    if e.is_control or placed.get(e.src, device) == device:
      continue
    if (e.src, e.src_output, device) in resident:
      continue
    key = (e.src, e.src_output)
    copies[key] = max(copies.get(key, 0), e.bytes)
  return copies
