"""Profiling a real training step: positive times, stable across runs."""

import math

import numpy as np
import pytest

from tfopt import zoo
from tfopt.cost.profile import profile_step
from tfopt.graph import capture_train_step


@pytest.fixture(scope="module")
def step_and_batch():
  # Big enough that the heavy ops take milliseconds: their times are then
  # stable run to run even on a shared 2-core machine.
  model = zoo.mlp(input_dim=512, hidden=(1024, 1024))
  x, y = model.batch(256)
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
  assert costs[kernel].persistent_bytes == 512 * 1024 * 4


def _agree(first, second) -> bool:
  """Whether two profiles of one step have the same shape (see below)."""
  # Load on a shared 2-core machine slows a whole run down; the totals stay
  # within a factor that a broken profiler (zeros, wrong units) would miss.
  if not first.total_compute_us() == pytest.approx(
      second.total_compute_us(), rel=0.5):
    return False
  # What placement uses is the profile's shape: each heavy op's share of the
  # step (ops over 2 % of it), and their order. Those agree run to run
  # (measured here: median share change <= 23 %).
  heavy = [n for n in first
           if first[n].compute_us > 0.02 * first.total_compute_us()]
  assert len(heavy) >= 5
  share = lambda costs, n: costs[n].compute_us / costs.total_compute_us()
  ratios = [math.log(share(second, n) / share(first, n)) for n in heavy]
  if float(np.median(np.abs(ratios))) >= math.log(1.5):
    return False
  # The heavy ops' times correlate run to run. (Log times, not ranks:
  # MatMuls of equal size take nearly equal time, so their order is noise.)
  a = np.log([first[n].compute_us for n in heavy])
  b = np.log([second[n].compute_us for n in heavy])
  return float(np.corrcoef(a, b)[0, 1]) > 0.7


def test_two_profiles_agree_within_noise(step_and_batch):
  step, batch = step_and_batch
  # Medians of 9 traced steps: contention spikes on a shared machine are
  # outvoted. A burst of load can still skew one profile (seen once in a
  # full suite run: correlation 0.52), so of three profiles one pair must
  # agree; a broken profiler (zeros, wrong units, noise) agrees with none.
  profiles = [profile_step(step, inputs=batch, steps=9, warmup=2)
              for _ in range(2)]
  if not _agree(*profiles):
    profiles.append(profile_step(step, inputs=batch, steps=9, warmup=2))
    assert _agree(profiles[0], profiles[2]) or _agree(profiles[1],
                                                      profiles[2])


def test_bad_arguments_are_named(step_and_batch):
  step, batch = step_and_batch
  with pytest.raises(ValueError, match="steps=0"):
    profile_step(step, inputs=batch, steps=0)
  with pytest.raises(ValueError, match="warmup=-1"):
    profile_step(step, inputs=batch, warmup=-1)
  with pytest.raises(ValueError, match="Argument `inputs`.*2 arrays"):
    profile_step(step, inputs=batch[:1], steps=1, warmup=0)


_FUSED_BY_RUNTIME = """
import json, statistics, time
import numpy as np
import tfopt, keras, tensorflow as tf
from tfopt.cost.profile import profile_step
from tfopt.graph import capture_train_step
from tfopt.runtime import StepSession, session_config
keras.utils.set_random_seed(0)
inp = keras.Input((24, 24, 3))
h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inp)
h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
out = keras.layers.Dense(4)(keras.layers.GlobalAveragePooling2D()(h))
model = keras.Model(inp, out)
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(
    from_logits=True))
x = np.random.default_rng(0).standard_normal((16, 24, 24, 3)).astype(
    "float32")
y = np.zeros(16, "int32")
step = capture_train_step(model, x=x, y=y)
costs = profile_step(step, inputs=[x, y], steps=3, warmup=1)
options = tf.compat.v1.RunOptions(
    trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
walls = []
with StepSession(step, config=session_config(inter_op_threads=1)) as s:
  s.run([x, y])
  for _ in range(5):
    start = time.perf_counter()
    s.run([x, y], options=options, run_metadata=tf.compat.v1.RunMetadata())
    walls.append((time.perf_counter() - start) * 1e6)
convs = [op.name for op in step.graph.ops if op.type == "Conv2D"]
print(json.dumps({"total": costs.total_compute_us(),
                  "wall": statistics.median(walls),
                  "convs_profiled": [costs[c].profiled for c in convs]}))
"""


def test_ops_the_runtime_fuses_are_not_counted_twice():
  # Conv layers with a bias: TensorFlow's oneDNN build runs Conv2D + BiasAdd
  # as one kernel under the BiasAdd's name (and folds BiasAddGrad into the
  # filter gradient). Ops run one at a time while profiling, so the op
  # times of a step cannot add up to more than the step's wall time. In a
  # fresh process: traced op times drift upward in a process that already
  # ran many sessions (see tfopt/cost/profile.py).
  import json
  import subprocess
  import sys
  done = subprocess.run([sys.executable, "-c", _FUSED_BY_RUNTIME],
                        capture_output=True, text=True, timeout=300,
                        check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  # Measured here: 0.6-0.85 of the wall time; before the fix about 1.5.
  assert result["total"] <= 1.3 * result["wall"], result
  assert result["convs_profiled"] == [True, True]
