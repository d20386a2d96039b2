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
