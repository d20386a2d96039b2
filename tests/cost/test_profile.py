"""Profiling a real training step: positive times, stable across runs."""

import math

import numpy as np
import pytest

from tfopt import zoo
from tfopt.cost.profile import profile_step
from tfopt.graph import capture_train_step


@pytest.fixture(scope="module")
def step_and_batch():
  model = zoo.mlp(input_dim=256, hidden=(512, 512))
  x, y = model.batch(128)
  return capture_train_step(model.model, x=x, y=y), [x, y]


def test_profile_times_are_positive_and_flagged(step_and_batch):
  step, batch = step_and_batch
  costs = profile_step(step, inputs=batch, steps=3, warmup=1)
  g = step.graph
  assert set(costs) == {op.name for op in g.ops}
  matmuls = [op.name for op in g.ops if op.type == "MatMul"]
  assert matmuls and all(costs[m].profiled and costs[m].compute_us > 0
                         for m in matmuls)
  # The fed inputs do not run as ops; they keep the estimate, flagged.
  assert all(not costs[n].profiled for n in step.input_names)
  assert costs.num_profiled() >= len(g) - len(step.input_names)
  # Variables hold their own size for the whole step.
  kernel = next(op.name for op in g.ops if op.name == "dense_0/kernel")
  assert costs[kernel].persistent_bytes == 256 * 512 * 4


def test_two_profiles_agree_within_noise(step_and_batch):
  step, batch = step_and_batch
  first = profile_step(step, inputs=batch, steps=5, warmup=2)
  second = profile_step(step, inputs=batch, steps=5, warmup=2)
  assert first.total_compute_us() == pytest.approx(
      second.total_compute_us(), rel=0.35)
  # The heavy ops (over 100 us) keep their times: per-op log-ratios are
  # small on average, even on a busy 2-core machine.
  heavy = [n for n in first if first[n].compute_us > 100]
  assert len(heavy) >= 5
  ratios = [math.log(second[n].compute_us / first[n].compute_us)
            for n in heavy]
  assert abs(float(np.median(ratios))) < math.log(1.5)


def test_bad_arguments_are_named(step_and_batch):
  step, batch = step_and_batch
  with pytest.raises(ValueError, match="steps=0"):
    profile_step(step, inputs=batch, steps=0)
  with pytest.raises(ValueError, match="warmup=-1"):
    profile_step(step, inputs=batch, warmup=-1)
  with pytest.raises(ValueError, match="Argument `inputs`.*2 arrays"):
    profile_step(step, inputs=batch[:1], steps=1, warmup=0)
