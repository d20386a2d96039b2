"""The makespan lower bound (tfopt.placement.bound): hand-computed values on
tiny graphs, an independent LP solver (SciPy's HiGHS) for the memory LP, and
soundness against the simulator: no plan the portfolio finds on the shipped
workloads, no random plan of random DAGs, and no plan of a brute-force
search on tiny graphs simulates faster than the bound."""

import dataclasses
import itertools

import numpy as np
import pytest
from scipy.optimize import linprog

from tfopt import (Cluster, CommModel, ComputeSharing, CostModel, Device,
                   OpCost)
from tfopt.graph import CONTROL, Edge, Op, OpGraph, load_workload, \
    workload_names
from tfopt.graph.synthetic import total_memory
from tfopt.placement import (InfeasiblePlacement, Placement, PlacementResult,
                             make_problem, makespan_bound, place)
from tfopt.placement import bound as bound_module
from tfopt.simulate import simulate

FREE = CommModel.uniform(0.0, 1e9)


def _bound(graph, cluster, costs, **kwargs):
  return makespan_bound(make_problem(graph, cluster, costs), **kwargs)


def _all_plans(problem):
  """Every placement that keeps colocation, device types and pins."""
  groups = list(problem.members)
  for combo in itertools.product(*(problem.allowed[g] for g in groups)):
    yield Placement({m: d for g, d in zip(groups, combo)
                     for m in problem.members[g]}, problem.num_devices)


def _best_makespan(graph, cluster, costs):
  """The brute-force optimum over every plan (simulated in the default
  order), and how many plans fit."""
  problem = make_problem(graph, cluster, costs)
  spans = [s.makespan_us for s in (simulate(graph, p, costs, cluster)
                                   for p in _all_plans(problem))
           if s.feasible]
  return min(spans, default=None), len(spans)


# ------------------------------------------------------ hand-computed values

def test_chain_is_its_critical_path():
  # a(3) -> b(4) -> c(5) on 3 devices: nothing runs in parallel.
  g = OpGraph([Op(n, "X") for n in "abc"],
              [Edge("a", "b"), Edge("b", "c")])
  b = _bound(g, Cluster.uniform(3), {"a": 3.0, "b": 4.0, "c": 5.0})
  assert b.us == 12.0 and b.term == "critical path"
  assert dict(b.terms) == {"critical path": 12.0, "work / devices": 4.0}
  assert b.note == "" and b.feasible


def test_fork_takes_the_larger_of_path_and_work():
  # a(1) -> b(5), c(5) -> d(1): path 7, work 12 over 2 devices 6, over 1
  # device 12.
  g = OpGraph([Op(n, "X") for n in "abcd"],
              [Edge("a", "b"), Edge("a", "c"), Edge("b", "d"),
               Edge("c", "d")])
  costs = {"a": 1.0, "b": 5.0, "c": 5.0, "d": 1.0}
  two = _bound(g, Cluster.uniform(2), costs)
  assert (two.us, two.term) == (7.0, "critical path")
  one = _bound(g, Cluster.uniform(1), costs)
  assert (one.us, one.term) == (12.0, "work / devices")


def test_op_overheads_count_at_the_cheapest_allowed_device():
  # Device 0 charges 1 us per op, device 1 3 us; op c may only use
  # device 1 (a CPU). Path a -> c: (2 + 1) + (2 + 3) = 8. Work: a, b at
  # 2 + 1, c at 2 + 3: 11 over 2 devices, 5.5. The LP knows c's 5 us are
  # device 1's and a, b cost 5 there: with s of a and b on device 0,
  # T = max(3 s, 5 + 5 (2 - s)), least at s = 15/8: T = 45/8.
  g = OpGraph([Op("a", "X"), Op("b", "X"),
               Op("c", "X", device_types=("CPU",))], [Edge("a", "c")])
  cluster = Cluster((Device("/gpu:0", "GPU", op_overhead_us=1.0),
                     Device("/cpu:0", "CPU", op_overhead_us=3.0)))
  b = _bound(g, cluster, {"a": 2.0, "b": 2.0, "c": 2.0})
  assert b.terms["critical path"] == 8.0
  assert b.terms["work / devices"] == 5.5
  assert b.terms["memory LP"] == pytest.approx(45 / 8, rel=1e-9)
  assert (b.us, b.term) == (8.0, "critical path")


