"""refine: local search on a placement, judged by the simulator.

The constructive placers commit to each op once (m-TOPO, m-ETF, m-SCT) or
cut along one order (m-stage); none revisits a choice with the whole
schedule in view. `refine` does: it moves one colocation group at a time
(a group is the unit every placer already honours) to another device it may
use, simulates the plan, and keeps the move when the plan gets better:

  * first less memory over the caps (bytes over, summed over devices), so a
    plan that is over its caps is repaired by the liveness model, not by
    static accounting;
  * then a shorter makespan.

Groups are visited heaviest compute first (moving those changes the
makespan most), one sweep after another, until a sweep changes nothing (a
local optimum under single-group moves), a sweep of a plan that fits gains
under MIN_SWEEP_GAIN, the target is reached, the simulation budget is spent
or the deadline passes. Every accepted plan is feasible whenever the start
was, so stopping early is always safe: the search is anytime.

Cost: one simulation per tried move, (devices - 1) per group and sweep;
once the plan fits, a move whose timing is no faster skips the memory pass
(about half of a simulation). On the 192-op GNMT layer graph on 4 devices a
sweep is ~290 moves, a few tenths of a second; on graphs of hundreds of
ops `place`'s budget (REFINE_OP_SIMULATIONS), not convergence, ends it.
"""

from __future__ import annotations

import dataclasses
import time

from tfopt.placement.placement import Placement
from tfopt.placement.problem import PlacementProblem
from tfopt.simulate.simulator import Schedule, simulate, simulate_timing

# A move must shorten the makespan by more than this fraction to count:
# float noise in the simulator must not make the search cycle.
MIN_GAIN = 1e-9
# A sweep that shortens the makespan by less than this fraction ends the
# search: the long tail of tiny gains costs a sweep each.
MIN_SWEEP_GAIN = 0.005


@dataclasses.dataclass(frozen=True)
class Refined:
  """The refined plan, its schedule, and what the search did."""
  placement: Placement
  schedule: Schedule
  moves: int          # accepted group moves
  simulations: int    # tried moves
  sweeps: int         # full passes over the groups (the last may be cut)
  converged: bool     # a whole sweep found no (or only a tiny) gain


def score(schedule: Schedule) -> tuple[float, float]:
  """(bytes over the caps summed over devices, makespan): lower is better."""
  over = sum(peak - cap for _, peak, cap in schedule.over_cap())
  return (float(over), schedule.makespan_us)


def _better(new: tuple[float, float], old: tuple[float, float]) -> bool:
  if new[0] != old[0]:
    return new[0] < old[0]
  return new[1] < old[1] * (1.0 - MIN_GAIN)


def refine(problem: PlacementProblem, placement: Placement,
           schedule: Schedule | None = None, *,
           deadline: float | None = None,
           max_sweeps: int | None = None,
           max_simulations: int | None = None,
           target_us: float = 0.0) -> Refined:
  """Improves `placement` by single-group moves (see module doc).

  Args:
    problem: the problem `placement` solves.
    placement: the start; need not fit the caps.
    schedule: its simulated schedule, if already known.
    deadline: a `time.perf_counter()` value; the search stops at the first
      move tried after it. None: run until a sweep changes nothing.
    max_sweeps: at most this many sweeps (None: no limit).
    max_simulations: try at most this many moves (a budget that, unlike
      the deadline, gives the same plan on every run).
    target_us: stop once a plan that fits is this fast (a lower bound, for
      example: nothing can gain more).
  """
  graph, costs, cluster = problem.graph, problem.costs, problem.cluster
  if schedule is None:
    schedule = simulate(graph, placement, costs, cluster)
  current = dict(placement)
  best_score = score(schedule)
  units = sorted(problem.members, key=lambda gid: (
      -sum(costs[n].compute_us for n in problem.members[gid]),
      problem.rank[problem.members[gid][0]]))
  moves = simulations = sweeps = 0
  converged = False
  while not converged and (max_sweeps is None or sweeps < max_sweeps):
    sweeps += 1
    changed = False
    before = best_score
    for gid in units:
      names = problem.members[gid]
      for device in problem.allowed[gid]:
        if device == current[names[0]]:
          continue
        if (deadline is not None and time.perf_counter() > deadline) or \
            (max_simulations is not None and simulations >= max_simulations):
          return Refined(Placement(current, problem.num_devices), schedule,
                         moves, simulations, sweeps, False)
        trial = dict(current)
        for n in names:
          trial[n] = device
        timing = simulate_timing(graph, trial, costs, cluster)
        simulations += 1
        if best_score[0] == 0 and not _better((0.0, timing.makespan_us),
                                              best_score):
          continue  # slower than a plan that fits: no memory pass
        trial_schedule = timing.schedule()
        trial_score = score(trial_schedule)
        if _better(trial_score, best_score):
          current, schedule, best_score = trial, trial_schedule, trial_score
          moves += 1
          changed = True
          if best_score[0] == 0 and best_score[1] <= target_us:
            return Refined(Placement(current, problem.num_devices), schedule,
                           moves, simulations, sweeps, True)
    # Converged: no move helped, or the sweep only shaved a sliver off a
    # plan that fits (and fitted before it).
    converged = not changed or (
        before[0] == best_score[0] == 0 and
        best_score[1] > before[1] * (1.0 - MIN_SWEEP_GAIN))
  return Refined(Placement(current, problem.num_devices), schedule, moves,
                 simulations, sweeps, converged)
