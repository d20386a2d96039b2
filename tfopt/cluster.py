"""Device and Cluster: device names (TF device strings), memory caps, links,
and which devices share physical compute.

Virtual CPU devices in one process and remote `/job:worker/task:i` devices
are both just clusters: a placer only sees indices, caps, a CommModel and a
ComputeSharing. Logical CPUs of one process run on the same cores (and
server processes of one host do, unless each is pinned to its own): two
ops "in parallel" on them share those cores, which `ComputeSharing` tells
the simulator. `tfopt.runtime.calibrate` fits both on the real machine;
`tfopt.calibration` saves and reloads them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Sequence

from tfopt._errors import (check_non_negative, check_positive_int,
                           invalid_argument)
from tfopt.cost.comm import CommModel


def checked_overheads(name: str, values, per: str = "device"
                      ) -> tuple[float, ...]:
  """`values` (a list or tuple of finite times >= 0, one per count of
  `per`s) as a tuple of floats, or the Keras-style error naming `name`."""
  ok = (isinstance(values, (list, tuple)) and
        all(isinstance(t, numbers.Real) and not isinstance(t, bool) and
            0 <= t < math.inf for t in values))
  if not ok:
    raise invalid_argument(name, f"a list or tuple of finite times >= 0 "
                           f"(microseconds), one per count of {per}s",
                           values)
  return tuple(float(t) for t in values)


def overhead_at(table: Sequence[float], count: int) -> float:
  """`table[count - 1]`; beyond the table, its last entry plus, per count
  further, its last increase (none below 0); 0 for an empty table.

  >>> overhead_at((1.0, 3.0), 1), overhead_at((1.0, 3.0), 4), overhead_at((), 2)
  (1.0, 7.0, 0.0)
  """
  check_positive_int("count", count)
  if not table:
    return 0.0
  value = table[min(count, len(table)) - 1]
  if count > len(table) and len(table) > 1:
    value += max(0.0, table[-1] - table[-2]) * (count - len(table))
  return float(value)


@dataclasses.dataclass(frozen=True)
class Device:
  """One device: TF device string, type, memory cap (None = unlimited) and
  what each op costs its executor beyond the op's kernel time (dispatch,
  bookkeeping: measured by `tfopt.runtime.calibrate`, a few us per op on
  TensorFlow's CPU executor; profiles time the kernels alone)."""
  name: str
  device_type: str = "GPU"
  memory_bytes: int | None = None
  op_overhead_us: float = 0.0

  def __post_init__(self):
    if not self.name:
      raise invalid_argument("name", "a non-empty TF device string", self.name)
    check_non_negative("op_overhead_us", self.op_overhead_us)
    if self.memory_bytes is not None and (
        isinstance(self.memory_bytes, bool)
        or not isinstance(self.memory_bytes, int) or self.memory_bytes <= 0):
      raise invalid_argument("memory_bytes", "a positive integer or None",
                             self.memory_bytes)