def test_devices_sharing_one_core_divide_the_work():
  # Four independent 3 us ops on two devices of one core (a pool of two
  # threads, capacity 1): 12 us of work whatever the plan; capacity 2:
  # 6 us; apart: 6 us (two devices, one op at a time each).
  g = OpGraph([Op(n, "X") for n in "abcd"], [])
  costs = {n: 3.0 for n in "abcd"}
  for sharing, expected in ((ComputeSharing.shared(2, 1.0, threads=2), 12.0),
                            (ComputeSharing.shared(2, 2.0, threads=2), 6.0),
                            (None, 6.0)):
    b = _bound(g, Cluster.uniform(2, sharing=sharing), costs)
    assert (b.us, b.term) == (expected, "work / devices")


def _persistent_ops(n, compute=10.0, persistent=40):
  g = OpGraph([Op(f"m{i}", "X") for i in range(n)], [])
  return g, CostModel({f"m{i}": OpCost(compute, persistent_bytes=persistent)
                       for i in range(n)})


def test_memory_forces_work_onto_the_large_device():
  # Four independent ops of 10 us, each holding 40 persistent bytes, on
  # device 0 (cap 1000) and device 1 (cap 40). Device 1 holds at most one
  # op's bytes: with x_i the fraction of op i there, 40 * sum x_i <= 40,
  # so device 0 does at least 10 * (4 - 1) = 30 us. Work / devices: 20;
  # critical path: 10. The brute-force optimum is 30 too.
  g, costs = _persistent_ops(4)
  cluster = Cluster((Device("/d:0", memory_bytes=1000),
                     Device("/d:1", memory_bytes=40)), FREE)
  b = _bound(g, cluster, costs)
  assert b.terms["work / devices"] == 20.0
  assert b.terms["critical path"] == 10.0
  assert b.us == pytest.approx(30.0, rel=1e-9) and b.term == "memory LP"
  assert _best_makespan(g, cluster, costs) == (30.0, 5)


def test_memory_lp_is_a_relaxation_below_the_integer_optimum():
  # As above with device 1's cap at 60: fractionally 1.5 ops fit there
  # (40 * sum x_i <= 60), so device 0 does 10 * (4 - 1.5) = 25 us; whole
  # ops, only one fits: the optimum is 30.
  g, costs = _persistent_ops(4)
  cluster = Cluster((Device("/d:0", memory_bytes=1000),
                     Device("/d:1", memory_bytes=60)), FREE)
  b = _bound(g, cluster, costs)
  assert b.us == pytest.approx(25.0, rel=1e-9) and b.term == "memory LP"
  assert _best_makespan(g, cluster, costs)[0] == 30.0


def test_activations_live_at_the_loss_bind_the_lp():
  # Three towers f_i(10) -> loss(1) -> b_i(10), each f_i's 100-byte
  # activation read by b_i in its colocation group: while the loss runs,
  # every tower's activation is live on its group's device. Device 1
  # (cap 100) holds at most one tower's there (100 * sum x_i <= 100), so
  # device 0 does at least 20 * (3 - 1) = 40 us (persistent bytes alone
  # would allow 30.5 = 61 / 2). Path: 10 + 1 + 10 = 21. The brute-force
  # optimum is 41 (two towers on device 0, and the loss after them).
  ops, edges = [Op("loss", "X")], []
  for i in range(3):
    ops += [Op(f"f{i}", "X", (100,), colocation=f"t{i}"),
            Op(f"b{i}", "X", colocation=f"t{i}")]
    edges += [Edge(f"f{i}", "loss", CONTROL), Edge("loss", f"b{i}", CONTROL),
              Edge(f"f{i}", f"b{i}", 0, 0, 100)]
  g = OpGraph(ops, edges)
  costs = {"loss": 1.0, **{f"{p}{i}": 10.0 for p in "fb" for i in range(3)}}
  cluster = Cluster((Device("/d:0", memory_bytes=1000),
                     Device("/d:1", memory_bytes=100)), FREE)
  b = _bound(g, cluster, costs)
  assert b.terms["critical path"] == 21.0
  assert b.terms["work / devices"] == 30.5
  assert b.us == pytest.approx(40.0, rel=1e-9) and b.term == "memory LP"
  assert _best_makespan(g, cluster, costs)[0] == 41.0


