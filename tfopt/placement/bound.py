"""makespan_bound(problem) -> MakespanBound: no plan finishes sooner.

A proven lower bound on the simulated makespan of every plan that keeps the
problem's constraints (colocation, device types, pins) and that `simulate`
finds within the devices' caps (the cluster's own caps: a placement's
headroom is the placers' margin, not the simulator's test). It is the
largest of three terms, each sound for what the simulator charges:

  * critical path: the longest path, each op at its cheapest device (its
    compute time plus the smallest `op_overhead_us` among the devices its
    group may use), without communication. An op never runs faster than
    its compute time plus its device's overhead (shared cores only slow it
    down) and starts after every input, data or control, is there.
  * work / devices: every op's cheapest time added up, over the most work
    the devices do per unit of time (one op at a time each, or where they
    share cores `ComputeSharing.speed()`).
  * memory LP: which devices may hold which work, as a linear programme
    over colocation groups: x[g, d] >= 0, sum_d x[g, d] = 1, each device's
    work sum_g x[g, d] * w[g, d] <= T (and a core-sharing group's <= its
    speed * T), and its memory sum_g x[g, d] * m[g] <= cap_d for each
    memory row m; minimise T. A device whose cap a group's own memory
    exceeds gets none of it. Where caps push work onto fewer or slower
    devices this beats work / devices.

Memory rows (each a lower bound on a device's liveness peak in the
simulator's model, for the groups it holds):
  * persistent bytes, held all step;
  * at a probe op v (one that takes time), strictly inside v's run: every
    group's persistent bytes, plus each tensor that a group's op produced
    before v and the same group (so the same device) reads at or after v
    -- its buffer is allocated at its producer's start and freed no sooner
    than that reader ends -- plus, for v's own group, v's temp bytes and
    the outputs v allocates (a view's or a possible forward's excepted).
    A training graph's probe near the loss holds every activation that a
    layer keeps for its own backward op.
Each term adds the smallest step overhead the cluster charges a plan
(`Cluster.step_overhead`, over every count of devices), which the
simulator adds to every makespan.

A tensor is counted only where it allocates (views share a buffer), and
two counted tensors never share a buffer: a forward into a counted
tensor's buffer would need that tensor's readers done before the
forwarding op started, before v. The probes are the PROBES ops with the
most bytes so counted, on graphs of at most PROBE_MAX_OPS ops; on larger
graphs persistent bytes and each op's own temp and outputs only.

The LP's value is not trusted as the solver returns it: its dual prices
(beta_d per device row, gamma_s per sharing row, delta per memory row) are
clipped to >= 0 and turned into a bound by weak duality, evaluated here in
float64 on every colocation group:

  T >= (sum_g min_d [(beta_d + gamma_s(d)) w[g, d] + sum delta_d m[g]]
        - sum delta_d cap_d) / (sum beta_d + sum gamma_s speed_s),

true for any non-negative prices, so a solver's tolerance, or an LP solved
on merged groups (graphs with more than LP_MAX_VARIABLES group x device
pairs: groups of equal devices and similar memory per microsecond are
merged for the solve), can weaken the bound but never make it unsound.

Why not on `tfopt.placement.coarsen`'s graph: coarsening merges ops that a
plan may split, so an LP that keeps them together bounds only the plans
that do, not every plan; colocation groups are true constraints. The LP has
a time limit (LP_TIME_LIMIT_S); when it runs out or fails, the bound is the
larger of the first two terms and the note says why.

>>> from tfopt import Cluster
>>> from tfopt.graph import Op, OpGraph
>>> from tfopt.placement import make_problem
>>> g = OpGraph([Op(n, "X") for n in "abcd"], [])   # 4 independent ops
>>> costs = {n: 10.0 for n in "abcd"}
>>> makespan_bound(make_problem(g, Cluster.uniform(2), costs)).us
20.0
"""

from __future__ import annotations

import dataclasses
import math
import time
import types
from typing import Mapping

import numpy as np

from tfopt._errors import invalid_argument
from tfopt.graph import aliasing
from tfopt.graph.opgraph import CONTROL
from tfopt.placement.problem import PlacementProblem

CRITICAL_PATH = "critical path"
WORK = "work / devices"
MEMORY_LP = "memory LP"
TERMS = (CRITICAL_PATH, WORK, MEMORY_LP)

