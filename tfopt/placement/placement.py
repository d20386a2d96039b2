"""Placement: which device (an index into a Cluster) runs each op.

A placer returns a Placement; it never writes device strings itself (only
the export step writes `NodeDef.device`).
"""

from __future__ import annotations

import types
from typing import Iterator, Mapping

from tfopt._errors import invalid_argument


class Placement(Mapping[str, int]):
  """An immutable mapping op name -> device index in [0, num_devices).

  >>> p = Placement({"a": 0, "b": 1}, num_devices=2)
  >>> p["b"], p.ops_on(1)
  (1, ('b',))
  """

  __slots__ = ("_devices", "num_devices")

  def __init__(self, devices: Mapping[str, int], num_devices: int):
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or \
        num_devices <= 0:
      raise invalid_argument("num_devices", "a positive integer", num_devices)
    table = {}
    for name, d in devices.items():
      if isinstance(d, bool) or not isinstance(d, int) or not \
          0 <= d < num_devices:
        raise invalid_argument(f"placement[{name!r}]",
                               f"a device index in [0, {num_devices})", d)
      table[name] = d
    self._devices = types.MappingProxyType(table)
    self.num_devices = num_devices

  def __getitem__(self, name: str) -> int:
    return self._devices[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._devices)

  def __len__(self) -> int:
    return len(self._devices)

  def __repr__(self) -> str:
    counts = [0] * self.num_devices
    for d in self._devices.values():
      counts[d] += 1
    return f"Placement(ops={len(self)}, ops_per_device={counts})"

  def ops_on(self, device: int) -> tuple[str, ...]:
    return tuple(n for n, d in self._devices.items() if d == device)

  def check_covers(self, graph) -> None:
    """Raises ValueError naming the first op of `graph` left unplaced."""
    for op in graph.ops:
      if op.name not in self._devices:
        raise invalid_argument("placement", "a device for every op of the "
                               "graph", f"<op {op.name!r} unplaced>")

  @classmethod
  def single_device(cls, graph, num_devices: int = 1,
                    device: int = 0) -> "Placement":
    return cls({op.name: device for op in graph.ops}, num_devices)
