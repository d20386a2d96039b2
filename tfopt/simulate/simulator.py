"""simulate(graph, placement, costs, cluster) -> Schedule.

The single source of a makespan and of per-device peak memory: placers may
keep their own timelines for speed, but every number tfopt reports comes from
here. Pure: nothing it is given is modified.

Timing model (Baechi's, with measured refinements):
  * One compute stream per device. A device runs one op at a time; among the
    ops ready on a free device the earliest in topological order runs first
    (or the lowest of a given `priority`, e.g. a placer's own start times).
    An op takes its compute time plus its device's `op_overhead_us` (the
    executor's own work per op).
  * Devices that share cores (`Cluster.sharing`: logical CPUs of one
    process) divide them: while n ops of one sharing group run, each
    advances at min(1, capacity / n) of its profiled speed. Without
    sharing, every device computes apart. Groups that are hosts on one
    machine's cores (`ComputeSharing.machine_capacity`) slow each other
    too, by the machine's capacity over the groups' summed demand.
  * Where the sharing names a thread pool (`ComputeSharing.threads`:
    TensorFlow's inter-op pool on CPUs), a group runs up to that many ops
    at once, on any of its devices, instead of one per device: the lowest
    ranked ready ops of the group start first.
  * An op is ready when every input has arrived: at once from its own
    device, after a transfer from another one.
  * A tensor (op, output port) is sent once per destination device and reused
    there by every consumer. A transfer waits for the sender's and the
    receiver's channel (one channel per device, first come first served),
    holds both for `Link.channel_us` (by default latency + bytes/bandwidth;
    gRPC's fitted overhead + bytes/bandwidth, so small transfers overlap)
    and arrives latency + bytes/bandwidth after it started. Between hosts
    (`CommModel.hosts`) it also waits for the sending host's way out and
    the receiving host's way in, holding them for its bytes on the wire
    (`CommModel.wire_us`): the tasks of a host share its link. Where the
    CommModel says transfers are CPU work (`CommModel.cpu_work`: gRPC
    between server tasks), the transfer is also work on the sender's and
    the receiver's cores (`Link.cpu_us`: the channel time, or less on a
    link slower than the cores, between hosts), shared with the ops running there like an
    op's (it takes no executor thread), and the tensor arrives no sooner
    than both are done. Control edges
    move nothing and cost nothing, unless the CommModel says they are
    messages (TensorFlow's runtime sends one per op and destination device):
    then each is a zero-byte transfer.

Memory model (liveness, training-aware):
  * persistent bytes are held on the op's device for the whole step;
  * temp bytes only while the op runs;
  * each output is allocated when its op starts and freed once its last
    consumer on that device has finished and its last outgoing transfer has
    completed (an activation therefore stays live until its backward consumer
    ran); an output nobody consumes is freed when its op ends;
  * a received copy is charged to the receiver from the transfer's start until
    its last consumer there has finished -- unless the CommModel hands
    buffers over (`shared_buffers`: CPU devices of one process), where the
    sender's buffer stays charged to the sender until the receiver's last
    consumer finished;
  * outputs that allocate nothing are not charged again, as TensorFlow's
    runtime does (`tfopt.graph.aliasing`): a view (Identity, IdentityN,
    Reshape, ...) shares its input's buffer and keeps it live until the
    view's own readers finished; a variable read or a constant is the
    persistent memory already charged; an element-wise op writes into a
    same-sized input whose other readers all finished before it started.
  At equal times, frees are applied before allocations.

The makespan is the last op's or transfer's end, plus the cluster's step
overhead for the number of devices the plan uses (`Cluster.step_overhead`:
a runtime's dispatch to them, measured; none by default).
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import TYPE_CHECKING, Mapping, Sequence

from tfopt._errors import invalid_argument
from tfopt._timing import union_us
from tfopt.cluster import Cluster, ComputeSharing
from tfopt.cost.cost_model import op_costs
from tfopt.graph import aliasing
from tfopt.graph.opgraph import CONTROL, OpGraph, topological_order

if TYPE_CHECKING:
  from tfopt.placement.placement import Placement


@dataclasses.dataclass(frozen=True)
class Transfer:
  """One tensor copy between devices."""
  src_op: str
  src_output: int
  src_device: int
  dst_device: int
  bytes: int
  start_us: float
  end_us: float


@dataclasses.dataclass(frozen=True)
class Schedule:
  """The simulated step.

  Attributes:
    device, start_us, end_us: per op.
    transfers: every cross-device copy, in the order they were issued.
    makespan_us: the step's length (0 for an empty graph).
    peak_bytes: per device, the liveness peak.
    memory_caps: per device, the cap it was checked against (None = none).
  """
  device: Mapping[str, int]
  start_us: Mapping[str, float]
  end_us: Mapping[str, float]
  transfers: tuple[Transfer, ...]
  makespan_us: float
  peak_bytes: tuple[int, ...]
  memory_caps: tuple[int | None, ...]

  @property
  def memory_exceeded(self) -> bool:
    """True if some device's peak is over its cap."""
    return any(cap is not None and peak > cap
               for peak, cap in zip(self.peak_bytes, self.memory_caps))

  @property
  def feasible(self) -> bool:
    return not self.memory_exceeded

  def over_cap(self) -> list[tuple[int, int, int]]:
    """(device, peak, cap) of every device over its cap."""
    return [(d, p, c) for d, (p, c) in enumerate(zip(self.peak_bytes,
                                                     self.memory_caps))
            if c is not None and p > c]

  def busy_us(self) -> tuple[float, ...]:
    """Per device, the time it had an op running (ops that ran side by
    side on it count once)."""
    spans: list[list[tuple[float, float]]] = [[] for _ in self.peak_bytes]
    for name, d in self.device.items():
      spans[d].append((self.start_us[name], self.end_us[name]))
    return tuple(union_us(intervals) for intervals in spans)