# The LP's wall-time limit (GLOP). On the shipped workloads it solves in a
# few milliseconds; the limit guards graphs no one measured.
LP_TIME_LIMIT_S = 1.0
# Group x device pairs the LP takes as they are; beyond, merged groups.
LP_MAX_VARIABLES = 4_000
# Probe ops (memory rows beside the persistent one), and the graph size up
# to which they are computed (they need every op's ancestors, as bit sets).
PROBES = 8
PROBE_MAX_OPS = 5_000
# Two terms within this relative distance are a tie: the bound is credited
# to the earlier (simpler) term of TERMS.
_TIE = 1e-9
# The memory LP's value where it proves that no plan fits the caps.
_INFEASIBLE = object()


@dataclasses.dataclass(frozen=True)
class MakespanBound:
  """A proven lower bound on the makespan and where it came from.

  Attributes:
    us: the bound, the largest of `terms`.
    term: the term that gave it (one of TERMS; the first of a tie).
    terms: each term computed, name -> microseconds (the memory LP is
      missing when it was not solved).
    note: why the memory LP is missing, "" when it was solved.
    feasible: False where the memory rows prove that no plan fits the caps
      (a group no device can hold, or no fractional assignment); the bound
      is then the other terms'.
  """
  us: float
  term: str
  terms: Mapping[str, float]
  note: str = ""
  feasible: bool = True

  def describe(self) -> str:
    """One line: '337.43 ms (critical path; work / devices 130.11 ms, ...)'."""
    others = ", ".join(f"{name} {value / 1e3:,.2f} ms"
                       for name, value in self.terms.items()
                       if name != self.term)
    note = f"; {self.note}" if self.note else ""
    return (f"{self.us / 1e3:,.2f} ms ({self.term}"
            + (f"; {others}" if others else "") + f"{note})")


def makespan_bound(problem: PlacementProblem, *,
                   time_limit_s: float = LP_TIME_LIMIT_S) -> MakespanBound:
  """The lower bound of the module doc for `problem`'s graph, costs,
  devices, caps and constraints.

  Args:
    problem: from `make_problem`.
    time_limit_s: the memory LP's wall-time limit, seconds > 0.
  """
  if not isinstance(problem, PlacementProblem):
    raise invalid_argument("problem", "a PlacementProblem (make_problem)",
                           problem)
  if isinstance(time_limit_s, bool) or \
      not isinstance(time_limit_s, (int, float)) or not time_limit_s > 0:
    raise invalid_argument("time_limit_s", "a number of seconds > 0",
                           time_limit_s)
  data = _Data(problem)
  terms = {CRITICAL_PATH: _critical_path(problem, data),
           WORK: _work_over_devices(problem, data)}
  lp, note = _memory_lp(problem, data, float(time_limit_s))
  if isinstance(lp, float):
    terms[MEMORY_LP] = lp
  # Every plan pays the step overhead of the devices it uses, at least
  # the smallest the cluster charges.
  overheads = problem.cluster.step_overhead_us
  if overheads:
    least = min(problem.cluster.step_overhead(k)
                for k in range(1, len(problem.cluster) + 1))
    terms = {name: value + least for name, value in terms.items()}
  best = max(terms.values())
  term = next(name for name in TERMS if name in terms and
              terms[name] >= best - _TIE * abs(best))
  return MakespanBound(best, term, types.MappingProxyType(terms), note,
                       feasible=lp is not _INFEASIBLE)


class _Data:
  """The problem as arrays over colocation groups and devices."""

  def __init__(self, problem: PlacementProblem):
    cluster = problem.cluster
    self.groups = list(problem.members)
    self.index = {g: k for k, g in enumerate(self.groups)}
    self.num_devices = len(cluster)
    self.overhead = np.array([d.op_overhead_us for d in cluster.devices])
    self.caps = np.array([math.inf if d.memory_bytes is None else
                          float(d.memory_bytes) for d in cluster.devices])
    self.allowed = [problem.allowed[g] for g in self.groups]
    self.allowed_mask = np.zeros((len(self.groups), self.num_devices), bool)
    for k, devices in enumerate(self.allowed):
      self.allowed_mask[k, list(devices)] = True
    # Each op's cheapest overhead: the smallest among its group's devices.
    self.cheapest = {g: float(min(self.overhead[list(a)]))
                     for g, a in zip(self.groups, self.allowed)}
    compute = np.array([sum(problem.compute_us(n) for n in problem.members[g])
                        for g in self.groups])
    sizes = np.array([len(problem.members[g]) for g in self.groups])
    # w[g, d]: the group's work on device d.
    self.work = compute[:, None] + sizes[:, None] * self.overhead[None, :]
    self.persistent = np.array(
        [float(sum(problem.costs[n].persistent_bytes
                   for n in problem.members[g])) for g in self.groups])


