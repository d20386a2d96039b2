"""The launcher's report per host from hand-made attempt records and
final records: MFU pooled by hand (cores shared within a machine counted
once), stragglers put on their workers' hosts, the summary's lines."""

import json

import pytest

from tfopt.scale import host_report
from tfopt.scale.launch import LaunchResult, summary


def _mfu(flops, step_s, peak, cores):
  return {"flops_per_step": flops, "step_s": step_s, "peak_flops": peak,
          "cores": cores}


def test_pooled_mfu_counts_shared_cores_once_and_devices_each():
  # Two workers on the same two cores of machine "m" (peak 40 GFLOP/s for
  # both cores): 20 + 10 GFLOP/s achieved of 40.
  a = _mfu(2e9, 0.1, 40e9, [["m", 0], ["m", 1]])
  b = _mfu(2e9, 0.2, 40e9, [["m", 0], ["m", 1]])
  assert host_report.pooled_mfu([a, b])["mfu"] == pytest.approx(0.75)
  # The same core numbers on another machine: its own peak.
  c = dict(b, cores=[["n", 0], ["n", 1]])
  assert host_report.pooled_mfu([a, c])["mfu"] == pytest.approx(30 / 80)
  # One core of two shared: 40 + 20 (the new core) GFLOP/s of peak.
  d = dict(b, cores=[["m", 1], ["m", 2]])
  assert host_report.pooled_mfu([a, d])["peak_flops"] == pytest.approx(60e9)
  # Devices of their own (no cores): peaks add up; missing entries skipped.
  g = {"flops_per_step": 1e12, "step_s": 0.5, "peak_flops": 1e15}
  pooled = host_report.pooled_mfu([g, None, g])
  assert pooled["mfu"] == pytest.approx(4e12 / 2e15)
  assert pooled["workers"] == 2
  assert host_report.pooled_mfu([None, {}]) is None


def _record():
  return {"addresses": ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"],
          "links": [{"address": "10.0.0.1", "down_bits": 900e6,
                     "up_bits": 880e6},
                    {"address": "10.0.0.2", "down_bits": 19e6,
                     "up_bits": 18e6}],
          "network_stragglers": ["10.0.0.2"]}


def _finals():
  host1 = [["h1", 0], ["h1", 1]]
  host2 = [["h2", 0], ["h2", 1]]
  finals = {w: {"worker": w, "global_step": 30, "final_loss": 0.5,
                "weights_sha256": "cd" * 32,
                "mfu": _mfu(1e9, 0.1 * (w + 1), 100e9,
                            host1 if w < 2 else host2)}
            for w in range(4)}
  finals[0]["stragglers"] = {"host_side": [1], "compute": [3]}
  return finals


def test_each_host_gets_its_workers_mfu_stragglers_and_link():
  hosts = host_report.host_report(_record(), _finals())
  assert [h["workers"] for h in hosts] == [[0, 1], [2, 3]]
  # Host 1: 10 + 5 GFLOP/s of 100; host 2: 3.33 + 2.5 of 100.
  assert hosts[0]["mfu"]["mfu"] == pytest.approx(0.15)
  assert hosts[1]["mfu"]["mfu"] == pytest.approx((1 / 3 + 1 / 4) / 10)
  assert hosts[0]["stragglers"] == [1] and hosts[0]["compute_stragglers"] == []
  assert hosts[1]["stragglers"] == [] and hosts[1]["compute_stragglers"] == [3]
  assert not hosts[0]["network_straggler"] and hosts[1]["network_straggler"]
  assert hosts[1]["link"]["down_bits"] == 19e6
  # One host: no per-host rows; the job's MFU pools all.
  assert host_report.host_report({"addresses": ["127.0.0.1"] * 2},
                                 _finals()) == []
  job = host_report.job_mfu(_finals())
  assert job["mfu"] == pytest.approx((1.5 + 1 / 3 + 1 / 4) / 20)


def test_the_summary_prints_a_line_per_host_and_the_jobs_mfu(tmp_path):
  for w, final in _finals().items():
    (tmp_path / f"final-worker-{w}.json").write_text(json.dumps(final))
  (tmp_path / "final-worker-9.json").write_text("{cut by a ki")
  attempt = {"attempt": 0, "started": 0.0, "ended": 10.0,
             "first_step_s": 2.0, "resumed_from": None, "last_step": 30,
             "median_step_s": 0.1, "failure": None, **_record()}
  result = LaunchResult(True, str(tmp_path), [attempt])
  lines = summary(result).splitlines()
  hosts = [line for line in lines if line.startswith("host ")]
  assert hosts == [
      "host 10.0.0.1 (workers 0,1): MFU 15 % of 100 GFLOP/s peak "
      "(2 workers); link 900.0 Mbit/s in, 880.0 Mbit/s out; host-side "
      "straggler: worker 1",
      "host 10.0.0.2 (workers 2,3): MFU 5.83 % of 100 GFLOP/s peak "
      "(2 workers); link 19.0 Mbit/s in, 18.0 Mbit/s out; compute "
      "straggler: worker 3; NETWORK STRAGGLER (its link far slower than "
      "the other hosts')"]
  assert "MFU (job): 10.4 % of 200 GFLOP/s peak (4 workers)" in lines
  assert lines.count("worker 3 on host 10.0.0.2: step 30, final loss "
                     "0.500000, weights sha256 cdcdcdcdcdcdcdcd") == 1
  assert result.per_host()[1]["compute_stragglers"] == [3]
