"""m-ETF (Baechi): earliest-task-first list scheduling under memory caps.

Repeatedly schedules the (ready op, device) pair that can start earliest,
among devices with room for the op (its static memory, its colocation
group's if it is the group's first op, and the copies of remote inputs).
Ties go to the op earlier in topological order, then the lower device.

Speed: the reference recomputes every ready op on every device at every
step. Here each ready op sits once in a heap keyed by its best start time.
That key can only be stale from below -- device free times only grow and
free memory only shrinks -- so the popped entry is re-evaluated on its
device: if the key still holds it is the true minimum and is scheduled,
otherwise the op is re-keyed and pushed back.

The placer's timeline books transfers on the sender's and receiver's
channels as the simulator does: a split that looks free when transfers
never contend is what made the reference's plans slow under a PCIe model.
Reported numbers still come from `simulate`.
"""

from __future__ import annotations

import heapq

from tfopt.placement.placement import Placement
from tfopt.placement.problem import (InfeasiblePlacement, PlacementProblem,
                                     new_copies)


def m_etf(problem: PlacementProblem, reserve: float | None = None) -> Placement:
  """Places `problem` with m-ETF; raises InfeasiblePlacement on dead-end.

  With `reserve`, a colocation group may only start on a device holding less
  than `reserve` times an equal share of the graph's static memory (its soft
  cap); the rest of the real cap stays for the copies that members of groups
  already there will receive. Greedy ETF otherwise fills the first devices
  and dead-ends when memory is tight.
  """
  graph = problem.graph
  comm = problem.cluster.comm
  caps = problem.caps
  soft_caps = caps
  if reserve is not None:
    if not reserve >= 1.0:
      raise ValueError(f"Argument `reserve` must be >= 1. Received: "
                       f"reserve={reserve}")
    share = sum(problem.group_memory.values()) / problem.num_devices
    soft_caps = tuple(min(cap, share * reserve) for cap in caps)
  rank = problem.rank
  dev_free = [0.0] * problem.num_devices
  used = [0] * problem.num_devices
  placement: dict[str, int] = {}
  finish: dict[str, float] = {}
  resident: set = set()
  arrival: dict[tuple[str, int, int], float] = {}
  group_device: dict[str, int] = {}
  pending = {op.name: len(graph.in_edges(op.name)) for op in graph.ops}

  channel_free = [0.0] * problem.num_devices

  def book_copies(name: str, d: int, copies, channels):
    """Arrival time of each copy `name` needs on `d`, booking `channels`.

    Like the simulator, a copy holds the sender's and the receiver's channel;
    copies are issued in the order their producers finished.
    """
    times = {}
    for key in sorted(copies, key=lambda k: (finish[k[0]], rank[k[0]], k[1])):
      src, port = key
      s_dev = placement[src]
      duration = comm.transfer_us(copies[key], s_dev, d)
      if duration == 0.0:
        times[key] = finish[src]
        continue
      start = max(finish[src], channels[s_dev], channels[d])
      channels[s_dev] = channels[d] = start + duration
      times[key] = start + duration
    return times

  def evaluate_on(name: str, d: int):
    """(start, memory needed) of `name` on `d`, or None if it cannot fit."""
    gid = problem.group_of[name]
    copies = new_copies(problem, name, d, placement, resident)
    need = sum(copies.values())
    if gid not in group_device:
      need += problem.group_memory[gid]
      if used[d] + need > soft_caps[d]:
        return None
    if used[d] + need > caps[d]:
      return None
    times = book_copies(name, d, copies, list(channel_free))
    ready = 0.0
    for e in graph.in_edges(name):
      if placement[e.src] == d or e.is_control:
        t = finish[e.src]
      else:
        key = (e.src, e.src_output)
        t = times[key] if key in times else arrival[(e.src, e.src_output, d)]
      ready = max(ready, t)
    return max(dev_free[d], ready), need

  def best(name: str):
    gid = problem.group_of[name]
    candidates = ((group_device[gid],) if gid in group_device
                  else problem.allowed[gid])
    choice = None
    for d in candidates:
      result = evaluate_on(name, d)
      if result is not None and (choice is None or result[0] < choice[0]):
        choice = (result[0], d)
    if choice is None:
      raise InfeasiblePlacement(
          f"m-ETF{'' if reserve is None else f' (reserve {reserve:g})'} "
          f"found no device with room for op {name!r} (group memory "
          f"{problem.group_memory[gid] / 1e6:,.0f} MB); used per device: "
          f"{[round(u / 1e6) for u in used]} MB.")
    return choice

  heap = []
  for name in problem.order:
    if pending[name] == 0:
      start, d = best(name)
      heap.append((start, rank[name], d, name))
  heapq.heapify(heap)
  while heap:
    start, r, d, name = heapq.heappop(heap)
    current = evaluate_on(name, d)
    if current is None or current[0] > start:
      new_start, new_d = best(name)
      heapq.heappush(heap, (new_start, r, new_d, name))
      continue
    # Commit `name` to `d`.
    gid = problem.group_of[name]
    copies = new_copies(problem, name, d, placement, resident)
    for (src, port), t in book_copies(name, d, copies, channel_free).items():
      resident.add((src, port, d))
      arrival[(src, port, d)] = t
    used[d] += current[1]
    group_device.setdefault(gid, d)
    placement[name] = d
    finish[name] = start + problem.compute_us(name)
    dev_free[d] = finish[name]
    for e in graph.out_edges(name):
      pending[e.dst] -= 1
      if pending[e.dst] == 0:
        s, dd = best(e.dst)
        heapq.heappush(heap, (s, rank[e.dst], dd, e.dst))
  return Placement(placement, problem.num_devices)