def test_a_forwarding_op_is_not_charged_its_output_twice():
  # a (100 B) -> r = Relu(a), same group, read by nothing after: Relu
  # writes into a's buffer (its last reader), so 100 B, not 200, are live
  # while it runs; a cap of 100 must not rule the group out.
  g = OpGraph([Op("a", "X", (100,), colocation="g"),
               Op("r", "Relu", (100,), colocation="g")],
              [Edge("a", "r", 0, 0, 100)])
  costs = {"a": 1.0, "r": 1.0}
  cluster = Cluster.uniform(1, 100)
  plan = Placement.single_device(g, 1)
  assert simulate(g, plan, costs, cluster).peak_bytes == (100,)
  # (make_problem's static accounting charges both outputs: 200 B.)
  problem = dataclasses.replace(
      make_problem(g, Cluster.uniform(1, 200), costs), cluster=cluster)
  b = makespan_bound(problem)
  assert b.feasible and b.us == 2.0


def test_a_group_no_cap_can_hold_proves_no_plan_fits():
  # a's 100 B output is live while it runs (it allocates it), beside its
  # 50 B of temp: 150 B on whichever device, over both caps (120).
  # make_problem's static check refuses such a group already, so the
  # problem is built for caps of 150 and given the 120 B cluster after.
  g = OpGraph([Op("a", "X", (100,)), Op("b", "X")],
              [Edge("a", "b", 0, 0, 100)])
  costs = CostModel({"a": OpCost(1.0, temp_bytes=50), "b": OpCost(1.0)})
  small = Cluster.uniform(2, 120)
  problem = dataclasses.replace(
      make_problem(g, Cluster.uniform(2, 150), costs), cluster=small)
  b = makespan_bound(problem)
  assert not b.feasible and "no device's cap holds" in b.note
  assert "memory LP" not in b.terms and b.us == 2.0  # the path
  assert all(not simulate(g, p, costs, small).feasible
             for p in _all_plans(problem))


def test_an_lp_with_no_fractional_solution_proves_no_plan_fits():
  # Five 40-byte ops, two devices of 90 B: 200 B > 180 B even split
  # fractionally.
  g, costs = _persistent_ops(5)
  cluster = Cluster.uniform(2, 90, comm=FREE)
  b = _bound(g, cluster, costs)
  assert not b.feasible and "infeasible" in b.note
  assert b.us == 25.0  # work / devices
  assert _best_makespan(g, cluster, costs) == (None, 0)


def test_place_names_the_proof_when_it_finds_no_plan():
  # Three 40-byte ops, caps 100 and 30: the caps together (130) hold the
  # 120 bytes, but the small device holds none of them and the large one
  # 2.5 ops' worth, even fractionally.
  g, costs = _persistent_ops(3)
  cluster = Cluster((Device("/d:0", memory_bytes=100),
                     Device("/d:1", memory_bytes=30)), FREE)
  with pytest.raises(InfeasiblePlacement, match=r"\(memory LP: infeasible, "
                     r"no assignment of the groups, even fractional, fits "
                     r"the caps\.\)$"):
    place(g, cluster, costs)


def test_lp_time_limit_falls_back_and_says_so(monkeypatch):
  g, costs = _persistent_ops(4)
  cluster = Cluster((Device("/d:0", memory_bytes=1000),
                     Device("/d:1", memory_bytes=40)), FREE)
  monkeypatch.setattr(bound_module, "_solve",
                      lambda *a: "memory LP: not solved (NOT_SOLVED after "
                                 "1.00 s, limit 1 s)")
  b = _bound(g, cluster, costs)
  assert b.us == 20.0 and b.term == "work / devices"
  assert "memory LP" not in b.terms and "not solved" in b.note
  assert "not solved" in b.describe()


