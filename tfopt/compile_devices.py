"""Where `tfopt.compile(placement=...)` places: `devices`, `cluster` and
`pins` checked once, at the call, into one `PlacementDevices` that the
hook reads; nothing after the call checks them or asks again whether the
devices are this process's.

Checks, in order (each a Keras-style error naming the argument):
  * `devices`: a non-empty list of TF device strings;
  * `cluster`: given only when some device names a task of another job
    ("/job:worker/task:1/..."); then this process connects to the cluster
    (`tfopt.runtime.remote.connect`: its tasks must answer), else None;
  * every device exists: a device of this process (logical CPUs come from
    `tf.config.set_logical_device_configuration`) or of the connected
    cluster;
  * `pins`: {layer name or variable path: device index or string}, each
    resolved to an index into `devices` (`compile_placement.check_pins`).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from tfopt._errors import invalid_argument


@dataclasses.dataclass(frozen=True)
class PlacementDevices:
  """The checked devices of one `tfopt.compile` call.

  Attributes:
    names: the device strings, in the user's order (plan device i is
      names[i]).
    spec: the cluster this process connected to, {job: ["host:port", ...]},
      when the devices name its tasks; None for devices of this process.
    pins: {layer name or variable path: device index}.
    in_process_cpus: every device is a CPU device of this process (they
      hand tensors over without a copy; calibrated automatically).
  """
  names: tuple[str, ...]
  spec: Mapping[str, list[str]] | None
  pins: Mapping[str, int]
  in_process_cpus: bool

  @property
  def remote(self) -> bool:
    """Whether the devices are tasks of a cluster (other processes)."""
    return self.spec is not None

  @property
  def target(self) -> str:
    """The session target that reaches the devices ("" for this
    process's)."""
    from tfopt.runtime.remote import is_remote, session_target  # pylint: disable=g-import-not-at-top
    if not self.remote:
      return ""
    first = next(d for d in self.names if is_remote(d))
    return session_target(self.spec, first)

  def target_of(self, graph_def) -> str:
    """The session target for a graph placed on these devices: the first
    task a node runs on ("" when every node is this process's)."""
    from tfopt.runtime.remote import is_remote, session_target  # pylint: disable=g-import-not-at-top
    if not self.remote:
      return ""
    first = next((n.device for n in graph_def.node
                  if n.device and is_remote(n.device)), None)
    return "" if first is None else session_target(self.spec, first)

  def cluster(self, memory_per_device: int | None, calibration=None):
    """The devices as a tfopt Cluster: each device's type from its string
    (a placer keeps CPU-only ops off GPUs), the cap on each, CPU devices of
    this process sharing buffers, and the calibration's link and core
    sharing where one is given (a calibration across hosts: its two
    links, by the host each task's address names). On tasks of a cluster,
    one device each, the calibration's step dispatch from this process
    (`Calibration.dispatch_us`) is the cluster's step overhead: the
    placers weigh it when they spread a plan."""
    from tfopt.cluster import Cluster, Device  # pylint: disable=g-import-not-at-top
    from tfopt.cost.comm import CommModel  # pylint: disable=g-import-not-at-top
    from tfopt.runtime.remote import device_type, task_hosts, task_of  # pylint: disable=g-import-not-at-top
    devices = tuple(Device(d, device_type(d), memory_per_device)
                    for d in self.names)
    cluster = Cluster(devices, CommModel(shared_buffers=self.in_process_cpus))
    if calibration is None:
      return cluster
    hosts = task_hosts(self.spec, self.names) if self.remote else None
    cluster = calibration.applied_to(cluster, hosts)
    tasks = [task_of(d) for d in self.names]
    if self.remote and None not in tasks and len(set(tasks)) == len(tasks):
      cluster = dataclasses.replace(
          cluster, step_overhead_us=calibration.dispatch_us)
    return cluster


def check_placement_devices(devices, cluster, pins) -> PlacementDevices:
  """The checks of the module doc, in order; connects to `cluster` when the
  devices name its tasks."""
  from tfopt.compile_placement import check_pins  # pylint: disable=g-import-not-at-top
  from tfopt.runtime import remote  # pylint: disable=g-import-not-at-top
  names = _device_strings(devices)
  spec = _connect(names, cluster)
  _check_exist(names)
  return PlacementDevices(tuple(names), spec, check_pins(pins, names),
                          remote.in_process_cpus(names))


def _device_strings(devices) -> list[str]:
  if isinstance(devices, str) or not isinstance(devices, Sequence):
    raise invalid_argument("devices", "a non-empty list of TF device strings "
                           "when `placement` is given", devices)
  names = list(devices)
  if not names or not all(isinstance(d, str) and d for d in names):
    raise invalid_argument("devices", "a non-empty list of TF device strings "
                           "when `placement` is given", devices)
  return names


def _connect(names: list[str], cluster):
  """The cluster spec when a device names a task of another job (this
  process connects to it); None for devices of this process."""
  from tfopt.runtime import remote  # pylint: disable=g-import-not-at-top
  if not any(remote.is_remote(d) for d in names):
    if cluster is not None:
      raise invalid_argument("cluster", "given only when `devices` name tasks "
                             "of a cluster (/job:<name>/task:<i>/...)",
                             cluster)
    return None
  return remote.connect(cluster)


def _check_exist(names: list[str]) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfopt.runtime.session import same_device  # pylint: disable=g-import-not-at-top
  available = [d.name for d in tf.config.list_logical_devices()]
  for d in names:
    if not any(same_device(d, a) for a in available):
      raise invalid_argument(
          "devices", f"devices of this process ({available}); logical CPU "
          f"devices come from tf.config.set_logical_device_configuration "
          f"before TensorFlow starts", names)
