"""place(graph, cluster, costs, placer="auto") -> PlacementResult.

"auto" is a portfolio. These all run, and `simulate` scores each:
  * one device (when the constraints allow it);
  * m-TOPO in both modes, and m-topo-live (m-TOPO over-subscribing its static
    budgets, each plan proven feasible by the simulator);
  * m-stage: the training graph cut into contiguous layer stages (each
    layer's forward ops, gradients, weights, slots and update together),
    checked by the simulator's liveness peaks: what parameter-heavy models
    need, where static accounting refuses every plan;
  * m-branch: a network's parallel branches (towers, Inception paths) each
    whole -- gradients, weights, slots and updates with it -- on a device
    of its own, which the greedy list schedulers never find;
  * m-SCT (on graphs whose LP is cheap) and m-ETF, on all devices and, as
    "m-etf@k", on the first 2, 4, ... devices (greedy ETF spreads over every
    device it is given, which costs transfers);
  * each of those on the coarsened graph ("<placer>/coarse");
  * on graphs of at most EXACT_IN_AUTO_MAX_OPS ops, the exact CP-SAT placer,
    warm-started from the best of them; it also repairs graphs of at most
    exact.MAX_OPS ops that every heuristic dead-ended on.
The fastest feasible plan wins (ties: the earlier candidate, so one device
wins a tie): "auto" is never worse than one device when one device fits. A
named placer returns its own plan, still simulated. m-ETF and m-SCT retry in
reserve mode (new work only starts on a device below 1.1, 1.25 or 1.5 equal
shares of the graph's memory) before they give up.

Before any placer runs, `live_memory_bound` checks that a plan can exist at
all: when the bytes that must be live at once in any schedule (at some op:
persistent memory, its temp, and the tensors produced before it and read by
it or later) exceed the devices' caps added up, `InfeasiblePlacement` says
so, naming that op, instead of reporting that the placers found nothing.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Mapping

from tfopt._errors import invalid_argument
from tfopt.cluster import Cluster
from tfopt.graph.analysis import (format_bytes, live_memory_bound,
                                  makespan_lower_bound)
from tfopt.graph.opgraph import OpGraph
from tfopt.placement import exact as exact_placer
from tfopt.placement.coarsen import coarsen as coarsen_graph
from tfopt.placement.m_branch import m_branch
from tfopt.placement.m_etf import m_etf
from tfopt.placement.m_sct import favourite_children, m_sct
from tfopt.placement.m_stage import m_stage
from tfopt.placement.m_topo import m_topo
from tfopt.placement.placement import Placement
from tfopt.placement.problem import (InfeasiblePlacement, PlacementProblem,
                                     make_problem)
from tfopt.simulate.simulator import Schedule, simulate

# -- Portfolio settings (sizes and times measured on the 2-core CI machine) --
AUTO = ("single", "m-topo", "m-topo-fill", "m-etf")
# Feasibility first: reserve-mode shares m-ETF / m-SCT retry with.
RESERVES = (1.1, 1.25, 1.5)
# From this size, tight-memory retries start in reserve mode (each failed
# attempt costs a full run).
RESERVE_FIRST_MIN_OPS = 5000
# Budget scale factors m-topo-live tries (static bytes over-subscribed).
LIVE_FACTORS = (1.25, 1.5, 2.0, 2.5, 3.0, 4.0)
# m-topo-live simulates every plan it tries: cheap below this size.
LIVE_IN_AUTO_MAX_OPS = 5_000
# m-SCT joins "auto" while its LP is cheap (about 3 s at 8,000 edges here).
SCT_IN_AUTO_MAX_EDGES = 12_000
# CP-SAT's deterministic time ran about 5x wall seconds on 2 cores, and on
# 60-op graphs its contention-free plans simulated no faster than m-ETF's:
# in "auto" it runs only where it is cheap, or as a repair.
EXACT_IN_AUTO_MAX_OPS = 24
EXACT_AUTO_TIME = 1.0
EXACT_REPAIR_TIME = 5.0
# "auto" also places the coarsened graph (each plan expanded back and
# simulated on the original) up to this size; beyond it, time is better
# spent on the original graph's candidates.
COARSE_IN_AUTO_MAX_OPS = 5000


def _single(problem: PlacementProblem) -> Placement:
  """Everything on the first device every group may use."""
  shared = set(range(problem.num_devices))
  for allowed in problem.allowed.values():
    shared &= set(allowed)
  if not shared:
    raise InfeasiblePlacement("No single device satisfies every op's device "
                              "types and pins.")
  return Placement.single_device(problem.graph, problem.num_devices,
                                 min(shared))


def _reserve_order(problem: PlacementProblem, max_devices: int | None):
  """Attempts in order. Plain first: where it succeeds its plans were the
  best measured. But on large graphs (each failed attempt costs a full run)
  under tight memory (no device could hold the whole graph), where plain
  greedy ETF dead-ended in most runs measured here, reserve 1.25 first."""
  caps = problem.caps[:max_devices or problem.num_devices]
  if (len(problem.graph) < RESERVE_FIRST_MIN_OPS or
      max(caps) >= sum(problem.group_memory.values())):
    return (None,) + RESERVES
  return (1.25, 1.5, 1.1, None)


def _feasibility_first(run, problem: PlacementProblem,
                       max_devices: int | None = None) -> Placement:
  """`run(reserve)` in `_reserve_order`; the first plan wins, else the first
  attempt's error is raised."""
  first_error = None
  for reserve in _reserve_order(problem, max_devices):
    try:
      return run(reserve)
    except InfeasiblePlacement as err:
      first_error = first_error or err
  raise first_error


