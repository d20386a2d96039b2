"""A cluster's fitted parameters, saved and reloaded: the calibration file.

`tfopt-calibrate --devices=logical:2` (or
`tfopt.runtime.fit_cluster`) measures, on this machine, what the simulator
needs to predict a placed step: the link between the devices (latency,
bandwidth, the per-transfer overhead that holds the channels, control
dependencies as messages) and whether the devices share cores (and how many
ops those cores run at full speed at once). It writes a JSON file in the
`tfopt.calibration/1` format; `place`, `run_placed`, `tfopt.compile` and
`benchmarks.runtime` read it back with `load_calibration` and build their
Cluster from it (`Calibration.cluster`).

A calibration describes one machine and one TensorFlow: a file made on
another machine (CPU model, core count, architecture) or with another
TensorFlow version is refused with a message saying so. A file older than
`STALE_AFTER_DAYS` still loads, and every report that uses it says it is
stale.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import numbers
import os
import platform
from typing import Any, Sequence

from tfopt._errors import check_positive_int, invalid_argument
from tfopt.cluster import (Cluster, ComputeSharing, Device,
                           checked_overheads, overhead_at)
from tfopt.cost.comm import CommModel, Link

FORMAT = "tfopt.calibration/1"
STALE_AFTER_DAYS = 30
# How devices of each kind share cores: logical CPUs of one process and
# unpinned server processes of one host use the same cores; pinned tasks
# have their own.
KINDS = ("logical", "processes", "pinned")


class CalibrationError(ValueError):
  """A calibration file that cannot be used here (with the reason)."""


def machine_fingerprint() -> dict[str, Any]:
  """What identifies this machine's hardware for a calibration: CPU model,
  usable cores, architecture and OS (not the host name: CI machines of
  one kind get new names every run)."""
  model = platform.processor() or ""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          model = line.split(":", 1)[1].strip()
          break
  except OSError:  # no /proc (macOS, Windows): platform's name stands
    pass
  cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else os.cpu_count())
  return {"cpu": model, "cores": cores, "arch": platform.machine(),
          "system": platform.system()}


def _tensorflow_version() -> str:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.__version__


@dataclasses.dataclass(frozen=True)
class Calibration:
  """Fitted link and compute-sharing parameters of one kind of cluster.

  Attributes:
    kind: "logical" (CPU devices of one process), "processes" (server
      processes on this host) or "pinned" (server processes, each pinned to
      its own core).
    num_devices: how many devices were measured.
    link: latency, bandwidth and overhead between two of them.
    control_messages: cross-device control dependencies cost a message.
    capacity: ops of one sharing group that run at full speed at once.
    shared: whether the devices share cores (one sharing group).
    op_overhead_us: what each op costs a device's executor beyond its
      kernel (profiles time kernels alone).
    cores_per_device: cores each device computes on when it has its own
      (pinned: 1), for profiling; None where they share.
    intra_op_threads, inter_op_threads: the devices' thread pools as
      measured (None: TensorFlow's defaults).
    host_link: the link between tasks of different hosts, where the
      devices measured were tasks on several hosts (`link` is then the
      link inside one host); None: one level.
    hosts_share_cores: tasks of different hosts compute on the same cores
      (hosts of `tfopt.scale.hosts.LocalHosts`, all on this machine) rather
      than each host on cores of its own.
    hosts_capacity: ops of two tasks on different hosts that run side by
      side unslowed, as measured (in [1, 2]; None: not measured). Where
      hosts share cores, each host's tasks form a sharing group of
      `capacity` and the groups together run this many (at least
      `capacity`) ops' worth (`ComputeSharing.machine_capacity`); without
      it, all tasks form one group of `capacity`.
    dispatch_us: per count of server tasks a step uses (1, 2, ...), what
      a step of one trivial op per task costs when this process calls it
      through its eager runtime, as `tfopt.compile` trains
      (`tfopt.runtime.dispatch`); empty: not measured.
    feed_gbps: how fast a batch travels from this process to the first
      task (GB/s), which tfopt.compile charges every batch at; None: not
      measured.
    machine, tensorflow, created: where, with what and when (UTC ISO).
    fit: the measurements' residuals and raw numbers, for the report.
    path: the file it was loaded from (not saved).
  """
  kind: str
  num_devices: int
  link: Link
  control_messages: bool
  capacity: float
  shared: bool
  op_overhead_us: float = 0.0
  cores_per_device: int | None = None
  intra_op_threads: int | None = None
  inter_op_threads: int | None = None
  host_link: Link | None = None
  hosts_share_cores: bool = True
  hosts_capacity: float | None = None
  dispatch_us: tuple[float, ...] = ()
  feed_gbps: float | None = None
  machine: dict = dataclasses.field(default_factory=machine_fingerprint)
  tensorflow: str = dataclasses.field(default_factory=_tensorflow_version)
  created: str = dataclasses.field(default_factory=lambda: (
      datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds")))
  fit: dict = dataclasses.field(default_factory=dict)
  path: str | None = dataclasses.field(default=None, compare=False)

  def __post_init__(self):
    if self.kind not in KINDS:
      raise invalid_argument("kind", f"one of {list(KINDS)}", self.kind)
    check_positive_int("num_devices", self.num_devices)
    for name in ("link", "host_link"):
      value = getattr(self, name)
      if not isinstance(value, Link) and not (name == "host_link" and
                                              value is None):
        raise invalid_argument(name, "a tfopt.cost.Link" + (
            " or None" if name == "host_link" else ""), value)
    if isinstance(self.capacity, bool) or not isinstance(
        self.capacity, (int, float)) or not self.capacity >= 1:
      raise invalid_argument("capacity", "a number >= 1", self.capacity)
    if self.hosts_capacity is not None and (
        isinstance(self.hosts_capacity, bool) or not isinstance(
            self.hosts_capacity, (int, float)) or
        not 1 <= self.hosts_capacity <= 2):
      raise invalid_argument("hosts_capacity", "a number in [1, 2] or None",
                             self.hosts_capacity)
    object.__setattr__(self, "dispatch_us", checked_overheads(
        "dispatch_us", self.dispatch_us, per="task"))
    if self.feed_gbps is not None and (
        isinstance(self.feed_gbps, bool) or
        not isinstance(self.feed_gbps, (int, float)) or
        not 0 < self.feed_gbps < float("inf")):
      raise invalid_argument("feed_gbps", "a finite number > 0 or None",
                             self.feed_gbps)

  # -- What it means for a cluster --

  def comm(self, hosts: Sequence[str] | None = None) -> CommModel:
    """The link between any two devices; with `hosts` (per device, the
    host it runs on) and a `host_link`, pairs on different hosts cross
    that link instead."""
    # Logical CPUs of one process hand tensors over without a copy; server
    # tasks copy through gRPC, whose work runs on the tasks' own cores.
    between = self.host_link
    if hosts is None or between is None:
      hosts, between = (), self.link  # one level
    elif between.cpu_bandwidth_gbps is None:
      # The wire between hosts is slower than the cores: they process the
      # bytes at the rate measured inside a host.
      between = dataclasses.replace(between, cpu_bandwidth_gbps=max(
          between.bandwidth_gbps, self.link.bandwidth_gbps))
    return CommModel.two_level(hosts, self.link, between,
                     control_messages=self.control_messages,
                     shared_buffers=self.kind == "logical",
                     cpu_work=self.kind != "logical")

  def sharing(self, num_devices: int,
              hosts: Sequence[str] | None = None) -> ComputeSharing:
    """Which of `num_devices` devices of this kind share cores, and the
    executor pools they draw on (`ComputeSharing.threads`): logical CPUs
    of one process share their session's inter-op pool (TensorFlow's
    default: one thread per core the process could use, as recorded in
    `machine` when measured); a pinned task
    has its own (`inter_op_threads`). Unpinned server processes each
    have a pool of their own on shared cores, which one group's pool does
    not describe: there each device runs one op at a time."""
    if hosts is not None and len(hosts) != num_devices:
      raise invalid_argument("hosts", f"one host per device ({num_devices})",
                             hosts)
    threads = None
    if self.kind == "logical":
      threads = (self.inter_op_threads or self.machine.get("cores")
                 or machine_fingerprint()["cores"])
    elif self.kind == "pinned":
      threads = self.inter_op_threads or 1
    if self.shared and hosts is not None and not self.hosts_share_cores:
      # Each host's tasks share that host's cores.
      ids = {h: i for i, h in enumerate(dict.fromkeys(hosts))}
      return ComputeSharing(tuple(ids[h] for h in hosts), self.capacity,
                            threads)
    if self.shared and hosts is not None and \
        self.hosts_capacity is not None:
      # Hosts on one machine's cores: each host's tasks share its cores
      # as measured inside a host, and the hosts slow each other as much
      # as two hosts' tasks were measured to side by side (a host pinned
      # to a core of its own next to another, capacity 1: two ops on one
      # host run at half speed, one op on each host at hosts_capacity / 2).
      ids = {h: i for i, h in enumerate(dict.fromkeys(hosts))}
      return ComputeSharing(tuple(ids[h] for h in hosts), self.capacity,
                            threads, machine_capacity=max(
                                self.capacity, self.hosts_capacity))
    if self.shared:
      return ComputeSharing.shared(num_devices, self.capacity, threads)
    return ComputeSharing.alone(num_devices, threads)

  def cluster(self, device_names: Sequence[str],
              memory_bytes: int | None = None, *,
              device_type: str = "CPU") -> Cluster:
    """A Cluster of these devices with the fitted link and sharing."""
    names = list(device_names)
    return Cluster(tuple(Device(n, device_type, memory_bytes,
                                self.op_overhead_us) for n in names),
                   self.comm(), self.sharing(len(names)))

  def applied_to(self, cluster: Cluster,
                 hosts: Sequence[str] | None = None) -> Cluster:
    """`cluster`'s devices (names, types, caps) with the fitted link, core
    sharing and per-op overhead; `hosts` (per device, its host) applies
    the two levels of a calibration across hosts."""
    if hosts is not None and len(hosts) != len(cluster):
      raise invalid_argument("hosts", f"one host per device ({len(cluster)})",
                             hosts)
    # replace: what else the cluster carries (its step overhead) stays.
    return dataclasses.replace(cluster, devices=tuple(dataclasses.replace(
        d, op_overhead_us=self.op_overhead_us) for d in cluster.devices),
                               comm=self.comm(hosts),
                               sharing=self.sharing(len(cluster), hosts))

  def step_overhead_us(self, tasks: int, feed_bytes: int = 0) -> float:
    """What a step on `tasks` server tasks costs beyond its simulated ops
    when this process drives it (`dispatch_us`), plus `feed_bytes` of
    batch fed to it at `feed_gbps`; 0 where not measured. Beyond the
    counts measured, each further task costs the last measured step.

    >>> c = Calibration("processes", 2, Link(), True, 1.0, True,
    ...                 dispatch_us=(1000.0, 1500.0), feed_gbps=0.1)
    >>> c.step_overhead_us(3), c.step_overhead_us(1, feed_bytes=10_000)
    (2000.0, 1100.0)
    """
    check_positive_int("tasks", tasks)
    feed = self.feed_us(feed_bytes)  # checks feed_bytes
    if not self.dispatch_us:
      return 0.0
    return overhead_at(self.dispatch_us, tasks) + feed

  def feed_us(self, feed_bytes: int) -> float:
    """`feed_bytes` of batch fed from this process at `feed_gbps` (0 where
    not measured).

    >>> Calibration("processes", 2, Link(), True, 1.0, True,
    ...             feed_gbps=0.1).feed_us(10_000)
    100.0
    """
    if isinstance(feed_bytes, bool) or not isinstance(
        feed_bytes, numbers.Integral) or feed_bytes < 0:
      raise invalid_argument("feed_bytes", "an integer >= 0", feed_bytes)
    return (int(feed_bytes) / (self.feed_gbps * 1e3) if self.feed_gbps
            else 0.0)

  # -- Age and provenance --

  def age_days(self, now: datetime.datetime | None = None) -> float:
    now = now or datetime.datetime.now(datetime.timezone.utc)
    made = datetime.datetime.fromisoformat(self.created)
    if made.tzinfo is None:
      made = made.replace(tzinfo=datetime.timezone.utc)
    return (now - made).total_seconds() / 86400.0

  @property
  def stale(self) -> bool:
    return self.age_days() > STALE_AFTER_DAYS

  def describe(self) -> str:
    """One line for reports: what was fitted, from where, and whether it is
    stale."""
    where = self.path or "not saved"
    overhead = ("whole latency" if self.link.overhead_us is None else
                f"{self.link.overhead_us:.0f} us")
    pool = self.sharing(self.num_devices).threads
    sharing = (f"shared cores, capacity {self.capacity:.2f}" if self.shared
               else "own cores each") + (
                   f", {pool} inter-op thread(s) per "
                   f"{'process' if self.shared else 'device'}" if pool
                   else "")
    age = self.age_days()
    if self.host_link is not None:
      line_between = (f"; between hosts {self.host_link.latency_us:.0f} us, "
                      f"{self.host_link.bandwidth_gbps:.3g} GB/s")
      if self.hosts_capacity is not None:
        line_between += (f", side by side {self.hosts_capacity:.2f} "
                         f"({'shared' if self.hosts_share_cores else 'own'}"
                         " cores)")
    else:
      line_between = ""
    if self.dispatch_us:
      feed = (f", the batch fed at {self.feed_gbps:.3g} GB/s"
              if self.feed_gbps else "")
      line_between += (f"; step dispatch {self.dispatch_us[0] / 1e3:.2f}-"
                       f"{self.dispatch_us[-1] / 1e3:.2f} ms on 1-"
                       f"{len(self.dispatch_us)} tasks{feed}")
    line = (f"calibrated {self.kind} x{self.num_devices} ({where}, "
            f"{self.created[:10]}, {_age(age)} old): latency {self.link.latency_us:.0f} us, "
            f"{self.link.bandwidth_gbps:.3g} GB/s, overhead {overhead}, "
            f"control edges {'are messages' if self.control_messages else 'free'}"
            f"{', copies work both ends' if self.kind != 'logical' else ''}"
            f"{line_between}"
            f"; {sharing}; {self.op_overhead_us:.1f} us per op")
    if age > STALE_AFTER_DAYS:
      line += (f"; STALE: {age:.0f} days old (over {STALE_AFTER_DAYS}), "
               f"run tfopt-calibrate again")
    return line

  # -- The file --

  def to_json(self) -> dict[str, Any]:
    return {"format": FORMAT, "kind": self.kind,
            "num_devices": self.num_devices,
            "link": _link_json(self.link),
            "control_messages": self.control_messages,
            "capacity": self.capacity, "shared": self.shared,
            "op_overhead_us": self.op_overhead_us,
            "cores_per_device": self.cores_per_device,
            "intra_op_threads": self.intra_op_threads,
            "inter_op_threads": self.inter_op_threads,
            "host_link": None if self.host_link is None else _link_json(
                self.host_link),
            "hosts_share_cores": self.hosts_share_cores,
            "hosts_capacity": self.hosts_capacity,
            "dispatch_us": list(self.dispatch_us),
            "feed_gbps": self.feed_gbps,
            "machine": self.machine, "tensorflow": self.tensorflow,
            "created": self.created, "fit": self.fit}

  def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Writes the file atomically; an existing file only with `overwrite`."""
    from tfopt._io import atomic_write_text  # pylint: disable=g-import-not-at-top
    atomic_write_text(path, json.dumps(self.to_json(), indent=1) + "\n",
                      overwrite=overwrite)


