"""Placers on hand-computed tiny graphs, their constraints and errors, and
properties that must hold on random DAGs."""

import itertools

import numpy as np
import pytest

from tfopt import (Cluster, CommModel, ComputeSharing, CostModel, Device,
                   OpCost)
from tfopt.graph import Edge, Op, OpGraph
from tfopt.graph.synthetic import layered_dag, total_memory
from tfopt.placement import (InfeasiblePlacement, Placement, m_etf, m_topo,
                             make_problem, place)
from tfopt.simulate import simulate
from tfopt.placement.api import plan_lower_bound

FREE = CommModel.uniform(0.0, 1e9)
SLOW = CommModel.uniform(100.0, 0.001)  # 1000 B take 1 s


def _chain(n, mem=100):
  g = OpGraph([Op(f"o{i}", "X", output_bytes=(mem,)) for i in range(n)],
              [Edge(f"o{i}", f"o{i + 1}", 0, 0, mem) for i in range(n - 1)])
  return g, CostModel({f"o{i}": OpCost(1.0) for i in range(n)})


def test_m_topo_balanced_and_fill_on_a_chain():
  g, costs = _chain(4)  # 100 B each (+ 100 B copy at the cut)
  cluster = Cluster.uniform(2, 10_000)
  balanced = m_topo(make_problem(g, cluster, costs), "balanced")
  assert [balanced[f"o{i}"] for i in range(4)] == [0, 0, 1, 1]
  fill = m_topo(make_problem(g, Cluster.uniform(2, 300), costs), "fill")
  assert [fill[f"o{i}"] for i in range(4)] == [0, 0, 0, 1]


FORK = OpGraph([Op(n, "X", output_bytes=(1000,)) for n in "abcd"],
               [Edge("a", "b", 0, 0, 1000), Edge("a", "c", 0, 0, 1000),
                Edge("b", "d", 0, 0, 1000), Edge("c", "d", 0, 0, 1000)])
FORK_COSTS = {"a": 1.0, "b": 5.0, "c": 5.0, "d": 1.0}


def test_m_etf_splits_a_fork_when_transfers_are_free():
  cluster = Cluster.uniform(2, comm=FREE)
  p = m_etf(make_problem(FORK, cluster, FORK_COSTS))
  assert p["b"] != p["c"]
  assert simulate(FORK, p, FORK_COSTS, cluster).makespan_us == \
      pytest.approx(7.0)


def test_m_etf_keeps_a_fork_together_when_transfers_are_slow():
  cluster = Cluster.uniform(2, comm=SLOW)
  p = m_etf(make_problem(FORK, cluster, FORK_COSTS))
  assert len(set(p.values())) == 1
  assert simulate(FORK, p, FORK_COSTS, cluster).makespan_us == 12.0


@pytest.mark.parametrize("side_us, spread", [(1.5, False), (2.5, True)])
def test_auto_spreads_only_for_a_clear_gain(side_us, spread):
  # A 100 us op beside an independent small one: on one device their sum,
  # on two the larger (nothing to transfer). A 1.5 us side op gains 1.5 %
  # by spreading (under SPREAD_MIN_GAIN, 2 %; over the target gap, 1 %, so
  # the portfolio does not stop at one device): one device, whose plan is
  # reported; 2.5 us gains 2.4 %: two devices.
  g = OpGraph([Op("big", "X"), Op("side", "X")], [])
  costs = {"big": 100.0, "side": side_us}
  result = place(g, Cluster.uniform(2, comm=FREE), costs)
  assert result.single_device_us == 100.0 + side_us
  if spread:
    assert result.placement["big"] != result.placement["side"]
    assert result.makespan_us == 100.0
  else:
    assert result.placer == "single"
    assert set(result.placement.values()) == {0}
    assert result.makespan_us == 100.0 + side_us
    # The faster plan is still among the candidates, with its time, and
    # the report says why one device was kept.
    assert min(c.makespan_us for c in result.candidates
               if c.feasible) == 100.0
    line = next(l for l in result.table().splitlines()
                if l.startswith("single"))
    assert "(kept: m-etf gains 1.5%, under 2%)" in line
    assert line.endswith("<- chosen")