def test_merged_groups_give_a_certified_bound(monkeypatch):
  # With every group merged for the solve, the dual prices still certify
  # the bound on the groups themselves: identical ops merge losslessly.
  monkeypatch.setattr(bound_module, "LP_MAX_VARIABLES", 2)
  g, costs = _persistent_ops(4)
  cluster = Cluster((Device("/d:0", memory_bytes=1000),
                     Device("/d:1", memory_bytes=40)), FREE)
  assert _bound(g, cluster, costs).us == pytest.approx(30.0, rel=1e-9)


# ------------------------------------------------- independent LP solver

def _highs_lp(work, persistent, caps, allowed):
  """min T s.t. sum_d x[g, d] = 1, sum_g x w <= T, sum_g x m <= cap_d,
  built here from scratch and solved by SciPy's HiGHS."""
  pairs = [(g, d) for g in range(len(work)) for d in allowed[g]]
  n = len(pairs) + 1  # the last variable is T
  c = np.zeros(n)
  c[-1] = 1.0
  a_eq = np.zeros((len(work), n))
  for j, (g, _) in enumerate(pairs):
    a_eq[g, j] = 1.0
  a_ub, b_ub = [], []
  for d in range(len(caps)):
    load = np.zeros(n)
    mem = np.zeros(n)
    for j, (g, dd) in enumerate(pairs):
      if dd == d:
        load[j], mem[j] = work[g], persistent[g]
    load[-1] = -1.0
    a_ub += [load, mem]
    b_ub += [0.0, caps[d]]
  out = linprog(c, A_ub=np.array(a_ub), b_ub=b_ub, A_eq=a_eq,
                b_eq=np.ones(len(work)), bounds=(0, None), method="highs")
  assert out.status == 0, out.message
  return out.fun


@pytest.mark.parametrize("seed", range(12))
def test_memory_lp_equals_an_independent_solvers_optimum(seed):
  rng = np.random.default_rng(seed)
  n, num_devices = int(rng.integers(3, 9)), int(rng.integers(2, 4))
  work = rng.uniform(1.0, 20.0, n).round(2)
  persistent = rng.integers(0, 100, n)
  cpu_only = rng.random(n) < 0.25
  ops = [Op(f"o{i}", "X", device_types=("CPU",) if cpu_only[i] else None)
         for i in range(n)]
  costs = CostModel({f"o{i}": OpCost(float(work[i]),
                                     persistent_bytes=int(persistent[i]))
                     for i in range(n)})
  caps = [int(persistent.max() + rng.integers(0, persistent.sum() + 1))
          for _ in range(num_devices)]
  devices = tuple(Device(f"/d:{d}", "CPU" if d == 0 else "GPU", caps[d])
                  for d in range(num_devices))
  allowed = [[0] if cpu_only[i] else list(range(num_devices))
             for i in range(n)]
  g = OpGraph(ops, [])
  b = _bound(g, Cluster(devices, FREE), costs)
  if not b.feasible:
    with pytest.raises(AssertionError):
      _highs_lp(work, persistent, caps, allowed)
    return
  assert b.terms["memory LP"] == pytest.approx(
      _highs_lp(work, persistent, caps, allowed), rel=1e-7)


# ------------------------------------------------------------- soundness

@pytest.mark.parametrize("name", workload_names())
def test_no_plan_found_on_a_shipped_workload_beats_the_bound(name):
  cg = load_workload(name)
  graph, costs = cg.graph, cg.costs
  for fraction in (1.0, 0.6, 0.35):
    cap = int(total_memory(graph, costs) * fraction)
    cluster = Cluster.uniform(4, cap)
    result = place(graph, cluster, costs, time_limit_s=2.0)
    assert result.bound is not None and result.bound.feasible
    assert result.lower_bound_us == result.bound.us
    assert set(result.bound.terms) == {"critical path", "work / devices",
                                       "memory LP"}
    checked = 0
    for c in result.candidates:
      if c.placement is None:
        continue
      s = c.schedule or simulate(graph, c.placement, costs, cluster)
      if s.feasible:
        assert s.makespan_us >= result.lower_bound_us * (1 - 1e-9), c.placer
        checked += 1
    assert checked >= 1