def _link_json(link: Link) -> dict[str, Any]:
  return {"latency_us": link.latency_us,
          "bandwidth_gbps": link.bandwidth_gbps,
          "overhead_us": link.overhead_us,
          "cpu_bandwidth_gbps": link.cpu_bandwidth_gbps}


def _link_from(doc: dict) -> Link:
  return Link(doc["latency_us"], doc["bandwidth_gbps"], doc.get("overhead_us"),
              doc.get("cpu_bandwidth_gbps"))


def from_json(doc: Any, *, path: str | None = None) -> Calibration:
  """A Calibration from a parsed document; CalibrationError names what is
  wrong (the machine and TensorFlow are not checked here)."""
  where = f"Calibration file {path!r}" if path else "The calibration"
  if not isinstance(doc, dict) or doc.get("format") != FORMAT:
    found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
    raise CalibrationError(f"{where} is not in the {FORMAT} format (format: "
                           f"{found!r}).")
  try:
    host_link = doc.get("host_link")
    return Calibration(
        kind=doc["kind"], num_devices=doc["num_devices"],
        link=_link_from(doc["link"]),
        host_link=None if host_link is None else _link_from(host_link),
        hosts_share_cores=bool(doc.get("hosts_share_cores", True)),
        hosts_capacity=doc.get("hosts_capacity"),
        dispatch_us=tuple(doc.get("dispatch_us") or ()),
        feed_gbps=doc.get("feed_gbps"),
        control_messages=bool(doc["control_messages"]),
        capacity=doc["capacity"], shared=bool(doc["shared"]),
        op_overhead_us=float(doc["op_overhead_us"]),
        cores_per_device=doc.get("cores_per_device"),
        intra_op_threads=doc.get("intra_op_threads"),
        inter_op_threads=doc.get("inter_op_threads"),
        machine=dict(doc["machine"]), tensorflow=str(doc["tensorflow"]),
        created=str(doc["created"]), fit=dict(doc.get("fit") or {}),
        path=path)
  except KeyError as err:
    raise CalibrationError(f"{where} lacks the field {err.args[0]!r}.") \
        from None
  except (TypeError, ValueError) as err:
    raise CalibrationError(f"{where} has a bad value: {err}") from None


