"""Devices and clusters."""

import pytest

from tfopt import Cluster, Device


def test_uniform_cluster():
  c = Cluster.uniform(3, 1 << 30)
  assert len(c) == 3 and c.memory_caps == (1 << 30,) * 3
  assert c.devices[2].name == "/device:GPU:2"


def test_bad_clusters_are_named():
  with pytest.raises(ValueError, match="num_devices=0"):
    Cluster.uniform(0)
  with pytest.raises(ValueError, match="memory_bytes=-5"):
    Device("/device:CPU:0", "CPU", -5)
  with pytest.raises(ValueError, match="unique names"):
    Cluster((Device("/cpu:0"), Device("/cpu:0")))
  with pytest.raises(ValueError, match="names"):
    Cluster.uniform(2, names=["a"])


def test_compute_sharing():
  from tfopt import ComputeSharing
  shared = ComputeSharing.shared(3, capacity=2.0)
  assert shared.groups == (0, 0, 0)
  assert [shared.rate(n) for n in (0, 1, 2, 4)] == [1.0, 1.0, 1.0, 0.5]
  assert ComputeSharing.alone(2).groups == (0, 1)
  c = Cluster.uniform(2, sharing=ComputeSharing((0, 0)))
  assert c.sharing.rate(2) == 0.5
  with pytest.raises(ValueError, match=r"capacity.*>= 1.*capacity=0.5"):
    ComputeSharing((0, 0), 0.5)
  with pytest.raises(ValueError, match="groups"):
    ComputeSharing(())
  with pytest.raises(ValueError, match=r"threads.*Received: threads=0"):
    ComputeSharing((0, 0), 1.0, threads=0)
  assert ComputeSharing.shared(3, threads=2).slots(3) == 2
  assert ComputeSharing.shared(3).slots(3) == 3  # one op per device
  with pytest.raises(ValueError, match=r"one group per device \(3\)"):
    Cluster.uniform(3, sharing=ComputeSharing((0, 0)))
