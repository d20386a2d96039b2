"""Straggler detection on simulated synchronous data parallelism (the
collective makes everyone wait for the latest worker), and the recorder on
a real fit with an injected host delay."""

import json
import time

import keras
import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.scale.stragglers import (StepPhaseRecorder, chrome_trace, detect,
                                    heatmap_png)


def _simulate(workers=4, steps=200, compute=0.020, gap=0.004, slow=None,
              delay=0.0, seed=0):
  """Host gaps and in-step times of a synchronous job: every worker leaves
  the all-reduce when the last one arrives."""
  rng = np.random.default_rng(seed)
  host = gap + rng.exponential(0.0005, size=(workers, steps))
  if slow is not None:
    host[slow] += delay
  work = compute + rng.normal(0, 0.0005, size=(workers, steps))
  arrival = host + work
  in_step = work + (arrival.max(axis=0, keepdims=True) - arrival)
  return host, in_step


@pytest.mark.parametrize("delay", [0.100, 0.010, 0.3 * 0.024])
def test_injected_host_delay_names_the_right_worker(delay):
  host, in_step = _simulate(slow=2, delay=delay)
  report = detect(host, in_step)
  assert report.stragglers == [2]
  assert report.fraction[[0, 1, 3]].max() == 0  # never a healthy worker
  # Per-worker step time cannot tell, and in-step time blames the healthy
  # ones: they wait longest inside the collective.
  totals = (host + in_step).mean(axis=1)
  assert np.ptp(totals) < 1e-9
  assert int(np.argmin(in_step.mean(axis=1))) == 2


def test_no_straggler_without_delay_and_bad_input(tmp_path):
  host, in_step = _simulate()
  report = detect(host, in_step)
  assert report.stragglers == []
  heatmap_png(str(tmp_path / "h.png"), report)
  assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"
  with pytest.raises(ValueError, match="Argument `host_gap`"):
    detect(host[:1], in_step[:1])
  with pytest.raises(ValueError, match="Argument `min_fraction`"):
    detect(host, in_step, min_fraction=0)


class _Delay(keras.callbacks.Callback):
  def on_train_batch_begin(self, batch, logs=None):
    time.sleep(0.03)


@pytest.mark.serial
def test_recorder_splits_host_gap_and_step():
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile("sgd", "mse")
  x = np.zeros((32, 4), "float32")
  y = np.zeros((32, 2), "float32")
  recorder = StepPhaseRecorder()
  model.fit(x, y, batch_size=4, epochs=2, verbose=0,
            callbacks=[_Delay(), recorder])
  assert len(recorder.host_gap) == len(recorder.in_step) == 16
  assert min(recorder.host_gap) >= 0.03    # the injected host delay
  assert 0 < np.median(recorder.in_step) < 0.03


@pytest.mark.serial
def test_chrome_trace_of_two_workers(tmp_path):
  import json
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile("sgd", "mse")
  x = np.zeros((16, 4), "float32")
  recorders = {}
  for worker in ("worker0", "worker1"):
    recorders[worker] = StepPhaseRecorder()
    model.fit(x, x[:, :2], batch_size=4, verbose=0,
              callbacks=[recorders[worker]])
  chrome_trace(str(tmp_path / "t.json"), recorders)
  trace = json.loads((tmp_path / "t.json").read_text())
  for pid in (0, 1):
    spans = [e for e in trace["traceEvents"]
             if e["pid"] == pid and e["ph"] == "X"]
    assert [e["name"] for e in spans] == ["host gap", "step"] * 4
    ends = [e["ts"] + e["dur"] for e in spans]
    starts = [e["ts"] for e in spans]
    # Phases tile the worker's row: each starts where the previous ended
    # (a step's host gap ends exactly at its begin), never overlapping.
    # (wall-clock begins, perf_counter durations: equal within 0.5 ms)
    assert all(s >= e - 500 for s, e in zip(starts[1:], ends[:-1]))
    assert spans[1]["ts"] == pytest.approx(spans[0]["ts"] + spans[0]["dur"])
  names = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"]
  assert names == ["worker0", "worker1"]
  with pytest.raises(ValueError, match="Argument `workers`"):
    chrome_trace(str(tmp_path / "u.json"), {})


