"""MFUMonitor: FLOPs from the compiled step, MFU = FLOPs / step time /
peak on the recorded step times, goodput in (0, 1], clear errors."""

import keras
import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.scale.flops import train_step_flops
from tfopt.scale.mfu import MFUMonitor, PEAK_FLOPS


def _model():
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64),
                            keras.layers.Dense(8)])
  model.compile(keras.optimizers.SGD(0.01), "mse")
  return model


def test_mfu_is_flops_over_step_time_over_peak():
  model = _model()
  x = np.random.default_rng(0).normal(size=(256, 32)).astype("float32")
  y = np.zeros((256, 8), "float32")
  monitor = MFUMonitor((x[:16], y[:16]), peak_flops=1e9)
  history = model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                      callbacks=[monitor])
  # 2 * 16 * (32*64 + 64*8) forward, twice more for the weight gradients
  # and once more for the second layer's input gradient.
  fwd = [2 * 16 * 32 * 64, 2 * 16 * 64 * 8]
  assert monitor.flops_per_step == 2 * sum(fwd) + fwd[1]
  assert monitor.flops_per_step == train_step_flops(model, x[:16],
                                                    y[:16]).total
  assert len(monitor.step_times) == 2 * 15  # first step of each epoch out
  s = monitor.summary()
  step = float(np.median(monitor.step_times))
  assert s["mfu"] == pytest.approx(monitor.flops_per_step / step / 1e9)
  assert s["samples_per_s"] == pytest.approx(16 / step)
  assert 0 < s["goodput"] <= 1
  assert len(history.history["mfu"]) == 2
  assert MFUMonitor.async_safe is False


def test_peak_from_table_and_errors():
  model = _model()
  x = np.zeros((8, 32), "float32")
  y = np.zeros((8, 8), "float32")
  monitor = MFUMonitor((x, y), peak_flops="a100-fp32")
  model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[monitor])
  assert monitor.peak == PEAK_FLOPS["a100-fp32"]
  with pytest.raises(ValueError, match="Argument `peak_flops`"):
    MFUMonitor((x, y), peak_flops="gpu9000")
  with pytest.raises(ValueError, match="Argument `peak_flops`"):
    MFUMonitor((x, y), peak_flops=-1)
  with pytest.raises(ValueError, match="Argument `sample_batch`"):
    MFUMonitor(x)
  with pytest.raises(RuntimeError, match="at least two batches"):
    MFUMonitor((x, y), peak_flops=1.0).summary()


def test_timeline_png(tmp_path):
  model = _model()
  x = np.random.default_rng(0).normal(size=(128, 32)).astype("float32")
  y = np.zeros((128, 8), "float32")
  monitor = MFUMonitor((x[:16], y[:16]), peak_flops=1e9)
  with pytest.raises(RuntimeError, match="needs a fit"):
    monitor.timeline_png(str(tmp_path / "early.png"))
  model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[monitor])
  assert monitor.epoch_starts == [0, 7, 14]  # 7 clean steps per epoch
  path = tmp_path / "mfu.png"
  monitor.timeline_png(str(path), window=3)
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  with pytest.raises(FileExistsError):
    monitor.timeline_png(str(path))
  with pytest.raises(ValueError, match="Argument `window`"):
    monitor.timeline_png(str(tmp_path / "w.png"), window=0)


def test_mfu_against_a_stated_peak_and_the_achievable_one_apart():
  # Default "auto" on a CPU-only machine: the theoretical peak from
  # /proc/cpuinfo, named; the measured achievable peak is a separate figure
  # (not bounded by it: a VM lists its base clock, and boost clocks measured
  # 405 against 332 GFLOP/s here).
  from tfopt.scale.mfu import cpu_peak_flops
  model = _model()
  x = np.random.default_rng(0).normal(size=(64, 32)).astype("float32")
  y = np.zeros((64, 8), "float32")
  monitor = MFUMonitor((x[:16], y[:16]), measure_achievable=True)
  model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[monitor])
  s = monitor.summary()
  theoretical, source = cpu_peak_flops()
  assert s["peak_flops"] == theoretical and s["peak_source"] == source
  assert source.startswith("theoretical: ")
  assert s["achievable_flops"] > 0
  achieved = monitor.flops_per_step / s["step_s"]
  assert s["mfu"] == pytest.approx(achieved / theoretical)
  assert s["mfu_of_achievable"] == pytest.approx(
      achieved / s["achievable_flops"])
  # A stated number and a datasheet key say so; no achievable by default.
  stated = MFUMonitor((x[:16], y[:16]), peak_flops=2e12)
  model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[stated])
  assert stated.summary()["peak_source"] == "stated by the user"
  assert stated.summary()["achievable_flops"] is None


def test_cpu_peak_from_cpuinfo_by_hand():
  from tfopt.scale.mfu import _gpu_key, cpu_peak_flops
  info = ("processor : 0\ncpu MHz : 2500.0\nflags : sse2 avx avx2 avx512f\n"
          "processor : 1\ncpu MHz : 3000.0\nflags : sse2 avx avx2 avx512f\n")
  # 4 cores x 3.0 GHz (the fastest listed) x 64 FLOP/cycle (AVX-512).
  assert cpu_peak_flops(info, cores=4)[0] == 4 * 3.0e9 * 64
  assert cpu_peak_flops("cpu MHz : 1000\nflags : sse2\n", cores=1)[0] == 8e9
  assert _gpu_key("NVIDIA H200", "bfloat16") == "h200-bf16"
  assert _gpu_key("NVIDIA H100 80GB HBM3", "float32") == "h100-sxm-fp32"
  assert _gpu_key("NVIDIA A100-SXM4-40GB", "float32") == "a100-fp32"
  assert _gpu_key("Some GPU", "float32") is None


