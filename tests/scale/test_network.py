"""Network stragglers from measured link rates (hand-made rates and a fake
set of hosts whose probe can fail); the launcher's per-host lines."""

import types

import pytest

from tfopt.scale import launch as launch_module
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
  assert not watch.sample(100.0, 0, [None, None])  # no connection, no step
  assert not watch.sample(100.5, 0, [2.0, 1.0])  # no step time: nothing
  # Steps (0.01 s each) from here on: first the baseline.
  assert watch.sample(101.0, 1, [2.0, 1.0], step_s=0.01)
  assert watch.probed(101.0, 1, [2.0, 1.0], _links([900e6, 900e6])) == []
  assert not watch.sample(102.0, 5, [0.8, 1.2], step_s=0.01)
  assert watch.level == [0.8, 1.0]
  # 8 > 4 x 0.8 and 0.8 + 5, alone: that host's own delay, no probe.
  assert not watch.sample(103.0, 9, [8.0, 1.1], step_s=0.01)
  # 5.5 is not 5 ms above its level of 1.0: still only one host raised.
  assert not watch.sample(104.0, 12, [9.0, 5.5], step_s=0.01)
  assert watch.sample(105.0, 14, [12.0, 25.0], step_s=0.01)
  named = watch.probed(105.5, 14, [12.0, 25.0], _links([900e6, 15e6]))
  assert named == ["10.0.0.2"]
  (period,) = watch.slow
  assert period == {"address": "10.0.0.2", "from_s": 5.5, "from_step": 14,
                    "to_s": None, "to_step": None, "down_bits": 15e6,
                    "up_bits": 15e6, "rtt_ms": 25.0}
  # Still slow: no new probe, the period stays open.
  assert not watch.sample(106.0, 16, [20.0, 30.0], step_s=0.01)
  assert period["to_s"] is None
  # The RTTs back down: a probe, within the cooldown not yet.
  assert not watch.sample(108.0, 40, [0.9, 1.3], step_s=0.01)
  assert watch.sample(111.0, 60, [0.9, 1.3], step_s=0.01)
  # The link still measures slow: the period stays open, nothing new.
  assert watch.probed(111.0, 60, [0.9, 1.3],
                      _links([900e6, 14e6])) == ["10.0.0.2"]
  assert period["to_s"] is None and len(watch.slow) == 1
  assert watch.level == [0.8, 1.0]  # a slow link is no busy network
  # Named again: the next confirming probe waits twice the cooldown.
  assert not watch.sample(117.0, 90, [1.0, 1.1], step_s=0.01)
  # Not measured (its probe failed; skipped; the only other host failed):
  # the period stays open.
  assert watch.sample(121.0, 90, [1.0, 1.1], step_s=0.01)
  failed = [_links([900e6])[0], {"address": "10.0.0.2", "error": "timeout"}]
  assert watch.probed(121.0, 90, [1.0, 1.1], failed) == []
  assert watch.sample(126.0, 95, [1.0, 1.1], step_s=0.01)
  assert watch.probed(126.0, 95, [1.0, 1.1], [failed[0], None]) == []
  assert watch.sample(131.0, 97, [1.0, 1.1], step_s=0.01)
  assert watch.probed(131.0, 97, [1.0, 1.1],
                      [{"address": "10.0.0.1", "error": "timeout"},
                       _links([900e6, 900e6])[1]]) == []
  assert period["to_s"] is None
  # Measured back: the period ends at that probe.
  assert watch.sample(136.0, 100, [1.0, 1.1], step_s=0.01)
  assert watch.probed(136.5, 101, [1.0, 1.1], _links([900e6, 880e6]),
                      took_s=0.6) == []
  assert (period["to_s"], period["to_step"]) == (36.5, 101)
  assert [(p["named"], p["kind"]) for p in watch.probes] == [
      ([], "baseline"), (["10.0.0.2"], "alarm"),
      (["10.0.0.2"], "confirming")] + [([], "confirming")] * 4
  assert watch.probes[-1]["took_s"] == 0.6
  assert watch.record() == {"probes": watch.probes, "slow": watch.slow,
                            "probe_counts": {"baseline": 1, "alarm": 1,
                                             "confirming": 5,
                                             "false_alarm": 0}}
  assert watch.level == [0.8, 1.0]


