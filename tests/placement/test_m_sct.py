"""m-SCT: the favourite-child LP, its rounding guarantee, and placement."""

import collections

import pytest

from tfopt import Cluster, CommModel
from tfopt.graph import Edge, Op, OpGraph
from tfopt.graph.synthetic import layered_dag, total_memory
from tfopt.placement import favourite_children, m_sct, make_problem, place
from tfopt.simulate import simulate

SLOW = CommModel.uniform(100.0, 0.001)


def test_a_fork_gets_exactly_one_favourite_child():
  # a -> b (5 us) and a -> c (1 us), both tensors slow to move: the LP may
  # spare only one transfer out of a; it spares the one on the longer path.
  g = OpGraph([Op(n, "X", (1000,)) for n in "abc"],
              [Edge("a", "b", 0, 0, 1000), Edge("a", "c", 0, 0, 1000)])
  costs = {"a": 1.0, "b": 5.0, "c": 1.0}
  fav = favourite_children(make_problem(g, Cluster.uniform(2, comm=SLOW),
                                        costs))
  assert fav.status == "optimal" and fav.solver == "GLOP"
  assert fav.child == {"a": "b"}
  # The relaxation splits the one transfer it must pay (1100 us) between
  # the paths: 1 + 1100 x + 5 = 1 + 1100 (1 - x) + 1, so x_ab = 0.498 (< 1/2:
  # b is the favourite) and the LP makespan is 554 us.
  assert fav.lp_makespan_us == pytest.approx(554.0)


def test_a_chain_keeps_every_edge_favourite():
  g = OpGraph([Op(f"o{i}", "X", (1000,)) for i in range(5)],
              [Edge(f"o{i}", f"o{i + 1}", 0, 0, 1000) for i in range(4)])
  costs = {f"o{i}": 1.0 for i in range(5)}
  problem = make_problem(g, Cluster.uniform(3, comm=SLOW), costs)
  assert favourite_children(problem).child == {f"o{i}": f"o{i + 1}"
                                               for i in range(4)}
  p = m_sct(problem)
  assert len(set(p.values())) == 1
  assert simulate(g, p, costs, problem.cluster).makespan_us == 5.0


@pytest.mark.parametrize("seed", range(5))
def test_rounding_guarantee_and_favourites_share_a_device(seed):
  g, costs = layered_dag(200, seed=seed, mean_width=5)
  problem = make_problem(g, Cluster.uniform(4), costs)
  fav = favourite_children(problem)
  assert fav.child  # the LP found some favourites
  parents = collections.Counter(fav.child.values())
  assert max(parents.values()) == 1  # at most one favourite parent
  for parent, child in fav.child.items():  # (one child per parent: a dict)
    assert child in g.successors(parent)
  placement = m_sct(problem, favourites=fav)
  # Uncapped memory: every favourite child free to move sits with its
  # parent (one in a colocation group may already be bound elsewhere).
  free = [(p, c) for p, c in fav.child.items() if g[c].colocation is None]
  assert free
  assert all(placement[p] == placement[c] for p, c in free)


def test_m_sct_in_the_portfolio_under_tight_memory():
  g, costs = layered_dag(300, seed=2)
  cluster = Cluster.uniform(4, int(total_memory(g, costs) * 0.35))
  result = place(g, cluster, costs, "m-sct")
  assert result.placer == "m-sct" and result.schedule.feasible
  auto = place(g, cluster, costs)
  assert "m-sct" in {c.placer for c in auto.candidates}
  assert auto.makespan_us <= result.makespan_us


def test_tactical_idling_holds_the_device_for_the_favourite_child():
  # p (1 us) feeds its favourite child j (1 us), which feeds its favourite
  # child k (100 us); j also needs q (3 us, free copy). x (100 us) is ready
  # from the start. Without idling, x takes p's device at t=1, j waits until
  # 101 and k ends at 202. Held for j, the device runs j at 3 and k at 4
  # (ending at 104), and x goes to the other device after q (3 to 103).
  free = CommModel.uniform(0.0, 1e9)
  g = OpGraph([Op(n, "X", (8,)) for n in ("p", "q", "j", "k", "x")],
              [Edge("p", "j", 0, 0, 8), Edge("q", "j", 0, 1, 8),
               Edge("j", "k", 0, 0, 8)])
  costs = {"p": 1.0, "q": 3.0, "j": 1.0, "k": 100.0, "x": 100.0}
  problem = make_problem(g, Cluster.uniform(2, comm=free), costs)
  given = type(favourite_children(problem))({"p": "j", "j": "k"}, "given",
                                            "optimal", 0.0, 0.0)
  placement = m_sct(problem, favourites=given)
  s = simulate(g, placement, costs, problem.cluster)
  assert placement["p"] == placement["j"] == placement["k"] != placement["x"]
  assert s.start_us["j"] == pytest.approx(3.0)
  assert s.makespan_us == pytest.approx(104.0)