def simulate(graph: OpGraph, placement: Placement | Mapping[str, int], costs,
             cluster: Cluster, *,
             priority: Mapping[str, float] | None = None) -> Schedule:
  """Simulates one step of `graph` placed by `placement` (see module doc).

  Args:
    graph: the OpGraph.
    placement: op name -> device index, for every op.
    costs: a CostModel (or mapping op name -> OpCost or microseconds).
    cluster: devices (their memory caps), the CommModel, and which devices
      share cores (`cluster.sharing`).
    priority: optional op -> number; among ready ops a free device runs the
      lowest first (ties: topological order). By default the topological
      order alone, as TensorFlow's executor roughly does; a placer's own
      start times replay its intended order.
  """
  return simulate_timing(graph, placement, costs, cluster,
                         priority=priority).schedule()


@dataclasses.dataclass(frozen=True)
class Timing:
  """The timing pass of `simulate` alone: its makespan, and `schedule()`
  for the memory pass (the liveness peaks, about half of the work). A
  caller that only needs to know whether a plan is faster than another
  (placement portfolios, local search) skips the memory pass of plans that
  are not."""
  makespan_us: float
  _graph: OpGraph
  _timeline: "_Timeline"
  _op_cost: Mapping
  _cluster: Cluster

  def schedule(self) -> Schedule:
    timeline, cluster = self._timeline, self._cluster
    peaks = _peak_memory(self._graph, timeline.device, self._op_cost,
                         timeline.start, timeline.end, timeline.transfers,
                         len(cluster), cluster.comm.shared_buffers)
    return Schedule(timeline.device, timeline.start, timeline.end,
                    tuple(timeline.transfers), self.makespan_us, peaks,
                    cluster.memory_caps)


def simulate_timing(graph: OpGraph,
                    placement: Placement | Mapping[str, int], costs,
                    cluster: Cluster, *,
                    priority: Mapping[str, float] | None = None) -> Timing:
  """`simulate`'s timing pass; `.schedule()` completes it (same result as
  `simulate`, same arguments)."""
  placement = _checked_placement(graph, placement, cluster)
  op_cost = op_costs(graph, costs)
  timeline = _Timeline(graph, {op.name: placement[op.name] for op in
                               graph.ops}, op_cost,
                       _ranks(graph, priority), cluster)
  timeline.run()
  makespan = max(timeline.end.values(), default=0.0)
  if timeline.transfers:
    makespan = max(makespan, max(t.end_us for t in timeline.transfers))
  if cluster.step_overhead_us and timeline.device:
    makespan += cluster.step_overhead(len(set(timeline.device.values())))
  return Timing(makespan, graph, timeline, op_cost, cluster)