def test_auto_reports_every_candidate_and_picks_the_fastest():
  cluster = Cluster.uniform(2, comm=FREE)
  result = place(FORK, cluster, FORK_COSTS, coarsen=False)
  # m-TOPO's split ties m-ETF's here; the earlier candidate wins a tie.
  assert result.placer in ("m-topo", "m-etf")
  assert result.makespan_us == pytest.approx(7.0)
  assert result.single_device_us == 12.0
  assert result.lower_bound_us == 7.0
  assert {c.placer for c in result.candidates} == {
      "single", "m-topo", "m-topo-fill", "m-etf", "m-sct", "m-topo-live",
      "m-stage", "m-branch", "refine", "exact"}
  # m-TOPO reached the lower bound: what comes after it was not run.
  names = [c.placer for c in result.candidates]
  for c in result.candidates[names.index("m-topo") + 1:]:
    assert c.error.startswith("not run: a plan within the target gap"), c
  assert "<- chosen" in result.table()
  # With no target, everything runs and the first of the tied plans wins.
  full = place(FORK, cluster, FORK_COSTS, coarsen=False, target_gap=0.0,
               refine=False)
  assert not any(c.error and c.error.startswith("not run")
                 for c in full.candidates)


def test_device_types_pins_and_colocation():
  ops = [Op("v", "VarHandleOp", (0,), colocation="loc:@v"),
         Op("read", "ReadVariableOp", (400,), colocation="loc:@v"),
         Op("str", "StringOp", (8,), device_types=("CPU",)),
         Op("mm", "MatMul", (400,))]
  g = OpGraph(ops, [Edge("v", "read", 0, 0, 0), Edge("read", "mm", 0, 0, 400),
                    Edge("str", "mm", 0, 1, 8)])
  costs = {n.name: 1.0 for n in ops}
  cluster = Cluster((Device("/gpu:0", "GPU"), Device("/gpu:1", "GPU"),
                     Device("/cpu:0", "CPU")), FREE)
  for placer in ("m-topo", "m-topo-fill", "m-etf", "auto"):
    p = place(g, cluster, costs, placer, pins={"read": 1}).placement
    assert p["str"] == 2 and p["read"] == p["v"] == 1, placer


def test_errors_name_the_problem():
  g, costs = _chain(3, mem=614_000_000)
  with pytest.raises(InfeasiblePlacement,
                     match="op 'o0' needs 614 MB; the largest device cap it "
                     "may use is 322 MB"):
    place(g, Cluster.uniform(2, 322_000_000), costs)
  with pytest.raises(ValueError, match="num_devices=0"):
    Cluster.uniform(0)
  with pytest.raises(ValueError, match=r"pins\['o1'\].*\[0, 2\).*5"):
    place(g, Cluster.uniform(2), costs, pins={"o1": 5})
  with pytest.raises(ValueError, match="no op is named 'nope'"):
    place(g, Cluster.uniform(2), costs, pins={"nope": 0})
  with pytest.raises(ValueError, match="at least one op"):
    place(OpGraph([], []), Cluster.uniform(2), {})
  with pytest.raises(ValueError, match="placer='fastest'"):
    place(g, Cluster.uniform(2), costs, "fastest")
  bad = OpGraph([Op("a", "X", colocation="g", device_types=("CPU",)),
                 Op("b", "X", colocation="g", device_types=("GPU",))], [])
  with pytest.raises(ValueError, match="group 'g'.*CPU.*GPU"):
    place(bad, Cluster.uniform(2), {"a": 1.0, "b": 1.0})


def _all_placements(graph, devices):
  names = [op.name for op in graph.ops]
  for choice in itertools.product(range(devices), repeat=len(names)):
    yield Placement(dict(zip(names, choice)), devices)


def test_no_plan_can_exist_names_the_op_and_the_bytes():
  # Six 100 B outputs all live until the sink reads them: while the sink
  # runs, 600 B + its own 100 B are live somewhere, more than 2 x 250 B.
  names = [f"o{i}" for i in range(6)]
  g = OpGraph([Op(n, "X", (100,)) for n in names] + [Op("sink", "X", (100,))],
              [Edge(n, "sink", 0, i, 100) for i, n in enumerate(names)])
  costs = {n: 1.0 for n in names + ["sink"]}
  cluster = Cluster.uniform(2, 250)
  with pytest.raises(InfeasiblePlacement,
                     match=r"no plan can exist: while op 'sink' runs, at "
                     r"least 700 B are live .* more than the 2 devices' caps "
                     r"together \(500 B\)"):
    place(g, cluster, costs)
  # The oracle: all 128 placements simulated, none within the caps.
  assert not any(simulate(g, p, costs, cluster).feasible
                 for p in _all_placements(g, 2))


