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
