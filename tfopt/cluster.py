"""Device and Cluster: device names (TF device strings), memory caps, links.

Virtual CPU devices in one process and remote `/job:worker/task:i` devices
are both just clusters: a placer only sees indices, caps and a CommModel.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from tfopt._errors import check_positive_int, invalid_argument
from tfopt.cost.comm import CommModel


@dataclasses.dataclass(frozen=True)
class Device:
  """One device: TF device string, type and memory cap (None = unlimited)."""
  name: str
  device_type: str = "GPU"
  memory_bytes: int | None = None

  def __post_init__(self):
    if not self.name:
      raise invalid_argument("name", "a non-empty TF device string", self.name)
    if self.memory_bytes is not None and (
        isinstance(self.memory_bytes, bool)
        or not isinstance(self.memory_bytes, int) or self.memory_bytes <= 0):
      raise invalid_argument("memory_bytes", "a positive integer or None",
                             self.memory_bytes)


@dataclasses.dataclass(frozen=True)
class Cluster:
  """An ordered set of devices and the links between them."""
  devices: tuple[Device, ...]
  comm: CommModel = CommModel()

  def __post_init__(self):
    devices = tuple(self.devices)
    if not devices:
      raise invalid_argument("devices", "a non-empty sequence of Device",
                             self.devices)
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
      raise invalid_argument("devices", "devices with unique names", names)
    object.__setattr__(self, "devices", devices)

  def __len__(self) -> int:
    return len(self.devices)

  @property
  def memory_caps(self) -> tuple[int | None, ...]:
    return tuple(d.memory_bytes for d in self.devices)

  @classmethod
  def uniform(cls, num_devices: int, memory_bytes: int | None = None, *,
              device_type: str = "GPU", comm: CommModel | None = None,
              names: Sequence[str] | None = None) -> "Cluster":
    """`num_devices` identical devices named /device:<type>:i by default."""
    check_positive_int("num_devices", num_devices)
    if names is not None and len(names) != num_devices:
      raise invalid_argument("names", f"a sequence of {num_devices} names",
                             names)
    names = names or [f"/device:{device_type}:{i}" for i in range(num_devices)]
    return cls(tuple(Device(n, device_type, memory_bytes) for n in names),
               comm or CommModel())
