"""place(graph, cluster, costs, placer="auto") -> PlacementResult.

"auto" is a portfolio, run cheapest first; `simulate` scores each plan:
  * one device (when the constraints allow it);
  * m-TOPO in both modes;
  * m-ETF on all devices and, as "m-etf@k", on the first 2, 4, ... devices
    (greedy ETF spreads over every device it is given, which costs
    transfers);
  * m-stage: the training graph cut into contiguous layer stages (each
    layer's forward ops, gradients, weights, slots and update together),
    checked by the simulator's liveness peaks: what parameter-heavy models
    need, where static accounting refuses every plan;
  * m-branch: a network's parallel branches (towers, Inception paths) each
    whole -- gradients, weights, slots and updates with it -- on a device
    of its own, which the greedy list schedulers never find;
  * m-SCT (on graphs whose LP is cheap) and m-topo-live (m-TOPO
    over-subscribing its static budgets, each plan proven feasible by the
    simulator);
  * each of those on the coarsened graph ("<placer>/coarse");
  * where none of them fits (caps near the live-memory bound), m-pack
    (tfopt.placement.m_pack): whole layers packed by liveness, block moves
    and swaps off the device furthest over, then single groups;
  * refinement ("<best>+refine", tfopt.placement.refine): the best plan
    improved by moving one colocation group at a time, each move simulated
    (from the plan least over its caps when none fits: a liveness-aware
    repair), within a deterministic budget of REFINE_OP_SIMULATIONS;
  * on graphs of at most EXACT_IN_AUTO_MAX_OPS ops, the exact CP-SAT placer,
    warm-started from the best plan so far; it also repairs graphs of at
    most exact.MAX_OPS ops that every heuristic dead-ended on.
The fastest feasible plan wins (ties: the earlier candidate, so one device
wins a tie): "auto" is never worse than one device when one device fits,
and keeps one device unless a plan over several is predicted at least
SPREAD_MIN_GAIN faster (a smaller gain is under the simulator's error). A
named placer returns its own plan, still simulated. m-ETF and m-SCT retry in
reserve mode (new work only starts on a device below 1.1, 1.25 or 1.5 equal
shares of the graph's memory) before they give up.

Anytime rules: once a feasible plan is in hand, no new candidate starts
after `time_limit_s` (default DEFAULT_TIME_LIMIT_S; refinement stops too) or
once the plan is within `target_gap` of the makespan lower bound (default
DEFAULT_TARGET_GAP); those candidates are listed as "not run". The bound
(`tfopt.placement.bound`: critical path, work over devices, a memory LP)
is proven for the devices and caps, and the result carries it
(`lower_bound_us`, `bound`, `over_bound`). Until a plan
fits, the portfolio goes on: a time limit never turns a placeable graph
into a refusal. A plan whose own lower bound (`plan_lower_bound`: its
busiest device's compute, its longest path with transfers) is no better
than the best makespan so far cannot win and is not simulated (one whose
simulated makespan is no better is not checked for memory); a plan another
placer already returned is not simulated twice.

Before any placer runs, `live_memory_bound` checks that a plan can exist at
all: when the bytes that must be live at once in any schedule (at some op:
persistent memory, its temp, and the tensors produced before it and read by
it or later) exceed the devices' caps added up, `InfeasiblePlacement` says
so, naming that op, instead of reporting that the placers found nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from typing import Callable, Mapping

from tfopt._errors import invalid_argument
from tfopt.cluster import Cluster
from tfopt.graph.analysis import format_bytes, live_memory_bound
from tfopt.graph.opgraph import OpGraph
from tfopt.placement import exact as exact_placer
from tfopt.placement import refine as refine_search
from tfopt.placement.bound import MakespanBound, makespan_bound
from tfopt.placement.coarsen import coarsen as coarsen_graph
from tfopt.placement.m_branch import m_branch
from tfopt.placement.m_etf import m_etf
from tfopt.placement.m_pack import m_pack
from tfopt.placement.m_sct import favourite_children, m_sct
from tfopt.placement.m_stage import m_stage
from tfopt.placement.m_topo import m_topo
from tfopt.placement.placement import Placement
from tfopt.placement.problem import (InfeasiblePlacement, PlacementProblem,
                                     make_problem)
from tfopt.simulate.simulator import Schedule, simulate, simulate_timing

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
# m-SCT on the original graph joins "auto" up to this many edges: its LP
# costs 0.2 s at 2,000 edges and 1.7 s at 8,000 here, and in the benchmark
# it never won a row where m-SCT on the coarsened graph (always in the
# portfolio, a small LP) did not do as well.
SCT_IN_AUTO_MAX_EDGES = 1_000
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
# "auto" refines its best plan by single-group moves (tfopt.placement.refine)
# on graphs of at most this many colocation groups: a sweep of one
# simulation per group and device then takes seconds, not minutes.
REFINE_IN_AUTO_MAX_GROUPS = 500
# Its budget, in op simulations (tried moves x ops): deterministic, unlike
# the time limit, so one input gives one plan; about 1 s on the CI machine.
REFINE_OP_SIMULATIONS = 150_000
# "auto" keeps the step on one device (where it fits) unless a plan that
# spreads it is predicted at least this much faster: below it the gain is
# under the simulator's error (up to about 25 % per row of the calibrated
# runtime benchmark), and in that benchmark's run before this rule (commit
# e2cbb13's results) plans predicted within 0.1 % of one device ran at
# 0.95-1.12x of it on logical CPUs, where one device needs no hand-overs.
SPREAD_MIN_GAIN = 0.02
# The anytime rules (place's `time_limit_s` and `target_gap`).
DEFAULT_TIME_LIMIT_S = 10.0
DEFAULT_TARGET_GAP = 0.01


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
  caps the static placers refuse. A plan met before (several budgets often
  give one plan) or one whose lower bound cannot beat the best so far is
  not simulated.
  """
  best = None
  seen = set()
  for factor in LIVE_FACTORS:
    scaled = dataclasses.replace(
        problem, caps=tuple(c * factor for c in problem.caps))
    for mode in ("fill", "balanced"):
      try:
        placement = m_topo(scaled, mode)
      except InfeasiblePlacement:
        continue
      key = tuple(placement[n] for n in problem.order)
      if key in seen or (best is not None and plan_lower_bound(
          problem, placement) >= best[0]):
        continue
      seen.add(key)
      timing = simulate_timing(problem.graph, placement, problem.costs,
                               problem.cluster)
      if best is not None and timing.makespan_us >= best[0]:
        continue  # cannot win: no memory pass
      if timing.schedule().feasible:
        best = (timing.makespan_us, placement)
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
    "m-pack": m_pack,
}