def _checked_placement(graph: OpGraph, placement, cluster: Cluster):
  """`placement` as a Placement on the cluster's devices, covering `graph`."""
  # Imported here: tfopt.placement's package imports this module (its
  # placers simulate), so a module-level import is circular.
  from tfopt.placement.placement import Placement  # pylint: disable=g-import-not-at-top
  num_devices = len(cluster)
  if not isinstance(placement, Placement):
    placement = Placement(placement, num_devices)
  if placement.num_devices != num_devices:
    raise invalid_argument("placement", f"a placement on {num_devices} "
                           "devices (the cluster's)",
                           f"<placement on {placement.num_devices} devices>")
  placement.check_covers(graph)
  return placement


def _ranks(graph: OpGraph, priority) -> dict[str, object]:
  """Each op's rank among ready ops: topological index, or (priority,
  topological index)."""
  topo = {name: i for i, name in enumerate(topological_order(graph))}
  if priority is None:
    return topo
  missing = next((op.name for op in graph.ops if op.name not in priority),
                 None)
  if missing is not None:
    raise invalid_argument("priority", "a number for every op",
                           f"<op {missing!r} has none>")
  return {n: (float(priority[n]), topo[n]) for n in topo}


class _Timeline:
  """The event loop: ops start on free devices, run at the speed their
  device's sharing group allows, finish, and send their outputs.

  Compute: each device runs one op at a time, or, where the sharing names
  a thread pool, each group runs up to `sharing.threads` ops on any of its
  devices. Devices of one sharing group (`Cluster.sharing`) divide their
  cores: while n of the group's ops run, each advances at
  `sharing.rate(n)` of its profiled speed, so an op's end is only known
  once no other op of its group starts or ends before it; `_reshare`
  recomputes the group's ends at each such event (stale "end" events are
  recognised by a version number).

  Transfers: one per (tensor, destination device), and, when the CommModel
  says control dependencies are messages, one per (op, destination device)
  for control edges. A transfer starts once both channels (and, between
  hosts, the sending host's way out and the receiving host's way in) are
  free, holds the channels for `Link.channel_us` and the hosts' links for
  its bytes on the wire, and arrives after `Link.transfer_us`.
  """

  def __init__(self, graph: OpGraph, device: dict[str, int], op_cost,
               rank, cluster: Cluster):
    self.graph, self.device, self.op_cost, self.rank = (graph, device,
                                                        op_cost, rank)
    self.comm = cluster.comm
    self.overhead = [dev.op_overhead_us for dev in cluster.devices]
    num = len(cluster)
    sharing = cluster.sharing or ComputeSharing.alone(num)
    self.sharing = sharing
    self.group = list(sharing.groups)
    self.running_in: dict[int, dict[str, list[float]]] = {
        g: {} for g in set(self.group)}  # op -> [work left, since]
    self.version: dict[str, int] = {}
    self.pending = {op.name: len(graph.in_edges(op.name)) for op in graph.ops}
    self.ready: list[list[tuple[object, str]]] = [[] for _ in range(num)]
    self.busy = [False] * num
    # Thread pools: per group, the devices that draw on it and how many
    # ops (not transfers' work) run on it.
    self.pooled = sharing.threads is not None
    self.ops_running = {g: 0 for g in set(self.group)}
    # Transfers whose cores' work is modelled: index -> [parts left (the
    # link's time, each side's work), readers, work per side].
    self.in_flight: dict[int, list] = {}
    self.members: dict[int, list[int]] = {}
    for d, g in enumerate(self.group):
      self.members.setdefault(g, []).append(d)
    self.channel_free = [0.0] * num
    hosts = self.comm.hosts  # one per device: Cluster checks it
    # Each host's network link, per direction: free from this time on.
    self.wire_out = [0.0] * (max(hosts) + 1 if hosts else 0)
    self.wire_in = list(self.wire_out)
    self.start: dict[str, float] = {}
    self.end: dict[str, float] = {}
    self.transfers: list[Transfer] = []
    self.events: list[tuple[float, int, str, object]] = []
    self.seq = 0
    for op in graph.ops:
      if self.pending[op.name] == 0:
        heapq.heappush(self.ready[device[op.name]], (rank[op.name], op.name))

  def run(self) -> None:
    self._dispatch(0.0)
    while self.events:
      now = self.events[0][0]
      while self.events and self.events[0][0] == now:
        _, _, kind, payload = heapq.heappop(self.events)
        if kind == "end":
          name, version = payload
          if self.version.get(name) != version:
            continue
          if isinstance(name, tuple):  # ("transfer", index, device)
            self._finish_work(name, now)
          else:
            self._finish(name, now)
        elif kind == "arrive":
          for dst in payload:
            self._satisfy(dst)
        elif kind == "linked":  # a worked transfer's link time is over
          self._part_done(payload, now)
        else:  # "work": a worked transfer got its channels
          self._start_work(payload, now)
      self._dispatch(now)
    if len(self.end) != len(self.graph):
      stuck = next(op.name for op in self.graph.ops
                   if op.name not in self.end)
      raise RuntimeError(f"Simulation ended with op {stuck!r} never run; "
                         f"the graph is not a DAG.")

  def _push(self, time: float, kind: str, payload) -> None:
    heapq.heappush(self.events, (time, self.seq, kind, payload))
    self.seq += 1

  def _satisfy(self, dst: str) -> None:
    self.pending[dst] -= 1
    if self.pending[dst] == 0:
      heapq.heappush(self.ready[self.device[dst]], (self.rank[dst], dst))

  def _dispatch(self, now: float) -> None:
    """Every free device starts its first ready op; with thread pools,
    each group fills its free threads with its lowest ranked ready ops."""
    if self.pooled:
      self._dispatch_pools(now)
      return
    touched = set()
    for d, queue in enumerate(self.ready):
      if not self.busy[d] and queue:
        _, name = heapq.heappop(queue)
        self.busy[d] = True
        touched.add(self._begin(name, d, now))
    for group in touched:
      self._reshare(group, now)

  def _dispatch_pools(self, now: float) -> None:
    threads = self.sharing.threads
    for group, devices in self.members.items():
      started = False
      while self.ops_running[group] < threads:
        queues = [(self.ready[d][0], d) for d in devices if self.ready[d]]
        if not queues:
          break
        _, d = min(queues)
        _, name = heapq.heappop(self.ready[d])
        self._begin(name, d, now)
        started = True
      if started:
        self._reshare(group, now)

  def _begin(self, name: str, d: int, now: float) -> int:
    """Starts op `name` on device `d`; returns its sharing group."""
    self.start[name] = now
    group = self.group[d]
    self._advance(group, now)
    self.running_in[group][name] = [
        self.op_cost[name].compute_us + self.overhead[d], now]
    self.ops_running[group] += 1
    return group

  def _affected(self, group: int):
    """The groups whose rate a change in `group` moves: all of them when
    they share a machine's cores (`ComputeSharing.machine_capacity`)."""
    if self.sharing.machine_capacity is None:
      return (group,)
    return tuple(self.running_in)

  def _rate(self, group: int) -> float:
    """Each running op's speed in `group` now."""
    rate = self.sharing.rate(len(self.running_in[group]))
    if self.sharing.machine_capacity is not None:
      rate *= self.sharing.machine_rate(
          [len(r) for r in self.running_in.values()])
    return rate

  def _advance(self, group: int, now: float) -> None:
    """Work done by the group's running ops since their last update (and
    every group's, where they share a machine)."""
    for g in self._affected(group):
      rate = self._rate(g)
      for state in self.running_in[g].values():
        state[0] = max(0.0, state[0] - (now - state[1]) * rate)
        state[1] = now

  def _reshare(self, group: int, now: float) -> None:
    """New end events for the group's running ops at its current rate
    (and every group's, where they share a machine)."""
    for g in self._affected(group):
      rate = self._rate(g)
      for name, (left, _) in self.running_in[g].items():
        version = self.version.get(name, 0) + 1
        self.version[name] = version
        self._push(now + left / rate, "end", (name, version))

  def _finish(self, name: str, now: float) -> None:
    d = self.device[name]
    group = self.group[d]
    self._advance(group, now)
    del self.running_in[group][name]
    self.ops_running[group] -= 1
    self._reshare(group, now)
    self.end[name] = now
    self.busy[d] = False
    self._send(name, d, now)

  def _send(self, name: str, d: int, now: float) -> None:
    """Outputs to their readers: at once on `d`, else one transfer per
    (port, destination device), in the order the readers rank."""
    copies: dict[tuple[int, int], list] = {}
    for e in self.graph.out_edges(name):
      dd = self.device[e.dst]
      if dd == d or (e.is_control and not self.comm.control_messages):
        self._satisfy(e.dst)
      else:
        copies.setdefault((e.src_output, dd), []).append(e)
    for (port, dd), edges in sorted(
        copies.items(), key=lambda kv: min(self.rank[e.dst] for e in kv[1])):
      link = self.comm.link(d, dd)
      nbytes = max(e.bytes for e in edges)
      duration = (link.message_us(nbytes) if port == CONTROL else
                  link.transfer_us(nbytes))
      if duration == 0.0:
        for e in edges:
          self._satisfy(e.dst)
        continue
      t0 = max(now, self.channel_free[d], self.channel_free[dd])
      wire = self.comm.wire_us(nbytes, d, dd)
      if wire:
        out, into = self.comm.hosts[d], self.comm.hosts[dd]
        t0 = max(t0, self.wire_out[out], self.wire_in[into])
        self.wire_out[out] = self.wire_in[into] = t0 + wire
      channel = min(duration, link.channel_us(nbytes))
      self.channel_free[d] = self.channel_free[dd] = t0 + channel
      readers = tuple(e.dst for e in edges)
      k = len(self.transfers)
      self.transfers.append(Transfer(name, port, d, dd, nbytes, t0,
                                     t0 + duration))
      work = min(channel, link.cpu_us(nbytes))
      if not (self.comm.cpu_work and work > 0):
        self._push(t0 + duration, "arrive", readers)
        continue
      self.in_flight[k] = [3, readers, work]
      self._push(t0 + duration, "linked", k)
      if t0 > now:
        self._push(t0, "work", k)
      else:
        self._start_work(k, now)

  def _start_work(self, k: int, now: float) -> None:
    """Transfer `k`'s work joins its sender's and receiver's cores."""
    transfer, work = self.transfers[k], self.in_flight[k][2]
    groups = []
    for device in (transfer.src_device, transfer.dst_device):
      group = self.group[device]
      self._advance(group, now)
      self.running_in[group][("transfer", k, device)] = [work, now]
      groups.append(group)
    for group in set(groups):
      self._reshare(group, now)

  def _finish_work(self, key: tuple, now: float) -> None:
    group = self.group[key[2]]
    self._advance(group, now)
    del self.running_in[group][key]
    self._reshare(group, now)
    self._part_done(key[1], now)

  def _part_done(self, k: int, now: float) -> None:
    """One of transfer `k`'s parts ended; after the last it arrives."""
    state = self.in_flight[k]
    state[0] -= 1
    if state[0]:
      return
    del self.in_flight[k]
    if now > self.transfers[k].end_us:
      self.transfers[k] = dataclasses.replace(self.transfers[k], end_us=now)
    for dst in state[1]:
      self._satisfy(dst)