def test_a_probe_that_names_nobody_holds_the_levels_and_probes_wait():
  """An alarm naming nobody holds the levels at least at its values for
  hold_s (a busy network swinging is probed once), and the cooldown
  spaces the probes."""
  watch = network.NetworkWatch(["a", "b", "c"], cooldown_s=5.0, hold_s=30.0)
  assert watch.sample(0.0, 0, [1.0, 1.0, 1.0], step_s=0.01)  # baseline
  watch.probed(0.0, 0, [1.0, 1.0, 1.0], _links([900e6, 880e6, 910e6]))
  assert watch.sample(1.0, 3, [9.0, 9.0, 1.0], step_s=0.01)
  assert watch.probed(1.0, 3, [9.0, 9.0, 1.0],
                      _links([900e6, 880e6, 910e6])) == []
  assert watch.level == [9.0, 9.0, 1.0] and watch.slow == []
  # The network swings between quiet and that busy: no new alarm while
  # the levels hold; after hold_s they fall to the quiet values again.
  for t in range(7, 31, 2):
    assert not watch.sample(float(t), t,
                            [20.0 if (t // 2) % 2 else 0.5] * 2 + [1.0],
                            step_s=0.01)
  assert watch.level == [9.0, 9.0, 1.0]
  assert not watch.sample(32.0, 40, [0.5, 0.5, 1.0], step_s=0.01)
  assert watch.level == [0.5, 0.5, 1.0]
  # Higher than the hold: an alarm (within the cooldown not yet).
  other = network.NetworkWatch(["a", "b"], cooldown_s=5.0)
  assert other.sample(0.0, 0, [1.0, 1.0], step_s=0.01)  # baseline
  other.probed(0.0, 0, [1.0, 1.0], _links([900e6, 880e6]))
  assert other.sample(1.0, 3, [9.0, 9.0], step_s=0.01)
  other.probed(1.0, 3, [9.0, 9.0], _links([900e6, 880e6]))
  assert not other.sample(3.0, 7, [60.0, 70.0], step_s=0.01)
  assert other.sample(6.5, 9, [60.0, 70.0], step_s=0.01)
  assert other.probe_counts["false_alarm"] == 1
  # One host sampled alone (the others have no connection): it suffices.
  lone = network.NetworkWatch(["a", "b"])
  assert lone.sample(0.0, 0, [1.0, None], step_s=0.01)  # baseline
  lone.probed(0.0, 0, [1.0, None], [_links([900e6])[0], None])
  assert lone.sample(1.0, 1, [20.0, None], step_s=0.01)
  # No step ended since the last sample: no alarm, however high the RTTs.
  late = network.NetworkWatch(["a", "b"])
  assert late.sample(0.0, 0, [1.0, 1.0], step_s=0.01)
  late.probed(0.0, 0, [1.0, 1.0], _links([900e6, 880e6]))
  assert not late.sample(1.0, 800, [30.0, 40.0], step_s=None)


def test_a_baseline_probe_finds_a_link_slow_from_the_start():
  """The first sample with a step time asks for a baseline probe: a link
  slow before the attempt's first sample raises nothing later."""
  watch = network.NetworkWatch(["a", "b"])
  assert not watch.sample(0.0, 0, [None, None], step_s=None)
  assert watch.sample(1.0, 40, [20.0, 25.0], step_s=0.1)
  assert watch.probed(1.2, 40, [20.0, 25.0], _links([900e6, 9e6])) == ["b"]
  assert watch.probes[0]["kind"] == "baseline"
  assert watch.slow[0]["from_step"] == 40
  # The baseline starts no cooldown: an alarm right after it may run.
  quiet = network.NetworkWatch(["a", "b"], cooldown_s=5.0)
  assert quiet.sample(1.0, 40, [1.0, 1.0], step_s=0.1)
  assert quiet.probed(1.0, 40, [1.0, 1.0], _links([900e6, 900e6])) == []
  assert not quiet.sample(1.5, 45, [1.0, 1.0], step_s=0.1)  # no second
  assert quiet.sample(2.0, 50, [20.0, 25.0], step_s=0.1)
  # Once: later quiet samples with step times ask only to confirm.
  assert watch.sample(7.0, 90, [20.0, 25.0], step_s=0.1)
  assert watch.probed(7.0, 90, [20.0, 25.0], _links([900e6, 9e6])) == ["b"]
  assert watch.probes[1]["kind"] == "confirming"


def test_a_step_slowing_down_asks_for_a_probe_even_with_quiet_rtts():
  """The step time's level is its lowest; a step over step_jump x it is
  an alarm (the RTTs sampled need not have risen); an alarm naming
  nobody holds the level, so a compute straggler is probed once."""
  watch = network.NetworkWatch(["a", "b"], step_jump=2.0, cooldown_s=1.0)
  assert watch.sample(1.0, 80, [1.0, 1.0], step_s=0.012)
  assert watch.probed(1.0, 80, [1.0, 1.0], _links([950e6, 940e6])) == []
  assert watch.probes[0]["kind"] == "baseline"
  assert watch.step_level == 0.012  # a baseline holds nothing
  assert not watch.sample(2.0, 165, [1.0, 1.0], step_s=0.020)
  assert not watch.sample(3.0, 165, [1.0, 1.0], step_s=None)  # a pause
  assert watch.step_level == 0.012
  assert watch.sample(4.0, 195, [1.2, 1.1], step_s=0.034)
  assert watch.probed(4.2, 195, [1.2, 1.1],
                      _links([950e6, 70e6])) == ["b"]
  assert watch.probes[1]["step_s"] == 0.034
  assert watch.step_level == 0.012  # a slow link is not the new normal
  # Step time back: asked to confirm; the link measures back, closed.
  assert watch.sample(6.0, 300, [1.0, 1.0], step_s=0.013)
  watch.probed(6.2, 300, [1.0, 1.0], _links([950e6, 940e6]))
  assert [(p["from_step"], p["to_step"]) for p in watch.slow] == [(195, 300)]
  # A compute straggler: probed once, then the level holds at it.
  assert watch.sample(8.0, 350, [1.0, 1.0], step_s=0.05)
  assert watch.probed(8.0, 350, [1.0, 1.0], _links([950e6, 940e6])) == []
  assert watch.step_level == 0.05
  assert not watch.sample(10.0, 390, [1.0, 1.0], step_s=0.06)
  assert not watch.sample(12.0, 420, [1.0, 1.0], step_s=0.013)
  assert watch.step_level == 0.05  # held
  assert watch.probe_counts == {"baseline": 1, "alarm": 2, "confirming": 1,
                                "false_alarm": 1}


def test_a_lasting_throttle_backs_the_confirming_probes_off():
  """Confirming probes that name the same host again wait 2x, 4x, ...
  the cooldown, up to MAX_COOLDOWN_S; the probes kept are the last
  MAX_PROBES_KEPT, every one counted."""
  watch = network.NetworkWatch(["a", "b"], cooldown_s=5.0)
  assert watch.sample(0.0, 0, [1.0, 1.0], step_s=0.1)
  watch.probed(0.0, 0, [1.0, 1.0], _links([900e6, 9e6]))  # named b
  now, waits = 0.0, []
  for _ in range(7):
    t = now + 1.0
    while not watch.sample(t, 0, [1.0, 1.0], step_s=0.1):
      t += 1.0
    waits.append(t - now)
    now = t
    assert watch.probed(now, 0, [1.0, 1.0], _links([900e6, 9e6])) == ["b"]
  # The baseline named b: its cooldown counts; then 10, 20, 40, 60, 60 s.
  assert waits == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0]
  for i in range(60):
    watch.probed(1000.0 + i, i, [1.0, 1.0], _links([900e6, 9e6]))
  assert len(watch.probes) == network.MAX_PROBES_KEPT
  assert watch.probes[-1]["step"] == 59
  assert sum(watch.probe_counts.values()) == 68
  assert len(watch.slow) == 1


def test_network_watch_refuses_bad_settings_and_samples():
  for name, value in (("jump", 1.0), ("min_rise_ms", -1),
                      ("step_jump", 0.5), ("cooldown_s", float("inf")),
                      ("hold_s", 0)):
    with pytest.raises(ValueError, match=f"Argument `{name}` must be a "
                       f"finite number > .*Received: {name}="):
      network.NetworkWatch(["a", "b"], **{name: value})
  for bad in ([1.0], [1.0, float("nan")], [1.0, -2.0]):
    with pytest.raises(ValueError, match=r"Argument `rtts_ms` must be one "
                       r"RTT \(finite ms >= 0, or None\) per host \(2\). "
                       r"Received: rtts_ms=\["):
      network.NetworkWatch(["a", "b"]).sample(0.0, 0, bad)
  with pytest.raises(ValueError, match=r"Argument `links` must be one probed "
                     r"link \(or None\) per host \(2\)"):
    network.NetworkWatch(["a", "b"]).probed(0.0, 0, [1.0, 1.0],
                                            _links([1e9]))
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
                    "then); NETWORK STRAGGLER from step 300 not measured back "
                    "before the attempt ended (its link 9.0 Mbit/s in, 9.0 "
                    "Mbit/s out then)")