def _auto_names(problem: PlacementProblem) -> tuple[str, ...]:
  """The portfolio, cheapest first (the anytime rules may stop it early):
  AUTO, m-ETF on the first 2, 4, ... devices where those devices' caps can
  hold the graph's static memory at all (otherwise the run is sure to
  dead-end and would only cost time), m-stage and m-branch, m-SCT, and
  m-topo-live (a simulation per budget it tries)."""
  total = sum(problem.group_memory.values())
  subsets = []
  k = 2
  while k < problem.num_devices:
    if sum(problem.caps[:k]) >= total:
      subsets.append(f"m-etf@{k}")
    k *= 2
  small = len(problem.graph) <= LIVE_IN_AUTO_MAX_OPS
  sct = ("m-sct",) if len(problem.graph.edges) <= SCT_IN_AUTO_MAX_EDGES else ()
  return (AUTO + tuple(subsets) + (("m-stage", "m-branch") if small else ())
          + sct + (("m-topo-live",) if small else ()))


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
  """The chosen plan, its schedule, and every candidate's numbers.

  `lower_bound_us` is proven: no plan on these devices and caps simulates
  faster (`bound`, from tfopt.placement.bound, says which term gave it;
  None where the result was built by hand)."""
  placer: str
  placement: Placement
  schedule: Schedule
  placement_seconds: float
  candidates: tuple[Candidate, ...]
  lower_bound_us: float
  single_device_us: float
  bound: MakespanBound | None = None

  @property
  def makespan_us(self) -> float:
    return self.schedule.makespan_us

  @property
  def lower_bound_term(self) -> str:
    """Which term gave the lower bound ("" where unknown)."""
    return "" if self.bound is None else self.bound.term

  @property
  def over_bound(self) -> float | None:
    """The plan's makespan over the lower bound (>= 1; None for a zero
    bound): how far from optimal the plan can be at most."""
    if not self.lower_bound_us > 0:
      return None
    return self.makespan_us / self.lower_bound_us

  def describe_bound(self) -> str:
    """One line: the plan, the bound and its term, their ratio."""
    ratio = self.over_bound
    bound = (self.bound.describe() if self.bound is not None else
             f"{self.lower_bound_us / 1e3:,.2f} ms")
    return (f"plan {self.makespan_us / 1e3:,.2f} ms ({self.placer}), lower "
            f"bound {bound}, plan / bound "
            + ("--" if ratio is None else f"{ratio:.3f}"))

  def table(self) -> str:
    """A comparison of all candidates, one line each."""
    lines = [f"{'placer':<19}{'seconds':>9}{'makespan ms':>13}"
             f"{'peak MB per device':>32}  status"]
    for c in self.candidates:
      if c.schedule is None:
        # "not run", "not simulated", "not checked": skipped by the
        # anytime rules, not failures.
        kind = "skipped" if (c.error or "").startswith("not ") else "failed"
        lines.append(f"{c.placer:<19}{c.seconds:>9.3f}{'-':>13}{'-':>32}  "
                     f"{kind}: {c.error}")
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
          coarsen: bool | None = None,
          time_limit_s: float = DEFAULT_TIME_LIMIT_S,
          target_gap: float = DEFAULT_TARGET_GAP,
          refine: bool | None = None) -> PlacementResult:
  """Places `graph` on `cluster` (see module doc).

  Args:
    graph, cluster, costs: what to place, where, and what each op costs.
    placer: "auto" or one of PLACERS.
    pins: op name -> device index; the op's colocation group follows.
    headroom: fraction of each device's cap kept free.
    coarsen: also place the coarsened graph (default: "auto" on graphs of
      at most COARSE_IN_AUTO_MAX_OPS ops).
    time_limit_s: once a feasible plan is in hand, "auto" starts no new
      candidate, and refinement stops, after this many seconds since the
      call; the best plan so far is returned. A candidate already running
      finishes.
    target_gap: "auto" stops as soon as a feasible plan is within this
      fraction of the makespan lower bound (nothing can gain more).
    refine: run the local search on the best plan (default: "auto" on
      graphs of at most REFINE_IN_AUTO_MAX_GROUPS colocation groups).

  Raises:
    InfeasiblePlacement: no candidate produced a plan within the caps; the
      message names each candidate's failure (and, when one op alone cannot
      fit, that op and its bytes).
  """
  _check_place_arguments(placer, time_limit_s, target_gap)
  started = time.perf_counter()
  with _cyclic_gc_paused():
    problem = make_problem(graph, cluster, costs, pins=pins,
                           headroom=headroom)
    bound = live_memory_bound(graph, problem.costs)
    if bound.bytes > sum(problem.caps):
      raise InfeasiblePlacement(bound.explain(sum(problem.caps),
                                              len(cluster)) + ".")
    lower = makespan_bound(problem)
    run = _Portfolio(problem, started + time_limit_s,
                     lower.us * (1.0 + target_gap))
    _run_placers(run, placer, pins, headroom, coarsen, refine)
    return _result(problem, run, bound, lower, started)


