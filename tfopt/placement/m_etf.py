"""m-ETF (Baechi): earliest-task-first list scheduling under memory caps.

Repeatedly schedules the (ready op, device) pair that can start earliest,
among devices with room for the op (its static memory, its colocation
group's if it is the group's first op, and the copies of remote inputs).
Ties go to the op earlier in topological order, then the lower device.

Speed: the reference recomputes every ready op on every device at every
step. Here each (ready op, device) pair keeps a cached start time, which
can only be stale from below -- device and channel free times only grow,
free memory only shrinks -- and the pair with the least lower bound is
re-evaluated on its own device alone: if the bound still holds it is the
minimum and is scheduled, otherwise its cache is raised and it waits again.
A pair's bound is the larger of its cache and its device's free time, so
each device keeps two heaps: pairs whose cache is above the device's free
time, by cache, and pairs whose cache the device's free time has passed,
which all share that bound, by tie-break. (One heap of ops keyed by their
caches re-evaluated every ready op each time a device's free time moved:
quadratic on wide graphs, 7.7 M evaluations to place a small MobileNet's
step.) The inner loops run on integer indices over precomputed edge
tuples.

The placer's timeline books transfers on the sender's and receiver's
channels (a split that looks free when transfers never contend is what made
the reference's plans slow under a PCIe model), as the reference does: when
it schedules the consumer, from the producer's end or once both channels
are free. On the Hanen-Munier example this reproduces the reference's
schedule exactly (tests/placement/test_worked_examples.py). `simulate`
models the runtime instead, which sends a tensor as soon as its producer
ends, in its readers' order; so where transfers contend, the same plan can
simulate slower than the placer's own timeline (29 vs 31 us there), and
reported numbers come from `simulate`. Given the placer's start times as
priorities, the simulator runs every device's ops in the placer's order.
"""

from __future__ import annotations

import heapq
from typing import Mapping

from tfopt.placement.placement import Placement
from tfopt.placement.problem import InfeasiblePlacement, PlacementProblem

_INF = float("inf")


def m_etf(problem: PlacementProblem, reserve: float | None = None,
          max_devices: int | None = None,
          favourite_child: Mapping[str, str] | None = None,
          timeline: dict | None = None) -> Placement:
  """Places `problem` with m-ETF; raises InfeasiblePlacement on dead-end.

  With `max_devices`, only the first `max_devices` devices are used (groups
  whose constraints allow none of them keep their own devices): greedy ETF
  spreads over every device it is given, which costs transfers.

  If `timeline` is a dict, it receives the placer's own start time of every
  op (what tests compare with `simulate`).

  `favourite_child` (op -> child, see m_sct) keeps each favourite child on
  its parent's device whenever memory allows, where it wins every tie, and
  idles tactically: while a ready favourite child waits for that device,
  other work may run there only if it ends before the child starts.

  With `reserve`, a colocation group may only start on a device holding less
  than `reserve` times an equal share of the graph's static memory (its soft
  cap); the rest of the real cap stays for the copies that members of groups
  already there will receive. Greedy ETF otherwise fills the first devices
  and dead-ends when memory is tight.
  """
  etf = _Etf(problem, _soft_caps(problem, reserve, max_devices),
             max_devices, favourite_child, reserve)
  etf.run()
  if timeline is not None:
    timeline.update(etf.starts())
  return etf.placement()


def _soft_caps(problem: PlacementProblem, reserve: float | None,
               max_devices: int | None) -> tuple[float, ...]:
  """The caps a group may start under: the real ones, or in reserve mode
  `reserve` equal shares of the graph's static memory (see m_etf)."""
  caps = problem.caps
  if reserve is None:
    return caps
  if not reserve >= 1.0:
    raise ValueError(f"Argument `reserve` must be >= 1. Received: "
                     f"reserve={reserve}")
  num = problem.num_devices
  share = sum(problem.group_memory.values()) / min(num, max_devices or num)
  return tuple(min(cap, share * reserve) for cap in caps)


def _link_times(comm):
  """(transfer, occupancy)(nbytes, src, dst): a copy's duration and how long
  it holds the channels (closures over the default link's numbers, the
  common case, for speed)."""
  if comm.pairs:
    return comm.transfer_us, lambda n, s, d: comm.link(s, d).channel_us(n)
  latency = comm.default.latency_us
  per_byte = 1.0 / (comm.default.bandwidth_gbps * 1e3)
  overhead = comm.default.channel_us(0)

  def transfer(nbytes, src, dst):
    return latency + nbytes * per_byte if nbytes > 0 and src != dst else 0.0

  def occupancy(nbytes, src, dst):
    del src, dst
    return overhead + nbytes * per_byte

  return transfer, occupancy