class _WatchedHosts:
  """Two hosts for the launcher's link watch: given RTTs and rates; `ss`
  may fail."""
  num_hosts = 2
  addresses = ["10.0.0.1", "10.0.0.2"]

  def __init__(self, rtts, rates, fail=None):
    self.rtts, self.rates, self.fail = rtts, rates, fail
    self.sampled, self.measured = 0, []

  def tcp_rtt_ms(self, host):
    if self.fail is not None:
      raise self.fail
    self.sampled += 1
    return self.rtts[host]

  def measure_link(self, host, seconds):
    self.measured.append((host, seconds))
    return {"down_bits": self.rates[host], "up_bits": self.rates[host]}


def _attempt(hosts, down=()):
  """An attempt of a launcher on `hosts` (links in `down` cut), watched,
  with hand-made beats in place of the workers' heartbeats."""
  launcher = types.SimpleNamespace(
      hosts=hosts, link_probe_s=5.0, terminate_requested=False,
      down_until={h: float("inf") for h in down}, workers=1)
  attempt = launch_module._Attempt(launcher, 0)
  attempt.record["started"], attempt.record["last_step"] = 0.0, 0
  attempt.network_watch = network.NetworkWatch(hosts.addresses)
  attempt.watch = types.SimpleNamespace(beats={}, directory="/nonexistent")
  return attempt


