"""m-TOPO (Baechi): ops in topological order, filling one device at a time.

Two modes:
  * "balanced": each device takes about 1/D of the graph's static memory
    before the next device starts (the published rule), never more than its
    cap; the last device takes what remains, within its cap;
  * "fill": each device is filled up to its cap before moving on, which
    keeps as much of the graph as possible on few devices (fewer transfers).

A colocation group goes where its first op (in topological order) goes, and
its whole memory is reserved then. Devices an op may not use (types, pins)
are skipped for it without ending that device's turn.
"""

from __future__ import annotations

from tfopt.placement.placement import Placement
from tfopt.placement.problem import (InfeasiblePlacement, PlacementProblem,
                                     new_copies)


def m_topo(problem: PlacementProblem, mode: str = "balanced") -> Placement:
  """Places `problem` with m-TOPO; raises InfeasiblePlacement on dead-end."""
  if mode not in ("balanced", "fill"):
    raise ValueError(f"Argument `mode` must be 'balanced' or 'fill'. "
                     f"Received: mode={mode!r}")
  num = problem.num_devices
  caps = problem.caps
  total = sum(problem.group_memory.values())
  if mode == "balanced":
    share = total / num
    budgets = [min(cap, share) for cap in caps]
    budgets[-1] = caps[-1]
  else:
    budgets = list(caps)
  used = [0] * num
  group_device: dict[str, int] = {}
  placement: dict[str, int] = {}
  resident: set = set()
  current = 0
  for name in problem.order:
    gid = problem.group_of[name]
    if gid in group_device:
      device = group_device[gid]
      copies = new_copies(problem, name, device, placement, resident)
    else:
      group_need = problem.group_memory[gid]
      allowed = problem.allowed[gid]

      def need_on(d):
        return group_need + sum(
            new_copies(problem, name, d, placement, resident).values())

      device = _first_fit(current, allowed, need_on, used, budgets, caps)
      if device is None:
        raise InfeasiblePlacement(
            f"m-TOPO ({mode}) found no device for op {name!r} "
            f"({group_need / 1e6:,.0f} MB); used per device: "
            f"{[round(u / 1e6) for u in used]} MB.")
      # An op that fits only past the current device's budget moves the
      # turn on; one placed elsewhere because of types/pins does not.
      if device > current and current in allowed:
        current = device
      group_device[gid] = device
      used[device] += group_need
      copies = new_copies(problem, name, device, placement, resident)
    # Received copies stay on the receiver: charge each once.
    for (src, port), nbytes in copies.items():
      resident.add((src, port, device))
      used[device] += nbytes
    placement[name] = device
  return Placement(placement, num)


def _first_fit(current, allowed, need_on, used, budgets, caps):
  """The first allowed device from `current` on within its budget; else the
  earliest allowed device within its real cap."""
  for d in allowed:
    if d >= current and used[d] + need_on(d) <= budgets[d]:
      return d
  for d in allowed:
    if used[d] + need_on(d) <= caps[d]:
      return d
  return None