class _Etf:
  """m-ETF's state on integer indices in topological order (module doc,
  "Speed"), and its steps: what an op would need copied to a device, the
  booking of those copies on the channels, the start an op can get on a
  device, making an op ready, committing it, and the loop."""

  def __init__(self, problem: PlacementProblem, soft_caps, max_devices,
               favourite_child, reserve):
    graph = problem.graph
    self.problem, self.reserve = problem, reserve
    self.caps, self.soft_caps = problem.caps, soft_caps
    num = problem.num_devices
    self.names = names = problem.order
    index = {n: i for i, n in enumerate(names)}
    n_ops = len(names)
    group_ids = {g: k for k, g in enumerate(problem.members)}
    self.group = [group_ids[problem.group_of[n]] for n in names]
    self.group_mem = [problem.group_memory[g] for g in problem.members]
    allowed = [problem.allowed[g] for g in problem.members]
    if max_devices is not None:
      allowed = [tuple(d for d in a if d < max_devices) or a
                 for a in allowed]
    self.group_allowed = allowed
    self.compute = [problem.compute_us(n) for n in names]
    self.op_overhead = [d.op_overhead_us for d in problem.cluster.devices]
    self.ins = [tuple((index[e.src], e.src_output, e.bytes, e.is_control)
                      for e in graph.in_edges(n)) for n in names]
    self.outs = [tuple(index[e.dst] for e in graph.out_edges(n))
                 for n in names]
    self.pending = [len(x) for x in self.ins]
    self.transfer, self.occupancy = _link_times(problem.cluster.comm)
    self.place = [-1] * n_ops
    self.finish = [0.0] * n_ops
    self.dev_free = [0.0] * num
    self.channel_free = [0.0] * num
    self.used = [0] * num
    self.group_device = [-1] * len(self.group_mem)
    self.arrival: dict[tuple[int, int, int], float] = {}  # (src, port, dev)
    self.cache = [None] * n_ops  # per op: {device: lower bound of start}
    self.fav_parent = [-1] * n_ops
    # Tactical idling: device -> (favourite child, its start there) while
    # the child is ready and waits for its parent's device.
    self.reserved: dict[int, tuple[int, float]] = {}
    for parent_name, child_name in (favourite_child or {}).items():
      self.fav_parent[index[child_name]] = index[parent_name]
    # Per device: pairs queued by cached start (above the device's free
    # time) and pairs the free time has passed (by tie-break); a pair's
    # entry is current while its version is.
    self.waiting: list[list] = [[] for _ in range(num)]
    self.passed: list[list] = [[] for _ in range(num)]
    self.version: dict[tuple[int, int], int] = {}
    self.seq = 0
    self.favoured = [False] * n_ops  # queued on its favourite's device only

  def copies_on(self, i, d):
    """{(src, port): bytes} that op i would need copied to device d."""
    place, arrival = self.place, self.arrival
    copies = {}
    for s, port, nbytes, ctrl in self.ins[i]:
      if ctrl or place[s] == d or (s, port, d) in arrival:
        continue
      if nbytes > copies.get((s, port), -1):
        copies[(s, port)] = nbytes
    return copies

  def book(self, copies, d, channels):
    """Arrival of each copy on d, booking `channels` in producer order."""
    finish, place = self.finish, self.place
    times = {}
    for key in sorted(copies, key=lambda k: (finish[k[0]], k[0], k[1])):
      s = key[0]
      sd = place[s]
      duration = self.transfer(copies[key], sd, d)
      if duration == 0.0:
        times[key] = finish[s]
        continue
      start = finish[s]
      if channels[sd] > start:
        start = channels[sd]
      if channels[d] > start:
        start = channels[d]
      channels[sd] = channels[d] = start + min(
          duration, self.occupancy(copies[key], sd, d))
      times[key] = start + duration
    return times

  def evaluate(self, i, d):
    """(start, memory needed, copies) of op i on d; start is inf if no room
    or if i's colocation group has since settled on another device."""
    g = self.group[i]
    settled = self.group_device[g]
    if settled >= 0 and settled != d:
      return _INF, 0, {}
    copies = self.copies_on(i, d)
    need = sum(copies.values())
    used = self.used[d]
    if settled < 0:
      need += self.group_mem[g]
      if used + need > self.soft_caps[d]:
        return _INF, need, copies
    if used + need > self.caps[d]:
      return _INF, need, copies
    times = self.book(copies, d, list(self.channel_free)) if copies else {}
    ready = self.dev_free[d]
    place, finish, arrival = self.place, self.finish, self.arrival
    for s, port, _, ctrl in self.ins[i]:
      if ctrl or place[s] == d:
        t = finish[s]
      else:
        t = times.get((s, port))
        if t is None:
          t = arrival[(s, port, d)]
      if t > ready:
        ready = t
    held = self.reserved.get(d)
    overhead = self.op_overhead[d]
    if held is not None and held[0] != i and \
        ready + self.compute[i] + overhead > held[1]:
      # d idles for its favourite child: only work that ends before the
      # child starts may go first; anything else waits for the child.
      ready = max(ready, held[1] + self.compute[held[0]] + overhead)
    return ready, need, copies

  def fail(self, i):
    g = self.group[i]
    mode = "" if self.reserve is None else f" (reserve {self.reserve:g})"
    raise InfeasiblePlacement(
        f"m-ETF{mode} found no device with room for op {self.names[i]!r} "
        f"(group memory {self.group_mem[g] / 1e6:,.0f} MB); used per "
        f"device: {[round(u / 1e6) for u in self.used]} MB.")

  def push(self, i, t, d):
    """Caches op i's start t on d and queues the pair on d (an infinite t,
    no room, drops the pair)."""
    if t == _INF:
      self.cache[i].pop(d, None)
      self.version.pop((i, d), None)  # its queued entry is stale
      return
    self.cache[i][d] = t
    self.seq += 1
    self.version[(i, d)] = self.seq
    # A favourite child wins ties on its parent's device.
    p = self.fav_parent[i]
    tie = 0 if p >= 0 and self.place[p] == d else 1
    if t <= self.dev_free[d]:
      heapq.heappush(self.passed[d], (tie, i, self.seq))
    else:
      heapq.heappush(self.waiting[d], (t, tie, i, self.seq))

  def best_on(self, d):
    """(bound, tie, op) of the least pair queued on d, or None; stale
    entries (op scheduled, or its pair re-queued since) are dropped."""
    waiting, passed, free = self.waiting[d], self.passed[d], self.dev_free[d]
    version = self.version
    while waiting and waiting[0][0] <= free:
      _, tie, i, seq = heapq.heappop(waiting)
      if version.get((i, d)) == seq:
        heapq.heappush(passed, (tie, i, seq))
    while passed and version.get((passed[0][1], d)) != passed[0][2]:
      heapq.heappop(passed)
    while waiting and version.get((waiting[0][2], d)) != waiting[0][3]:
      heapq.heappop(waiting)
      while waiting and waiting[0][0] <= free:
        _, tie, i, seq = heapq.heappop(waiting)
        if version.get((i, d)) == seq:
          heapq.heappush(passed, (tie, i, seq))
    if passed:
      return free, passed[0][0], passed[0][1]
    if waiting:
      return waiting[0][0], waiting[0][1], waiting[0][2]
    return None

  def make_ready(self, i, favour=True):
    """Caches op i's start on each device it may use and queues it (a
    favourite child: on its parent's device, which it reserves)."""
    g = self.group[i]
    devices = ((self.group_device[g],) if self.group_device[g] >= 0
               else self.group_allowed[g])
    p = self.fav_parent[i]
    self.cache[i] = {}
    self.favoured[i] = False
    if favour and p >= 0 and self.place[p] in devices:
      parent_device = self.place[p]
      t = self.evaluate(i, parent_device)[0]
      if t < _INF:  # the parent's device has room: the child goes there
        if parent_device not in self.reserved:
          self.reserved[parent_device] = (i, t)
        self.favoured[i] = True
        self.push(i, t, parent_device)
        return
    for d in devices:
      self.push(i, self.evaluate(i, d)[0], d)
    if not self.cache[i]:
      self.fail(i)

  def commit(self, i, d, start, need, copies):
    """Op i runs on d from `start`: its copies booked, memory and group
    settled, its successors released."""
    if self.reserved.get(d, (-1,))[0] == i:
      del self.reserved[d]
    for key, when in self.book(copies, d, self.channel_free).items():
      self.arrival[(key[0], key[1], d)] = when
    self.used[d] += need
    g = self.group[i]
    if self.group_device[g] < 0:
      self.group_device[g] = d
    self.place[i] = d
    self.finish[i] = start + self.compute[i] + self.op_overhead[d]
    self.dev_free[d] = self.finish[i]
    for other in self.cache[i]:
      del self.version[(i, other)]
    self.cache[i] = None
    for j in self.outs[i]:
      self.pending[j] -= 1
      if self.pending[j] == 0:
        self.make_ready(j)

  def run(self):
    """Takes the pair with the least bound (ties: a favourite child on its
    parent's device, then the op earlier in topological order, then the
    lower device); re-queues it when its cache was stale (module doc),
    else commits it."""
    for i, waiting in enumerate(self.pending):
      if waiting == 0:
        self.make_ready(i)
    devices = range(len(self.dev_free))
    while True:
      best = None
      for d in devices:
        cand = self.best_on(d)
        if cand is not None and (best is None or cand < best[0]):
          best = (cand, d)
      if best is None:
        return
      (t, _, i), d = best
      start, need, copies = self.evaluate(i, d)
      if start > t:
        self.push(i, start, d)
        if not self.cache[i]:
          if self.favoured[i]:
            self.make_ready(i, favour=False)  # the favourite device filled
            continue
          self.fail(i)
        continue
      self.commit(i, d, start, need, copies)

  def starts(self) -> dict[str, float]:
    """The placer's own start time of every op."""
    return {self.names[i]: self.finish[i] - self.compute[i] -
            self.op_overhead[self.place[i]] for i in range(len(self.names))}

  def placement(self) -> Placement:
    return Placement({self.names[i]: self.place[i]
                      for i in range(len(self.names))},
                     self.problem.num_devices)