def _m_etf_feasibility_first(problem: PlacementProblem,
                             max_devices: int | None = None) -> Placement:
  """m-ETF, retried in reserve mode on a dead-end."""
  return _feasibility_first(
      lambda r: m_etf(problem, reserve=r, max_devices=max_devices), problem,
      max_devices)


def _m_sct_feasibility_first(problem: PlacementProblem) -> Placement:
  """m-SCT (one LP), retried in reserve mode with the same favourites."""
  favourites = favourite_children(problem)
  return _feasibility_first(
      lambda r: m_sct(problem, favourites=favourites, reserve=r), problem)


def _m_topo_live(problem: PlacementProblem) -> Placement:
  """m-TOPO with static budgets scaled by LIVE_FACTORS, each plan checked by
  the simulator against the real caps; the fastest feasible plan wins.

  Static accounting holds every tensor for the whole step; the liveness peak
  of a training step is often half of that. Over-subscribing the static
  budget and letting `simulate` prove the liveness peak fits finds plans for
  caps the static placers refuse.
  """
  best = None
  for factor in LIVE_FACTORS:
    scaled = dataclasses.replace(
        problem, caps=tuple(c * factor for c in problem.caps))
    for mode in ("fill", "balanced"):
      try:
        placement = m_topo(scaled, mode)
      except InfeasiblePlacement:
        continue
      schedule = simulate(problem.graph, placement, problem.costs,
                          problem.cluster)
      if schedule.feasible and (best is None or
                                schedule.makespan_us < best[0]):
        best = (schedule.makespan_us, placement)
  if best is None:
    raise InfeasiblePlacement(
        f"m-topo-live found no plan whose liveness peak fits, with static "
        f"budgets scaled up to {LIVE_FACTORS[-1]}x.")
  return best[1]


PLACERS: dict[str, Callable[[PlacementProblem], Placement]] = {
    "single": _single,
    "m-topo": lambda p: m_topo(p, "balanced"),
    "m-topo-fill": lambda p: m_topo(p, "fill"),
    "m-etf": _m_etf_feasibility_first,
    "m-sct": _m_sct_feasibility_first,
    "m-topo-live": _m_topo_live,
    "m-stage": m_stage,
    "m-branch": m_branch,
}


def _auto_names(problem: PlacementProblem) -> tuple[str, ...]:
  """The portfolio: AUTO, m-SCT, and m-ETF on the first 2, 4, ... devices, where
  those devices' caps can hold the graph's static memory at all (otherwise
  the run is sure to dead-end and would only cost time)."""
  total = sum(problem.group_memory.values())
  subsets = []
  k = 2
  while k < problem.num_devices:
    if sum(problem.caps[:k]) >= total:
      subsets.append(f"m-etf@{k}")
    k *= 2
  sct = ("m-sct",) if len(problem.graph.edges) <= SCT_IN_AUTO_MAX_EDGES else ()
  live = (("m-topo-live", "m-stage", "m-branch")
          if len(problem.graph) <= LIVE_IN_AUTO_MAX_OPS else ())
  return AUTO + sct + live + tuple(subsets)