def _run_placers(run: "_Portfolio", placer: str, pins, headroom: float,
                 coarsen: bool | None, refine: bool | None) -> None:
  """The named placer, or the "auto" portfolio in its order (module doc)."""
  problem = run.problem
  if placer == "exact":
    hint = run.attempt("m-etf")
    run.add(_exact_attempt(problem, hint if hint.feasible else None, 10.0))
    return
  names = _auto_names(problem) if placer == "auto" else (placer,)
  for name in names:
    run.attempt(name)
  if coarsen is None:
    coarsen = placer == "auto" and len(problem.graph) <= COARSE_IN_AUTO_MAX_OPS
  if coarsen:
    run.coarse(names, pins, headroom)
  if placer == "auto":
    _liveness_repairs(run, names)
    if refine is None:
      refine = len(problem.members) <= REFINE_IN_AUTO_MAX_GROUPS
    if refine:
      run.refine()
    _exact_in_auto(run)


@contextlib.contextmanager
def _cyclic_gc_paused():
  """Python's cycle collector paused while the placers run: they allocate
  millions of short-lived objects, which start collections that walk every
  object of the process (in a process with TensorFlow and a model loaded,
  most of the heap). Measured once on this VM with TensorFlow imported
  (a one-off script, not a benchmark): "auto" on synthetic 1k- and 4k-op
  graphs went from 0.35-3.18 s to 0.34-2.18 s.
  Nothing of ours forms cycles that must go before the call returns; the
  collector runs again after it."""
  enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if enabled:
      gc.enable()