def test_monitor_exchanges_phases_and_writes_scalars(tmp_path):
  """Two monitors (workers 0 and 1) in one directory, fed simulated phases
  in lockstep: the chief's verdict per exchange names worker 1, and the
  TensorBoard scalars hold the lateness per worker."""
  import tensorflow as tf
  from tfopt.scale.stragglers import StragglerMonitor
  host, in_step = _simulate(workers=2, steps=40, slow=1, delay=0.010)
  tb = tmp_path / "tb"
  monitors = [StragglerMonitor(tmp_path / "phases", w, 2, exchange_every=10,
                               tensorboard_dir=str(tb)) for w in (1, 0)]
  for step in range(40):
    for m in monitors:  # worker 1 flushes first, then the chief reads
      w = m.worker
      m.host_gap.append(host[w, step])
      m.in_step.append(in_step[w, step])
      m.begin_wall.append(1000.0 + step * 0.03)
      m.maybe_exchange()
  for m in monitors:
    m.on_train_end()
  chief = monitors[1]
  assert [r["stragglers"] for r in chief.reports] == [[1]] * 4
  assert all(9 < r["late_ms"][1] < 11 and r["late_ms"][0] < 0
             for r in chief.reports)
  assert chief.report.stragglers == [1]
  assert (tmp_path / "phases" / "heatmap.png").exists()
  trace = json.loads((tmp_path / "phases" / "trace.json").read_text())
  assert sum(e["name"] == "step" for e in trace["traceEvents"]) == 80
  values = {}
  for path in tb.iterdir():
    for record in tf.data.TFRecordDataset(str(path)):
      event = tf.compat.v1.Event.FromString(record.numpy())
      for v in event.summary.value:
        values.setdefault(v.tag, []).append(
            float(tf.make_ndarray(v.tensor)))
  assert len(values["stragglers/late_ms/worker_1"]) == 4
  assert min(values["stragglers/late_ms/worker_1"]) > 9
  assert max(values["stragglers/flagged/worker_0"]) == 0
  with pytest.raises(ValueError, match="Argument `exchange_every`"):
    StragglerMonitor(tmp_path, 0, 2, exchange_every=1)


def test_compute_timing_inside_the_step(caplog):
  # Read from the step's own timestamps: compute + sync within the step's
  # host-clock time, every step; an XLA-compiled step (no Timestamp
  # kernel) keeps host phases only, saying so, and trains.
  x = np.random.default_rng(0).normal(size=(160, 8)).astype("float32")
  y = x[:, :1] * 2.0
  for jit in (False, True):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32),
                              keras.layers.Dense(1)])
    model.compile("adam", "mse", jit_compile=jit)
    recorder = StepPhaseRecorder(time_compute=True)
    with caplog.at_level("WARNING", logger="tfopt"):
      model.fit(x, y, batch_size=2, epochs=1, verbose=0,
                callbacks=[recorder])
    if jit:
      assert recorder.compute == [] and len(recorder.in_step) == 80
      assert any("XLA" in r.getMessage() for r in caplog.records)
      continue
    # 80 steps: more than the 64-step ring, read back in two parts.
    assert len(recorder.compute) == len(recorder.sync) == 80
    for c, s, t in zip(recorder.compute, recorder.sync, recorder.in_step):
      assert 0 < c and 0 <= s and c + s <= t


@pytest.mark.parametrize("unknown_length", [False, True])
def test_compute_timing_per_call_with_steps_per_execution(unknown_length):
  # 4 steps per call, each holding its forward pass >= 5 ms (a host sleep
  # whose output the loss needs): a call's compute is its steps' sum, so
  # >= 20 ms (10 ms for the epoch's short last call, also where Keras
  # cannot know it is short: a filtered dataset), and within the call's
  # host-clock time.
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  def sleep_5ms():
    time.sleep(0.005)
    return np.float32(0.0)

  class Slow(keras.layers.Layer):

    def call(self, x):
      pause = tf.numpy_function(sleep_5ms, [], tf.float32, stateful=True)
      return x + tf.stop_gradient(tf.reshape(pause, []))

    def compute_output_shape(self, shape):
      return shape

  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((8,)), Slow(), keras.layers.Dense(1)])
  model.compile("adam", "mse", steps_per_execution=4)
  x = np.random.default_rng(0).normal(size=(40, 8)).astype("float32")
  data = tf.data.Dataset.from_tensor_slices((x, x[:, :1]))
  if unknown_length:
    data = data.filter(lambda a, b: True)
  recorder = StepPhaseRecorder(time_compute=True)
  model.fit(data.batch(4), epochs=2, verbose=0, callbacks=[recorder])
  # 10 steps an epoch: calls of 4, 4 and 2.
  assert len(recorder.in_step) == len(recorder.compute) == 6
  for c, s, t, steps in zip(recorder.compute, recorder.sync,
                            recorder.in_step, (4, 4, 2) * 2):
    assert steps * 0.005 <= c < (steps + 1) * 0.005 + 0.05
    assert 0 <= s and c + s <= t


def test_compute_timing_read_while_training_with_many_steps_per_call():
  # 40 steps per call (more than the default ring of 64 holds twice):
  # the ring is made 80 long and read every second call, while training;
  # every call's compute within its host time.
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
  model.compile("adam", "mse", steps_per_execution=40)
  x = np.random.default_rng(0).normal(size=(400, 8)).astype("float32")
  recorder = StepPhaseRecorder(time_compute=True)
  reads = []
  collect = recorder.collect
  recorder.collect = lambda: reads.append(len(recorder.in_step)) or collect()
  model.fit(x, x[:, :1], batch_size=1, epochs=1, verbose=0,
            callbacks=[recorder])
  assert recorder._timer.window == 80  # pylint: disable=protected-access
  assert reads[:4] == [2, 4, 6, 8]  # and at the epoch's and train's end
  assert len(recorder.compute) == 10
  for c, s, t in zip(recorder.compute, recorder.sync, recorder.in_step):
    assert 0 < c and 0 <= s and c + s <= t
