"""A real transfer measurement between two TensorFlow tasks on loopback."""

import pytest

from tfopt.cost.comm_measure import measure_comm_model, measure_transfer_times


def test_measured_transfers_grow_with_size_and_fit():
  sizes = [1, 1024, 64 * 1024, 1 << 20, 4 << 20]
  fit, points = measure_comm_model(sizes, repeats=3)
  assert [b for b, _ in points] == sizes
  times = dict(points)
  # 4 MiB through gRPC takes clearly longer than 1 KiB.
  assert times[4 << 20] > 2 * times[1024]
  assert fit.link.bandwidth_gbps > 0 and fit.link.latency_us >= 0
  assert fit.num_points >= 2


def test_bad_arguments_are_named():
  with pytest.raises(ValueError, match="Argument `sizes`"):
    measure_transfer_times([0, 8])
  with pytest.raises(ValueError, match="repeats=0"):
    measure_transfer_times([8], repeats=0)
  with pytest.raises(ValueError, match="src_device"):
    measure_transfer_times([8], dst_device="/cpu:0")
