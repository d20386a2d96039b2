"""CommModel arithmetic and the least-squares fit."""

import numpy as np
import pytest

from tfopt.cost import CommModel, Link, fit_comm_model
from tfopt.cost.comm import fit_overhead


def test_default_is_the_published_pcie_fit():
  link = CommModel().default
  assert (link.latency_us, link.bandwidth_gbps) == (134.0, 5.7)
  assert CommModel().transfer_us(57_000) == pytest.approx(134.0 + 10.0)
  assert CommModel().transfer_us(0) == 0.0


def test_per_pair_links_and_same_device():
  fast = Link(latency_us=1.0, bandwidth_gbps=100.0)
  comm = CommModel(pairs={(0, 1): fast})
  assert comm.transfer_us(100_000, 0, 1) == pytest.approx(2.0)
  assert comm.transfer_us(100_000, 1, 0) == pytest.approx(134 + 100_000 / 5700)
  assert comm.transfer_us(100_000, 1, 1) == 0.0


def test_fit_recovers_a_known_line_with_noise():
  rng = np.random.default_rng(0)
  sizes = [4 ** k for k in range(14)]
  true = [25.0 + b / 2000.0 for b in sizes]  # 25 us + 2 GB/s
  noisy = [t * (1 + 0.01 * rng.standard_normal()) for t in true]
  fit = fit_comm_model(sizes, noisy)
  assert fit.link.bandwidth_gbps == pytest.approx(2.0, rel=0.02)
  assert fit.link.latency_us == pytest.approx(25.0, abs=5.0)
  assert fit.relative_residual < 0.05 and fit.num_points == 14
  assert "GB/s" in str(fit)


def test_fit_clamps_a_negative_latency():
  fit = fit_comm_model([1000, 2000, 3000], [0.5, 2.0, 3.0])
  assert fit.link.latency_us == 0.0 and fit.link.bandwidth_gbps > 0


def test_bad_input_is_named():
  with pytest.raises(ValueError, match="Argument `nbytes`"):
    fit_comm_model([1], [1.0])
  with pytest.raises(ValueError, match="distinct sizes"):
    fit_comm_model([8, 8], [1.0, 2.0])
  with pytest.raises(ValueError, match="do not grow with size"):
    fit_comm_model([10, 20, 30], [5.0, 4.0, 3.0])
  with pytest.raises(ValueError, match="bandwidth_gbps=0"):
    Link(1.0, 0)
  with pytest.raises(ValueError, match="latency_us=-1"):
    Link(-1, 1.0)


def test_overhead_is_what_holds_the_channels():
  link = Link(100.0, 1.0, overhead_us=10.0)
  assert link.transfer_us(1000) == 101.0 and link.channel_us(1000) == 11.0
  assert link.message_us(0) == 100.0 and link.transfer_us(0) == 0.0
  baechi = Link(100.0, 1.0)  # no overhead: the whole latency holds them
  assert baechi.channel_us(1000) == baechi.transfer_us(1000) == 101.0
  with pytest.raises(ValueError, match=r"overhead_us.*at most latency_us "
                     r"\(100.0\).*overhead_us=200"):
    Link(100.0, 1.0, overhead_us=200)


def test_fit_overhead_recovers_a_known_overhead_from_noisy_batches():
  # n transfers issued together: latency 700 + (n - 1) x 40 us, 3 % noise.
  rng = np.random.default_rng(1)
  counts = [1, 2, 4, 8, 16, 32] * 3
  times = [(700 + (n - 1) * 40.0) * (1 + 0.03 * rng.standard_normal())
           for n in counts]
  overhead, residual = fit_overhead(counts, times, Link(700.0, 1.0))
  assert overhead == pytest.approx(40.0, rel=0.1)
  assert residual < 0.06
  # Serial transfers (every one pays the whole latency): clipped to it.
  serial = [700.0 * n for n in (1, 2, 4)]
  assert fit_overhead([1, 2, 4], serial, Link(700.0, 1.0))[0] == 700.0
  # ...also where the latency has more digits than the rounding keeps (a
  # calibration rounded 2.6021416065 up past its latency and failed).
  latency = 2.6021416065098752
  fitted, _ = fit_overhead([1, 2, 4], [latency * n for n in (1, 2, 4)],
                           Link(latency, 1.0))
  assert fitted <= latency
  Link(latency, 1.0, fitted)  # accepted
  with pytest.raises(ValueError, match="distinct counts"):
    fit_overhead([2, 2], [1.0, 2.0], Link(1.0, 1.0))
  with pytest.raises(ValueError, match="times_us"):
    fit_overhead([1, 2], [1.0, -2.0], Link(1.0, 1.0))
