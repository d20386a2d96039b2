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
    its last consumer there has finished.
  At equal times, frees are applied before allocations.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import TYPE_CHECKING, Mapping, Sequence

from tfopt._errors import invalid_argument
from tfopt.cluster import Cluster
from tfopt.cost.cost_model import op_costs
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
  deltas: list[list[tuple[float, int]]] = [[] for _ in range(num_devices)]
  # Last use of each (op, port) on its own device and on each receiver.
  last_local: dict[tuple[str, int], float] = {}
  last_remote: dict[tuple[str, int, int], float] = {}
  for e in graph.edges:
    if e.is_control:
      continue
    d_src, d_dst = device[e.src], device[e.dst]
    key = (e.src, e.src_output)
    if d_src == d_dst:
      last_local[key] = max(last_local.get(key, 0.0), end[e.dst])
    else:
      rkey = (e.src, e.src_output, d_dst)
      last_remote[rkey] = max(last_remote.get(rkey, 0.0), end[e.dst])
  sent_until: dict[tuple[str, int], float] = {}
  for t in transfers:
    key = (t.src_op, t.src_output)
    sent_until[key] = max(sent_until.get(key, 0.0), t.end_us)
    deltas[t.dst_device].append((t.start_us, t.bytes))
    deltas[t.dst_device].append(
        (max(t.end_us, last_remote[(t.src_op, t.src_output, t.dst_device)]),
         -t.bytes))
  for op in graph.ops:
    name, d, c = op.name, device[op.name], op_cost[op.name]
    if c.persistent_bytes:
      deltas[d].append((0.0, c.persistent_bytes))
    if c.temp_bytes:
      deltas[d].append((start[name], c.temp_bytes))
      deltas[d].append((end[name], -c.temp_bytes))
    for port, nbytes in enumerate(op.output_bytes):
      if nbytes:
        key = (name, port)
        free = max(end[name], last_local.get(key, 0.0),
                   sent_until.get(key, 0.0))
        deltas[d].append((start[name], nbytes))
        deltas[d].append((free, -nbytes))
  peaks = []
  for events in deltas:
    # Frees (negative) before allocations at equal times.
    events.sort()
    level = peak = 0
    for _, delta in events:
      level += delta
      peak = max(peak, level)
    peaks.append(peak)
  return tuple(peaks)