def _placer(name: str) -> Callable[[PlacementProblem], Placement]:
  if name.startswith("m-etf@"):
    k = int(name.split("@")[1])
    return lambda p: _m_etf_feasibility_first(p, max_devices=k)
  return PLACERS[name]


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One placer's attempt: its plan and schedule, or why it failed."""
  placer: str
  seconds: float
  placement: Placement | None = None
  schedule: Schedule | None = None
  error: str | None = None
  note: str = ""

  @property
  def feasible(self) -> bool:
    return self.schedule is not None and self.schedule.feasible

  @property
  def makespan_us(self) -> float | None:
    return None if self.schedule is None else self.schedule.makespan_us


@dataclasses.dataclass(frozen=True)
class PlacementResult:
  """The chosen plan, its schedule, and every candidate's numbers."""
  placer: str
  placement: Placement
  schedule: Schedule
  placement_seconds: float
  candidates: tuple[Candidate, ...]
  lower_bound_us: float
  single_device_us: float

  @property
  def makespan_us(self) -> float:
    return self.schedule.makespan_us

  def table(self) -> str:
    """A comparison of all candidates, one line each."""
    lines = [f"{'placer':<19}{'seconds':>9}{'makespan ms':>13}"
             f"{'peak MB per device':>32}  status"]
    for c in self.candidates:
      if c.schedule is None:
        lines.append(f"{c.placer:<19}{c.seconds:>9.3f}{'-':>13}{'-':>32}  "
                     f"failed: {c.error}")
        continue
      peaks = "/".join(f"{p / 1e6:,.0f}" for p in c.schedule.peak_bytes)
      status = "feasible" if c.feasible else "over cap"
      chosen = "  <- chosen" if c.placer == self.placer else ""
      note = f" ({c.note})" if c.note else ""
      lines.append(f"{c.placer:<19}{c.seconds:>9.3f}"
                   f"{c.schedule.makespan_us / 1e3:>13.2f}{peaks:>32}  "
                   f"{status}{note}{chosen}")
    return "\n".join(lines)


def place(graph: OpGraph, cluster: Cluster, costs, placer: str = "auto", *,
          pins: Mapping[str, int] | None = None, headroom: float = 0.0,
          coarsen: bool | None = None) -> PlacementResult:
  """Places `graph` on `cluster` (see module doc).

  Args:
    graph, cluster, costs: what to place, where, and what each op costs.
    placer: "auto" or one of PLACERS.
    pins: op name -> device index; the op's colocation group follows.
    headroom: fraction of each device's cap kept free.

  Raises:
    InfeasiblePlacement: no candidate produced a plan within the caps; the
      message names each candidate's failure (and, when one op alone cannot
      fit, that op and its bytes).
  """
  if placer not in ("auto", "exact") and placer not in PLACERS:
    raise invalid_argument("placer", f"'auto', 'exact' or one of "
                           f"{sorted(PLACERS)}", placer)
  started = time.perf_counter()
  problem = make_problem(graph, cluster, costs, pins=pins, headroom=headroom)
  caps_total = sum(problem.caps)
  bound = live_memory_bound(graph, problem.costs)
  if bound.bytes > caps_total:
    raise InfeasiblePlacement(bound.explain(caps_total, len(cluster)) + ".")
  names = _auto_names(problem) if placer == "auto" else (placer,)
  if placer == "exact":
    hint = _attempt(problem, "m-etf")
    candidates = [_exact_attempt(problem, hint if hint.feasible else None,
                                 10.0)]
  else:
    candidates = [_attempt(problem, name) for name in names]
  if coarsen is None:
    coarsen = placer == "auto" and len(graph) <= COARSE_IN_AUTO_MAX_OPS
  if coarsen and placer != "exact":
    candidates += _coarse_attempts(problem, names, pins, headroom)
  if placer == "auto" and not any(c.feasible for c in candidates) and \
      "m-topo-live" not in names:
    # Large graph, nothing fits statically: the liveness-checked repairs.
    candidates.append(_attempt(problem, "m-topo-live"))
    candidates.append(_attempt(problem, "m-stage"))
  if placer == "auto":
    feasible_so_far = [c for c in candidates if c.feasible]
    best_so_far = min(feasible_so_far, key=lambda c: c.makespan_us,
                      default=None)
    # Small graphs: the exact placer, warm-started from the best plan.
    # Any graph the heuristics could not place: the exact placer as repair.
    if len(graph) <= EXACT_IN_AUTO_MAX_OPS:
      candidates.append(_exact_attempt(problem, best_so_far, EXACT_AUTO_TIME))
    elif best_so_far is None and len(graph) <= exact_placer.MAX_OPS:
      candidates.append(_exact_attempt(problem, None, EXACT_REPAIR_TIME))
  lower = makespan_lower_bound(graph, problem.costs, len(cluster))
  single = next((c for c in candidates
                 if c.placer == "single" and c.schedule is not None), None)
  if single is None:  # a named placer ran: simulate one device here
    single = Candidate("single", 0.0, schedule=simulate(
        graph, Placement.single_device(graph, len(cluster)), problem.costs,
        cluster))
  # Devices differ only in caps and types, which do not change timing.
  single_us = single.schedule.makespan_us
  feasible = [c for c in candidates if c.feasible]
  if not feasible:
    reasons = "; ".join(
        f"{c.placer}: {c.error or 'over cap ' + str(c.schedule.over_cap())}"
        for c in candidates)
    raise InfeasiblePlacement(
        f"No feasible placement on {len(cluster)} devices. {reasons}. (The "
        f"live-memory bound does not rule a plan out: "
        f"{format_bytes(bound.bytes)} must be live at once while op "
        f"{bound.op!r} runs, within the caps together, "
        f"{format_bytes(caps_total)}.)")
  best = min(feasible, key=lambda c: c.schedule.makespan_us)
  return PlacementResult(best.placer, best.placement, best.schedule,
                         time.perf_counter() - started, tuple(candidates),
                         lower, single_us)


