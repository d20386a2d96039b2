"""The exact CP-SAT placer: optimal on tiny graphs, never worse than the
heuristic it starts from, and a repair where greedy placers dead-end."""

import pytest

from tfopt import Cluster, CommModel, CostModel, OpCost
from tfopt.graph import Edge, Op, OpGraph
from tfopt.graph.synthetic import layered_dag, total_memory
from tfopt.placement import (InfeasiblePlacement, make_problem, m_topo,
                             place)
from tfopt.placement.exact import exact

FREE = CommModel.uniform(0.0, 1e9)


def test_optimal_on_a_fork():
  g = OpGraph([Op(n, "X", (1000,)) for n in "abcd"],
              [Edge("a", "b", 0, 0, 1000), Edge("a", "c", 0, 0, 1000),
               Edge("b", "d", 0, 0, 1000), Edge("c", "d", 0, 0, 1000)])
  costs = {"a": 1.0, "b": 5.0, "c": 5.0, "d": 1.0}
  result = exact(make_problem(g, Cluster.uniform(2, comm=FREE), costs))
  assert result.status == "OPTIMAL" and result.gap == 0.0
  assert result.placement["b"] != result.placement["c"]
  assert result.objective_us == pytest.approx(7.0, rel=1e-3)
  # With slow links the optimum keeps the fork on one device: 12 us.
  slow = Cluster.uniform(2, comm=CommModel.uniform(100.0, 0.001))
  result = exact(make_problem(g, slow, costs))
  assert len(set(result.placement.values())) == 1
  assert result.objective_us == pytest.approx(12.0, rel=1e-3)


def test_memory_forces_the_optimal_packing_where_greedy_fill_dead_ends():
  # Independent ops of 50, 34, 50, 33, 33 bytes on 2 x 100 B: filling in
  # order puts 50 + 34 on device 0 and then cannot place the last 33.
  sizes = {"a": 50, "b": 34, "c": 50, "d": 33, "e": 33}
  g = OpGraph([Op(n, "X", (0,)) for n in sizes], [])
  costs = CostModel({n: OpCost(1.0, persistent_bytes=b)
                     for n, b in sizes.items()})
  problem = make_problem(g, Cluster.uniform(2, 100, comm=FREE), costs)
  with pytest.raises(InfeasiblePlacement):
    m_topo(problem, "fill")
  result = exact(problem)
  loads = [sum(sizes[n] for n in sizes if result.placement[n] == d)
           for d in (0, 1)]
  assert sorted(loads) == [100, 100]
  assert result.objective_us == pytest.approx(3.0, rel=1e-3)


@pytest.mark.parametrize("seed", range(4))
def test_never_worse_than_the_heuristic_it_starts_from(seed):
  g, costs = layered_dag(20, seed=seed, mean_width=3)
  cluster = Cluster.uniform(3, int(total_memory(g, costs) * 0.6))
  result = place(g, cluster, costs)
  by_name = {c.placer: c for c in result.candidates}
  assert "exact" in by_name and by_name["exact"].feasible
  best_heuristic = min(c.makespan_us for c in result.candidates
                       if c.feasible and c.placer != "exact")
  assert by_name["exact"].makespan_us <= best_heuristic + 1e-6
  assert result.makespan_us <= best_heuristic + 1e-6
  exact_plan = by_name["exact"].placement
  for members in g.colocation_groups.values():
    assert len({exact_plan[m] for m in members}) == 1


def test_named_exact_placer_and_size_limit():
  g, costs = layered_dag(20, seed=1, mean_width=3)
  result = place(g, Cluster.uniform(2), costs, "exact")
  assert result.placer == "exact" and result.schedule.feasible
  big, big_costs = layered_dag(500, seed=0)
  with pytest.raises(ValueError, match="at most 400 ops"):
    exact(make_problem(big, Cluster.uniform(2), big_costs))


def test_proven_infeasible():
  g = OpGraph([Op(n, "X", (0,)) for n in "abc"], [])
  costs = CostModel({n: OpCost(1.0, persistent_bytes=60) for n in "abc"})
  with pytest.raises(InfeasiblePlacement, match="proved"):
    exact(make_problem(g, Cluster.uniform(2, 100), costs))


def test_exact_works_when_tensorflow_was_loaded_first():
  # CP-SAT crashes in a process where TensorFlow loaded first
  # (google/or-tools#3230); tfopt then solves in a child process.
  import pathlib
  import subprocess
  import sys
  script = """
import tensorflow as tf
print(float(tf.reduce_sum(tf.ones([3]))))
from tfopt import _native
assert _native.TENSORFLOW_LOADED_FIRST
from tfopt import Cluster, CommModel
from tfopt.graph import Edge, Op, OpGraph
from tfopt.placement import make_problem
from tfopt.placement.exact import exact
g = OpGraph([Op(n, "X", (1000,)) for n in "abcd"],
            [Edge("a", "b", 0, 0, 1000), Edge("a", "c", 0, 0, 1000),
             Edge("b", "d", 0, 0, 1000), Edge("c", "d", 0, 0, 1000)])
cluster = Cluster.uniform(2, comm=CommModel.uniform(0.0, 1e9))
r = exact(make_problem(g, cluster, dict(a=1.0, b=5.0, c=5.0, d=1.0)))
print(r.status, r.placement["b"] != r.placement["c"])
"""
  root = pathlib.Path(__file__).resolve().parents[2]
  done = subprocess.run([sys.executable, "-c", script], cwd=root,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split()[-2:] == ["OPTIMAL", "True"]


def test_a_crashed_solver_process_is_a_failed_candidate(monkeypatch):
  # The solver's child process dies (here: it cannot import tfopt). The
  # portfolio keeps its other plans and names the crash; only a request for
  # the exact placer alone surfaces the error.
  import importlib
  from tfopt import _native
  # (tfopt.placement.exact the attribute is the function.)
  exact_module = importlib.import_module("tfopt.placement.exact")
  monkeypatch.setattr(_native, "TENSORFLOW_LOADED_FIRST", True)
  monkeypatch.setattr(exact_module, "_child_env",
                      lambda: {"PYTHONPATH": "/nonexistent", "PATH": "/bin",
                               "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1",
                               "PYTHONHOME": "/nonexistent"})
  g, costs = layered_dag(20, seed=0, mean_width=3)
  cluster = Cluster.uniform(3, int(total_memory(g, costs) * 0.6))
  result = place(g, cluster, costs)
  by_name = {c.placer: c for c in result.candidates}
  assert not by_name["exact"].feasible
  assert "solver process failed (exit" in by_name["exact"].error
  assert result.schedule.feasible and result.placer != "exact"
  with pytest.raises(exact_module.ExactSolverError, match="exit"):
    exact(make_problem(g, cluster, costs))
