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


# Multiply-accumulates of each Dense layer's MatMuls for a batch of 256, by
# hand: the forward MatMul and its two gradients (input and kernel) each do
# batch * fan_in * fan_out of them. dense_0's input gradient is not computed
# (its input is the data).
_MACS = {"dense_0": 256 * 512 * 1024, "dense_1": 256 * 1024 * 1024,
         "logits": 256 * 1024 * 10}


def _layer(op_name: str) -> str:
  return next(layer for layer in _MACS if f"/{layer}_1/" in op_name)


def _flops_mismatch(costs, by_layer) -> str:
  """How the MatMuls' times in one profile miss their MAC counts; '' if not."""
  # The five big MatMuls (134M and 268M MACs) run at one speed: time per
  # MAC within a factor 3 of each other. Measured here: within 15 %; next
  # to two CPU burners, over 2 in half the profiles and 4.7 in one of
  # eight. Times given to the wrong MatMul put a 134M one at the 268M ones'
  # time: a factor 4.
  big = by_layer["dense_0"] + by_layer["dense_1"]
  times = {m: round(costs[m].compute_us) for m in big + by_layer["logits"]}
  per_mac = [costs[m].compute_us / _MACS[_layer(m)] for m in big]
  if not max(per_mac) / min(per_mac) < 3:
    return f"time per MAC {max(per_mac) / min(per_mac):.1f}x apart: {times}"
  # The logits' MatMuls do 50-100x fewer MACs: each is faster than any big
  # one by a wide margin (measured: 17-20x; next to burners, 3.6x at worst).
  slowest_small = max(costs[m].compute_us for m in by_layer["logits"])
  if not slowest_small * 3 < min(costs[m].compute_us for m in big):
    return f"logits' MatMuls not 3x faster than the big ones: {times}"
  # (Their share of the step is not checked: it moved from 47 % to 65 %
  # between processes here, with the Adam updates' elementwise ops.)
  return ""


@pytest.mark.serial
def test_matmul_times_follow_their_flops(step_and_batch):
  step, batch = step_and_batch
  matmuls = [op.name for op in step.graph.ops if op.type == "MatMul"]
  by_layer = {layer: [m for m in matmuls if _layer(m) == layer]
              for layer in _MACS}
  assert {k: len(v) for k, v in by_layer.items()} == {
      "dense_0": 2, "dense_1": 3, "logits": 3}
  # Load can skew one profile; one of three must follow the arithmetic.
  # Swapped, unit-mixed or random times follow it in none.
  misses = []
  for _ in range(3):
    miss = _flops_mismatch(
        profile_step(step, inputs=batch, steps=15, warmup=2), by_layer)
    if not miss:
      return
    misses.append(miss)
  pytest.fail("No profile follows the MACs:\n" + "\n".join(misses))


def _agree(first, second) -> bool:
  """Whether two profiles of one step have the same shape (see below)."""
  # Load on a shared 2-core machine slows a whole run down (CI once saw
  # totals 1.9x apart); a broken profiler (zeros, wrong units) is off by far
  # more.
  low, high = sorted([first.total_compute_us(), second.total_compute_us()])
  if not (0 < low and high / low < 3):
    return False
  # What placement uses is the profile's shape: the heavy ops' shares of the
  # step and their order. Heavy: the first profile's five slowest ops (here
  # the five big MatMuls, 5-17 % each; an op-share line such as 2 % let
  # elementwise ops come and go under load).
  heavy = sorted(first, key=lambda n: first[n].compute_us)[-5:]
  share = lambda costs, n: costs[n].compute_us / costs.total_compute_us()
  ratios = [math.log(share(second, n) / share(first, n)) for n in heavy]
  if float(np.median(np.abs(ratios))) >= math.log(1.5):
    return False
  # The heavy ops' times correlate run to run (log times: the 134M- and
  # 268M-MAC MatMuls are two clusters a factor 2 apart).
  a = np.log([first[n].compute_us for n in heavy])
  b = np.log([second[n].compute_us for n in heavy])
  return float(np.corrcoef(a, b)[0, 1]) > 0.7


@pytest.mark.serial
def test_two_profiles_agree_within_noise(step_and_batch):
  step, batch = step_and_batch
  # Medians of 15 traced steps: contention spikes on a shared machine are
  # outvoted. A long burst of load can still skew a profile (CI once saw
  # three profiles, none agreeing with another; next to two CPU burners
  # here, a MatMul was 1.8x its time in one profile), so profiles are taken
  # until two agree, four at most; a broken profiler (zeros, wrong units,
  # noise) agrees with none.
  profiles = []
  for _ in range(4):
    new = profile_step(step, inputs=batch, steps=15, warmup=2)
    if any(_agree(old, new) for old in profiles):
      return
    profiles.append(new)
  pytest.fail(f"No two of {len(profiles)} profiles agree: totals "
              f"{[round(p.total_compute_us()) for p in profiles]} us.")


