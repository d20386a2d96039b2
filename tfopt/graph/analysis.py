"""Graph analyses as plain functions: critical path and makespan bounds.

Each takes the graph first and a cost table (a CostModel, or a plain mapping
op name -> microseconds), returns new values and mutates nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Union

from tfopt._errors import check_positive_int
from tfopt.cost.comm import CommModel
from tfopt.cost.cost_model import CostModel, OpCost, op_costs
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
  return "\n".join(lines)