def load_calibration(path: str | os.PathLike, *,
                     check_machine: bool = True) -> Calibration:
  """Reads a calibration file and checks it belongs here.

  Raises CalibrationError when the file does not parse, is not in the
  format, or (with `check_machine`) was made on another machine or with
  another TensorFlow version; FileNotFoundError names a missing file.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"No calibration file at {path!r}: make one with "
                            f"`tfopt-calibrate "
                            f"--out={path}`.")
  try:
    with open(path, encoding="utf-8") as f:
      doc = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    raise CalibrationError(f"Calibration file {path!r} does not parse as "
                           f"JSON: {err}") from None
  calibration = from_json(doc, path=path)
  if check_machine:
    check_here(calibration)
  return calibration


def check_here(calibration: Calibration) -> None:
  """Raises CalibrationError when `calibration` was made on another
  machine or TensorFlow version than this process's."""
  where = (f"Calibration file {calibration.path!r}" if calibration.path
           else "The calibration")
  here = machine_fingerprint()
  if calibration.machine != here:
    raise CalibrationError(
        f"{where} was made on another machine ({_machine(calibration.machine)}"
        f") than this one ({_machine(here)}): its link and core-sharing "
        f"numbers do not describe this one. Run `tfopt-calibrate` here.")
  version = _tensorflow_version()
  if calibration.tensorflow != version:
    raise CalibrationError(
        f"{where} was made with TensorFlow {calibration.tensorflow}, and this "
        f"is TensorFlow {version}: its runtime's costs may differ. Run "
        f"`tfopt-calibrate` again.")


def _age(days: float) -> str:
  """An age for a person: minutes, hours or days."""
  minutes = max(0.0, days) * 24 * 60
  if minutes < 90:
    return f"{minutes:.0f} min"
  return f"{minutes / 60:.0f} h" if minutes < 48 * 60 else f"{days:.0f} days"


def _machine(m: dict) -> str:
  return (f"{m.get('cpu') or '?'}, {m.get('cores')} cores, "
          f"{m.get('arch')}, {m.get('system')}")
