"""The simulator against timelines and memory peaks computed by hand."""

import pytest

from tfopt import Cluster, CommModel, ComputeSharing, CostModel, OpCost
from tfopt.cost import Link
from tfopt.graph import Edge, Op, OpGraph
from tfopt.placement.placement import Placement
from tfopt.simulate.simulator import simulate

# 10 us + 1000 B at 1 GB/s (1000 B/us) = 11 us per 1000-byte tensor.
COMM = CommModel.uniform(latency_us=10.0, bandwidth_gbps=1.0)


def _cluster(n, cap=None):
  return Cluster.uniform(n, cap, comm=COMM)


def _graph(spec, edges, out=1000):
  return OpGraph([Op(n, "X", output_bytes=(out,)) for n in spec],
                 [Edge(s, d, 0, 0, out) for s, d in edges])


def _place(mapping, n):
  return Placement(mapping, n)


DIAMOND = _graph("abcd", [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
DIAMOND_COSTS = {"a": 1.0, "b": 5.0, "c": 2.0, "d": 1.0}


def test_single_device_runs_ops_back_to_back():
  s = simulate(DIAMOND, Placement.single_device(DIAMOND), DIAMOND_COSTS,
               _cluster(1))
  assert s.makespan_us == 9.0
  assert (s.start_us["b"], s.start_us["c"], s.start_us["d"]) == (1.0, 6.0, 8.0)
  assert s.transfers == ()


def test_diamond_on_two_devices_pays_two_transfers():
  # a(0-1) d0; b(1-6) d0; a->c copy 1-12; c(12-14) d1; c->d copy 14-25;
  # d(25-26) d0.
  p = _place({"a": 0, "b": 0, "c": 1, "d": 0}, 2)
  s = simulate(DIAMOND, p, DIAMOND_COSTS, _cluster(2))
  assert s.start_us["c"] == 12.0 and s.end_us["c"] == 14.0
  assert s.start_us["d"] == 25.0 and s.makespan_us == 26.0
  assert [(t.src_op, t.start_us, t.end_us) for t in s.transfers] == [
      ("a", 1.0, 12.0), ("c", 14.0, 25.0)]


def test_communication_makes_one_device_best():
  # Splitting the fork saves 2 us of compute but costs 22 us of copies.
  one = simulate(DIAMOND, Placement.single_device(DIAMOND, 2), DIAMOND_COSTS,
                 _cluster(2))
  two = simulate(DIAMOND, _place({"a": 0, "b": 0, "c": 1, "d": 0}, 2),
                 DIAMOND_COSTS, _cluster(2))
  assert one.makespan_us == 9.0 < two.makespan_us == 26.0


def test_free_communication_makes_two_devices_best():
  free = Cluster.uniform(2, comm=CommModel.uniform(0.0, 1e9))
  s = simulate(DIAMOND, _place({"a": 0, "b": 0, "c": 1, "d": 0}, 2),
               DIAMOND_COSTS, free)
  assert s.makespan_us == pytest.approx(7.0)  # a, b || c, d


def test_a_tensor_is_sent_once_per_device_and_channels_serialize():
  # a feeds b and c on device 1 (one copy) and e on device 2 (second copy,
  # which waits for device 0's channel: 12-23).
  g = _graph("abce", [("a", "b"), ("a", "c"), ("a", "e")])
  p = _place({"a": 0, "b": 1, "c": 1, "e": 2}, 3)
  s = simulate(g, p, {n: 1.0 for n in "abce"}, _cluster(3))
  assert [(t.dst_device, t.start_us, t.end_us) for t in s.transfers] == [
      (1, 1.0, 12.0), (2, 12.0, 23.0)]
  assert (s.start_us["b"], s.start_us["c"]) == (12.0, 13.0)
  assert s.start_us["e"] == 23.0 and s.makespan_us == 24.0


def test_receiver_channel_is_shared_too():
  # a on d0 and b on d1 both send to c on d2: the second copy waits for d2.
  g = _graph("abc", [("a", "c"), ("b", "c")])
  s = simulate(g, _place({"a": 0, "b": 1, "c": 2}, 3),
               {"a": 1.0, "b": 1.0, "c": 1.0}, _cluster(3))
  assert sorted((t.start_us, t.end_us) for t in s.transfers) == [
      (1.0, 12.0), (12.0, 23.0)]
  assert s.makespan_us == 24.0


def test_ready_ops_run_in_topological_order_and_control_edges_are_free():
  g = OpGraph([Op("a", "X", (0,)), Op("b", "X", (0,)), Op("c", "X", (0,))],
              [Edge("a", "c", -1)])
  s = simulate(g, _place({"a": 0, "b": 0, "c": 1}, 2),
               {"a": 2.0, "b": 2.0, "c": 1.0}, _cluster(2))
  assert (s.start_us["a"], s.start_us["b"]) == (0.0, 2.0)
  assert s.start_us["c"] == 2.0 and s.transfers == ()


def test_liveness_memory_of_a_training_chain():
  # f1 -> f2 -> loss -> b2 -> b1, and f1's activation is also read by b1.
  # Outputs of 100 B; f2 temp 50 B; a 1000 B weight on f1.
  names = ["f1", "f2", "loss", "b2", "b1"]
  g = OpGraph([Op(n, "X", output_bytes=(100,)) for n in names],
              [Edge("f1", "f2", 0, 0, 100), Edge("f2", "loss", 0, 0, 100),
               Edge("loss", "b2", 0, 0, 100), Edge("b2", "b1", 0, 0, 100),
               Edge("f1", "b1", 0, 1, 100)])
  costs = CostModel({n: OpCost(1.0) for n in names} |
                    {"f1": OpCost(1.0, persistent_bytes=1000),
                     "f2": OpCost(1.0, temp_bytes=50)})
  s = simulate(g, Placement.single_device(g), costs, _cluster(1))
  # During f2: weight 1000 + f1 out 100 + f2 out 100 + temp 50 = 1250.
  # During b2: 1000 + f1 (held for b1) 100 + loss out 100 + b2 out 100 = 1300.
  assert s.peak_bytes == (1300,)
  assert not s.memory_exceeded
  tight = simulate(g, Placement.single_device(g), costs, _cluster(1, 1299))
  assert tight.memory_exceeded and tight.over_cap() == [(0, 1300, 1299)]


def test_received_copies_are_charged_to_the_receiver():
  g = _graph("ab", [("a", "b")])
  s = simulate(g, _place({"a": 0, "b": 1}, 2), {"a": 1.0, "b": 1.0},
               _cluster(2))
  # d0 holds a's output (1000) until the copy is done; d1 holds the copy and
  # b's own output (1000 + 1000).
  assert s.peak_bytes == (1000, 2000)


def test_bad_placements_are_named():
  with pytest.raises(ValueError, match="op 'd' unplaced"):
    simulate(DIAMOND, _place({"a": 0, "b": 0, "c": 0}, 1), DIAMOND_COSTS,
             _cluster(1))
  with pytest.raises(ValueError, match="placement on 2 devices"):
    simulate(DIAMOND, Placement.single_device(DIAMOND, 2), DIAMOND_COSTS,
             _cluster(3))
  with pytest.raises(ValueError, match=r"placement\['a'\].*\[0, 2\)"):
    Placement({"a": 2}, 2)
  with pytest.raises(ValueError, match="missing op 'b'"):
    simulate(DIAMOND, Placement.single_device(DIAMOND), {"a": 1.0},
             _cluster(1))


def test_empty_graph():
  g = OpGraph([], [])
  s = simulate(g, Placement({}, 2), {}, _cluster(2))
  assert s.makespan_us == 0.0 and s.peak_bytes == (0, 0)


# -- Devices that share cores, links that overlap transfers, control messages.

def _pair(costs_a, costs_b):
  g = OpGraph([Op("a", "X", (0,)), Op("b", "X", (0,))], [])
  return g, _place({"a": 0, "b": 1}, 2), {"a": costs_a, "b": costs_b}


@pytest.mark.parametrize("capacity, end_a, end_b", [
    # One core's worth: both at half speed until b is done (4 us of work
    # at 0.5 -> t=8); a has 6 us left, alone at full speed -> 14.
    (1.0, 14.0, 8.0),
    # 1.5 cores: 0.75 each; b ends at 4 / 0.75, a then runs its last 6 us.
    (1.5, 6.0 + 4 / 0.75, 4 / 0.75),
    # Two cores' worth: no slow-down.
    (2.0, 10.0, 4.0)])
def test_two_devices_sharing_cores_by_hand(capacity, end_a, end_b):
  g, p, costs = _pair(10.0, 4.0)
  shared = Cluster.uniform(2, sharing=ComputeSharing((0, 0), capacity))
  s = simulate(g, p, costs, shared)
  assert s.end_us["a"] == pytest.approx(end_a)
  assert s.end_us["b"] == pytest.approx(end_b)
  # Apart (no sharing), or in different groups: parallel at full speed.
  for cluster in (Cluster.uniform(2), Cluster.uniform(
      2, sharing=ComputeSharing((0, 1), 1.0))):
    apart = simulate(g, p, costs, cluster)
    assert (apart.end_us["a"], apart.end_us["b"]) == (10.0, 4.0)


def test_sharing_slows_a_running_op_when_another_starts():
  # One core's worth for d0 and d1. d0 runs a (2 us of work), then c (2 us)
  # after it; d1 runs b (6 us). 0-4: a and b at half speed, a ends at 4, b
  # has done 2. 4-8: c and b at half speed, c ends at 8, b has 2 left,
  # alone at full speed until 10.
  g = OpGraph([Op("a", "X", (0,)), Op("b", "X", (0,)), Op("c", "X", (0,))],
              [Edge("a", "c", -1)])
  s = simulate(g, _place({"a": 0, "b": 1, "c": 0}, 2),
               {"a": 2.0, "b": 6.0, "c": 2.0},
               Cluster.uniform(2, sharing=ComputeSharing.shared(2)))
  assert (s.end_us["a"], s.start_us["c"], s.end_us["c"]) == (4.0, 4.0, 8.0)
  assert s.end_us["b"] == pytest.approx(10.0)
  assert s.makespan_us == pytest.approx(10.0)  # 10 us of work on one core


def test_a_thread_pool_runs_independent_ops_of_one_device_side_by_side():
  # a (10 us) and b (4 us) both on d0, independent. One op at a time: 14.
  # A pool of two threads on one core's worth (capacity 1): both at half
  # speed until b is done (t=8), a's last 6 us alone -> 14, the same
  # work. On 1.5 cores: 0.75 each, b ends at 4/0.75, a runs its last 6 us
  # at full speed.
  g = OpGraph([Op("a", "X", (0,)), Op("b", "X", (0,))], [])
  p = _place({"a": 0, "b": 0}, 2)
  costs = {"a": 10.0, "b": 4.0}
  serial = simulate(g, p, costs, Cluster.uniform(
      2, sharing=ComputeSharing.shared(2, 1.5)))
  assert (serial.start_us["b"], serial.end_us["b"]) == (10.0, 14.0)
  for capacity, end_b in ((1.0, 8.0), (1.5, 4 / 0.75)):
    pooled = simulate(g, p, costs, Cluster.uniform(
        2, sharing=ComputeSharing.shared(2, capacity, threads=2)))
    assert pooled.start_us == {"a": 0.0, "b": 0.0}
    assert pooled.end_us["b"] == pytest.approx(end_b)
    assert pooled.end_us["a"] == pytest.approx(end_b + 10.0 - end_b *
                                               capacity / 2)
    assert pooled.busy_us() == (pytest.approx(pooled.makespan_us), 0.0)


def test_a_pool_of_one_thread_serialises_a_group_across_devices():
  # Two devices drawing on one single-thread pool (capacity 2 does not
  # help: one op at a time). The lower ranked op (a, topological order)
  # runs first, then b: 0-10, 10-14; apart, pools of one thread each run
  # them side by side.
  g, p, costs = _pair(10.0, 4.0)
  one_pool = simulate(g, p, costs, Cluster.uniform(
      2, sharing=ComputeSharing.shared(2, 2.0, threads=1)))
  assert (one_pool.end_us["a"], one_pool.start_us["b"],
          one_pool.end_us["b"]) == (10.0, 10.0, 14.0)
  apart = simulate(g, p, costs, Cluster.uniform(
      2, sharing=ComputeSharing.alone(2, threads=1)))
  assert (apart.end_us["a"], apart.end_us["b"]) == (10.0, 4.0)


def test_a_transfer_s_work_shares_the_cores_at_both_ends():
  # a (4 us, d0) sends 1000 B to b (1 us, d1); c (30 us) runs on d1 from 0.
  # Link: 10 us latency, 1 GB/s, 8 us overhead: the copy arrives 11 us after
  # it starts and is 8 + 1 = 9 us of work on each side's core. d0 is idle:
  # its side is done at 4 + 9 = 13. d1 runs c: both at half speed, the
  # copy's work done at 4 + 18 = 22 (later than the link's 15), by when c
  # has 30 - 4 - 9 = 17 us left, alone again: c ends at 39, and b runs
  # after it (one op at a time on d1).
  g = OpGraph([Op("a", "X", (1000,)), Op("b", "X", (0,)),
               Op("c", "X", (0,))], [Edge("a", "b", 0, 0, 1000)])
  p = _place({"a": 0, "b": 1, "c": 1}, 2)
  costs = {"a": 4.0, "b": 1.0, "c": 30.0}
  worked = CommModel.uniform(10.0, 1.0, overhead_us=8.0, cpu_work=True)
  s = simulate(g, p, costs, Cluster.uniform(2, comm=worked))
  (copy,) = s.transfers
  assert (copy.start_us, copy.end_us) == (4.0, pytest.approx(22.0))
  assert s.end_us["c"] == pytest.approx(39.0)
  assert (s.start_us["b"], s.makespan_us) == (pytest.approx(39.0),
                                              pytest.approx(40.0))
  # Free for the cores (Baechi's model): c is not slowed, the copy lands
  # at 15.
  free = simulate(g, p, costs, Cluster.uniform(2, comm=CommModel.uniform(
      10.0, 1.0, overhead_us=8.0)))
  assert free.transfers[0].end_us == 15.0
  assert (free.end_us["c"], free.start_us["b"]) == (30.0, 30.0)


def test_a_slow_wire_holds_the_channels_not_the_cores():
  # As above, but 1000 B cross a wire of 0.01 GB/s (100 us) while the cores
  # process them at 1 GB/s: the copy arrives at 4 + 10 + 100 = 114; each
  # side's work is 8 + 1 = 9 us (d1 shares it with c: done at 22, c ends at
  # 39), so the link, not the cores, decides when b starts.
  g = OpGraph([Op("a", "X", (1000,)), Op("b", "X", (0,)),
               Op("c", "X", (0,))], [Edge("a", "b", 0, 0, 1000)])
  p = _place({"a": 0, "b": 1, "c": 1}, 2)
  costs = {"a": 4.0, "b": 1.0, "c": 30.0}
  wire = CommModel(Link(10.0, 0.01, 8.0, cpu_bandwidth_gbps=1.0),
                   cpu_work=True)
  s = simulate(g, p, costs, Cluster.uniform(2, comm=wire))
  (copy,) = s.transfers
  assert (copy.start_us, copy.end_us) == (4.0, pytest.approx(114.0))
  assert s.end_us["c"] == pytest.approx(39.0)
  assert s.start_us["b"] == pytest.approx(114.0)
  # Without the cores' own rate the wire's 108 us are the cores' work too:
  # c, sharing d1 with it, ends later.
  slow = simulate(g, p, costs, Cluster.uniform(2, comm=CommModel(
      Link(10.0, 0.01, 8.0), cpu_work=True)))
  assert slow.end_us["c"] > 50.0


def test_overhead_lets_transfers_overlap():
  # a's three outputs go to three readers on d1. Latency 10 us, 1000 B at
  # 1 GB/s: 11 us each. Without an overhead each holds the channels for all
  # 11 us (arrivals 12, 23, 34); with a 2 us overhead for 2 + 1 us, so they
  # start 3 us apart and arrive at 12, 15, 18.
  g = OpGraph([Op("a", "X", (1000, 1000, 1000))] +
              [Op(n, "X", (0,)) for n in "bcd"],
              [Edge("a", n, k, 0, 1000) for k, n in enumerate("bcd")])
  p = _place({"a": 0, "b": 1, "c": 1, "d": 1}, 2)
  costs = {n: 1.0 for n in "abcd"}
  serial = simulate(g, p, costs, _cluster(2))
  assert [t.end_us for t in serial.transfers] == [12.0, 23.0, 34.0]
  overlap = simulate(g, p, costs, Cluster.uniform(2, comm=CommModel.uniform(
      10.0, 1.0, overhead_us=2.0)))
  assert [(t.start_us, t.end_us) for t in overlap.transfers] == [
      (1.0, 12.0), (4.0, 15.0), (7.0, 18.0)]
  assert overlap.makespan_us == 19.0


def test_hosts_on_one_machine_slow_each_other_by_its_capacity():
  # Hosts {d0, d1} and {d2, d3}, each on one core (capacity 1), the
  # machine running 1.6 cores' worth. a, b on host 0 and c on host 1, 10 us
  # each, start at 0: host 0's demand 1 (two ops on its one core), host
  # 1's 1; 1.6 / 2 = 0.8, so a and b run at 0.5 x 0.8 = 0.4 and c at 0.8:
  # c ends at 12.5, a and b have 5 us left, now at 0.5: they end at 22.5.
  g = OpGraph([Op(n, "X", (0,)) for n in "abc"], [])
  p = _place({"a": 0, "b": 1, "c": 2}, 4)
  costs = {n: 10.0 for n in "abc"}

  def run(machine):
    sharing = ComputeSharing((0, 0, 1, 1), 1.0, machine_capacity=machine)
    return simulate(g, p, costs, Cluster.uniform(4, comm=COMM,
                                                 sharing=sharing))
  s = run(1.6)
  assert s.end_us["c"] == pytest.approx(12.5)
  assert s.end_us["a"] == pytest.approx(22.5)
  assert s.end_us["b"] == pytest.approx(22.5)
  # Hosts apart (the machine runs both hosts' cores unslowed): per-host
  # groups only.
  apart = run(2.0)
  assert (apart.end_us["c"], apart.end_us["a"]) == (10.0, 20.0)
  assert run(None).end_us == apart.end_us
  with pytest.raises(ValueError, match=r"Argument `machine_capacity` must "
                     r"be a finite number >= 1 or None. Received: "
                     r"machine_capacity=0.5"):
    ComputeSharing((0, 1), machine_capacity=0.5)


def test_tasks_of_a_host_share_its_network_link():
  # a on d0 and b on d1 (host 0) each send 1000 B to c on d2 and e on d3
  # (host 1) at t=1 over a link of 10 us latency, 2 us overhead, 1 GB/s
  # (1 us of wire per 1000 B). Per device pair the two copies run side by
  # side (both arrive at 12); through one link per host the second waits
  # for the first's 1 us on the wire: 1-12 and 2-13.
  g = _graph("abce", [("a", "c"), ("b", "e")])
  p = _place({"a": 0, "b": 1, "c": 2, "e": 3}, 4)
  costs = {n: 1.0 for n in "abce"}
  link = Link(10.0, 1.0, 2.0)
  apart = simulate(g, p, costs, Cluster.uniform(4, comm=CommModel(link)))
  assert sorted((t.start_us, t.end_us) for t in apart.transfers) == [
      (1.0, 12.0), (1.0, 12.0)]
  shared = simulate(g, p, costs, Cluster.uniform(4, comm=CommModel.two_level(
      "AABB", Link(0.0, 1e6), link)))
  assert sorted((t.start_us, t.end_us) for t in shared.transfers) == [
      (1.0, 12.0), (2.0, 13.0)]
  assert shared.makespan_us == 14.0
  # Ways in and out are apart: d0 -> d2 and d3 -> d1 at once do not wait
  # for each other.
  g2 = _graph("abce", [("a", "c"), ("e", "b")])
  p2 = _place({"a": 0, "b": 1, "c": 2, "e": 3}, 4)
  both = simulate(g2, p2, costs, Cluster.uniform(4, comm=CommModel.two_level(
      "AABB", Link(0.0, 1e6), link)))
  assert sorted((t.start_us, t.end_us) for t in both.transfers) == [
      (1.0, 12.0), (1.0, 12.0)]
  with pytest.raises(ValueError, match=r"Argument `hosts` must be per "
                     r"device a host index >= 0. Received: hosts=\(0, -1\)"):
    CommModel(link, hosts=(0, -1))
  with pytest.raises(ValueError, match=r"Argument `comm` must be a "
                     r"CommModel with one host per device \(4\). Received: "
                     r"comm=\(0, 1\)"):
    Cluster.uniform(4, comm=CommModel(link, hosts=(0, 1)))


def test_control_edges_across_devices_can_be_messages():
  # a (d0) -> control -> c (d1), and a -> control -> d (d1): one message
  # per op and destination device, a zero-byte transfer of 10 us.
  g = OpGraph([Op(n, "X", (0,)) for n in "acd"],
              [Edge("a", "c", -1), Edge("a", "d", -1)])
  p = _place({"a": 0, "c": 1, "d": 1}, 2)
  costs = {"a": 2.0, "c": 1.0, "d": 1.0}
  free = simulate(g, p, costs, _cluster(2))
  assert free.start_us["c"] == 2.0 and free.transfers == ()
  messages = Cluster.uniform(2, comm=CommModel.uniform(
      10.0, 1.0, control_messages=True))
  s = simulate(g, p, costs, messages)
  assert [(t.src_output, t.bytes, t.start_us, t.end_us)
          for t in s.transfers] == [(-1, 0, 2.0, 12.0)]
  assert (s.start_us["c"], s.start_us["d"]) == (12.0, 13.0)
  assert s.peak_bytes == (0, 0)  # a message holds no memory


@pytest.mark.parametrize("seed", range(3))
def test_timing_pass_then_memory_pass_equals_simulate(seed):
  from tfopt.graph.synthetic import layered_dag, total_memory
  from tfopt.simulate import simulate_timing
  g, costs = layered_dag(120, seed=seed, mean_width=4)
  cluster = Cluster.uniform(3, int(total_memory(g, costs) * 0.5))
  table = {op.name: i % 3 for i, op in enumerate(g.ops)}
  for members in g.colocation_groups.values():
    for m in members:
      table[m] = table[members[0]]
  plan = Placement(table, 3)
  whole = simulate(g, plan, costs, cluster)
  timing = simulate_timing(g, plan, costs, cluster)
  assert timing.makespan_us == whole.makespan_us
  assert timing.schedule() == whole


def test_the_step_overhead_of_the_devices_used_is_added():
  # Two independent 10 us ops: on one device 20 us + the overhead of one;
  # on two 10 us + the overhead of two; beyond the table, its last step.
  g = _graph("ab", [])
  costs = {"a": 10.0, "b": 10.0}
  cluster = Cluster.uniform(3, comm=COMM, step_overhead_us=(1.0, 8.0))
  assert simulate(g, _place({"a": 0, "b": 0}, 3), costs,
                  cluster).makespan_us == 21.0
  assert simulate(g, _place({"a": 0, "b": 2}, 3), costs,
                  cluster).makespan_us == 18.0
  assert cluster.step_overhead(3) == 15.0
  # The ops' times are not moved by it: it is the runtime's, after them.
  split = simulate(g, _place({"a": 0, "b": 2}, 3), costs, cluster)
  assert split.end_us == {"a": 10.0, "b": 10.0}
  for bad in ((1.0, -2.0), (float("inf"),), 5.0):
    with pytest.raises(ValueError, match="Argument `step_overhead_us` must "
                       "be a list or tuple of finite times >= 0"):
      Cluster.uniform(2, step_overhead_us=bad)
