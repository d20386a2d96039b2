"""CostModel: per-op compute time and memory, a table keyed by op name.

Costs live apart from the graph's structure (ARCHITECTURE.md: structure apart
from numbers), so one OpGraph can be costed by profiling, by an analytic
estimate, or by a file, and the three compared.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Iterator, Mapping

from tfopt._errors import invalid_argument


@dataclasses.dataclass(frozen=True)
class OpCost:
  """What one op costs.

  Attributes:
    compute_us: run time in microseconds (>= 0).
    temp_bytes: scratch memory held only while the op runs.
    persistent_bytes: memory held for the whole step (weights, slots).
    profiled: False where no measurement existed and the numbers are an
      estimate.
  """
  compute_us: float
  temp_bytes: int = 0
  persistent_bytes: int = 0
  profiled: bool = True

  def __post_init__(self):
    for field in ("compute_us", "temp_bytes", "persistent_bytes"):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or \
          not value >= 0 or value == float("inf"):
        raise invalid_argument(field, "a finite number >= 0", value)


class CostModel(Mapping[str, OpCost]):
  """An immutable mapping op name -> OpCost, with a few totals.

  >>> c = CostModel({"a": OpCost(2.0), "b": OpCost(3.0, persistent_bytes=8)})
  >>> c.total_compute_us(), c["b"].persistent_bytes
  (5.0, 8)
  """

  __slots__ = ("_costs", "source", "notes")

  def __init__(self, costs: Mapping[str, OpCost], *, source: str = "",
               notes: Mapping[str, str] | None = None):
    """`notes`: op name -> why its cost was not measured on its own node
    (fused by the runtime into another, or estimated and why)."""
    table = {}
    for name, cost in costs.items():
      if not isinstance(cost, OpCost):
        raise invalid_argument(f"costs[{name!r}]", "an OpCost", cost)
      table[name] = cost
    self._costs = types.MappingProxyType(table)
    self.source = source
    self.notes = types.MappingProxyType(dict(notes or {}))

  def __getitem__(self, name: str) -> OpCost:
    try:
      return self._costs[name]
    except KeyError:
      raise KeyError(f"No cost for op {name!r}") from None

  def __iter__(self) -> Iterator[str]:
    return iter(self._costs)

  def __len__(self) -> int:
    return len(self._costs)

  def __repr__(self) -> str:
    return (f"CostModel(ops={len(self)}, total_compute_us="
            f"{self.total_compute_us():.1f}, source={self.source!r})")

  def total_compute_us(self) -> float:
    return float(sum(c.compute_us for c in self._costs.values()))

  def num_profiled(self) -> int:
    return sum(1 for c in self._costs.values() if c.profiled)

  def describe_unmeasured(self, limit: int = 5) -> str:
    """One line: which ops the runtime fused into others (measured there)
    and which are estimated, a few named each; "" when every op was
    measured on its own node."""
    parts = []
    for label, ops in (
        ("fused by the runtime (measured on the op that absorbed them)",
         [n for n, why in self.notes.items() if why.startswith("fused")]),
        ("estimated (profiled: false)",
         [n for n, c in self._costs.items() if not c.profiled])):
      if ops:
        more = f", +{len(ops) - limit} more" if len(ops) > limit else ""
        parts.append(f"{len(ops)} {label}: {', '.join(ops[:limit])}{more}")
    return "; ".join(parts)

  def scaled_to(self, total_us: float, *, why: str = "") -> "CostModel":
    """The measured ops' times scaled so that all ops add up to
    `total_us` (estimated ones kept): a profile brought to the level of a
    step timed at another moment, as `profile_step`'s clock does. Where
    nothing measured is left to scale (or the estimates alone exceed
    `total_us`), the costs unchanged. `why` is added to the source.

    >>> c = CostModel({"a": OpCost(2.0), "b": OpCost(1.0, profiled=False)})
    >>> c.scaled_to(5.0)["a"].compute_us
    4.0
    """
    if isinstance(total_us, bool) or not isinstance(
        total_us, (int, float)) or not 0 < total_us < float("inf"):
      raise invalid_argument("total_us", "a positive finite number",
                             total_us)
    measured = sum(c.compute_us for c in self._costs.values() if c.profiled)
    rest = sum(c.compute_us for c in self._costs.values() if not c.profiled)
    if measured <= 0 or total_us <= rest:
      return self
    scale = (total_us - rest) / measured
    return CostModel(
        {n: dataclasses.replace(c, compute_us=c.compute_us * scale)
         if c.profiled else c for n, c in self._costs.items()},
        source=f"{self.source}, scaled x{scale:.2f}" + (
            f" {why}" if why else ""),
        notes=self.notes)

  def compute_times(self) -> dict[str, float]:
    """Op name -> compute_us, the form graph analyses take."""
    return {k: c.compute_us for k, c in self._costs.items()}

  def check_covers(self, graph) -> None:
    """Raises ValueError naming the first op of `graph` without a cost."""
    for op in graph.ops:
      if op.name not in self._costs:
        raise invalid_argument("costs", f"a cost for every op of graph "
                               f"{graph.name!r}", f"<missing op {op.name!r}>")


def op_costs(graph, costs) -> dict[str, OpCost]:
  """op name -> OpCost for every op of `graph`.

  `costs` is a CostModel or a mapping op name -> OpCost or microseconds (the
  short form tests and analyses use). A missing op or a bad number is
  reported by name.
  """
  table = {}
  for op in graph.ops:
    try:
      value = costs[op.name]
    except KeyError:
      raise invalid_argument("costs", "a cost for every op of the graph",
                             f"<missing op {op.name!r}>") from None
    if not isinstance(value, OpCost):
      if isinstance(value, bool) or not isinstance(value, (int, float)) or \
          not value >= 0:
        raise invalid_argument(f"costs[{op.name!r}]", "a number >= 0", value)
      value = OpCost(float(value))
    table[op.name] = value
  return table
