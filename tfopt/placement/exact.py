"""The exact placer: OR-Tools CP-SAT, for small (coarsened) graphs.

Model (the shape of OR-Tools' rcpsp example, with devices as alternatives):
  * one optional interval per (op, device) sharing the op's start; exactly
    one is present;
  * no overlap on each device's compute stream;
  * precedence: a consumer starts after its producer ends, plus the transfer
    time when the two sit on different devices;
  * memory caps, with the heuristics' static accounting: each op's bytes on
    its device, and each remote tensor's copy once per receiving device;
  * colocation groups share a device; device types and pins restrict it;
  * objective: the makespan.
Transfers are delays here, without channel contention; the plan is scored
by `simulate` like every other. Times are scaled to integers.

Deterministic: one worker, a fixed seed and a *deterministic* time limit
(CP-SAT's work units, not wall seconds). With a warm start (`hint`) the
search begins from that plan, and `exact` returns the hint's placement
whenever the solver's plan does not simulate faster: never worse than the
heuristic it was given.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from tfopt.placement.placement import Placement
from tfopt.placement.problem import InfeasiblePlacement, PlacementProblem
from tfopt.simulate.simulator import simulate

MAX_OPS = 400


@dataclasses.dataclass(frozen=True)
class ExactResult:
  """The exact placer's plan and how close to optimal it is."""
  placement: Placement
  status: str            # "OPTIMAL" or "FEASIBLE"
  objective_us: float    # the model's makespan of its plan
  bound_us: float        # the model's proven lower bound
  used_hint: bool        # True if the hint simulated faster and was kept

  @property
  def gap(self) -> float:
    """(objective - bound) / objective, 0 when proven optimal."""
    if self.objective_us <= 0:
      return 0.0
    return max(0.0, (self.objective_us - self.bound_us) / self.objective_us)