def _critical_path(problem: PlacementProblem, data: _Data) -> float:
  finish: dict[str, float] = {}
  graph = problem.graph
  for name in problem.order:
    start = max((finish[e.src] for e in graph.in_edges(name)), default=0.0)
    finish[name] = (start + problem.compute_us(name)
                    + data.cheapest[problem.group_of[name]])
  return max(finish.values(), default=0.0)


def _speeds(problem: PlacementProblem):
  """(per-device row speeds or None, {sharing group: (devices, speed)}):
  a device without a thread pool runs one op at a time at full speed at
  most (speed 1); a sharing group's ops together at most
  `ComputeSharing.group_speed` ops' worth (only groups where that binds
  more than their devices' own rows get a row)."""
  sharing, num = problem.cluster.sharing, problem.num_devices
  if sharing is None:
    return [1.0] * num, {}
  members: dict[int, list[int]] = {}
  for d, g in enumerate(sharing.groups):
    members.setdefault(g, []).append(d)
  device_rows = None if sharing.threads is not None else [1.0] * num
  rows = {}
  for g, devices in members.items():
    speed = sharing.group_speed(len(devices))
    if device_rows is None or speed < len(devices):
      rows[g] = (tuple(devices), speed)
  return device_rows, rows


def _work_over_devices(problem: PlacementProblem, data: _Data) -> float:
  sharing = problem.cluster.sharing
  speed = float(problem.num_devices) if sharing is None else sharing.speed()
  total = sum(problem.compute_us(n) + data.cheapest[problem.group_of[n]]
              for n in problem.order)
  return total / speed


# ---------------------------------------------------------------- memory

