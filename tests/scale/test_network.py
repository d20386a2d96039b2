"""Network stragglers from measured link rates (hand-made rates and a fake
set of hosts whose probe can fail); the launcher's per-host lines."""

import pytest

from tfopt.scale import network
from tfopt.scale.host_report import host_lines

def test_a_host_far_below_the_others_median_is_named_slowest_first():
  assert network.network_stragglers([100e6, 9e6, 98e6, 30e6]) == [1, 3]
  # 60 of ~97: not below half the others' median.
  assert network.network_stragglers([95e6, 60e6, 96e6]) == []
  # Unmeasured hosts neither count nor get named; one measured: nothing.
  assert network.network_stragglers([None, 9e6, 98e6]) == [1]
  assert network.network_stragglers([None, 9e6]) == []
  assert network.network_stragglers([50e6, 40e6], ratio=0.9) == [1]
  with pytest.raises(ValueError, match=r"Argument `ratio` must be a "
                     r"fraction in \(0, 1\). Received: ratio=1.5"):
    network.network_stragglers([1.0, 2.0], ratio=1.5)

class _Hosts:
  """Three hosts; host 1's probe fails, host 2 is slow."""
  num_hosts = 3
  addresses = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]

  def measure_link(self, host, seconds):
    assert seconds == 0.1
    if host == 1:
      raise OSError("timed out")
    rate = 100e6 if host == 0 else 5e6
    return {"down_bits": rate, "up_bits": rate * 0.9}

def test_a_failed_probe_is_recorded_not_raised():
  links = network.probe_links(_Hosts(), 0.1)
  assert links[1] == {"address": "10.0.0.2", "error": "timed out"}
  rates = [network.slowest_rate(link) for link in links]
  assert rates == [90e6, None, 4.5e6]
  assert network.network_stragglers(rates) == [2]
  assert network.probe_links(_Hosts(), 0.1, skip={0, 1})[:2] == [None, None]

def test_the_summary_gives_each_host_its_workers_and_verdict():
  links = network.probe_links(_Hosts(), 0.1)
  record = {"addresses": ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.3"],
            "links": links, "network_stragglers": ["10.0.0.3"]}
  lines = host_lines(record, {})
  assert lines[0] == ("host 10.0.0.1 (workers 0): link 100.0 Mbit/s in, "
                      "90.0 Mbit/s out")
  assert lines[1] == ("host 10.0.0.2 (workers 1): link not measured "
                      "(timed out)")
  assert lines[2].startswith("host 10.0.0.3 (workers 2,3): link 5.0 "
                             "Mbit/s in, 4.5 Mbit/s out; NETWORK STRAGGLER")
  assert host_lines({}, {}) == []


def _links(rates_bits):
  return [{"address": f"10.0.0.{h + 1}", "down_bits": rate, "up_bits": rate}
          for h, rate in enumerate(rates_bits)]


def test_the_network_watch_probes_when_two_hosts_rtts_rise_and_times_the_period():
  """Hand-made samples: levels are each host's lowest RTT; one host's RTT
  rising alone is no probe; both rising is one, and the host it names is
  slow from that step until a probe, asked for once the RTTs are back
  down, measures its link back."""
  watch = network.NetworkWatch(["10.0.0.1", "10.0.0.2"], start=100.0)
  assert not watch.sample(100.0, 0, [None, None])  # no connection yet
  assert not watch.sample(101.0, 1, [2.0, 1.0])
  assert not watch.sample(102.0, 5, [0.8, 1.2])
  assert watch.level == [0.8, 1.0]
  # 8 > 4 x 0.8 and 0.8 + 5, alone: that host's own delay, no probe.
  assert not watch.sample(103.0, 9, [8.0, 1.1])
  # 5.5 is not 5 ms above its level of 1.0: still only one host raised.
  assert not watch.sample(104.0, 12, [9.0, 5.5])
  assert watch.sample(105.0, 14, [12.0, 25.0])
  named = watch.probed(105.5, 14, [12.0, 25.0], _links([900e6, 15e6]))
  assert named == ["10.0.0.2"]
  (period,) = watch.slow
  assert period == {"address": "10.0.0.2", "from_s": 5.5, "from_step": 14,
                    "to_s": None, "to_step": None, "down_bits": 15e6,
                    "up_bits": 15e6, "rtt_ms": 25.0}
  # Still slow: no new probe, the period stays open.
  assert not watch.sample(106.0, 16, [20.0, 30.0])
  assert period["to_s"] is None
  # The RTTs back down: a probe, within the cooldown not yet.
  assert not watch.sample(108.0, 40, [0.9, 1.3])
  assert watch.sample(111.0, 60, [0.9, 1.3])
  # The link still measures slow: the period stays open, nothing new.
  assert watch.probed(111.0, 60, [0.9, 1.3],
                      _links([900e6, 14e6])) == ["10.0.0.2"]
  assert period["to_s"] is None and len(watch.slow) == 1
  assert watch.level == [0.8, 1.0]  # a slow link is no busy network
  # Measured back: the period ends at that probe.
  assert watch.sample(117.0, 90, [1.0, 1.1])
  assert watch.probed(117.5, 91, [1.0, 1.1], _links([900e6, 880e6])) == []
  assert (period["to_s"], period["to_step"]) == (17.5, 91)
  assert watch.record() == {"probes": watch.probes, "slow": watch.slow}
  assert [(p["named"], p["confirming"]) for p in watch.probes] == [
      (["10.0.0.2"], False), (["10.0.0.2"], True), ([], True)]
  assert watch.level == [0.8, 1.0]