def test_no_plan_found_says_the_bound_does_not_rule_one_out():
  # Both ops may only run on the CPU, whose cap holds one of them: the
  # constraint, not memory in total, rules a plan out.
  g = OpGraph([Op("a", "X", (200,), device_types=("CPU",)),
               Op("b", "X", (200,), device_types=("CPU",))],
              [Edge("a", "b", 0, 0, 200)])
  cluster = Cluster((Device("/cpu:0", "CPU", 300), Device("/gpu:0", "GPU",
                                                          300)))
  with pytest.raises(InfeasiblePlacement,
                     match="No feasible placement on 2 devices.*does not rule "
                     "a plan out: 400 B must be live at once while op 'b' "
                     "runs, within the caps together, 600 B"):
    place(g, cluster, {"a": 1.0, "b": 1.0})


@pytest.mark.parametrize("seed", range(8))
def test_live_memory_bound_is_sound_against_brute_force(seed):
  """On random 7-op DAGs, 2 devices, all 128 placements simulated: none
  keeps fewer bytes live at its peaks (added up) than the bound, so caps
  whose sum is below it leave no feasible placement. (It is close: on these
  seeds one device's own peak equals it in 4 of 8.)"""
  import random

  from tfopt.graph.analysis import live_memory_bound
  rng = random.Random(seed)
  names = [f"n{i}" for i in range(7)]
  ops = [Op(n, "X", (rng.choice([10, 50, 100, 300]),)) for n in names]
  edges, port = [], {}
  for j in range(1, 7):
    for i in rng.sample(range(j), k=min(j, rng.choice([1, 2]))):
      port[names[j]] = port.get(names[j], -1) + 1
      edges.append(Edge(names[i], names[j], 0, port[names[j]],
                        ops[i].output_bytes[0]))
  g = OpGraph(ops, edges)
  costs = CostModel({n: OpCost(float(rng.choice([1, 2, 5])),
                               persistent_bytes=rng.choice([0, 20]))
                     for n in names})
  bound = live_memory_bound(g, costs).bytes
  peaks = [sum(simulate(g, p, costs, Cluster.uniform(2)).peak_bytes)
           for p in _all_placements(g, 2)]
  # Sound: no schedule keeps less live at its worst than the bound...
  assert min(peaks) >= bound
  # ... so caps below it, together, are infeasible for every placement.
  cap = (bound - 1) / 2
  tight = Cluster.uniform(2, int(cap))
  assert not any(simulate(g, p, costs, tight).feasible
                 for p in _all_placements(g, 2))


@pytest.mark.parametrize("seed", range(12))
def test_properties_on_random_dags(seed):
  g, costs = layered_dag(60 + 10 * seed, seed=seed, mean_width=4)
  devices = 2 + seed % 3
  fraction = (1.0, 0.6, 0.35)[seed % 3]
  cap = int(total_memory(g, costs) * fraction)
  cluster = Cluster.uniform(devices, cap)
  result = place(g, cluster, costs)
  single = simulate(g, Placement.single_device(g, devices), costs, cluster)
  for c in result.candidates:
    if c.placement is None:
      continue
    p, s = c.placement, c.schedule
    if s is None:  # not (fully) simulated: it cannot beat the chosen plan
      assert c.error.startswith(("not simulated", "not checked for memory")), c
      s = simulate(g, p, costs, cluster)
      assert s.makespan_us >= result.makespan_us - 1e-6
      assert s.makespan_us >= plan_lower_bound(
          make_problem(g, cluster, costs), p) - 1e-6
    assert set(p) == {op.name for op in g.ops}  # every op placed once
    for members in g.colocation_groups.values():
      assert len({p[m] for m in members}) == 1, c.placer
    for e in g.edges:  # precedence
      assert s.start_us[e.dst] >= s.end_us[e.src] - 1e-9
    # Static accounting bounds the liveness peak: heuristics never overflow
    # (the single-device baseline is judged by its peak, and may).
    assert s.feasible or c.placer == "single", (c.placer, s.over_cap())
  assert result.schedule.feasible
  if single.feasible:
    assert result.makespan_us <= single.makespan_us
  assert result.makespan_us >= result.lower_bound_us - 1e-6


