"""m-ETF (Baechi): earliest-task-first list scheduling under memory caps.

Repeatedly schedules the (ready op, device) pair that can start earliest,
among devices with room for the op (its static memory, its colocation
group's if it is the group's first op, and the copies of remote inputs).
Ties go to the op earlier in topological order, then the lower device.

Speed: the reference recomputes every ready op on every device at every
step. Here each ready op sits once in a heap, keyed by the least of its
cached per-device start times. Those caches can only be stale from below --
device and channel free times only grow, free memory only shrinks -- so a
popped entry is re-evaluated on its own device alone: if the key still holds
it is the minimum and is scheduled, otherwise that device's cache is raised
and the op is pushed back with its next-best key. The inner loops run on
integer indices over precomputed edge tuples.

The placer's timeline books transfers on the sender's and receiver's
channels as the simulator does: a split that looks free when transfers
never contend is what made the reference's plans slow under a PCIe model.
Reported numbers still come from `simulate`.
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
  graph = problem.graph
  comm = problem.cluster.comm
  num = problem.num_devices
  caps = problem.caps
  soft_caps = caps
  if reserve is not None:
    if not reserve >= 1.0:
      raise ValueError(f"Argument `reserve` must be >= 1. Received: "
                       f"reserve={reserve}")
    share = sum(problem.group_memory.values()) / min(num, max_devices or num)
    soft_caps = tuple(min(cap, share * reserve) for cap in caps)

  # Integer view of the problem, in topological order.
  names = problem.order
  index = {n: i for i, n in enumerate(names)}
  n_ops = len(names)
  group_ids = {g: k for k, g in enumerate(problem.members)}
  group = [group_ids[problem.group_of[n]] for n in names]
  group_mem = [problem.group_memory[g] for g in problem.members]
  group_allowed = [problem.allowed[g] for g in problem.members]
  if max_devices is not None:
    group_allowed = [tuple(d for d in a if d < max_devices) or a
                     for a in group_allowed]
  compute = [problem.compute_us(n) for n in names]
  op_overhead = [d.op_overhead_us for d in problem.cluster.devices]
  ins = [tuple((index[e.src], e.src_output, e.bytes, e.is_control)
               for e in graph.in_edges(n)) for n in names]
  outs = [tuple(index[e.dst] for e in graph.out_edges(n)) for n in names]
  pending = [len(x) for x in ins]
  if comm.pairs:
    transfer = comm.transfer_us

    def occupancy(nbytes, src, dst):
      return comm.link(src, dst).channel_us(nbytes)
  else:
    latency = comm.default.latency_us
    per_byte = 1.0 / (comm.default.bandwidth_gbps * 1e3)
    overhead = comm.default.channel_us(0)

    def transfer(nbytes, src, dst):
      return latency + nbytes * per_byte if nbytes > 0 and src != dst else 0.0

    def occupancy(nbytes, src, dst):
      del src, dst
      return overhead + nbytes * per_byte

  place = [-1] * n_ops
  finish = [0.0] * n_ops
  dev_free = [0.0] * num
  channel_free = [0.0] * num
  used = [0] * num
  group_device = [-1] * len(group_mem)
  arrival: dict[tuple[int, int, int], float] = {}  # (src, port, dev) -> t
  cache = [None] * n_ops  # per op: per-device lower bounds of its start
  fav_parent = [-1] * n_ops
  # Tactical idling: device -> (favourite child, its start there) while the
  # child is ready and waits for its parent's device.
  reserved: dict[int, tuple[int, float]] = {}
  for parent_name, child_name in (favourite_child or {}).items():
    fav_parent[index[child_name]] = index[parent_name]

  def copies_on(i, d):
    """{(src, port): bytes} that op i would need copied to device d."""
    copies = {}
    for s, port, nbytes, ctrl in ins[i]:
      if ctrl or place[s] == d or (s, port, d) in arrival:
        continue
      if nbytes > copies.get((s, port), -1):
        copies[(s, port)] = nbytes
    return copies

  def book(copies, d, channels):
    """Arrival of each copy on d, booking `channels` in producer order."""
    times = {}
    for key in sorted(copies, key=lambda k: (finish[k[0]], k[0], k[1])):
      s = key[0]
      sd = place[s]
      duration = transfer(copies[key], sd, d)
      if duration == 0.0:
        times[key] = finish[s]
        continue
      start = finish[s]
      if channels[sd] > start:
        start = channels[sd]
      if channels[d] > start:
        start = channels[d]
      channels[sd] = channels[d] = start + min(
          duration, occupancy(copies[key], sd, d))
      times[key] = start + duration
    return times

  def evaluate(i, d):
    """(start, memory needed, copies) of op i on d; start is inf if no room
    or if i's colocation group has since settled on another device."""
    g = group[i]
    if group_device[g] >= 0 and group_device[g] != d:
      return _INF, 0, {}
    copies = copies_on(i, d)
    need = sum(copies.values())
    if group_device[g] < 0:
      need += group_mem[g]
      if used[d] + need > soft_caps[d]:
        return _INF, need, copies
    if used[d] + need > caps[d]:
      return _INF, need, copies
    times = book(copies, d, list(channel_free)) if copies else {}
    ready = dev_free[d]
    for s, port, _, ctrl in ins[i]:
      if ctrl or place[s] == d:
        t = finish[s]
      else:
        t = times.get((s, port))
        if t is None:
          t = arrival[(s, port, d)]
      if t > ready:
        ready = t
    held = reserved.get(d)
    if held is not None and held[0] != i and \
        ready + compute[i] + op_overhead[d] > held[1]:
      # d idles for its favourite child: only work that ends before the
      # child starts may go first; anything else waits for the child.
      ready = max(ready, held[1] + compute[held[0]] + op_overhead[d])
    return ready, need, copies

  def key_of(i):
    """(best cached start, device) of op i."""
    best_t, best_d = _INF, -1
    for d, t in cache[i].items():
      if t < best_t or (t == best_t and d < best_d):
        best_t, best_d = t, d
    return best_t, best_d

  def fail(i):
    g = group[i]
    mode = "" if reserve is None else f" (reserve {reserve:g})"
    raise InfeasiblePlacement(
        f"m-ETF{mode} found no device with room for op {names[i]!r} (group "
        f"memory {group_mem[g] / 1e6:,.0f} MB); used per device: "
        f"{[round(u / 1e6) for u in used]} MB.")

  def push(i, t, d, heap):
    # A favourite child wins ties on its parent's device.
    p = fav_parent[i]
    heapq.heappush(heap, (t, 0 if p >= 0 and place[p] == d else 1, i, d))

  def make_ready(i, heap, favour=True):
    g = group[i]
    devices = ((group_device[g],) if group_device[g] >= 0
               else group_allowed[g])
    p = fav_parent[i]
    if favour and p >= 0 and place[p] in devices:
      t = evaluate(i, place[p])[0]
      if t < _INF:  # the parent's device has room: the child goes there
        cache[i] = {place[p]: t}
        if place[p] not in reserved:
          reserved[place[p]] = (i, t)
        push(i, t, place[p], heap)
        return
    cache[i] = {d: evaluate(i, d)[0] for d in devices}
    t, d = key_of(i)
    if t == _INF:
      fail(i)
    push(i, t, d, heap)

  heap: list[tuple[float, int, int, int]] = []
  for i in range(n_ops):
    if pending[i] == 0:
      make_ready(i, heap)
  while heap:
    t, _, i, d = heapq.heappop(heap)
    start, need, copies = evaluate(i, d)
    if start > t:
      cache[i][d] = start
      t2, d2 = key_of(i)
      if t2 == _INF:
        if len(cache[i]) == 1 and fav_parent[i] >= 0:
          make_ready(i, heap, favour=False)  # the favourite device filled up
          continue
        fail(i)
      push(i, t2, d2, heap)
      continue
    # Commit op i to device d.
    if reserved.get(d, (-1,))[0] == i:
      del reserved[d]
    for key, when in book(copies, d, channel_free).items():
      arrival[(key[0], key[1], d)] = when
    used[d] += need
    g = group[i]
    if group_device[g] < 0:
      group_device[g] = d
    place[i] = d
    finish[i] = start + compute[i] + op_overhead[d]
    dev_free[d] = finish[i]
    cache[i] = None
    for j in outs[i]:
      pending[j] -= 1
      if pending[j] == 0:
        make_ready(j, heap)
  if timeline is not None:
    timeline.update({names[i]: finish[i] - compute[i] - op_overhead[place[i]]
                     for i in range(n_ops)})
  return Placement({names[i]: place[i] for i in range(n_ops)}, num)