def _coarse_attempts(problem: PlacementProblem, names, pins,
                     headroom: float) -> list[Candidate]:
  """Each placer on the coarsened graph, expanded and simulated."""
  start = time.perf_counter()
  coarsening = coarsen_graph(problem.graph, problem.costs)
  coarse_pins = {}
  for op, d in (pins or {}).items():
    g = coarsening.group_of[op]
    if coarse_pins.get(g, d) != d:
      return [Candidate("coarse", time.perf_counter() - start,
                        error=f"pins disagree inside coarse op {g!r}")]
    coarse_pins[g] = d
  try:
    coarse_problem = make_problem(coarsening.graph, problem.cluster,
                                  coarsening.costs, pins=coarse_pins,
                                  headroom=headroom)
  except (InfeasiblePlacement, ValueError) as err:
    return [Candidate("coarse", time.perf_counter() - start, error=str(err))]
  overhead = time.perf_counter() - start
  out = []
  for name in names:
    if name in ("single", "m-branch"):
      # single: identical to the original graph's plan; m-branch: it reads
      # forward / backward roles, which coarse ops mix.
      continue
    t0 = time.perf_counter()
    try:
      placement = coarsening.expand(_placer(name)(coarse_problem))
    except InfeasiblePlacement as err:
      out.append(Candidate(f"{name}/coarse", time.perf_counter() - t0 +
                           overhead, error=str(err)))
      continue
    seconds = time.perf_counter() - t0 + overhead
    schedule = simulate(problem.graph, placement, problem.costs,
                        problem.cluster)
    out.append(Candidate(f"{name}/coarse", seconds, placement, schedule,
                         note=coarsening.describe()))
  return out


def _exact_attempt(problem: PlacementProblem, hint: Candidate | None,
                   deterministic_time: float) -> Candidate:
  start = time.perf_counter()
  try:
    result = exact_placer.exact(
        problem, hint=None if hint is None else hint.placement,
        hint_starts=None if hint is None else hint.schedule.start_us,
        deterministic_time=deterministic_time)
  except (InfeasiblePlacement, ValueError,
          exact_placer.ExactSolverError) as err:
    # A crashed solver costs this candidate, not the portfolio.
    return Candidate("exact", time.perf_counter() - start, error=str(err))
  seconds = time.perf_counter() - start
  schedule = simulate(problem.graph, result.placement, problem.costs,
                      problem.cluster)
  note = (f"{result.status}, gap {100 * result.gap:.1f} %"
          + (", kept the warm start" if result.used_hint else ""))
  return Candidate("exact", seconds, result.placement, schedule, note=note)


def _attempt(problem: PlacementProblem, name: str) -> Candidate:
  start = time.perf_counter()
  try:
    placement = _placer(name)(problem)
  except InfeasiblePlacement as err:
    return Candidate(name, time.perf_counter() - start, error=str(err))
  seconds = time.perf_counter() - start
  schedule = simulate(problem.graph, placement, problem.costs, problem.cluster)
  return Candidate(name, seconds, placement, schedule)
