"""Graph analyses as plain functions: critical path and makespan bounds.

Each takes the graph first and a cost table (a CostModel, or a plain mapping
op name -> microseconds), returns new values and mutates nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Union

import numpy as np

from tfopt._errors import check_positive_int
from tfopt.cost.comm import CommModel
from tfopt.cost.cost_model import CostModel, OpCost, op_costs
from tfopt.graph import aliasing
from tfopt.graph.opgraph import OpGraph, topological_order

Costs = Union[CostModel, Mapping[str, float], Mapping[str, OpCost]]


def compute_times(graph: OpGraph, costs: Costs) -> dict[str, float]:
  """Op name -> compute microseconds for every op of `graph`."""
  return {name: c.compute_us for name, c in op_costs(graph, costs).items()}


@dataclasses.dataclass(frozen=True)
class CriticalPath:
  """The longest path: its length in microseconds and its ops in order."""
  length_us: float
  ops: tuple[str, ...]


def critical_path(graph: OpGraph, costs: Costs,
                  comm: CommModel | None = None) -> CriticalPath:
  """Longest compute path through `graph`.

  With `comm`, every data edge on the path also pays its transfer time, as if
  each op sat on its own device (the bound Baechi's m-SCT reasons about);
  control edges move no data and cost nothing.

  >>> from tfopt.graph.opgraph import Op, Edge
  >>> g = OpGraph([Op("a", "X"), Op("b", "X"), Op("c", "X")],
  ...             [Edge("a", "b", bytes=1000), Edge("a", "c")])
  >>> critical_path(g, {"a": 1.0, "b": 2.0, "c": 5.0})
  CriticalPath(length_us=6.0, ops=('a', 'c'))
  """
  times = compute_times(graph, costs)
  if not len(graph):
    return CriticalPath(0.0, ())
  finish: dict[str, float] = {}
  best_pred: dict[str, str | None] = {}
  for name in topological_order(graph):
    start, via = 0.0, None
    for e in graph.in_edges(name):
      delay = comm.transfer_us(e.bytes) if comm and not e.is_control else 0.0
      t = finish[e.src] + delay
      if t > start or via is None and t == start:
        start, via = t, e.src
    finish[name] = start + times[name]
    best_pred[name] = via
  end = max(graph.ops, key=lambda op: (finish[op.name], -graph.index(op.name)))
  path, node = [], end.name
  while node is not None:
    path.append(node)
    node = best_pred[node]
  return CriticalPath(finish[end.name], tuple(reversed(path)))


def makespan_lower_bound(graph: OpGraph, costs: Costs,
                         num_devices: int) -> float:
  """max(critical path without communication, total work / num_devices).

  No schedule on `num_devices` identical devices can finish sooner.

  >>> from tfopt.graph.opgraph import Op
  >>> g = OpGraph([Op(n, "X") for n in "abcd"], [])
  >>> makespan_lower_bound(g, dict(a=4.0, b=4.0, c=4.0, d=4.0), 2)
  8.0
  """
  check_positive_int("num_devices", num_devices)
  total = sum(compute_times(graph, costs).values())
  return max(critical_path(graph, costs).length_us, total / num_devices)


def format_bytes(nbytes: float) -> str:
  """Bytes for a person, three significant digits (decimal units).

  >>> format_bytes(512), format_bytes(3_200), format_bytes(614e6)
  ('512 B', '3.20 KB', '614 MB')
  >>> format_bytes(5.347e9), format_bytes(35e9)
  ('5.35 GB', '35.0 GB')
  """
  for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
    if nbytes >= size:
      value = nbytes / size
      digits = 0 if value >= 100 else 1 if value >= 10 else 2
      return f"{value:,.{digits}f} {unit}"
  return f"{nbytes:,.0f} B"


@dataclasses.dataclass(frozen=True)
class LiveMemoryBound:
  """Bytes live at once while `op` runs, in every schedule on any devices.

  `bytes` = `persistent` (every op's, all step) + `temp` (the op's own) +
  `tensors` (outputs started before or with the op and read by it or
  after it, each counted once, copies not counted)."""
  bytes: int
  op: str | None
  persistent: int
  temp: int
  tensors: int

  def explain(self, caps_total: float, num_devices: int) -> str:
    """Why no plan fits when `bytes` > `caps_total`."""
    mb = format_bytes
    return (f"no plan can exist: while op {self.op!r} runs, at least "
            f"{mb(self.bytes)} are live on the devices together in any "
            f"schedule (persistent {mb(self.persistent)} + its temp "
            f"{mb(self.temp)} + tensors produced before it or by it and read "
            f"by it or later {mb(self.tensors)}), more than the {num_devices} devices' "
            f"caps together ({mb(caps_total)})")


def live_memory_bound(graph: OpGraph, costs: Costs) -> LiveMemoryBound:
  """The largest, over ops v that take time, of the bytes that must be live
  somewhere while v runs, whatever the placement and the order.

  In the simulator's memory model (`tfopt.simulate`) a tensor is held from
  its producer's start until its last consumer finished (on the sender
  until its copies are sent, on each receiver from the copy's start), so a
  tensor produced by v or an ancestor of v and read by v or a descendant of
  v is live throughout v's run; so are every op's persistent bytes and v's
  temp bytes. Their sum bounds the devices' liveness peaks added up: if it
  exceeds the caps added up, no placement fits. (A training graph's bound
  sits near the loss: every activation a backward op reads is live there.)

  >>> from tfopt.graph.opgraph import Op, Edge
  >>> g = OpGraph([Op("a", "X", output_bytes=(100,)),
  ...              Op("b", "X", output_bytes=(10,)),
  ...              Op("c", "X", output_bytes=(1,))],
  ...             [Edge("a", "b", bytes=100), Edge("b", "c", bytes=10),
  ...              Edge("a", "c", bytes=100)])
  >>> bound = live_memory_bound(g, {"a": 1.0, "b": 1.0, "c": 1.0})
  >>> bound.op, bound.bytes  # while c runs: a's, b's and its own output
  ('c', 111)
  """
  table = op_costs(graph, costs)
  order = list(topological_order(graph))
  index = {name: i for i, name in enumerate(order)}
  n = len(order)
  persistent = sum(c.persistent_bytes for c in table.values())
  if not n:
    return LiveMemoryBound(persistent, None, persistent, 0, 0)
  # Bitsets over topological positions: strict ancestors and descendants.
  anc = [0] * n
  for i, name in enumerate(order):
    for e in graph.in_edges(name):
      j = index[e.src]
      anc[i] |= anc[j] | (1 << j)
  desc = [0] * n
  for i in range(n - 1, -1, -1):
    for e in graph.out_edges(order[i]):
      j = index[e.dst]
      desc[i] |= desc[j] | (1 << j)
  # Each buffer (its producer, port): the ops during whose run it is live.
  # A view shares its input's buffer, so the buffer's readers are those of
  # every view of it; a variable read or a constant is persistent memory
  # (tfopt.graph.aliasing). Its bytes: the smaller of the output and its
  # copies (either may be the one alive at a given moment).
  root = _buffer_roots(graph, order)
  readers: dict[tuple[str, int], list] = {}
  for e in graph.edges:
    if not e.is_control and root.get((e.src, e.src_output)) is not None:
      readers.setdefault(root[(e.src, e.src_output)], []).append(e)
  live = np.zeros(n, dtype=np.float64)
  nbytes_per_row = (n + 7) // 8
  for (src, port), edges in readers.items():
    size = min([graph[src].output_bytes[port]] +
               [e.bytes for e in edges if e.src == src]) \
        if port < len(graph[src].output_bytes) else 0
    if size <= 0:
      continue
    u = index[src]
    spans = 0
    for e in edges:
      c = index[e.dst]
      spans |= anc[c] | (1 << c)
    during = (desc[u] & spans)  # strict descendants of u, up to a reader
    if not during:
      continue
    bits = np.unpackbits(np.frombuffer(during.to_bytes(
        nbytes_per_row, "little"), dtype=np.uint8), bitorder="little")[:n]
    live += float(size) * bits
  best, best_v = -1, None
  best_parts = (0, 0)
  for i, name in enumerate(order):
    c = table[name]
    if c.compute_us <= 0:
      continue  # an instantaneous op: no moment strictly inside its run
    own = _own_allocation(graph, name, root, readers, desc[i], index)
    tensors = int(live[i]) + own
    total = persistent + c.temp_bytes + tensors
    if total > best:
      best, best_v, best_parts = total, name, (c.temp_bytes, tensors)
  if best_v is None:
    return LiveMemoryBound(persistent, None, persistent, 0, 0)
  return LiveMemoryBound(best, best_v, persistent, *best_parts)


def _buffer_roots(graph: OpGraph, order) -> dict[tuple[str, int],
                                               tuple[str, int] | None]:
  """(op, port) -> the (op, port) that allocated its buffer, following
  views to their input; None for persistent memory (variable reads,
  constants) and views of it."""
  root: dict[tuple[str, int], tuple[str, int] | None] = {}
  for name in order:
    op = graph[name]
    inputs = sorted((e for e in graph.in_edges(name) if not e.is_control),
                    key=lambda e: (e.dst_input is None, e.dst_input or 0))
    for port in range(op.num_outputs):
      source = aliasing.view_input(op, port)
      if aliasing.is_persistent_view(op):
        root[(name, port)] = None
      elif source is not None and source < len(inputs):
        e = inputs[source]
        root[(name, port)] = root.get((e.src, e.src_output),
                                      (e.src, e.src_output))
      else:
        root[(name, port)] = (name, port)
  return root


def _own_allocation(graph: OpGraph, name: str, root, readers, desc_bits: int,
                    index) -> int:
  """What op `name` must allocate for its outputs in every schedule: not a
  view's, and not a forwarding op's output 0 where some same-sized input
  buffer has no reader after it (in some order it is the last reader and
  writes in place)."""
  op = graph[name]
  own = aliasing.allocated_output_bytes(op)
  if not own or not aliasing.may_forward(op) or not op.output_bytes:
    return own
  for e in graph.in_edges(name):
    r = None if e.is_control else root.get((e.src, e.src_output))
    if r is None or graph[r[0]].type == "Placeholder" or \
        graph[r[0]].output_bytes[r[1]] != op.output_bytes[0]:
      continue
    if not any(desc_bits >> index[x.dst] & 1 for x in readers.get(r, ())):
      return own - op.output_bytes[0]
  return own


def graph_summary(graph: OpGraph, costs: CostModel,
                  num_devices: int = 4) -> dict:
  """Counts and totals a person reads first, as a JSON-ready dict."""
  output_bytes = sum(sum(op.output_bytes) for op in graph.ops)
  path_us = critical_path(graph, costs).length_us
  total_us = sum(costs[op.name].compute_us for op in graph.ops)
  persistent = sum(costs[op.name].persistent_bytes for op in graph.ops)
  temp = sum(costs[op.name].temp_bytes for op in graph.ops)
  data_edges = [e for e in graph.edges if not e.is_control]
  return {
      "name": graph.name,
      "ops": len(graph),
      "data_edges": len(data_edges),
      "control_edges": len(graph.edges) - len(data_edges),
      "colocation_groups": len(graph.colocation_groups),
      "backward_ops": sum(1 for op in graph.ops if op.backward),
      "profiled_ops": sum(1 for op in graph.ops if costs[op.name].profiled),
      "total_compute_us": total_us,
      "critical_path_us": path_us,
      "critical_path_with_comm_us": critical_path(graph, costs,
                                                  CommModel()).length_us,
      # makespan_lower_bound's formula, reusing the path computed above.
      "lower_bound_us": max(path_us, total_us / num_devices),
      "lower_bound_devices": num_devices,
      "persistent_bytes": persistent,
      "output_bytes": output_bytes,
      "temp_bytes": temp,
      "total_memory_bytes": persistent + output_bytes + temp,
      # What the devices' caps must hold together, in any schedule.
      "live_memory_bound_bytes": live_memory_bound(graph, costs).bytes,
  }


def format_summary(summary: Mapping) -> str:
  """A short human-readable table of `graph_summary`'s dict."""
  mib = 1 << 20
  lines = [
      f"graph            {summary['name']}",
      f"ops              {summary['ops']} ({summary['backward_ops']} backward, "
      f"{summary['profiled_ops']} profiled)",
      f"edges            {summary['data_edges']} data, "
      f"{summary['control_edges']} control",
      f"colocation       {summary['colocation_groups']} groups",
      f"total compute    {summary['total_compute_us'] / 1e3:.2f} ms",
      f"critical path    {summary['critical_path_us'] / 1e3:.2f} ms "
      f"({summary['critical_path_with_comm_us'] / 1e3:.2f} ms with PCIe "
      f"transfers on every edge)",
      f"lower bound      {summary['lower_bound_us'] / 1e3:.2f} ms on "
      f"{summary['lower_bound_devices']} devices",
      f"memory           {summary['total_memory_bytes'] / mib:.1f} MiB "
      f"(persistent {summary['persistent_bytes'] / mib:.1f}, outputs "
      f"{summary['output_bytes'] / mib:.1f}, temp "
      f"{summary['temp_bytes'] / mib:.1f})",
  ]
  if "live_memory_bound_bytes" in summary:
    lines.append(f"live at once     at least "
                 f"{summary['live_memory_bound_bytes'] / mib:.1f} MiB in any "
                 f"schedule (the caps together must hold it)")
  return "\n".join(lines)