@pytest.mark.parametrize("sharing", [
    None, ComputeSharing.shared(3, 1.3), ComputeSharing.shared(3, 1.3, 2),
    ComputeSharing.alone(3, threads=2), ComputeSharing((0, 0, 1), 1.0, 3)])
def test_plan_lower_bound_holds_whatever_the_cores_and_pools(sharing):
  g, costs = layered_dag(80, seed=5, mean_width=4)
  cluster = Cluster.uniform(3, sharing=sharing,
                            comm=CommModel.uniform(5.0, 1.0))
  problem = make_problem(g, cluster, costs)
  rng = np.random.default_rng(0)
  for _ in range(20):
    plan = Placement({op.name: int(rng.integers(3)) for op in g.ops}, 3)
    assert simulate(g, plan, costs, cluster).makespan_us >= plan_lower_bound(
        problem, plan) - 1e-6


def test_plan_lower_bound_of_a_shared_pool_by_hand():
  # Four independent 3 us ops on two devices of one core (capacity 1):
  # 12 us of work, whichever device runs it; apart, the busier device's 6.
  g = OpGraph([Op(n, "X") for n in "abcd"], [])
  costs = {n: 3.0 for n in "abcd"}
  plan = Placement({"a": 0, "b": 0, "c": 1, "d": 1}, 2)
  for sharing, bound in ((ComputeSharing.shared(2, 1.0, threads=2), 12.0),
                         (ComputeSharing.shared(2, 2.0, threads=2), 6.0),
                         (None, 6.0)):
    cluster = Cluster.uniform(2, sharing=sharing)
    assert plan_lower_bound(make_problem(g, cluster, costs), plan) == bound
    assert simulate(g, plan, costs, cluster).makespan_us == bound


def test_place_on_devices_of_one_core_knows_splitting_cannot_help():
  # The fork a(1) -> b(5), c(5) -> d(1) on two logical devices of one core
  # (one pool of two threads, capacity 1): 12 us of work however placed,
  # which is the bound `place` reports and the makespan it reaches; apart
  # (no sharing) the bound is the critical path, 7.
  pooled = Cluster.uniform(2, comm=FREE, sharing=ComputeSharing.shared(
      2, 1.0, threads=2))
  result = place(FORK, pooled, FORK_COSTS)
  assert result.lower_bound_us == 12.0
  assert result.makespan_us == pytest.approx(12.0)
  assert place(FORK, Cluster.uniform(2, comm=FREE),
               FORK_COSTS).lower_bound_us == 7.0


def test_deterministic():
  g, costs = layered_dag(300, seed=3)
  cluster = Cluster.uniform(4, int(total_memory(g, costs) * 0.4))
  a = place(g, cluster, costs)
  b = place(g, cluster, costs)
  assert a.placer == b.placer and dict(a.placement) == dict(b.placement)


@pytest.mark.parametrize("seed", range(8))
def test_m_etf_timeline_equals_simulate_where_transfers_cannot_contend(seed):
  # The number tfopt reports comes from `simulate`. Replaying m-ETF's own
  # order, the simulator reproduces m-ETF's timeline exactly when transfers
  # are free. (With real transfers the two book channels in different
  # orders -- m-ETF when it places a consumer, the simulator when the
  # producer finishes -- and only the simulator's number is reported.)
  g, costs = layered_dag(150, seed=seed, mean_width=4)
  cluster = Cluster.uniform(3, comm=FREE)
  own = {}
  placement = m_etf(make_problem(g, cluster, costs), timeline=own)
  replay = simulate(g, placement, costs, cluster, priority=own)
  assert set(own) == set(replay.start_us)
  for name, start in own.items():
    # FREE moves 1 MB in 1e-6 us: timelines agree to well under 1e-4 us.
    assert replay.start_us[name] == pytest.approx(start, abs=1e-4), name