def exact(problem: PlacementProblem, *, hint: Placement | None = None,
          hint_starts: Mapping[str, float] | None = None,
          deterministic_time: float = 10.0, seed: int = 0) -> ExactResult:
  """Solves `problem` with CP-SAT (see module doc).

  Raises:
    ValueError: the graph has more than MAX_OPS ops (coarsen it first).
    InfeasiblePlacement: the model is proven infeasible, or no plan was
      found within the deterministic time limit.
  """
  from ortools.sat.python import cp_model  # imported here: heavy

  graph = problem.graph
  names = problem.order
  num = problem.num_devices
  if len(names) > MAX_OPS:
    raise ValueError(
        f"Argument `problem` must have at most {MAX_OPS} ops for the exact "
        f"placer (coarsen the graph first). Received: {len(names)} ops")
  comm = problem.cluster.comm
  # Scale microseconds to integers: the horizon maps to about 1e6 units.
  durations = {n: problem.compute_us(n) for n in names}
  delays = {}
  for e in graph.edges:
    if not e.is_control:
      delays[(e.src, e.dst)] = max(delays.get((e.src, e.dst), 0.0), max(
          comm.transfer_us(e.bytes, a, b) for a in range(num)
          for b in range(num) if a != b) if num > 1 else 0.0)
  horizon_us = sum(durations.values()) + sum(delays.values())
  scale = 1e6 / horizon_us if horizon_us > 0 else 1.0
  dur = {n: int(math.ceil(durations[n] * scale)) for n in names}
  horizon = sum(dur.values()) + sum(int(math.ceil(d * scale))
                                    for d in delays.values()) + 1

  model = cp_model.CpModel()
  start = {n: model.new_int_var(0, horizon, f"s[{n}]") for n in names}
  end = {n: model.new_int_var(0, horizon, f"e[{n}]") for n in names}
  on = {}
  per_device = [[] for _ in range(num)]
  for n in names:
    allowed = set(problem.allowed[problem.group_of[n]])
    literals = []
    for d in range(num):
      if d not in allowed:
        continue
      lit = model.new_bool_var(f"x[{n},{d}]")
      on[(n, d)] = lit
      literals.append(lit)
      per_device[d].append(model.new_optional_interval_var(
          start[n], dur[n], end[n], lit, f"i[{n},{d}]"))
    model.add_exactly_one(literals)
    model.add(end[n] == start[n] + dur[n])
  for d in range(num):
    model.add_no_overlap(per_device[d])
  for gid, members in problem.members.items():
    head = members[0]
    for m in members[1:]:
      for d in problem.allowed[gid]:
        model.add(on[(m, d)] == on[(head, d)])
  # Precedence, with the transfer delay when the endpoints differ.
  for e in graph.edges:
    model.add(start[e.dst] >= end[e.src])
    delay = delays.get((e.src, e.dst), 0.0) if not e.is_control else 0.0
    if delay > 0:
      same = model.new_bool_var(f"same[{e.src},{e.dst}]")
      for d in range(num):
        a, b = on.get((e.src, d)), on.get((e.dst, d))
        if a is not None and b is not None:
          model.add_implication(same, a).only_enforce_if(b)
          model.add_bool_or([same, a.Not(), b.Not()])
        elif b is not None:
          model.add_implication(b, same.Not())
      model.add(start[e.dst] >= end[e.src] + int(math.ceil(delay * scale))
                ).only_enforce_if(same.Not())
  # Memory: static bytes plus one received copy per (tensor, device).
  for d in range(num):
    if math.isinf(problem.caps[d]):
      continue
    terms = [problem.memory[n] * on[(n, d)] for n in names if (n, d) in on]
    consumers: dict[tuple[str, int], list[str]] = {}
    sizes: dict[tuple[str, int], int] = {}
    for e in graph.edges:
      if not e.is_control and e.bytes > 0 and (e.dst, d) in on:
        key = (e.src, e.src_output)
        consumers.setdefault(key, []).append(e.dst)
        sizes[key] = max(sizes.get(key, 0), e.bytes)
    for (src, port), dsts in consumers.items():
      copy = model.new_bool_var(f"copy[{src}:{port},{d}]")
      for v in dsts:
        # v on d and src elsewhere => the copy lives on d.
        src_here = on.get((src, d))
        if src_here is None:
          model.add_implication(on[(v, d)], copy)
        else:
          model.add_bool_or([copy, on[(v, d)].Not(), src_here])
      terms.append(sizes[(src, port)] * copy)
    model.add(sum(terms) <= int(problem.caps[d]))
  makespan = model.new_int_var(0, horizon, "makespan")
  model.add_max_equality(makespan, [end[n] for n in names])
  model.minimize(makespan)
  if hint is not None:
    for n in names:
      for d in range(num):
        if (n, d) in on:
          model.add_hint(on[(n, d)], hint[n] == d)
      if hint_starts is not None:
        model.add_hint(start[n], int(hint_starts[n] * scale))

  solver = cp_model.CpSolver()
  solver.parameters.num_workers = 1
  solver.parameters.random_seed = seed
  solver.parameters.max_deterministic_time = deterministic_time
  status = solver.solve(model)
  if status == cp_model.INFEASIBLE:
    raise InfeasiblePlacement("The exact placer proved that no placement "
                              "satisfies the memory caps and constraints.")
  if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
    raise InfeasiblePlacement(
        f"The exact placer found no plan within its deterministic time limit "
        f"({deterministic_time:g}); status {solver.status_name(status)}.")
  placement = Placement({n: next(d for d in range(num) if (n, d) in on and
                                 solver.boolean_value(on[(n, d)]))
                         for n in names}, num)
  used_hint = False
  if hint is not None:
    ours = simulate(graph, placement, problem.costs, problem.cluster)
    theirs = simulate(graph, hint, problem.costs, problem.cluster)
    if theirs.feasible and (not ours.feasible or
                            theirs.makespan_us < ours.makespan_us):
      placement, used_hint = hint, True
  return ExactResult(placement, solver.status_name(status),
                     solver.objective_value / scale,
                     solver.best_objective_bound / scale, used_hint)
