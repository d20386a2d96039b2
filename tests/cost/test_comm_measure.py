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


def test_two_logical_devices_of_one_session():
  # `config` reaches the session: two logical CPU devices, measured in
  # process (shared memory: no size dependence is required here).
  import tensorflow as tf
  points = measure_transfer_times(
      [4, 4096], src_device="/job:localhost/replica:0/task:0/device:CPU:1",
      dst_device="/job:localhost/replica:0/task:0/device:CPU:0",
      config=tf.compat.v1.ConfigProto(device_count={"CPU": 2}), repeats=2)
  assert [b for b, _ in points] == [4, 4096]
  assert all(t >= 0 for _, t in points)
