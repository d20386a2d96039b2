"""CommModel: transfer time = latency + bytes / bandwidth, per device pair.

The default is the published PCIe fit used by Baechi: 134 us + 5.7 GB/s,
each transfer holding the sender's and the receiver's channel for all of it,
and control dependencies free.

Two refinements describe TensorFlow's own transports (fitted by
`tfopt.runtime.calibrate`, saved by `tfopt.calibration`):
  * `Link.overhead_us`: the part of the latency that occupies the channels.
    gRPC keeps many tensors in flight between two tasks: each costs the
    channels only its overhead plus its bytes, and arrives `latency_us`
    plus its bytes after it started. None (the default) means the whole
    latency occupies the channels, one transfer after another (Baechi's
    model).
  * `CommModel.control_messages`: a control dependency between ops on two
    devices is a message too (TensorFlow's partitioner sends a dummy tensor
    for each), costing a zero-byte transfer.
  * `CommModel.hosts`: the host of each device. Tasks of one host share
    its network link: transfers between hosts take turns on the sending
    host's way out and the receiving host's way in, each for its bytes on
    that wire (two tasks of a host sending to another host at once take
    turns on its link, rather than each having a link of its own). The
    wire time is the pair's link's: with three or more hosts of different
    rates, a fast host sending to a throttled one holds its way out for
    the slow link's time.

`fit_comm_model` fits latency and bandwidth by least squares from measured
(bytes, microseconds) pairs, `fit_overhead` the overhead from transfers
issued together; `tfopt.cost.comm_measure` measures both on real devices.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from tfopt._errors import check_non_negative, invalid_argument

PCIE_LATENCY_US = 134.0
PCIE_BANDWIDTH_GBPS = 5.7


@dataclasses.dataclass(frozen=True)
class Link:
  """One directed link: `latency_us` + bytes / (`bandwidth_gbps` GB/s).

  `overhead_us` (<= latency) is what each transfer occupies the channels
  for beyond its bytes; None: the whole latency (see module doc).

  `cpu_bandwidth_gbps`: how fast the two ends' cores process the bytes
  where transfers are CPU work (`CommModel.cpu_work`); None: at
  `bandwidth_gbps`, as between tasks of one host, where gRPC's copies are
  the link. A network slower than that (a link between hosts) holds the
  channels for its bytes on the wire, while the cores are busy only for
  the overhead plus the bytes at this rate (`cpu_us`).

  >>> Link(100.0, 1.0, overhead_us=10.0).channel_us(1000)  # 10 + 1 us
  11.0
  """
  latency_us: float = PCIE_LATENCY_US
  bandwidth_gbps: float = PCIE_BANDWIDTH_GBPS
  overhead_us: float | None = None
  cpu_bandwidth_gbps: float | None = None

  def __post_init__(self):
    check_non_negative("latency_us", self.latency_us)
    if isinstance(self.bandwidth_gbps, bool) or not isinstance(
        self.bandwidth_gbps, (int, float)) or not self.bandwidth_gbps > 0:
      raise invalid_argument("bandwidth_gbps", "a number > 0",
                             self.bandwidth_gbps)
    if self.overhead_us is not None:
      check_non_negative("overhead_us", self.overhead_us)
      if self.overhead_us > self.latency_us:
        raise invalid_argument("overhead_us", f"at most latency_us "
                               f"({self.latency_us})", self.overhead_us)
    if self.cpu_bandwidth_gbps is not None and (
        isinstance(self.cpu_bandwidth_gbps, bool) or
        not isinstance(self.cpu_bandwidth_gbps, (int, float)) or
        not self.cpu_bandwidth_gbps > 0):
      raise invalid_argument("cpu_bandwidth_gbps", "a number > 0 or None",
                             self.cpu_bandwidth_gbps)

  def transfer_us(self, nbytes: int) -> float:
    """Microseconds from a transfer's start until `nbytes` arrived; 0
    bytes (a control edge) costs 0 (a message: `message_us`)."""
    if nbytes <= 0:
      return 0.0
    # 1 GB/s = 1e9 B/s = 1e3 B/us.
    return self.latency_us + nbytes / (self.bandwidth_gbps * 1e3)

  def message_us(self, nbytes: int) -> float:
    """Like `transfer_us`, but a message without payload costs the
    latency (a control dependency between devices of TF's runtime)."""
    return self.latency_us + max(0, nbytes) / (self.bandwidth_gbps * 1e3)

  def channel_us(self, nbytes: int) -> float:
    """How long a transfer of `nbytes` holds the sender's and receiver's
    channels: its overhead plus its bytes (everything, without one)."""
    overhead = self.latency_us if self.overhead_us is None else \
        self.overhead_us
    return overhead + max(0, nbytes) / (self.bandwidth_gbps * 1e3)

  def cpu_us(self, nbytes: int) -> float:
    """The work a transfer of `nbytes` gives each end's cores where
    transfers are CPU work: `channel_us`, with the bytes at
    `cpu_bandwidth_gbps` where one is given.

    >>> Link(100.0, 0.01, 10.0, cpu_bandwidth_gbps=1.0).cpu_us(1000)
    11.0
    """
    if self.cpu_bandwidth_gbps is None:
      return self.channel_us(nbytes)
    overhead = self.latency_us if self.overhead_us is None else \
        self.overhead_us
    return overhead + max(0, nbytes) / (self.cpu_bandwidth_gbps * 1e3)


@dataclasses.dataclass(frozen=True)
class CommModel:
  """A default link plus optional per-pair overrides keyed (src, dst) index.

  `shared_buffers`: a transfer hands the sender's buffer over instead of
  copying it, as TensorFlow's in-process rendezvous does between CPU
  devices of one process (logical CPUs): the bytes stay charged to the
  sender's device until the last reader on any device finished, and the
  receiver is charged nothing. The transfer still takes its link time.

  `cpu_work`: a transfer is work of the sender's and of the receiver's
  cores for `Link.cpu_us` (its channel time, overhead plus bytes over
  bandwidth; on a wire slower than the cores, the bytes at the cores'
  rate), as gRPC's serialisation, copies and polling are in the server
  tasks' own processes: it shares their cores with the ops running there
  (slowing them, and slowed by them), and the tensor arrives no sooner
  than both sides' work is done. Calibrated links between server tasks
  set it; without it a transfer costs the devices nothing (a DMA engine's
  copy, Baechi's model).

  `hosts`: per device, the index of its host (empty: no network between
  hosts is modelled). A transfer between devices of different hosts holds
  the sender's host's way out and the receiver's host's way in for its
  bytes at the link's bandwidth (`wire_us`), one transfer at a time on
  each: the tasks of a host share its network link.

  >>> CommModel().transfer_us(5_700_000)   # 134 us + 1000 us
  1134.0
  >>> CommModel().transfer_us(100, 0, 0)   # same device: free
  0.0
  """
  default: Link = Link()
  pairs: Mapping[tuple[int, int], Link] = dataclasses.field(
      default_factory=dict)
  control_messages: bool = False
  shared_buffers: bool = False
  cpu_work: bool = False
  hosts: tuple[int, ...] = ()

  def __post_init__(self):
    hosts = tuple(self.hosts)
    if any(isinstance(h, bool) or not isinstance(h, (int, np.integer)) or
           h < 0 for h in hosts):
      raise invalid_argument("hosts", "per device a host index >= 0",
                             self.hosts)
    object.__setattr__(self, "hosts", tuple(int(h) for h in hosts))

  def link(self, src: int, dst: int) -> Link:
    return self.pairs.get((src, dst), self.default)

  def wire_us(self, nbytes: int, src: int, dst: int) -> float:
    """How long a transfer of `nbytes` from device `src` to `dst` holds
    the hosts' network links: its bytes at the link's bandwidth between
    devices of different `hosts`, else 0 (no network crossed).

    >>> CommModel(Link(100.0, 1.0), hosts=(0, 1)).wire_us(1000, 0, 1)
    1.0
    """
    if not self.hosts or self.hosts[src] == self.hosts[dst] or nbytes <= 0:
      return 0.0
    return nbytes / (self.link(src, dst).bandwidth_gbps * 1e3)

  def transfer_us(self, nbytes: int, src: int | None = None,
                  dst: int | None = None) -> float:
    if src is not None and src == dst:
      return 0.0
    link = self.default if src is None else self.link(src, dst)
    return link.transfer_us(nbytes)

  @classmethod
  def two_level(cls, hosts, inside: Link, between: Link,
                **kwargs) -> "CommModel":
    """`inside` between devices of one host, `between` between devices
    whose `hosts` (per device, any label of its host) differ; `kwargs`
    as the constructor's.

    >>> CommModel.two_level("aab", Link(1.0), Link(9.0)).link(1, 2).latency_us
    9.0
    >>> CommModel.two_level("aab", Link(1.0), Link(9.0)).hosts
    (0, 0, 1)
    """
    hosts = list(hosts)
    index = {h: i for i, h in enumerate(dict.fromkeys(hosts))}
    return cls(inside, pairs={
        (a, b): between for a in range(len(hosts)) for b in range(len(hosts))
        if hosts[a] != hosts[b]},
               hosts=tuple(index[h] for h in hosts) if len(index) > 1
               else (), **kwargs)

  @classmethod
  def uniform(cls, latency_us: float = PCIE_LATENCY_US,
              bandwidth_gbps: float = PCIE_BANDWIDTH_GBPS, *,
              overhead_us: float | None = None,
              control_messages: bool = False,
              shared_buffers: bool = False,
              cpu_work: bool = False) -> "CommModel":
    return cls(Link(latency_us, bandwidth_gbps, overhead_us),
               control_messages=control_messages,
               shared_buffers=shared_buffers, cpu_work=cpu_work)


@dataclasses.dataclass(frozen=True)
class CommFit:
  """A least-squares fit of transfer times: the link and how well it fits."""
  link: Link
  residual_rms_us: float
  relative_residual: float  # rms of residual / measured time
  num_points: int

  def __str__(self) -> str:
    return (f"latency {self.link.latency_us:.1f} us + bytes / "
            f"{self.link.bandwidth_gbps:.3f} GB/s  (rms residual "
            f"{self.residual_rms_us:.1f} us, relative rms "
            f"{100 * self.relative_residual:.1f} %, {self.num_points} points)")


def fit_comm_model(nbytes: Sequence[int], times_us: Sequence[float]) -> CommFit:
  """Least-squares fit of time = latency + bytes / bandwidth.

  The fit minimizes *relative* error (each point weighted by 1 / time):
  sizes span many orders of magnitude, and an ordinary fit would let 1 %
  noise on the largest copies swamp the latency of the small ones. Both
  coefficients are constrained to be physical (latency >= 0, bandwidth
  > 0): if the unconstrained fit gives a negative intercept the line is refit
  through the origin.

  >>> f = fit_comm_model([0, 1000, 2000], [10.0, 11.0, 12.0])
  >>> round(f.link.latency_us, 6), round(f.link.bandwidth_gbps, 6)
  (10.0, 1.0)
  """
  x = np.asarray(nbytes, dtype=np.float64)
  y = np.asarray(times_us, dtype=np.float64)
  if x.ndim != 1 or x.shape != y.shape or x.size < 2:
    raise invalid_argument("nbytes", "a 1-D sequence of at least 2 sizes, "
                           "as long as `times_us`", list(nbytes))
  if np.any(x < 0) or np.any(~np.isfinite(y)):
    raise invalid_argument("times_us", "finite, with sizes >= 0",
                           list(times_us))
  if np.ptp(x) == 0:
    raise invalid_argument("nbytes", "at least two distinct sizes",
                           list(nbytes))
  if np.any(y <= 0):
    raise invalid_argument("times_us", "positive times", list(times_us))
  w = 1.0 / y
  design = np.stack([w, x * w], axis=1)
  (latency, slope), *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
  if latency < 0:
    # Through the origin, still in relative error: minimize sum (s x/y - 1)^2.
    latency = 0.0
    slope = float(np.sum(x / y) / np.sum((x / y) ** 2))
  if slope <= 0:
    raise ValueError(
        "Measured transfer times do not grow with size, so no bandwidth can "
        f"be fitted. Received: nbytes={list(nbytes)}, times_us={list(times_us)}")
  residual = y - (latency + slope * x)
  rms = float(np.sqrt(np.mean(residual ** 2)))
  relative = float(np.sqrt(np.mean((residual / y) ** 2)))
  return CommFit(Link(float(latency), float(1.0 / slope / 1e3)), rms,
                 relative, x.size)


def fit_overhead(counts: Sequence[int], times_us: Sequence[float],
                 link: Link) -> tuple[float, float]:
  """The channel overhead per transfer from batches issued together.

  `times_us[i]` is how long `counts[i]` small transfers issued at once took
  until the last arrived (their payload negligible). Under the model, n of
  them take a latency plus (n - 1) overheads: the least-squares slope of
  time over n, clipped to [0, link.latency_us]. Returns (overhead_us,
  relative rms residual of the line).

  >>> fit_overhead([1, 2, 4], [100.0, 110.0, 130.0], Link(100.0, 1.0))
  (10.0, 0.0)
  """
  n = np.asarray(counts, dtype=np.float64)
  y = np.asarray(times_us, dtype=np.float64)
  if n.ndim != 1 or n.shape != y.shape or n.size < 2 or np.any(n < 1):
    raise invalid_argument("counts", "a 1-D sequence of at least 2 counts "
                           ">= 1, as long as `times_us`", list(counts))
  if np.ptp(n) == 0:
    raise invalid_argument("counts", "at least two distinct counts",
                           list(counts))
  if np.any(~np.isfinite(y)) or np.any(y <= 0):
    raise invalid_argument("times_us", "positive finite times",
                           list(times_us))
  slope, intercept = np.polyfit(n, y, 1)
  residual = y - (intercept + slope * n)
  relative = float(np.sqrt(np.mean((residual / y) ** 2)))
  # Rounded for stable reports, never above the latency it is capped at
  # (rounding 2.6021416065 up to 2.602141607 broke Link's own check).
  overhead = min(round(max(float(slope), 0.0), 9), link.latency_us)
  return overhead, round(relative, 9)
