"""simulate(graph, placement, costs, cluster) -> Schedule.

The single source of a makespan and of per-device peak memory: placers may
keep their own timelines for speed, but every number tfopt reports comes from
here. Pure: nothing it is given is modified.

Timing model (Baechi's):
  * One compute stream per device. A device runs one op at a time; among the
    ops ready on a free device the earliest in topological order runs first
    (or the lowest of a given `priority`, e.g. a placer's own start times).
  * An op is ready when every input has arrived: at once from its own
    device, after a transfer from another one.
  * A tensor (op, output port) is sent once per destination device and reused
    there by every consumer. A transfer occupies the sender's and the
    receiver's channel (one channel per device) for latency + bytes/bandwidth;
    transfers wait for both channels, first come first served. Control edges
    move no data and cost nothing.

Memory model (liveness, training-aware):
  * persistent bytes are held on the op's device for the whole step;
  * temp bytes only while the op runs;
  * each output is allocated when its op starts and freed once its last
    consumer on that device has finished and its last outgoing transfer has
    completed (an activation therefore stays live until its backward consumer
    ran); an output nobody consumes is freed when its op ends;
  * a received copy is charged to the receiver from the transfer's start until
    its last consumer there has finished;
  * outputs that allocate nothing are not charged again, as TensorFlow's
    runtime does (`tfopt.graph.aliasing`): a view (Identity, IdentityN,
    Reshape, ...) shares its input's buffer and keeps it live until the
    view's own readers finished; a variable read or a constant is the
    persistent memory already charged; an element-wise op writes into a
    same-sized input whose other readers all finished before it started.
  At equal times, frees are applied before allocations.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import TYPE_CHECKING, Mapping, Sequence

from tfopt._errors import invalid_argument
from tfopt.cluster import Cluster
from tfopt.cost.cost_model import op_costs
from tfopt.graph import aliasing
from tfopt.graph.opgraph import OpGraph, topological_order

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
    """Per device, the total time its compute stream was busy."""
    busy = [0.0] * len(self.peak_bytes)
    for name, d in self.device.items():
      busy[d] += self.end_us[name] - self.start_us[name]
    return tuple(busy)


def simulate(graph: OpGraph, placement: Placement | Mapping[str, int], costs,
             cluster: Cluster, *,
             priority: Mapping[str, float] | None = None) -> Schedule:
  """Simulates one step of `graph` placed by `placement` (see module doc).

  Args:
    graph: the OpGraph.
    placement: op name -> device index, for every op.
    costs: a CostModel (or mapping op name -> OpCost or microseconds).
    cluster: devices (their memory caps) and the CommModel.
    priority: optional op -> number; among ready ops a free device runs the
      lowest first (ties: topological order). By default the topological
      order alone, as TensorFlow's executor roughly does; a placer's own
      start times replay its intended order.
  """
  num_devices = len(cluster)
  # Imported here: tfopt.placement's package imports this module (its
  # placers simulate), so a module-level import is circular.
  from tfopt.placement.placement import Placement  # pylint: disable=g-import-not-at-top
  if not isinstance(placement, Placement):
    placement = Placement(placement, num_devices)
  if placement.num_devices != num_devices:
    raise invalid_argument("placement", f"a placement on {num_devices} "
                           "devices (the cluster's)",
                           f"<placement on {placement.num_devices} devices>")
  placement.check_covers(graph)
  op_cost = op_costs(graph, costs)
  topo = {name: i for i, name in enumerate(topological_order(graph))}
  if priority is None:
    rank = topo
  else:
    missing = next((op.name for op in graph.ops if op.name not in priority),
                   None)
    if missing is not None:
      raise invalid_argument("priority", "a number for every op",
                             f"<op {missing!r} has none>")
    rank = {n: (float(priority[n]), topo[n]) for n in topo}
  device = {op.name: placement[op.name] for op in graph.ops}
  comm = cluster.comm

  pending = {op.name: len(graph.in_edges(op.name)) for op in graph.ops}
  ready_at = {op.name: 0.0 for op in graph.ops}
  ready: list[list[tuple[int, str]]] = [[] for _ in range(num_devices)]
  busy_until = [0.0] * num_devices
  running = [False] * num_devices
  channel_free = [0.0] * num_devices
  start, end = {}, {}
  transfers: list[Transfer] = []
  events: list[tuple[float, int, str, object]] = []
  seq = 0

  def push(time, kind, payload):
    nonlocal seq
    heapq.heappush(events, (time, seq, kind, payload))
    seq += 1

  def satisfy(dst, time):
    if time > ready_at[dst]:
      ready_at[dst] = time
    pending[dst] -= 1
    if pending[dst] == 0:
      heapq.heappush(ready[device[dst]], (rank[dst], dst))

  for op in graph.ops:
    if pending[op.name] == 0:
      heapq.heappush(ready[device[op.name]], (rank[op.name], op.name))

  def dispatch(now):
    for d in range(num_devices):
      if not running[d] and ready[d]:
        _, name = heapq.heappop(ready[d])
        start[name] = now
        end[name] = now + op_cost[name].compute_us
        busy_until[d] = end[name]
        running[d] = True
        push(end[name], "end", name)

  def finish(name, now):
    d = device[name]
    running[d] = False
    # Group cross-device data edges by (port, destination device): one copy.
    copies: dict[tuple[int, int], list] = {}
    for e in graph.out_edges(name):
      dd = device[e.dst]
      if dd == d or e.is_control:
        satisfy(e.dst, now)
      else:
        copies.setdefault((e.src_output, dd), []).append(e)
    for (port, dd), edges in sorted(
        copies.items(), key=lambda kv: min(rank[e.dst] for e in kv[1])):
      nbytes = max(e.bytes for e in edges)
      duration = comm.transfer_us(nbytes, d, dd)
      if duration == 0.0:
        for e in edges:
          satisfy(e.dst, now)
        continue
      t0 = max(now, channel_free[d], channel_free[dd])
      t1 = t0 + duration
      channel_free[d] = channel_free[dd] = t1
      transfers.append(Transfer(name, port, d, dd, nbytes, t0, t1))
      push(t1, "arrive", tuple(e.dst for e in edges))

  dispatch(0.0)
  while events:
    now = events[0][0]
    while events and events[0][0] == now:
      _, _, kind, payload = heapq.heappop(events)
      if kind == "end":
        finish(payload, now)
      else:
        for dst in payload:
          satisfy(dst, now)
    dispatch(now)

  if len(end) != len(graph):
    stuck = next(op.name for op in graph.ops if op.name not in end)
    raise RuntimeError(f"Simulation ended with op {stuck!r} never run; the "
                       "graph is not a DAG.")
  makespan = max(end.values(), default=0.0)
  if transfers:
    makespan = max(makespan, max(t.end_us for t in transfers))
  peaks = _peak_memory(graph, device, op_cost, start, end, transfers,
                       num_devices)
  return Schedule(device, start, end, tuple(transfers), makespan, peaks,
                  cluster.memory_caps)


def _peak_memory(graph, device, op_cost, start, end,
                 transfers: Sequence[Transfer], num_devices) -> tuple[int, ...]:
  """Liveness peak per device from a finished timeline (see module doc)."""
  buffers = _Buffers(graph, device, start, end, transfers)
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
  """

  def __init__(self, graph, device, start, end, transfers):
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
    for t in transfers:
      loc = ("out", t.src_op, t.src_output)
      self.sent_until[loc] = max(self.sent_until.get(loc, 0.0), t.end_us)
      self._join(("copy", t.src_op, t.src_output, t.dst_device),
                 self._new(t.dst_device, t.bytes, t.start_us))
    topo = {name: i for i, name in enumerate(topological_order(graph))}
    for name in sorted(start, key=lambda n: (start[n], topo[n])):
      self._place_outputs(graph[name])
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