def _check_place_arguments(placer, time_limit_s, target_gap) -> None:
  if placer not in ("auto", "exact") and placer not in PLACERS:
    raise invalid_argument("placer", f"'auto', 'exact' or one of "
                           f"{sorted(PLACERS)}", placer)
  if isinstance(time_limit_s, bool) or \
      not isinstance(time_limit_s, (int, float)) or not time_limit_s > 0:
    raise invalid_argument("time_limit_s", "a number of seconds > 0",
                           time_limit_s)
  if isinstance(target_gap, bool) or \
      not isinstance(target_gap, (int, float)) or not target_gap >= 0:
    raise invalid_argument("target_gap", "a fraction >= 0", target_gap)


def _liveness_repairs(run: "_Portfolio", names) -> None:
  """Large graphs where nothing fitted statically: the liveness-checked
  placers the portfolio leaves out at that size; where still nothing fits
  (caps near the live-memory bound), m-pack."""
  if not run.best() and "m-topo-live" not in names:
    run.attempt("m-topo-live")
    run.attempt("m-stage")
  if not run.best():
    run.attempt("m-pack")


def _exact_in_auto(run: "_Portfolio") -> None:
  """The exact placer on small graphs, warm-started from the best plan so
  far (so never worse than it), or as the repair of graphs of at most
  exact.MAX_OPS ops that every heuristic dead-ended on."""
  problem, best = run.problem, run.best()
  small = len(problem.graph) <= EXACT_IN_AUTO_MAX_OPS
  if not (small or (best is None and
                    len(problem.graph) <= exact_placer.MAX_OPS)):
    return
  if run.skip("exact"):
    return
  if small:
    run.add(_exact_attempt(problem, best, EXACT_AUTO_TIME))
  else:
    run.add(_exact_attempt(problem, None, EXACT_REPAIR_TIME))


def _result(problem: PlacementProblem, run: "_Portfolio", bound,
            lower: MakespanBound, started: float) -> PlacementResult:
  """The fastest feasible candidate as a PlacementResult, or the error that
  names every candidate's failure."""
  graph, cluster = problem.graph, problem.cluster
  candidates = run.candidates
  single = next((c for c in candidates
                 if c.placer == "single" and c.schedule is not None), None)
  if single is None:  # a named placer ran: simulate one device here
    single = Candidate("single", 0.0, schedule=run.simulate(
        Placement.single_device(graph, len(cluster))))
  # Devices differ only in caps and types, which do not change timing.
  single_us = single.schedule.makespan_us
  best = run.best()
  if best is not None and _spreads_for_little(best, single, candidates):
    kept = dataclasses.replace(single, note=(
        f"kept: {best.placer} gains {1 - best.makespan_us / single_us:.1%}, "
        f"under {SPREAD_MIN_GAIN:.0%}"))
    candidates = tuple(kept if c is single else c for c in candidates)
    best = kept
  if best is None:
    reasons = "; ".join(
        f"{c.placer}: {c.error or 'over cap ' + str(c.schedule.over_cap())}"
        for c in candidates)
    proof = "" if lower.feasible else f" ({lower.note}.)"
    raise InfeasiblePlacement(
        f"No feasible placement on {len(cluster)} devices. {reasons}. (The "
        f"live-memory bound does not rule a plan out: "
        f"{format_bytes(bound.bytes)} must be live at once while op "
        f"{bound.op!r} runs, within the caps together, "
        f"{format_bytes(sum(problem.caps))}.){proof}")
  return PlacementResult(best.placer, best.placement, best.schedule,
                         time.perf_counter() - started, tuple(candidates),
                         lower.us, single_us, lower)


def _spreads_for_little(best: Candidate, single: Candidate,
                        candidates) -> bool:
  """Whether `best` spreads the step over devices for a predicted gain
  under SPREAD_MIN_GAIN while the portfolio's one-device plan fits."""
  if best is single or not any(c is single for c in candidates) or \
      not single.feasible:
    return False
  if len(set(best.placement.values())) < 2:
    return False
  return best.makespan_us > single.makespan_us * (1.0 - SPREAD_MIN_GAIN)