def _peak_memory(graph, device, op_cost, start, end,
                 transfers: Sequence[Transfer], num_devices,
                 shared_buffers: bool = False) -> tuple[int, ...]:
  """Liveness peak per device from a finished timeline (see module doc)."""
  buffers = _Buffers(graph, device, start, end, transfers, shared_buffers)
  deltas: list[list[tuple[float, int]]] = [[] for _ in range(num_devices)]
  for op in graph.ops:
    name, d, c = op.name, device[op.name], op_cost[op.name]
    if c.persistent_bytes:
      deltas[d].append((0.0, c.persistent_bytes))
    if c.temp_bytes:
      deltas[d].append((start[name], c.temp_bytes))
      deltas[d].append((end[name], -c.temp_bytes))
  for buf in buffers.all():
    deltas[buf.device].append((buf.alloc_us, buf.bytes))
    deltas[buf.device].append((buf.free_us, -buf.bytes))
  return tuple(peak_level(events) for events in deltas)


def peak_level(events) -> int:
  """The highest running sum of (time, +/- bytes) events in time order; at
  equal times frees (negative) come first."""
  level = peak = 0
  for _, delta in sorted(events):
    level += delta
    peak = max(peak, level)
  return peak


@dataclasses.dataclass
class _Buffer:
  """Memory that one or more tensors share on one device."""
  device: int
  bytes: int
  alloc_us: float
  locations: list = dataclasses.field(default_factory=list)
  free_us: float = 0.0
  forwardable: bool = True