def test_a_probe_that_names_nobody_raises_the_level_and_probes_wait():
  watch = network.NetworkWatch(["a", "b", "c"], cooldown_s=5.0)
  assert not watch.sample(0.0, 0, [1.0, 1.0, 1.0])
  assert watch.sample(1.0, 3, [9.0, 9.0, 1.0])
  assert watch.probed(1.0, 3, [9.0, 9.0, 1.0],
                      _links([900e6, 880e6, 910e6])) == []
  assert watch.level == [9.0, 9.0, 1.0] and watch.slow == []
  # A busy network at that level is no longer raised.
  assert not watch.sample(2.0, 5, [12.0, 11.0, 1.0])
  # Higher again, but within the cooldown: no probe yet; after it, one.
  assert not watch.sample(3.0, 7, [60.0, 70.0, 1.0])
  assert watch.sample(6.5, 9, [60.0, 70.0, 1.0])
  # One host sampled alone (the others have no connection): it suffices.
  lone = network.NetworkWatch(["a", "b"])
  lone.sample(0.0, 0, [1.0, None])
  assert lone.sample(1.0, 1, [20.0, None])


def test_a_step_slowing_down_asks_for_a_probe_even_with_quiet_rtts():
  """The step time's level is its lowest; a step over step_jump x it is
  a probe (the RTTs sampled need not have risen); a probe naming nobody
  raises the level, so a compute straggler is probed once, not every
  cooldown."""
  watch = network.NetworkWatch(["a", "b"], step_jump=2.0, cooldown_s=1.0)
  assert not watch.sample(0.0, 0, [1.0, 1.0], step_s=9.0)  # first step
  assert not watch.sample(1.0, 80, [1.0, 1.0], step_s=0.012)
  assert not watch.sample(2.0, 165, [1.0, 1.0], step_s=0.020)
  assert not watch.sample(3.0, 165, [1.0, 1.0], step_s=None)  # a pause
  assert watch.step_level == 0.012
  assert watch.sample(4.0, 195, [1.2, 1.1], step_s=0.034)
  assert watch.probed(4.2, 195, [1.2, 1.1],
                      _links([950e6, 70e6])) == ["b"]
  assert watch.probes[0]["step_s"] == 0.034
  assert watch.step_level == 0.012  # a slow link is not the new normal
  # Step time back: asked to confirm; the link measures back, closed.
  assert watch.sample(6.0, 300, [1.0, 1.0], step_s=0.013)
  watch.probed(6.2, 300, [1.0, 1.0], _links([950e6, 940e6]))
  assert [(p["from_step"], p["to_step"]) for p in watch.slow] == [(195, 300)]
  # A compute straggler: probed once, then the level follows it.
  assert watch.sample(8.0, 350, [1.0, 1.0], step_s=0.05)
  assert watch.probed(8.0, 350, [1.0, 1.0], _links([950e6, 940e6])) == []
  assert watch.step_level == 0.05
  assert not watch.sample(10.0, 390, [1.0, 1.0], step_s=0.06)


def test_network_watch_refuses_bad_settings_and_samples():
  for name, value in (("jump", 1.0), ("min_rise_ms", -1),
                      ("step_jump", 0.5), ("cooldown_s", float("inf"))):
    with pytest.raises(ValueError, match=f"Argument `{name}` must be a "
                       f"finite number > .*Received: {name}="):
      network.NetworkWatch(["a", "b"], **{name: value})
  with pytest.raises(ValueError, match=r"Argument `rtts_ms` must be one RTT "
                     r"\(or None\) per host \(2\). Received: rtts_ms=\[1.0\]"):
    network.NetworkWatch(["a", "b"]).sample(0.0, 0, [1.0])
  with pytest.raises(ValueError, match=r"Argument `step_s` must be a "
                     r"positive finite number of seconds, or None. "
                     r"Received: step_s=0"):
    network.NetworkWatch(["a", "b"]).sample(0.0, 0, [1.0, 1.0], step_s=0)


def test_the_summary_gives_the_steps_a_host_was_slow_in():
  record = {"addresses": ["10.0.0.1", "10.0.0.2"],
            "network_watch": {"probes": [], "slow": [
                {"address": "10.0.0.2", "from_s": 5.5, "from_step": 14,
                 "to_s": 9.0, "to_step": 60, "down_bits": 15e6,
                 "up_bits": 12e6, "rtt_ms": 25.0},
                {"address": "10.0.0.2", "from_s": 20.0, "from_step": 300,
                 "to_s": None, "to_step": None, "down_bits": 9e6,
                 "up_bits": 9e6, "rtt_ms": 30.0}]}}
  first, second = host_lines(record, {})
  assert first == "host 10.0.0.1 (workers 0)"
  assert second == ("host 10.0.0.2 (workers 1): NETWORK STRAGGLER from step "
                    "14 to step 60 (its link 15.0 Mbit/s in, 12.0 Mbit/s out "
                    "then); NETWORK STRAGGLER from step 300 to the end (its "
                    "link 9.0 Mbit/s in, 9.0 Mbit/s out then)")
