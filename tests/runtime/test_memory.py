"""The simulator's memory against what TensorFlow really allocates."""

import numpy as np
import pytest
import tensorflow as tf

from tfopt import Cluster, zoo
from tfopt.cost.profile import profile_step
from tfopt.graph import capture_train_step
from tfopt.placement.placement import Placement
from tfopt.runtime.memory import allocation_peaks, measure_peak_bytes
from tfopt.simulate import simulate

_MODELS = {
    "mlp": (dict(), 64),
    "small_cnn": (dict(), 16),
    "transformer_lm": (dict(vocab_size=2000, seq_len=64, num_layers=2,
                            d_model=128, num_heads=4, d_ff=512), 16),
}


# The serial pass: TensorFlow's measured peak depends on how its inter-op
# threads interleave the step's ops, and beside another test's load the
# MLP's rose 18 % above the simulated schedule's (12.3 vs 15.0 MB) once.
@pytest.mark.serial
@pytest.mark.parametrize("name", sorted(_MODELS))
def test_one_device_peak_within_15_percent_of_tensorflows(name):
  # TensorFlow's allocation records (every allocation and free of the step,
  # in time order) plus the variables it holds, against the simulator's
  # liveness peak from the profiled costs. Without charging views, variable
  # reads and in-place element-wise ops as TF does, the simulator was 37 %
  # (MLP), 25 % (CNN) and 15 % (Transformer) high.
  kwargs, batch = _MODELS[name]
  tf.random.set_seed(0)
  model = zoo.build(name, **kwargs)
  x, y = model.batch(batch)
  step = capture_train_step(model.model, x=x, y=y)
  inputs = [*tf.nest.flatten(x), *tf.nest.flatten(y)]
  measured = measure_peak_bytes(step, inputs).peak_bytes[0]
  costs = profile_step(step, inputs=inputs, steps=2, warmup=1)
  predicted = simulate(step.graph, Placement.single_device(step.graph), costs,
                       Cluster.uniform(1, device_type="CPU")).peak_bytes[0]
  variables = sum(int(np.prod(v.shape)) * v.dtype.size
                  for v in step.variables.values())
  assert measured > variables  # the step allocated something
  assert abs(predicted - measured) <= 0.15 * measured, (predicted, measured)


def test_allocation_peaks_replays_records_in_time_order():
  # Two fake nodes: +100 at t=1, +50 at t=2, -100 at t=3, +30 at t=3 (frees
  # first at equal times): peak 150.
  metadata = tf.compat.v1.RunMetadata()
  dev = metadata.step_stats.dev_stats.add(device="/device:CPU:0")
  for records in ([(1, 100), (3, -100)], [(2, 50), (3, 30)]):
    mem = dev.node_stats.add().memory.add()
    for t, b in records:
      mem.allocation_records.add(alloc_micros=t, alloc_bytes=b)
  other = metadata.step_stats.dev_stats.add(device="/device:CPU:1")
  other.node_stats.add().memory.add().allocation_records.add(
      alloc_micros=1, alloc_bytes=7)
  assert allocation_peaks(metadata, ["/device:CPU:0", "/device:CPU:1"]) == [
      150, 7]