def test_a_model_of_a_strategy_is_counted_on_a_copy_and_trains_as_without():
  """Under a distribution strategy the step is counted on a copy outside
  it (the user's optimizer is not built outside its scope, which used to
  fail and leave it half built): the same FLOPs as the formula, and the
  fit's weights equal a fit without the monitor."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  x = np.random.default_rng(1).normal(size=(64, 32)).astype("float32")
  y = np.zeros((64, 8), "float32")
  weights = []
  for with_monitor in (False, True):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
      model = _model()
    monitor = MFUMonitor((x[:16], y[:16]), peak_flops=1e9)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False,
              callbacks=[monitor] if with_monitor else [])
    weights.append(model.get_weights())
  fwd = [2 * 16 * 32 * 64, 2 * 16 * 64 * 8]
  assert monitor.flops_per_step == 2 * sum(fwd) + fwd[1]
  for a, b in zip(*weights):
    np.testing.assert_array_equal(a, b)


def test_given_flops_are_not_counted_and_fits_pool(monkeypatch):
  """flops_per_step given: nothing compiled; one monitor over several fits
  (tfopt.scale.worker.fit makes one per epoch) pools their steps and wall
  time and counts at most once."""
  from tfopt.scale import flops as flops_module  # pylint: disable=import-outside-toplevel
  calls = []
  real = flops_module.train_step_flops
  monkeypatch.setattr(flops_module, "train_step_flops",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  x = np.zeros((64, 32), "float32")
  y = np.zeros((64, 8), "float32")
  given = MFUMonitor((x[:16], y[:16]), peak_flops=1e9, flops_per_step=1e6)
  counted = MFUMonitor((x[:16], y[:16]), peak_flops=1e9)
  model = _model()
  for _ in range(2):
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[given, counted])
  assert calls == [1] and given.flops_per_step == 1e6
  assert len(given.step_times) == len(counted.step_times) == 2 * 3
  wall = given.summary()["goodput"]
  assert 0 < wall <= 1
  with pytest.raises(ValueError, match=r"Argument `flops_per_step` must be "
                     r"a positive number or None. Received: "
                     r"flops_per_step=0"):
    MFUMonitor((x, y), flops_per_step=0)


def _four_steps_per_call():
  """The model compiled with steps_per_execution=4 and 40 zero examples
  (the tests take the `mfu_ticking_clock` fixture)."""
  model = _model()
  model.compile(keras.optimizers.SGD(0.01), "mse", steps_per_execution=4)
  return model, np.zeros((40, 32), "float32"), np.zeros((40, 8), "float32")


@pytest.mark.usefixtures("mfu_ticking_clock")
def test_steps_per_execution_samples_cover_every_step():
  """With steps_per_execution=4 Keras calls the batch hooks once per 4
  steps (the epoch's last call 2): a clock ticking once per read gives 1 s
  per call, so 1/4 s per step of a full call and 1/2 s of the short one;
  the steps covered add up to the optimizer's iterations less the first
  call of each epoch."""
  model, x, y = _four_steps_per_call()
  monitor = MFUMonitor((x[:4], y[:4]), peak_flops=1e9, flops_per_step=1e6,
                       log_every=4)
  seen = []
  reader = keras.callbacks.LambdaCallback(
      on_train_batch_end=lambda batch, logs: seen.append(
          (batch, logs.get("mfu"))))
  model.fit(x, y, batch_size=4, epochs=2, verbose=0,
            callbacks=[monitor, reader])
  assert int(model.optimizer.iterations) == 20
  assert monitor.step_counts == [4, 2, 4, 2]
  assert monitor.step_times == [0.25, 0.5, 0.25, 0.5]
  s = monitor.summary()
  assert s["step_s"] == 0.25  # 8 of the 12 clean steps took 1/4 s
  assert s["mfu"] == pytest.approx(1e6 / 0.25 / 1e9)
  assert s["samples_per_s"] == pytest.approx(4 / 0.25)
  # Clean calls 4 s of the 7 from train begin to train end.
  assert s["goodput"] == pytest.approx(4 / 7)
  assert [e["step_s"] for e in monitor.epochs] == [0.25, 0.25]
  # log_every=4 steps: at the calls where the clean steps (4, 6; 10, 12)
  # pass a multiple of 4 (the end indices Keras passes: 7; 7, 11).
  assert [b for b, m in seen if m is not None] == [7, 7, 11]


@pytest.mark.usefixtures("mfu_ticking_clock")
def test_steps_per_execution_over_data_of_unknown_length():
  """A filtered dataset has no known length: Keras passes the short last
  call (2 of 4 steps) as 4; the optimizer's count corrects it at the
  epoch's end. The same ticking clock as above."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  model, x, y = _four_steps_per_call()
  data = tf.data.Dataset.from_tensor_slices((x, y)).filter(
      lambda a, b: True).batch(4)
  assert int(data.cardinality()) == tf.data.UNKNOWN_CARDINALITY
  monitor = MFUMonitor((x[:4], y[:4]), peak_flops=1e9, flops_per_step=1e6)
  model.fit(data, epochs=2, verbose=0, callbacks=[monitor])
  assert int(model.optimizer.iterations) == 20
  assert monitor.step_counts == [4, 2, 4, 2]
  assert monitor.step_times == [0.25, 0.5, 0.25, 0.5]
  assert monitor.summary()["step_s"] == 0.25