def _beat(step, end, phase="host", paused=0.0):
  """A beat written right at step `step`'s end, `paused` s of pauses
  summed by then."""
  return {"step": step, "step_end_time": end, "phase": phase, "time": end,
          "step_end_paused_s": paused, "paused_s": paused}


def test_the_step_time_comes_from_the_beats_step_end_times():
  """Steps slower than the sampling interval, pauses (seen or not),
  several workers: hand-computed seconds per step."""
  attempt = _attempt(_WatchedHosts([1.0, 1.0], [1e9, 1e9]))
  beats = attempt.watch.beats
  beats[0] = _beat(10, 100.0)
  assert attempt._step_s() is None  # a reference only
  beats[0] = _beat(10, 100.0)  # no step ended: the reference stays
  assert attempt._step_s() is None
  beats[0] = _beat(11, 102.5)  # one step of 2.5 s
  assert attempt._step_s() == 2.5
  beats[0] = _beat(14, 103.1)
  assert attempt._step_s() == pytest.approx(0.2)
  # A checkpoint of 6.8 s after step 14, seen or not by a beat: step 15's
  # 0.15 s, not 6.95 s.
  beats[0] = dict(_beat(14, 103.1), phase="checkpoint", time=105.0,
                  paused_s=1.9)
  assert attempt._step_s() is None  # a pause: no step time
  beats[0] = _beat(15, 110.05, paused=6.8)
  assert attempt._step_s() == pytest.approx(0.15)
  beats[0], beats[1] = _beat(25, 111.05, paused=6.8), None
  assert attempt._step_s() == pytest.approx(0.1)
  beats[1] = _beat(25, 111.0)
  beats[0] = _beat(35, 112.05, paused=6.8)
  assert attempt._step_s() == pytest.approx(0.1)
  beats[0], beats[1] = _beat(45, 113.05, paused=6.8), _beat(30, 113.5)
  assert attempt._step_s() == pytest.approx(0.5)  # the slowest worker
  # A step in progress for longer than the sampling interval (a stalled
  # link): its time so far, less a pause since the last step's end;
  # within the interval: nothing.
  beats[1] = None
  beats[0] = dict(_beat(45, 113.05, paused=6.8), phase="step", time=113.5)
  assert attempt._step_s() is None
  beats[0] = dict(_beat(45, 113.05, paused=6.8), phase="step",
                  time=116.05, paused_s=7.3)
  assert attempt._step_s() == pytest.approx(2.5)
  # Another worker pausing (its checkpoint, the job's end): no step time,
  # the references kept.
  beats[1] = {"step": 45, "phase": "done", "time": 116.0}
  assert attempt._step_s() is None
  beats[1] = None
  beats[0] = _beat(55, 117.05, paused=6.8)
  assert attempt._step_s() == pytest.approx(0.4)
  beats[0] = {"step": 60, "phase": "host"}  # an older worker's beat
  assert attempt._step_s() is None