def test_bad_arguments_are_named(step_and_batch):
  step, batch = step_and_batch
  with pytest.raises(ValueError, match="steps=0"):
    profile_step(step, inputs=batch, steps=0)
  with pytest.raises(ValueError, match="warmup=-1"):
    profile_step(step, inputs=batch, warmup=-1)
  with pytest.raises(ValueError, match="Argument `inputs`.*2 arrays"):
    profile_step(step, inputs=batch[:1], steps=1, warmup=0)


def test_the_function_clock_times_the_hooks_runtime_on_copies(
    step_and_batch, monkeypatch):
  """clock="function": the op times are scaled to the untraced step run as
  the hook runs it (`_function_clock`, stubbed here with a 40 ms step: the
  total follows it); the real clock runs the imported step on copies, so
  the step's own variables keep their values."""
  from tfopt.cost import profile as profile_module  # pylint: disable=import-outside-toplevel
  step, batch = step_and_batch
  before = {n: v.numpy().copy() for n, v in step.variables.items()}
  once = profile_module._function_clock(step, None, batch)  # pylint: disable=protected-access
  outputs = once()  # the step ran: its outputs (the loss among them)
  assert outputs and all(np.all(np.isfinite(o)) for o in outputs)
  assert len(outputs) >= len(step.output_names)
  for name, var in step.variables.items():
    np.testing.assert_array_equal(var.numpy(), before[name])
  import time  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(profile_module, "_function_clock",
                      lambda *a: (lambda: time.sleep(0.04)))
  costs = profile_step(step, inputs=batch, steps=2, warmup=1,
                       clock="function")
  assert costs.total_compute_us() == pytest.approx(40_000, rel=0.05)
  assert "as a tf.function" in costs.source
  with pytest.raises(ValueError, match=r"Argument `clock` must be True, "
                     r"False, 'session' or 'function'. Received: "
                     r"clock='wall'"):
    profile_step(step, inputs=batch, clock="wall")


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
                  "convs_profiled": [costs[c].profiled for c in convs],
                  "notes": dict(costs.notes),
                  "unmeasured": costs.describe_unmeasured()}))
"""


@pytest.mark.serial
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
  # Each conv is named as fused into the node that ran it (measured there),
  # and the fused ops are the report's, not hidden among the measured.
  notes = result["notes"]
  convs = [n for n in notes if n.endswith("/convolution")]
  assert len(convs) == 2 and all(
      notes[c].startswith("fused by the runtime into ") for c in convs), notes
  assert "fused by the runtime" in result["unmeasured"]


def test_an_op_missing_from_the_profile_is_flagged_unless_fused():
  # x (fed) -> conv -> bias -> relu; d -> e. The runtime ran bias as a fused
  # kernel (conv's time measured there), relu and d every step, e in no
  # step, and reported nothing for conv: conv is fused (0 us, measured), e
  # is estimated and flagged, with the reason (it used to be 0 us,
  # "profiled").
  from tfopt.cost import profile as prof
  from tfopt.graph import Edge, Op, OpGraph
  g = OpGraph([Op("x", "Placeholder", output_bytes=(64,)),
               Op("conv", "Conv2D", output_bytes=(64,)),
               Op("bias", "BiasAdd", output_bytes=(64,)),
               Op("relu", "Relu", output_bytes=(64,)),
               Op("d", "X", output_bytes=(8,)),
               Op("e", "Neg", output_bytes=(8,))],
              [Edge("x", "conv", 0, 0, 64), Edge("conv", "bias", 0, 0, 64),
               Edge("bias", "relu", 0, 0, 64), Edge("d", "e", 0, 0, 8)])
  samples = prof._Samples(  # pylint: disable=protected-access
      times={"bias": [5.0, 7.0], "relu": [1.0, 1.0], "d": [2.0, 2.0]},
      temps={"bias": [0, 0], "relu": [0, 0], "d": [0, 0]},
      persistent={"bias": 0, "relu": 0, "d": 0},
      ran={"bias": "_MklNativeFusedConv2D", "relu": "Relu", "d": "X"})
  costs, notes = prof._costs_from(  # pylint: disable=protected-access
      g, samples, 2, {"x"}, prof.analytic.CPU)
  assert costs["bias"].compute_us == 6.0 and costs["bias"].profiled
  assert costs["conv"].compute_us == 0.0 and costs["conv"].profiled
  assert notes["conv"] == ("fused by the runtime into bias "
                           "(_MklNativeFusedConv2D), measured there")
  assert not costs["e"].profiled and costs["e"].compute_us > 0
  assert "absent from the runtime's graphs" in notes["e"]
  assert not costs["x"].profiled and "fed" in notes["x"]
  assert set(notes) == {"conv", "e", "x"}
