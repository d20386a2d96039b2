"""m-SCT (Baechi, after Hanen and Munier's SCT): favourite children.

1. The LP relaxation (OR-Tools GLOP; PDLP above PDLP_MIN_EDGES edges), under
   a time limit: one variable x_ij in [0, 1] per data edge, x_ij = 0 meaning
   "j is i's favourite child: no transfer between them"; starts s_i >= 0,
       s_j >= s_i + p_i + c_ij * x_ij       for every edge,
       sum_j x_ij >= |succ(i)| - 1          (at most one favourite child),
       sum_i x_ij >= |pred(j)| - 1          (at most one favourite parent),
       w >= s_i + p_i,  minimize w,
   where c_ij is the edge's transfer time under the cluster's CommModel.
2. Rounding with repair: an edge with x_ij < THRESHOLD (1/2, Hanen and
   Munier's threshold) becomes a favourite; then every op keeps at most one
   favourite child and one favourite parent, the smallest x_ij winning (ties:
   topological order), so the result always satisfies the guarantee.
3. List scheduling as m-ETF (memory caps, channel-aware timeline), with the
   favourites: a favourite child goes to its favourite parent's device
   whenever memory allows, and on that device it wins every tie.

Tactical idling, in the form used here: once a favourite child is ready (all
its parents are scheduled, so its start on the parent's device is known),
that device is held for it: other work may use the device only if it ends
before the child starts (filling the gap); anything longer waits until the
child has run. A device is not held for a child whose other parents are not
scheduled yet: under memory caps that can deadlock (another parent may need
the held device). If the LP does not solve within its limit, m-SCT runs as
m-ETF (no favourites).
"""

from __future__ import annotations

import dataclasses
import time

from tfopt.placement.m_etf import m_etf
from tfopt.placement.placement import Placement
from tfopt.placement.problem import PlacementProblem

THRESHOLD = 0.5
PDLP_MIN_EDGES = 50_000


@dataclasses.dataclass(frozen=True)
class FavouriteChildren:
  """The LP's outcome: favourite child per op, and how it was solved."""
  child: dict[str, str]
  solver: str
  status: str
  lp_makespan_us: float
  seconds: float


def favourite_children(problem: PlacementProblem, *,
                       time_limit_s: float = 10.0,
                       solver_name: str | None = None) -> FavouriteChildren:
  """Solves the LP and rounds it (steps 1 and 2 of the module doc)."""
  from ortools.linear_solver import pywraplp  # imported here: heavy

  started = time.perf_counter()
  graph = problem.graph
  comm = problem.cluster.comm
  edges = {}
  for e in graph.edges:
    if e.is_control or e.src == e.dst:
      continue
    key = (e.src, e.dst)
    edges[key] = max(edges.get(key, 0.0), comm.transfer_us(e.bytes))
  if solver_name is None:
    solver_name = "PDLP" if len(edges) >= PDLP_MIN_EDGES else "GLOP"
  solver = pywraplp.Solver.CreateSolver(solver_name)
  params = pywraplp.MPSolverParameters()
  if solver_name == "GLOP":
    # Dual simplex: 3 s instead of 14 s on a 4,000-op graph here. Set through
    # MPSolverParameters: SetSolverSpecificParametersAsString parses a text
    # proto and crashed the process when TensorFlow was loaded beside it.
    params.SetIntegerParam(pywraplp.MPSolverParameters.LP_ALGORITHM,
                           pywraplp.MPSolverParameters.DUAL)
  solver.SetTimeLimit(int(time_limit_s * 1000))
  start = {n: solver.NumVar(0.0, solver.infinity(), "") for n in problem.order}
  x = {key: solver.NumVar(0.0, 1.0, "") for key in edges}
  makespan = solver.NumVar(0.0, solver.infinity(), "w")
  children: dict[str, list] = {}
  parents: dict[str, list] = {}
  for (i, j), c in edges.items():
    solver.Add(start[j] >= start[i] + problem.compute_us(i) + c * x[(i, j)])
    children.setdefault(i, []).append(x[(i, j)])
    parents.setdefault(j, []).append(x[(i, j)])
  for group in (children, parents):
    for xs in group.values():
      if len(xs) > 1:
        solver.Add(solver.Sum(xs) >= len(xs) - 1)
  for e in graph.edges:  # control edges: order only
    if e.is_control:
      solver.Add(start[e.dst] >= start[e.src] + problem.compute_us(e.src))
  for n in graph.sinks():  # elsewhere implied by the edges
    solver.Add(makespan >= start[n] + problem.compute_us(n))
  solver.Minimize(makespan)
  status = solver.Solve(params)
  if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
    return FavouriteChildren({}, solver_name, "not solved", float("nan"),
                             time.perf_counter() - started)
  value = {key: var.solution_value() for key, var in x.items()}
  rank = problem.rank
  # Rounding with repair: best edges first, each op at most one favourite
  # child and at most one favourite parent.
  chosen_child: dict[str, str] = {}
  has_parent: set = set()
  for (i, j) in sorted((k for k, v in value.items() if v < THRESHOLD),
                       key=lambda k: (value[k], rank[k[0]], rank[k[1]])):
    if i in chosen_child or j in has_parent:
      continue
    chosen_child[i] = j
    has_parent.add(j)
  return FavouriteChildren(
      chosen_child, solver_name,
      "optimal" if status == pywraplp.Solver.OPTIMAL else "feasible",
      makespan.solution_value(), time.perf_counter() - started)


def m_sct(problem: PlacementProblem, *, reserve: float | None = None,
          max_devices: int | None = None, time_limit_s: float = 10.0,
          favourites: FavouriteChildren | None = None) -> Placement:
  """Places `problem` with m-SCT; raises InfeasiblePlacement on dead-end."""
  if favourites is None:
    favourites = favourite_children(problem, time_limit_s=time_limit_s)
  return m_etf(problem, reserve=reserve, max_devices=max_devices,
               favourite_child=favourites.child)