def _memory_rows(problem: PlacementProblem, data: _Data):
  """(rows: list of per-group byte arrays, own: per group, the most bytes
  its ops alone hold on its device at some moment)."""
  rows = [data.persistent]
  own = data.persistent.copy()
  graph, costs, rank = problem.graph, problem.costs, problem.rank
  running = {}  # op taking time -> its temp + the outputs it allocates
  for name in problem.order:
    if costs[name].compute_us > 0:
      op = graph[name]
      allocated = aliasing.allocated_output_bytes(op)
      if aliasing.may_forward(op):
        allocated -= aliasing.allocated_bytes(op, 0)
      running[name] = float(costs[name].temp_bytes + allocated)
  if len(graph) > PROBE_MAX_OPS:
    for name, nbytes in running.items():
      k = data.index[problem.group_of[name]]
      own[k] = max(own[k], data.persistent[k] + nbytes)
    return rows, own
  # kept[g][i]: bytes of group g's kept tensors live strictly inside the
  # run of the op of topological rank i (groups that keep none left out).
  n = len(problem.order)
  kept: dict[int, np.ndarray] = {}
  for k, span, size in _kept_tensors(problem):
    bits = np.unpackbits(np.frombuffer(span.to_bytes((n + 7) // 8, "little"),
                                       dtype=np.uint8), bitorder="little")[:n]
    kept[k] = kept.get(k, np.zeros(n)) + size * bits
  everyone = sum(kept.values(), np.zeros(n))
  totals = {}
  for name, nbytes in running.items():
    k, i = data.index[problem.group_of[name]], rank[name]
    mine = kept[k][i] if k in kept else 0.0
    own[k] = max(own[k], data.persistent[k] + nbytes + mine)
    totals[name] = nbytes + float(everyone[i])
  # Probes: the ops with the most bytes held by all groups together.
  for v in sorted(totals, key=lambda m: (-totals[m], rank[m]))[:PROBES]:
    row = data.persistent.copy()
    for k, held in kept.items():
      row[k] += held[rank[v]]
    row[data.index[problem.group_of[v]]] += running[v]
    rows.append(row)
  return rows, own


def _kept_tensors(problem: PlacementProblem) -> list[tuple[int, int, float]]:
  """(group index, span, bytes) per tensor that allocates and that some op
  of its producer's colocation group reads: span has the bit of each op
  (by topological rank) strictly inside whose run the tensor is live on
  that group's device: strict descendants of the producer that are
  ancestors of, or are, such a reader."""
  graph, rank, group_of = problem.graph, problem.rank, problem.group_of
  order = problem.order
  index = {g: k for k, g in enumerate(problem.members)}
  readers: dict[tuple[str, int], list[str]] = {}
  for e in graph.edges:
    if e.is_control or e.src_output == CONTROL or \
        group_of[e.src] != group_of[e.dst]:
      continue
    op = graph[e.src]
    if aliasing.allocated_bytes(op, e.src_output) <= 0:
      continue
    readers.setdefault((e.src, e.src_output), []).append(e.dst)
  if not readers:
    return []
  anc = [0] * len(order)
  for i, name in enumerate(order):
    for e in graph.in_edges(name):
      j = rank[e.src]
      anc[i] |= anc[j] | (1 << j)
  desc = [0] * len(order)
  for i in range(len(order) - 1, -1, -1):
    for e in graph.out_edges(order[i]):
      j = rank[e.dst]
      desc[i] |= desc[j] | (1 << j)
  out = []
  for (src, port), names in readers.items():
    until = 0
    for r in names:
      until |= anc[rank[r]] | (1 << rank[r])
    span = desc[rank[src]] & until
    if span:
      out.append((index[group_of[src]], span,
                  float(aliasing.allocated_bytes(graph[src], port))))
  return out


# -------------------------------------------------------------------- LP

def _memory_lp(problem: PlacementProblem, data: _Data,
               time_limit_s: float) -> tuple[object, str]:
  """(the certified LP bound, None, or _INFEASIBLE; a note unless it is a
  bound)."""
  finite = np.isfinite(data.caps)
  rows, own = _memory_rows(problem, data) if finite.any() else ([], None)
  mask = data.allowed_mask.copy()
  if own is not None:
    mask &= own[:, None] <= data.caps[None, :]
  empty = np.flatnonzero(~mask.any(axis=1))
  if empty.size:
    k = int(empty[0])
    return _INFEASIBLE, (
        f"memory LP: no device's cap holds colocation group "
        f"{data.groups[k]!r} ({own[k]:,.0f} bytes at once): no plan fits")
  device_rows, group_rows = _speeds(problem)
  if not finite.any() and mask.all() and len(set(data.overhead)) <= 1:
    return None, ""  # the LP would be work / devices exactly
  memory = np.array(rows) if rows else np.zeros((0, len(data.groups)))
  items = _items(data, mask, memory)
  if items is None:
    return None, (f"memory LP: more than {LP_MAX_VARIABLES:,} group x "
                  "device pairs even with similar groups merged; not solved")
  merged = items[0] is not data.work
  prices = _solve(items, data.caps, device_rows, group_rows, time_limit_s)
  if prices is _INFEASIBLE:
    if merged:  # merging restricts the LP: no proof about the groups
      return None, "memory LP: infeasible with similar groups merged; not used"
    return _INFEASIBLE, ("memory LP: infeasible, no assignment of the "
                         "groups, even fractional, fits the caps")
  if isinstance(prices, str):
    return None, prices
  return _certified(data.work, mask, memory, data.caps, device_rows,
                    group_rows, *prices), ""


def _items(data: _Data, mask: np.ndarray, memory: np.ndarray):
  """(work, mask, memory) of the LP to solve: the groups themselves, or,
  where they are too many, merged groups of equal devices and memory per
  microsecond within a factor (coarser until they fit). None if nothing
  fits."""
  if mask.sum() <= LP_MAX_VARIABLES:
    return data.work, mask, memory
  scale = np.maximum(data.work.min(axis=1), 1e-12)
  density = memory / scale[None, :]
  with np.errstate(divide="ignore"):
    log_density = np.where(density > 0, np.log(np.maximum(density, 1e-300)),
                           -np.inf)
  for base in (1.25, 2.0, 4.0, 16.0, 256.0):
    buckets = np.floor(log_density / math.log(base)).T
    keys = np.concatenate([mask.astype(float), buckets], axis=1)
    first, inverse = np.unique(keys, axis=0, return_index=True,
                               return_inverse=True)[1:]
    inverse = inverse.reshape(-1)
    merged_mask = mask[first]
    if merged_mask.sum() > LP_MAX_VARIABLES:
      continue
    work = np.zeros((len(first), data.num_devices))
    np.add.at(work, inverse, data.work)
    merged_memory = np.zeros((memory.shape[0], len(first)))
    np.add.at(merged_memory.T, inverse, memory.T)
    return work, merged_mask, merged_memory
  return None


def _solve(items, caps, device_rows, group_rows, time_limit_s: float):
  """The LP's dual prices (beta per device, gamma per sharing group,
  delta per memory row and device), _INFEASIBLE, or a note saying why
  there are none."""
  from ortools.linear_solver import pywraplp  # imported here: heavy
  work, mask, memory = items
  num_items, num_devices = work.shape
  solver = pywraplp.Solver.CreateSolver("GLOP")
  solver.SetTimeLimit(max(1, int(time_limit_s * 1000)))
  inf = solver.infinity()
  makespan = solver.NumVar(0.0, inf, "T")
  on = [[] for _ in range(num_devices)]  # (item, variable) per device
  for k in range(num_items):
    assign = solver.Constraint(1.0, 1.0)
    for d in np.flatnonzero(mask[k]):
      var = solver.NumVar(0.0, inf, "")
      assign.SetCoefficient(var, 1.0)
      on[int(d)].append((k, var))

  def load_row(devices, speed):
    row = solver.Constraint(-inf, 0.0)
    row.SetCoefficient(makespan, -float(speed))
    for d in devices:
      for k, var in on[d]:
        row.SetCoefficient(var, float(work[k, d]))
    return row

  device_con = {}
  if device_rows is not None:
    for d, speed in enumerate(device_rows):
      device_con[d] = load_row((d,), speed)
  group_con = {g: load_row(devices, speed)
               for g, (devices, speed) in group_rows.items()}
  memory_con = {}
  for r in range(memory.shape[0]):
    for d in range(num_devices):
      if math.isfinite(caps[d]) and on[d]:
        row = solver.Constraint(-inf, float(caps[d]))
        for k, var in on[d]:
          row.SetCoefficient(var, float(memory[r, k]))
        memory_con[r, d] = row
  objective = solver.Objective()
  objective.SetCoefficient(makespan, 1.0)
  objective.SetMinimization()
  started = time.perf_counter()
  status = solver.Solve()
  if status == pywraplp.Solver.INFEASIBLE:
    return _INFEASIBLE
  if status != pywraplp.Solver.OPTIMAL:
    names = {getattr(pywraplp.Solver, n): n for n in (
        "FEASIBLE", "UNBOUNDED", "ABNORMAL", "MODEL_INVALID", "NOT_SOLVED")}
    spent = time.perf_counter() - started
    return (f"memory LP: not solved ({names.get(status, status)} after "
            f"{spent:.2f} s, limit {time_limit_s:g} s)")
  # Minimising, GLOP's dual value of a <= row is <= 0: its price is minus.
  beta = np.zeros(num_devices)
  for d, con in device_con.items():
    beta[d] = max(0.0, -con.dual_value())
  gamma = {g: max(0.0, -con.dual_value()) for g, con in group_con.items()}
  delta = np.zeros((memory.shape[0], num_devices))
  for (r, d), con in memory_con.items():
    delta[r, d] = max(0.0, -con.dual_value())
  return beta, gamma, delta


def _certified(work, mask, memory, caps, device_rows, group_rows, beta,
               gamma, delta) -> float:
  """The weak-duality bound of the module doc from non-negative prices,
  over every group (not the merged items the LP may have solved)."""
  per_device = beta.copy()
  speed_sum = float(sum(beta[d] * s for d, s in enumerate(device_rows))
                    if device_rows is not None else 0.0)
  for g, (devices, speed) in group_rows.items():
    per_device[list(devices)] += gamma[g]
    speed_sum += gamma[g] * speed
  if speed_sum <= 0.0:
    return 0.0
  caps_used = np.where(np.isfinite(caps), caps, 0.0)
  delta = np.where(np.isfinite(caps)[None, :], delta, 0.0)
  cost = work * per_device[None, :] + memory.T @ delta
  cost = np.where(mask, cost, np.inf)
  value = float(cost.min(axis=1).sum()) - float((delta * caps_used).sum())
  return max(0.0, value / speed_sum)