def _random_graph(rng, n, types, sizes, colocate, groups):
  ops = []
  for i in range(n):
    kind = types[rng.integers(len(types))]
    ports = 2 if kind == "IdentityN" or rng.random() < 0.15 else 1
    coloc = (f"g{rng.integers(groups)}" if i and rng.random() < colocate
             else None)
    ops.append(Op(f"o{i}", kind, tuple(int(rng.choice(sizes))
                                       for _ in range(ports)),
                  colocation=coloc,
                  device_types=("CPU",) if rng.random() < 0.1 else None))
  edges = []
  for i in range(1, n):
    for j, s in enumerate(sorted(set(rng.integers(0, i, rng.integers(0, 3))
                                     .tolist()))):
      if rng.random() < 0.15:
        edges.append(Edge(f"o{s}", f"o{i}", CONTROL))
        continue
      port = int(rng.integers(len(ops[s].output_bytes)))
      nbytes = ops[s].output_bytes[port]
      if rng.random() < 0.2:
        nbytes = int(nbytes * rng.random())
      edges.append(Edge(f"o{s}", f"o{i}", port, j, nbytes))
  costs = CostModel({f"o{i}": OpCost(
      float(rng.choice([0.0, 1.0, 2.0, 5.0, 10.0, 20 * rng.random()])),
      int(rng.choice([0, 0, 50, 300])), int(rng.choice([0, 0, 0, 100, 400])))
      for i in range(n)})
  return OpGraph(ops, edges), costs


def _random_cluster(rng, total):
  num = int(rng.integers(2, 4))
  types = ["CPU"] * num if rng.random() < 0.5 else ["GPU"] * (num - 1) + [
      "CPU"]
  devices = tuple(Device(
      f"/d:{d}", types[d],
      None if rng.random() < 0.2 else int(max(1, total * rng.uniform(0.2, 1))),
      float(rng.choice([0.0, 0.0, 0.5, 2.0]))) for d in range(num))
  comm = CommModel.uniform(float(rng.choice([0.0, 1.0, 5.0])),
                           float(rng.choice([0.01, 1.0, 1e9])),
                           control_messages=bool(rng.random() < 0.3),
                           shared_buffers=bool(rng.random() < 0.3),
                           cpu_work=bool(rng.random() < 0.2))
  sharing = [None, ComputeSharing.shared(num, 1.5),
             ComputeSharing.shared(num, 1.0, 2),
             ComputeSharing.alone(num, threads=2),
             ComputeSharing((0,) * (num - 1) + (1,), 1.0)][rng.integers(5)]
  return Cluster(devices, comm, sharing)


MIXED = (["X", "X", "X", "Identity", "Relu", "AddV2", "ReadVariableOp",
          "Const", "Placeholder", "IdentityN"], [0, 100, 200, 300, 400], 0.3)
# Same-sized tensors, element-wise ops and few large groups: forwards into
# a group's own buffers happen often.
FORWARDING = (["X", "Relu", "Relu", "AddV2", "Identity"], [100], 0.8)


@pytest.mark.parametrize("kind", ["mixed", "forwarding"])
def test_random_plans_of_random_dags_never_beat_the_bound(kind, monkeypatch):
  """Random graphs (views, forwards, variables, control edges, colocation,
  device types), clusters (caps, overheads, core sharing and pools, links
  that cost CPU work or hand buffers over) and plans in random priority
  orders: every plan within the caps takes at least the bound; a bound
  that says no plan fits is never contradicted; and each memory row of
  the LP is below the simulated peak of every device, for every plan,
  within the caps or not. A third of the problems solve the LP on merged
  groups."""
  types, sizes, colocate = MIXED if kind == "mixed" else FORWARDING
  fitted = 0
  for seed in range(60):
    rng = np.random.default_rng(seed)
    g, costs = _random_graph(rng, 10, types, sizes, colocate,
                             3 if kind == "mixed" else 2)
    total = max(1, total_memory(g, costs))
    cluster = _random_cluster(rng, total)
    try:
      problem = make_problem(g, cluster, costs)
    except (InfeasiblePlacement, ValueError):
      continue
    monkeypatch.setattr(bound_module, "LP_MAX_VARIABLES",
                        2 if rng.random() < 0.3 else 4_000)
    b = makespan_bound(problem)
    data = bound_module._Data(problem)
    rows, own = bound_module._memory_rows(problem, data)
    for _ in range(20):
      plan = Placement({m: d for gid, names in problem.members.items()
                        for d in [int(rng.choice(problem.allowed[gid]))]
                        for m in names}, problem.num_devices)
      priority = (None if rng.random() < 0.5 else
                  {op.name: float(rng.random()) for op in g.ops})
      s = simulate(g, plan, costs, cluster, priority=priority)
      device = [plan[problem.members[gid][0]] for gid in data.groups]
      for row in rows:
        held = np.zeros(problem.num_devices)
        np.add.at(held, device, row)
        assert np.all(np.array(s.peak_bytes) >= held - 1e-6), (seed, row)
      assert all(s.peak_bytes[d] >= own[k] - 1e-6
                 for k, d in enumerate(device)), seed
      if s.feasible:
        fitted += 1
        assert b.feasible, (seed, b)
        assert s.makespan_us >= b.us * (1 - 1e-9), (seed, s.makespan_us, b)
  assert fitted > 100