def test_simulate_priority_orders_ready_ops():
  g = OpGraph([Op(n, "X", (0,)) for n in "ab"], [])
  cluster = Cluster.uniform(1)
  default = simulate(g, Placement.single_device(g), {"a": 1.0, "b": 2.0},
                     cluster)
  assert (default.start_us["a"], default.start_us["b"]) == (0.0, 1.0)
  swapped = simulate(g, Placement.single_device(g), {"a": 1.0, "b": 2.0},
                     cluster, priority={"a": 5.0, "b": 0.0})
  assert (swapped.start_us["a"], swapped.start_us["b"]) == (2.0, 0.0)
  with pytest.raises(ValueError, match="op 'b' has none"):
    simulate(g, Placement.single_device(g), {"a": 1.0, "b": 2.0}, cluster,
             priority={"a": 0.0})


def test_m_topo_live_finds_plans_static_accounting_refuses():
  # A chain of 6 ops, each holding a 100 B weight and a 50 B output read by
  # the next op. One device peaks at 600 + 100 = 700 B. On 2 x 450 B, static
  # accounting (every byte held all step) needs 450 B per half plus a 50 B
  # copy: refused. By liveness a 3/3 split peaks at 400 B on each device
  # (3 weights + two live 50 B tensors: an output and its consumer's output,
  # or the received copy and o3's output).
  names = [f"o{i}" for i in range(6)]
  g = OpGraph([Op(n, "X", (50,)) for n in names],
              [Edge(a, b, 0, 0, 50) for a, b in zip(names, names[1:])])
  costs = CostModel({n: OpCost(1.0, persistent_bytes=100) for n in names})
  cluster = Cluster.uniform(2, 450, comm=FREE)
  with pytest.raises(InfeasiblePlacement):
    m_topo(make_problem(g, cluster, costs), "fill")
  result = place(g, cluster, costs, "m-topo-live")
  assert result.schedule.feasible
  assert result.schedule.peak_bytes == (400, 400)
  assert [result.placement[n] for n in names] == [0, 0, 0, 1, 1, 1]
  auto = place(g, cluster, costs)
  # m-stage, earlier in the portfolio, finds the same 3/3 split.
  assert auto.schedule.feasible and auto.placer in ("m-stage", "m-topo-live")
  assert [auto.placement[n] for n in names] == [0, 0, 0, 1, 1, 1]


def test_gnmt_on_two_devices_at_035_is_proven_infeasible(costgraph_files):
  """The shared GNMT training graph: its persistent memory and the
  activations live at the backward pass's start exceed 2 x 0.35 of its
  total memory (the single device's simulated peak is within 0.3 % of the
  bound), so no plan exists; at 2 x 0.40 the portfolio finds one."""
  from tfopt.graph import load_costgraph
  from tfopt.graph.analysis import live_memory_bound
  path = next(p for p in costgraph_files if "gnmt" in p.name)
  cg = load_costgraph(path)
  total = total_memory(cg.graph, cg.costs)
  bound = live_memory_bound(cg.graph, cg.costs)
  assert 0.70 < bound.bytes / total < 0.75
  single = simulate(cg.graph, Placement.single_device(cg.graph, 1), cg.costs,
                    Cluster.uniform(1))
  assert bound.bytes <= single.peak_bytes[0] <= bound.bytes * 1.003
  with pytest.raises(InfeasiblePlacement, match="no plan can exist: while "
                     f"op '{bound.op}' runs"):
    place(cg.graph, Cluster.uniform(2, int(0.35 * total)), cg.costs)
  result = place(cg.graph, Cluster.uniform(2, int(0.40 * total)), cg.costs)
  assert result.schedule.feasible


@pytest.mark.parametrize("overheads, spread", [((), True), ((1.0, 5.0), True),
                                                ((1.0, 15.0), False)])
def test_auto_weighs_the_step_overhead_of_spreading(overheads, spread):
  # Two independent 10 us ops, free links: spread they take 10 us plus the
  # overhead of two devices, on one 20 us plus that of one. The bound
  # holds the least overhead any plan pays.
  g = OpGraph([Op("a", "X"), Op("b", "X")], [])
  cluster = Cluster.uniform(2, comm=FREE, step_overhead_us=overheads)
  result = place(g, cluster, {"a": 10.0, "b": 10.0})
  used = len(set(result.placement.values()))
  assert used == (2 if spread else 1)
  least = min(overheads, default=0.0)
  assert result.single_device_us == 20.0 + (overheads[0] if overheads
                                             else 0.0)
  assert result.makespan_us == (10.0 + (overheads[1] if overheads else 0.0)
                                if spread else 21.0)
  assert result.lower_bound_us == 10.0 + least
  assert result.lower_bound_us <= result.makespan_us
