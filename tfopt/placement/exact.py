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
(CP-SAT's work units, not wall seconds). The model is first written as plain
data, so that where TensorFlow was loaded before OR-Tools (CP-SAT then
crashes, see tfopt/_native.py) it is built and solved in a child process. With a warm start (`hint`) the
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


class ExactSolverError(RuntimeError):
  """The solver's child process died or answered nothing readable (the
  message has its exit code and the end of its stderr)."""


def exact(problem: PlacementProblem, *, hint: Placement | None = None,
          hint_starts: Mapping[str, float] | None = None,
          deterministic_time: float = 10.0, seed: int = 0) -> ExactResult:
  """Solves `problem` with CP-SAT (see module doc).

  Raises:
    ValueError: the graph has more than MAX_OPS ops (coarsen it first).
    InfeasiblePlacement: the model is proven infeasible, or no plan was
      found within the deterministic time limit.
    ExactSolverError: the solver's child process crashed.
  """
  if len(problem.order) > MAX_OPS:
    raise ValueError(
        f"Argument `problem` must have at most {MAX_OPS} ops for the exact "
        f"placer (coarsen the graph first). Received: {len(problem.order)} "
        f"ops")
  data, scale = _model_data(problem, hint, hint_starts)
  data.update(deterministic_time=deterministic_time, seed=seed)
  from tfopt import _native  # pylint: disable=g-import-not-at-top
  if _native.TENSORFLOW_LOADED_FIRST:
    # CP-SAT crashes in a process where TensorFlow loaded first: solve in a
    # child process that imports OR-Tools alone.
    out = _solve_in_child(data)
  else:
    out = solve_model_data(data)
  status = out["status"]
  if status == "INFEASIBLE":
    raise InfeasiblePlacement("The exact placer proved that no placement "
                              "satisfies the memory caps and constraints.")
  if status not in ("OPTIMAL", "FEASIBLE"):
    raise InfeasiblePlacement(
        f"The exact placer found no plan within its deterministic time limit "
        f"({deterministic_time:g}); status {status}.")
  placement = Placement(out["devices"], problem.num_devices)
  used_hint = False
  if hint is not None:
    ours = simulate(problem.graph, placement, problem.costs, problem.cluster)
    theirs = simulate(problem.graph, hint, problem.costs, problem.cluster)
    if theirs.feasible and (not ours.feasible or
                            theirs.makespan_us < ours.makespan_us):
      placement, used_hint = hint, True
  return ExactResult(placement, status, out["objective"] / scale,
                     out["bound"] / scale, used_hint)


def _model_data(problem: PlacementProblem, hint, hint_starts):
  """The model as plain, JSON-able data (integers scaled from microseconds),
  and the scale."""
  graph = problem.graph
  names = list(problem.order)
  num = problem.num_devices
  comm = problem.cluster.comm
  durations = {n: problem.compute_us(n) for n in names}
  delays: dict[tuple[str, str], float] = {}
  for e in graph.edges:
    if not e.is_control and num > 1:
      worst = max(comm.transfer_us(e.bytes, a, b) for a in range(num)
                  for b in range(num) if a != b)
      delays[(e.src, e.dst)] = max(delays.get((e.src, e.dst), 0.0), worst)
  horizon_us = sum(durations.values()) + sum(delays.values())
  scale = 1e6 / horizon_us if horizon_us > 0 else 1.0
  # Received copies per device: (src, port) -> (bytes, consumers).
  tensors: dict[str, list] = {}
  for e in graph.edges:
    if not e.is_control and e.bytes > 0:
      key = f"{e.src}:{e.src_output}"
      entry = tensors.setdefault(key, [e.src, 0, []])
      entry[1] = max(entry[1], e.bytes)
      entry[2].append(e.dst)
  data = {
      "names": names,
      "num_devices": num,
      "duration": {n: int(math.ceil(durations[n] * scale)) for n in names},
      "allowed": {n: list(problem.allowed[problem.group_of[n]])
                  for n in names},
      "groups": [list(m) for m in problem.members.values() if len(m) > 1],
      "edges": [[e.src, e.dst,
                 0 if e.is_control else int(math.ceil(
                     delays.get((e.src, e.dst), 0.0) * scale))]
                for e in graph.edges],
      "memory": {n: int(problem.memory[n]) for n in names},
      "caps": [None if math.isinf(c) else int(c) for c in problem.caps],
      "tensors": list(tensors.values()),
      "hint": None if hint is None else {n: hint[n] for n in names},
      "hint_starts": None if hint_starts is None else {
          n: int(hint_starts[n] * scale) for n in names},
  }
  return data, scale


def solve_model_data(data: dict) -> dict:
  """Builds and solves the CP-SAT model of `_model_data`'s output.

  Returns {"status", "objective", "bound", "devices"} (scaled units).
  """
  from ortools.sat.python import cp_model  # imported here: heavy

  names, num = data["names"], data["num_devices"]
  dur = data["duration"]
  horizon = sum(dur.values()) + sum(d for _, _, d in data["edges"]) + 1
  model = cp_model.CpModel()
  start = {n: model.new_int_var(0, horizon, f"s[{n}]") for n in names}
  end = {n: model.new_int_var(0, horizon, f"e[{n}]") for n in names}
  on = {}
  per_device = [[] for _ in range(num)]
  for n in names:
    literals = []
    for d in data["allowed"][n]:
      lit = model.new_bool_var(f"x[{n},{d}]")
      on[(n, d)] = lit
      literals.append(lit)
      per_device[d].append(model.new_optional_interval_var(
          start[n], dur[n], end[n], lit, f"i[{n},{d}]"))
    model.add_exactly_one(literals)
    model.add(end[n] == start[n] + dur[n])
  for d in range(num):
    model.add_no_overlap(per_device[d])
  for members in data["groups"]:
    head = members[0]
    for m in members[1:]:
      for d in data["allowed"][head]:
        model.add(on[(m, d)] == on[(head, d)])
  # Precedence, with the transfer delay when the endpoints differ.
  for src, dst, delay in data["edges"]:
    model.add(start[dst] >= end[src])
    if delay > 0:
      same = model.new_bool_var(f"same[{src},{dst}]")
      for d in range(num):
        a, b = on.get((src, d)), on.get((dst, d))
        if a is not None and b is not None:
          model.add_implication(same, a).only_enforce_if(b)
          model.add_bool_or([same, a.Not(), b.Not()])
        elif b is not None:
          model.add_implication(b, same.Not())
      model.add(start[dst] >= end[src] + delay).only_enforce_if(same.Not())
  # Memory: static bytes plus one received copy per (tensor, device).
  for d, cap in enumerate(data["caps"]):
    if cap is None:
      continue
    terms = [data["memory"][n] * on[(n, d)] for n in names if (n, d) in on]
    for src, nbytes, consumers in data["tensors"]:
      here = [v for v in consumers if (v, d) in on]
      if not here:
        continue
      copy = model.new_bool_var(f"copy[{src},{d}]")
      src_here = on.get((src, d))
      for v in here:
        # v on d and src elsewhere => the copy lives on d.
        if src_here is None:
          model.add_implication(on[(v, d)], copy)
        else:
          model.add_bool_or([copy, on[(v, d)].Not(), src_here])
      terms.append(nbytes * copy)
    model.add(sum(terms) <= cap)
  makespan = model.new_int_var(0, horizon, "makespan")
  model.add_max_equality(makespan, [end[n] for n in names])
  model.minimize(makespan)
  if data["hint"] is not None:
    for (n, d), lit in on.items():
      model.add_hint(lit, data["hint"][n] == d)
    if data["hint_starts"] is not None:
      for n in names:
        model.add_hint(start[n], data["hint_starts"][n])
  solver = cp_model.CpSolver()
  solver.parameters.num_workers = 1
  solver.parameters.random_seed = data["seed"]
  solver.parameters.max_deterministic_time = data["deterministic_time"]
  status = solver.status_name(solver.solve(model))
  if status not in ("OPTIMAL", "FEASIBLE"):
    return {"status": status, "objective": 0.0, "bound": 0.0, "devices": {}}
  return {"status": status, "objective": solver.objective_value,
          "bound": solver.best_objective_bound,
          "devices": {n: next(d for d in range(num) if (n, d) in on and
                              solver.boolean_value(on[(n, d)]))
                      for n in names}}


def _solve_in_child(data: dict) -> dict:
  """`solve_model_data` in a fresh interpreter that never loads TensorFlow."""
  import json  # pylint: disable=g-import-not-at-top
  import subprocess
  import sys

  done = subprocess.run(
      [sys.executable, "-c",
       "import json, sys; from tfopt.placement.exact import solve_model_data;"
       " json.dump(solve_model_data(json.load(sys.stdin)), sys.stdout)"],
      input=json.dumps(data), capture_output=True, text=True, check=False,
      env=_child_env())
  if done.returncode != 0:
    raise ExactSolverError(f"The exact placer's solver process failed "
                           f"(exit {done.returncode}): "
                           f"{done.stderr[-2000:]}")
  try:
    return json.loads(done.stdout)
  except ValueError:
    raise ExactSolverError(f"The exact placer's solver process answered "
                           f"no plan: {done.stdout[-500:]!r}") from None


def _child_env() -> dict:
  import os  # pylint: disable=g-import-not-at-top
  import sys
  env = dict(os.environ)
  # The child must import this same tfopt.
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  env["PYTHONPATH"] = os.pathsep.join([root] + sys.path[1:])
  return env