@pytest.mark.parametrize("seed", range(40))
def test_bound_is_below_the_brute_force_optimum_of_tiny_graphs(seed):
  rng = np.random.default_rng(1000 + seed)
  g, costs = _random_graph(rng, 6, *MIXED, groups=2)
  cluster = _random_cluster(rng, max(1, total_memory(g, costs)))
  try:
    b = _bound(g, cluster, costs)
  except (InfeasiblePlacement, ValueError):
    return
  best, fits = _best_makespan(g, cluster, costs)
  if best is None:
    return
  assert b.feasible and fits > 0
  assert b.us <= best * (1 + 1e-9), (b, best)


# ------------------------------------------------------ the result and errors

def test_place_reports_the_bound_its_term_and_the_gap():
  g, costs = _persistent_ops(4)
  cluster = Cluster((Device("/d:0", memory_bytes=1000),
                     Device("/d:1", memory_bytes=40)), FREE)
  result = place(g, cluster, costs)
  assert result.makespan_us == 30.0
  assert result.lower_bound_us == pytest.approx(30.0, rel=1e-9)
  assert result.lower_bound_term == "memory LP"
  assert result.over_bound == pytest.approx(1.0, rel=1e-9)
  assert result.describe_bound() == (
      f"plan 0.03 ms ({result.placer}), lower bound 0.03 ms (memory LP; "
      "critical path 0.01 ms, work / devices 0.02 ms), plan / bound 1.000")


def test_a_result_built_by_hand_has_no_term():
  g = OpGraph([Op("a", "X")], [])
  plan = Placement.single_device(g)
  s = simulate(g, plan, {"a": 1.0}, Cluster.uniform(1))
  result = PlacementResult("x", plan, s, 0.0, (), 0.0, 1.0)
  assert result.lower_bound_term == "" and result.over_bound is None
  assert result.describe_bound().endswith("plan / bound --")


def test_bad_arguments_are_named():
  with pytest.raises(ValueError, match=r"Argument `problem` must be a "
                     r"PlacementProblem \(make_problem\)\. Received: "
                     r"problem='graph'"):
    makespan_bound("graph")
  g, costs = _persistent_ops(2)
  problem = make_problem(g, Cluster.uniform(2), costs)
  for bad in (0, -1.0, True, "1"):
    with pytest.raises(ValueError, match=r"Argument `time_limit_s` must be "
                       r"a number of seconds > 0\. Received: time_limit_s="):
      makespan_bound(problem, time_limit_s=bad)


def test_the_compile_report_has_the_plan_bound_and_gap():
  from tfopt.compile import HookReport  # no TensorFlow needed to render
  g, costs = _persistent_ops(4)
  cluster = Cluster((Device("/d:0", memory_bytes=1000),
                     Device("/d:1", memory_bytes=40)), FREE)
  result = place(g, cluster, costs)
  report = HookReport((), "place", "", placer=result.placer,
                      predicted_us=result.makespan_us,
                      single_device_us=result.single_device_us,
                      plan=result)
  lines = report.table().splitlines()
  at = next(i for i, line in enumerate(lines)
            if line.startswith("placement "))
  assert lines[at + 1] == result.describe_bound()
  assert lines[at + 1].endswith("plan / bound 1.000")