class _Portfolio:
  """The candidates of one `place` call, run cheapest first, with the
  anytime rules: nothing new starts after the deadline or once a feasible
  plan is within the target of the lower bound; a plan already simulated
  (several placers often return the same one) is not simulated again; a
  plan whose lower bound is no better than the best makespan cannot win and
  is not simulated, one whose simulated makespan is no better is not checked
  for memory."""

  def __init__(self, problem: PlacementProblem, deadline: float,
               target_us: float):
    self.problem, self.deadline, self.target_us = (problem, deadline,
                                                   target_us)
    self.candidates: list[Candidate] = []
    # Per distinct plan: its Timing, or its Schedule once completed.
    self._schedules: dict[tuple, object] = {}
    self._order = problem.order

  def stopped(self) -> bool:
    """Whether to start nothing more: a feasible plan is in hand and the
    time is up or the plan is within the target (without a feasible plan
    the portfolio goes on: a time limit never turns a placeable graph
    into a refusal)."""
    best = self.best()
    return best is not None and (time.perf_counter() > self.deadline or
                                 best.makespan_us <= self.target_us)

  def best(self) -> Candidate | None:
    feasible = [c for c in self.candidates if c.feasible]
    return min(feasible, key=lambda c: c.makespan_us, default=None)

  def add(self, candidate: Candidate) -> None:
    self.candidates.append(candidate)

  def skip(self, name: str) -> bool:
    """Records `name` as not run when the portfolio has stopped."""
    if not self.stopped():
      return False
    why = ("time limit reached" if time.perf_counter() > self.deadline
           else "a plan within the target gap of the lower bound was found")
    self.add(Candidate(name, 0.0, error=f"not run: {why}"))
    return True

  def simulate(self, placement: Placement) -> Schedule:
    timing = self._timing(placement)
    return timing if isinstance(timing, Schedule) else self._complete(
        placement, timing)

  def _timing(self, placement: Placement):
    """The plan's Schedule if completed before, else its Timing."""
    key = tuple(placement[n] for n in self._order)
    if key not in self._schedules:
      self._schedules[key] = simulate_timing(
          self.problem.graph, placement, self.problem.costs,
          self.problem.cluster)
    return self._schedules[key]

  def _complete(self, placement: Placement, timing) -> Schedule:
    schedule = timing.schedule()
    self._schedules[tuple(placement[n] for n in self._order)] = schedule
    return schedule

  def judge(self, name: str, placement: Placement, seconds: float,
            note: str = "") -> Candidate:
    """The candidate for `placement`, simulated; a plan that cannot win is
    not simulated (its lower bound is no better than the best makespan), or
    not checked for memory (its simulated makespan is no better)."""
    best = self.best()
    if best is not None:
      bound = plan_lower_bound(self.problem, placement)
      if bound >= best.makespan_us:
        return Candidate(name, seconds, placement, error=(
            f"not simulated: it cannot finish before {bound / 1e3:,.1f} ms, "
            f"no faster than {best.placer}'s "
            f"{best.makespan_us / 1e3:,.1f} ms"), note=note)
    timing = self._timing(placement)
    if best is not None and not isinstance(timing, Schedule) and \
        timing.makespan_us >= best.makespan_us:
      return Candidate(name, seconds, placement, error=(
          f"not checked for memory: it simulates to "
          f"{timing.makespan_us / 1e3:,.1f} ms, no faster than "
          f"{best.placer}'s {best.makespan_us / 1e3:,.1f} ms"), note=note)
    schedule = (timing if isinstance(timing, Schedule) else
                self._complete(placement, timing))
    return Candidate(name, seconds, placement, schedule, note=note)

  def attempt(self, name: str) -> Candidate:
    if self.skip(name):
      return self.candidates[-1]
    start = time.perf_counter()
    try:
      placement = _placer(name)(self.problem)
    except InfeasiblePlacement as err:
      candidate = Candidate(name, time.perf_counter() - start,
                            error=str(err))
    else:
      candidate = self.judge(name, placement, time.perf_counter() - start)
    self.add(candidate)
    return candidate

  def coarse(self, names, pins, headroom: float) -> None:
    _coarse_attempts(self, names, pins, headroom)

  def refine(self) -> None:
    """Local search from the best plan, or, when none fits, from the plan
    least over its caps (a liveness-aware repair)."""
    start_from = self.best()
    if start_from is None:
      over = [c for c in self.candidates if c.schedule is not None]
      start_from = min(over, key=lambda c: refine_search.score(c.schedule),
                       default=None)
    if start_from is None or self.skip("refine"):
      return
    t0 = time.perf_counter()
    repair = self.best() is None  # a repair is not cut by the time limit
    budget = max(1, REFINE_OP_SIMULATIONS // len(self.problem.graph))
    out = refine_search.refine(self.problem, start_from.placement,
                               start_from.schedule,
                               deadline=None if repair else self.deadline,
                               max_simulations=budget,
                               target_us=self.target_us)
    ended = ("converged" if out.converged else "budget spent"
             if out.simulations >= budget else "time limit reached")
    note = f"{out.moves} group moves in {out.simulations} simulations, {ended}"
    self.add(Candidate(f"{start_from.placer}+refine",
                       time.perf_counter() - t0, out.placement,
                       out.schedule, note=note))


def plan_lower_bound(problem: PlacementProblem,
                     placement: Placement) -> float:
  """No schedule of `placement` finishes sooner: the most compute one
  device, or one group of devices sharing cores, has to do at the fastest
  its cores allow, and the longest path when each edge between devices
  costs its transfer (messages for control edges where the CommModel sends
  them), without waiting for channels; plus the cluster's step overhead
  for the devices it uses, as the simulator adds it."""
  graph, costs, cluster = problem.graph, problem.costs, problem.cluster
  comm = cluster.comm
  overhead = [d.op_overhead_us for d in cluster.devices]
  busy = [0.0] * problem.num_devices
  finish: dict[str, float] = {}
  for name in problem.order:
    d = placement[name]
    begin = 0.0
    for e in graph.in_edges(name):
      ready = finish[e.src]
      src_device = placement[e.src]
      if src_device != d:
        link = comm.link(src_device, d)
        if not e.is_control:
          ready += link.transfer_us(e.bytes)
        elif comm.control_messages:
          ready += link.message_us(0)
      begin = max(begin, ready)
    work = costs[name].compute_us + overhead[d]
    finish[name] = begin + work
    busy[d] += work
  ops_us = max(_busiest_us(busy, cluster.sharing),
               max(finish.values(), default=0.0))
  if not cluster.step_overhead_us or not problem.order:
    return ops_us
  return ops_us + cluster.step_overhead(
      len({placement[name] for name in problem.order}))


def _busiest_us(busy: list[float], sharing) -> float:
  """The shortest time in which devices with `busy` microseconds of work
  each could do it: a device alone runs at full speed at most (or, with a
  thread pool, as fast as its group's cores allow); a group of devices
  sharing cores at most `capacity` ops' worth at once."""
  if sharing is None:
    return max(busy)
  groups: dict[int, list[float]] = {}
  for work, g in zip(busy, sharing.groups):
    groups.setdefault(g, []).append(work)
  bound = 0.0
  for works in groups.values():
    speed = sharing.group_speed(len(works))
    one = 1.0 if sharing.threads is None else speed
    bound = max(bound, max(works) / one, sum(works) / speed)
  return bound


def _coarse_attempts(run: "_Portfolio", names, pins,
                     headroom: float) -> None:
  """Each placer on the coarsened graph, expanded and judged on the
  original graph."""
  if run.skip("coarse"):
    return
  problem = run.problem
  start = time.perf_counter()
  coarsening = coarsen_graph(problem.graph, problem.costs)
  coarse_pins = {}
  for op, d in (pins or {}).items():
    g = coarsening.group_of[op]
    if coarse_pins.get(g, d) != d:
      run.add(Candidate("coarse", time.perf_counter() - start,
                        error=f"pins disagree inside coarse op {g!r}"))
      return
    coarse_pins[g] = d
  try:
    coarse_problem = make_problem(coarsening.graph, problem.cluster,
                                  coarsening.costs, pins=coarse_pins,
                                  headroom=headroom)
  except (InfeasiblePlacement, ValueError) as err:
    run.add(Candidate("coarse", time.perf_counter() - start, error=str(err)))
    return
  overhead = time.perf_counter() - start
  for name in names:
    if name in ("single", "m-branch"):
      # single: identical to the original graph's plan; m-branch: it reads
      # forward / backward roles, which coarse ops mix.
      continue
    if run.skip(f"{name}/coarse"):
      continue
    t0 = time.perf_counter()
    try:
      placement = coarsening.expand(_placer(name)(coarse_problem))
    except InfeasiblePlacement as err:
      run.add(Candidate(f"{name}/coarse", time.perf_counter() - t0 +
                        overhead, error=str(err)))
      continue
    run.add(run.judge(f"{name}/coarse", placement,
                      time.perf_counter() - t0 + overhead,
                      note=coarsening.describe()))


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
