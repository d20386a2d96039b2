"""The calibration's fits recover known parameters from synthetic
measurements; the measurements themselves run on this machine's devices,
from the command line and on pinned tasks."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tfopt.cost.comm import fit_overhead
from tfopt.runtime.calibrate import fit_capacity, fit_link


def test_fits_recover_known_parameters_from_synthetic_measurements():
  rng = np.random.default_rng(3)
  noise = lambda: 1 + 0.03 * rng.standard_normal()  # noqa: E731
  # A gRPC-like link: 600 us + bytes / 1.2 GB/s; transfers overlap with a
  # 40 us overhead; two ops side by side on shared cores run at 1.4x.
  sizes = [4 ** k for k in range(14)]
  link, info = fit_link([(b, (600 + b / 1200) * noise()) for b in sizes])
  assert link.latency_us == pytest.approx(600, rel=0.1)
  assert link.bandwidth_gbps == pytest.approx(1.2, rel=0.05)
  assert info["relative_rms"] < 0.06
  counts = [1, 2, 4, 8, 16] * 3
  overhead, _ = fit_overhead(
      counts, [(600 + (n - 1) * 40) * noise() for n in counts], link)
  assert overhead == pytest.approx(40, rel=0.15)
  alone = 10_000.0
  assert fit_capacity(alone, 2 * alone / 1.4) == pytest.approx(1.4)
  # A hand-over between devices sharing memory: no size dependence.
  shared, info = fit_link([(b, 15.0 * noise()) for b in sizes])
  assert shared.latency_us == pytest.approx(15.0, rel=0.05)
  assert shared.bandwidth_gbps >= 1e5 and "hand-over" in info["link"]
  with pytest.raises(RuntimeError, match="Too few copies"):
    fit_link([(8, 0.0), (16, 0.0)])
  # Between logical devices the hand-over can hide in the noise: free.
  below, info = fit_link([(8, 0.0), (16, 3.0), (32, 0.0)],
                         shared_memory=True)
  assert below.latency_us == 0.0 and "below the measurement's noise" in \
      info["link"]
  with pytest.raises(ValueError, match="Argument `alone_us`"):
    fit_capacity(0.0, 1.0)


@pytest.mark.serial
def test_calibrate_command_on_logical_devices(tmp_path):
  out = tmp_path / "cal.json"
  done = subprocess.run(
      [sys.executable, "-m", "tfopt.cli.calibrate",
       "--config=experiments/configs/calibrate_logical_2.py", f"--out={out}",
       "--repeats=3"], capture_output=True, text=True, timeout=300,
      check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "calibrated logical x2" in done.stdout and f"wrote {out}" in \
      done.stdout
  doc = json.loads(out.read_text())
  assert doc["format"] == "tfopt.calibration/1" and doc["shared"]
  assert 1.0 <= doc["capacity"] <= 2.0 and doc["control_messages"]
  # Logical devices hand tensors over: a latency of microseconds, not ms.
  assert 0 < doc["link"]["latency_us"] < 1000
  again = subprocess.run(
      [sys.executable, "-m", "tfopt.cli.calibrate",
       "--config=experiments/configs/calibrate_logical_2.py", f"--out={out}"],
      capture_output=True, text=True, timeout=300, check=False)
  assert again.returncode != 0 and "--overwrite" in again.stderr
  bad = subprocess.run(
      [sys.executable, "-m", "tfopt.cli.calibrate", "--devices=gpu:2",
       f"--out={tmp_path / 'x.json'}"], capture_output=True, text=True,
      timeout=300, check=False)
  assert bad.returncode != 0 and "--devices must be KIND:N" in bad.stderr
  for flags, says in (
      (["--cluster={\"worker\": [\"10.9.9.9:1\"]}", "--devices=logical:2"],
       "not both"),
      (["--cluster=not json"], "--cluster: Argument `cluster`"),
      (["--cluster={\"worker\": [\"10.9.9.9:1\"]}"], "at least two tasks"),
      (["--pinned"], "--pinned describes the tasks of --cluster")):
    bad = subprocess.run(
        [sys.executable, "-m", "tfopt.cli.calibrate", *flags,
         f"--out={tmp_path / 'x.json'}"], capture_output=True, text=True,
        timeout=300, check=False)
    assert bad.returncode != 0 and says in bad.stderr, (flags, bad.stderr)


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.usefixtures("two_pinned_cores")
def test_pinned_tasks_are_calibrated_apart():
  from tfopt.runtime.calibrate import fit_cluster
  calibration = fit_cluster("pinned", 2, repeats=3, progress=False)
  assert not calibration.shared and calibration.cores_per_device == 1
  assert calibration.intra_op_threads == 1
  # gRPC between processes: hundreds of microseconds, overlapping.
  assert 50 < calibration.link.latency_us < 20_000
  assert calibration.link.overhead_us < calibration.link.latency_us
  assert calibration.sharing(2).groups == (0, 1)