class _Buffers:
  """The buffers of a finished timeline: which tensor lives in which.

  A *location* is a tensor on a device: ("out", op, port) on its producer's
  device, ("copy", op, port, device) for a received copy. Each location
  maps to a buffer, or to None where it is memory charged as persistent (a
  variable read, a constant). Views share their input's buffer; a
  forwarding op takes over a same-sized input buffer whose every other
  reader finished before it started (see `tfopt.graph.aliasing`); fed
  inputs are never taken over (the caller holds them). A buffer is freed
  once every location in it has been read and sent for the last time.

  With `shared_buffers` (CommModel.shared_buffers) a received copy is no
  buffer of its own: it joins the sender's, which stays on the sender's
  device until the copy's readers finished too.
  """

  def __init__(self, graph, device, start, end, transfers,
               shared_buffers: bool = False):
    self.graph, self.device, self.start, self.end = graph, device, start, end
    self.readers: dict[tuple, list[str]] = {}
    for e in graph.edges:
      if e.is_control:
        continue
      self.readers.setdefault(self._location(e.src, e.src_output, e.dst),
                              []).append(e.dst)
    self.sent_until: dict[tuple, float] = {}
    self.of: dict[tuple, _Buffer | None] = {}
    self._buffers: list[_Buffer] = []
    # (op, port) -> copies that share the sender's buffer.
    self.handed_over: dict[tuple[str, int], list[tuple]] = {}
    for t in transfers:
      if t.src_output == CONTROL:  # a message: no tensor is held
        continue
      loc = ("out", t.src_op, t.src_output)
      self.sent_until[loc] = max(self.sent_until.get(loc, 0.0), t.end_us)
      copy = ("copy", t.src_op, t.src_output, t.dst_device)
      if shared_buffers:
        self.handed_over.setdefault(loc[1:], []).append(copy)
      else:
        self._join(copy, self._new(t.dst_device, t.bytes, t.start_us))
    topo = {name: i for i, name in enumerate(topological_order(graph))}
    # In start order, so a sender's buffers exist before its copies' readers
    # (a transfer starts after its sender did) look them up.
    for name in sorted(start, key=lambda n: (start[n], topo[n])):
      self._place_outputs(graph[name])
      for port in range(len(graph[name].output_bytes)):
        for copy in self.handed_over.get((name, port), ()):
          self._join(copy, self.of.get(("out", name, port)))
    for buf in self._buffers:
      buf.free_us = max(self._last_use(loc) for loc in buf.locations)

  def all(self) -> list[_Buffer]:
    return self._buffers

  def _location(self, src: str, port: int, reader: str) -> tuple:
    d = self.device[reader]
    return (("out", src, port) if self.device[src] == d
            else ("copy", src, port, d))

  def _new(self, device: int, nbytes: int, at: float) -> _Buffer:
    buf = _Buffer(device, nbytes, at)
    self._buffers.append(buf)
    return buf

  def _join(self, loc: tuple, buf: _Buffer | None) -> None:
    self.of[loc] = buf
    if buf is not None:
      buf.locations.append(loc)

  def _last_use(self, loc: tuple, besides: str | None = None) -> float:
    """When `loc` was read (by someone other than `besides`) or sent for
    the last time; a producer's own output lives at least until it ends."""
    times = [self.end[r] for r in self.readers.get(loc, ()) if r != besides]
    times.append(self.sent_until.get(loc, 0.0))
    if loc[0] == "out":
      times.append(self.end[loc[1]])
    return max(times)

  def _data_inputs(self, op) -> list[tuple]:
    edges = sorted((e for e in self.graph.in_edges(op.name)
                    if not e.is_control),
                   key=lambda e: (e.dst_input is None, e.dst_input or 0))
    return [self._location(e.src, e.src_output, op.name) for e in edges]

  def _forwardable(self, buf: _Buffer | None, nbytes: int, op,
                   inputs: list[tuple]) -> bool:
    if buf is None or not buf.forwardable or buf.bytes != nbytes or \
        buf.device != self.device[op.name]:
      return False
    begin = self.start[op.name]
    for loc in buf.locations:
      if inputs.count(loc) > 1:  # read twice by the op: held twice
        return False
      if self._last_use(loc, besides=op.name) > begin:
        return False
    return True

  def _place_outputs(self, op) -> None:
    d = self.device[op.name]
    inputs = None
    for port, nbytes in enumerate(op.output_bytes):
      loc = ("out", op.name, port)
      if not nbytes or aliasing.is_persistent_view(op):
        self.of[loc] = None
        continue
      if inputs is None:
        inputs = self._data_inputs(op)
      source = aliasing.view_input(op, port)
      if source is not None and source < len(inputs):
        self._join(loc, self.of.get(inputs[source]))
        continue
      if port == 0 and aliasing.may_forward(op):
        taken = next((self.of.get(i) for i in inputs if self._forwardable(
            self.of.get(i), nbytes, op, inputs)), None)
        if taken is not None:
          self._join(loc, taken)
          continue
      buf = self._new(d, nbytes, self.start[op.name])
      buf.forwardable = op.type != "Placeholder"
      self._join(loc, buf)