@dataclasses.dataclass(frozen=True)
class ComputeSharing:
  """Devices that compute on the same cores, and how many ops at once those
  cores run at full speed.

  Attributes:
    groups: per device, a group id; devices with equal ids share cores.
    capacity: ops of one group that run side by side unslowed (>= 1). When
      n ops of a group run at once, each progresses at min(1, capacity / n)
      of its profiled speed (processor sharing): 1.0 where each op alone
      already keeps every core of the group busy.
    machine_capacity: where the groups are hosts on one machine's cores
      (`tfopt.scale.hosts.LocalHosts`): the ops' worth all groups together
      run unslowed. A group's demand is min(its running ops, capacity);
      while the demands add up past this, every op slows further by
      machine_capacity / their sum. None: the groups compute apart.
    threads: how many ops one group runs at once, on any of its devices:
      the group's executor thread pool (TensorFlow's inter-op pool: logical
      CPUs of one process share their session's; a server task has its
      own). None: each device runs one op at a time (Baechi's model), as a
      GPU's compute stream does. With threads, a single device of the group
      runs independent ops side by side as TensorFlow's CPU executor does,
      so spreading a step over devices of one pool buys no parallelism one
      device did not already have.

  >>> ComputeSharing((0, 0), 1.0).rate(2)   # two ops share one core's worth
  0.5
  """
  groups: tuple[int, ...]
  capacity: float = 1.0
  threads: int | None = None
  machine_capacity: float | None = None

  def __post_init__(self):
    groups = tuple(self.groups)
    if not groups or any(isinstance(g, bool) or not isinstance(g, int)
                         for g in groups):
      raise invalid_argument("groups", "a non-empty sequence of integer "
                             "group ids, one per device", self.groups)
    object.__setattr__(self, "groups", groups)
    if isinstance(self.capacity, bool) or not isinstance(
        self.capacity, (int, float)) or not 1.0 <= self.capacity < float(
            "inf"):
      raise invalid_argument("capacity", "a finite number >= 1",
                             self.capacity)
    if self.threads is not None:
      check_positive_int("threads", self.threads)
    if self.machine_capacity is not None and (
        isinstance(self.machine_capacity, bool) or
        not isinstance(self.machine_capacity, (int, float)) or
        not 1.0 <= self.machine_capacity < float("inf")):
      raise invalid_argument("machine_capacity", "a finite number >= 1 or "
                             "None", self.machine_capacity)

  def rate(self, running: int) -> float:
    """Each op's speed when `running` ops of one group run at once."""
    return min(1.0, self.capacity / running) if running else 1.0

  def machine_rate(self, running: Sequence[int]) -> float:
    """The further factor on every op's speed when the groups run
    `running` ops each (1 without a `machine_capacity`).

    >>> ComputeSharing((0, 0, 1, 1), 1.0, machine_capacity=1.6
    ...                ).machine_rate([2, 1])  # one core's worth each
    0.8
    """
    if self.machine_capacity is None:
      return 1.0
    demand = sum(min(n, self.capacity) for n in running)
    return min(1.0, self.machine_capacity / demand) if demand else 1.0

  def slots(self, group_size: int) -> int:
    """Ops a group of `group_size` devices runs at once at most."""
    return group_size if self.threads is None else self.threads

  def group_speed(self, group_size: int) -> float:
    """The most ops' worth of profiled work a group of `group_size`
    devices does per unit of time."""
    return min(float(self.slots(group_size)), self.capacity)

  def speed(self) -> float:
    """`group_speed` summed over the groups: no schedule does its total
    work faster."""
    sizes: dict[int, int] = {}
    for g in self.groups:
      sizes[g] = sizes.get(g, 0) + 1
    total = sum(self.group_speed(n) for n in sizes.values())
    if self.machine_capacity is not None:  # the groups share one machine
      total = min(total, self.machine_capacity)
    return total

  @classmethod
  def alone(cls, num_devices: int, threads: int | None = None
            ) -> "ComputeSharing":
    """Every device on cores of its own (`threads`: each device's pool)."""
    return cls(tuple(range(num_devices)), 1.0, threads)

  @classmethod
  def shared(cls, num_devices: int, capacity: float = 1.0,
             threads: int | None = None) -> "ComputeSharing":
    """Every device on the same cores (`threads`: their one pool)."""
    return cls((0,) * num_devices, capacity, threads)


@dataclasses.dataclass(frozen=True)
class Cluster:
  """An ordered set of devices, the links between them, and which of them
  share cores (None: every device computes apart).

  `step_overhead_us`: per count of devices a plan uses (1, 2, ...), what
  a step costs beyond its ops and transfers: the runtime's dispatch to
  those devices and its wait for their replies (server tasks driven from
  a client, `Calibration.dispatch_us`); the simulator adds it to a plan's
  makespan (`step_overhead`), so plans that spread pay for it. Empty:
  nothing (Baechi's model).
  """
  devices: tuple[Device, ...]
  comm: CommModel = CommModel()
  sharing: ComputeSharing | None = None
  step_overhead_us: tuple[float, ...] = ()

  def __post_init__(self):
    devices = tuple(self.devices)
    if not devices:
      raise invalid_argument("devices", "a non-empty sequence of Device",
                             self.devices)
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
      raise invalid_argument("devices", "devices with unique names", names)
    object.__setattr__(self, "devices", devices)
    if self.sharing is not None and len(self.sharing.groups) != len(devices):
      raise invalid_argument("sharing", f"a ComputeSharing with one group "
                             f"per device ({len(devices)})",
                             self.sharing.groups)
    if self.comm.hosts and len(self.comm.hosts) != len(devices):
      raise invalid_argument("comm", f"a CommModel with one host per device "
                             f"({len(devices)})", self.comm.hosts)
    object.__setattr__(self, "step_overhead_us", checked_overheads(
        "step_overhead_us", self.step_overhead_us))

  def step_overhead(self, devices_used: int) -> float:
    """What a step on `devices_used` devices costs beyond its ops
    (`step_overhead_us`, extended as `overhead_at` does).

    >>> Cluster.uniform(3, step_overhead_us=(10.0, 15.0)).step_overhead(3)
    20.0
    """
    check_positive_int("devices_used", devices_used)
    return overhead_at(self.step_overhead_us, devices_used)

  def __len__(self) -> int:
    return len(self.devices)

  @property
  def memory_caps(self) -> tuple[int | None, ...]:
    return tuple(d.memory_bytes for d in self.devices)

  @classmethod
  def uniform(cls, num_devices: int, memory_bytes: int | None = None, *,
              device_type: str = "GPU", comm: CommModel | None = None,
              names: Sequence[str] | None = None,
              sharing: ComputeSharing | None = None,
              step_overhead_us: Sequence[float] = ()) -> "Cluster":
    """`num_devices` identical devices named /device:<type>:i by default."""
    check_positive_int("num_devices", num_devices)
    if names is not None and len(names) != num_devices:
      raise invalid_argument("names", f"a sequence of {num_devices} names",
                             names)
    names = names or [f"/device:{device_type}:{i}" for i in range(num_devices)]
    return cls(tuple(Device(n, device_type, memory_bytes) for n in names),
               comm or CommModel(), sharing, step_overhead_us)