def test_the_launchers_watch_probes_records_and_never_fails_the_job():
  hosts = _WatchedHosts([1.0, 1.0], [900e6, 10e6])
  attempt = _attempt(hosts)
  attempt.watch.beats[0] = _beat(10, 100.0)
  attempt._watch_links(1.0)
  assert hosts.measured == []  # no step time yet
  attempt.watch.beats[0] = _beat(50, 101.0)
  attempt.record["last_step"] = 50
  attempt._watch_links(1.5)  # within RTT_EVERY_S: not sampled
  assert hosts.sampled == 2
  attempt._watch_links(2.0)
  # The baseline probe, each link for at most WATCH_PROBE_S, not the
  # launcher's 5 s; host 2 named from step 50.
  assert hosts.measured == [(0, 0.25), (1, 0.25)]
  watched = attempt.record["network_watch"]
  assert [p["kind"] for p in watched["probes"]] == ["baseline"]
  assert [(p["address"], p["from_step"]) for p in watched["slow"]] == [
      ("10.0.0.2", 50)]
  # `ss` failing: recorded beside what was found; the watch stops after
  # SS_FAILURES_TO_STOP failures in a row.
  hosts.fail = OSError("ss: cannot open netlink socket")
  for t in range(launch_module.WATCH_FAILURES_TO_STOP):
    assert attempt.network_watch is not None
    attempt._watch_links(3.0 + t)
  assert attempt.network_watch is None
  watched = attempt.record["network_watch"]
  assert watched["errors"]["count"] == launch_module.WATCH_FAILURES_TO_STOP
  assert "cannot open netlink socket" in watched["errors"]["last"]
  assert watched["slow"][0]["address"] == "10.0.0.2"
  # Any error, not only OSError, stays inside the diagnosis, and is kept
  # after the next good sample.
  hosts = _WatchedHosts([1.0, 1.0], [1e9, 1e9], fail=ValueError("rtt:/"))
  broken = _attempt(hosts)
  broken._watch_links(1.0)
  hosts.fail = None
  broken._watch_links(2.0)
  assert broken.network_watch is not None and hosts.sampled == 2
  assert broken.record["network_watch"]["errors"] == {
      "count": 1, "last": "ValueError('rtt:/')"}


def test_a_probe_is_recorded_with_the_step_its_end_saw(tmp_path):
  """The step of a probe is the one the beats show when it ended, read
  afresh (the probe takes a while), and its duration is recorded."""
  from tfopt.scale import heartbeat
  hosts = _WatchedHosts([1.0, 1.0], [900e6, 9e6])
  attempt = _attempt(hosts)
  attempt.watch.directory = str(tmp_path)
  writer = heartbeat.HeartbeatWriter(str(tmp_path), 0, attempt=0)
  writer.end_step(77)
  writer.write()
  attempt.record["last_step"] = 50
  attempt.watch.beats[0] = _beat(40, 100.0)
  attempt._watch_links(1.0)
  attempt.watch.beats[0] = _beat(50, 101.0)
  attempt._watch_links(2.0)  # the baseline probe
  (probe,) = attempt.network_watch.probes
  assert probe["step"] == 77 and probe["took_s"] >= 0
  assert attempt.network_watch.slow[0]["from_step"] == 77


def test_the_watch_waits_while_a_host_is_cut_off_or_the_job_stops():
  hosts = _WatchedHosts([1.0, 1.0], [1e9, 1e9])
  attempt = _attempt(hosts, down={1})  # one of two hosts cut off
  attempt._watch_links(1.0)
  assert hosts.sampled == 0
  attempt = _attempt(hosts)
  attempt.launcher.terminate_requested = True
  attempt._watch_links(1.0)
  assert hosts.sampled == 0
