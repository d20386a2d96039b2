"""Training-at-scale measurements that exist so far (issue 8 is open: the
fault matrix needs the launcher, not built yet).

    python -m benchmarks.scale          # ~3 min on 2 CPUs

- checkpoint: time the training loop is blocked by a two-stage checkpoint
  (`TwoStageCheckpointer.save`: the host snapshot) vs a synchronous save of
  the same state (snapshot + write + fsync: what a plain save costs), and
  vs Keras' `model.save_weights` of the weights alone; a model of
  `--params` parameters with its Adam state, `--repeats` saves each,
  medians. Goal: at least 5x less blocking than the synchronous save.
- monitoring: `fit` step time with and without `MFUMonitor`, interleaved
  runs, medians. Goal: at most 2 % overhead.

Prints a table and writes benchmarks/results/scale.json.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

from absl import app, flags

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)

FLAGS = flags.FLAGS
flags.DEFINE_integer("params", 8_000_000, "Model parameters (float32).")
flags.DEFINE_integer("repeats", 5, "Saves per method.")
flags.DEFINE_integer("monitor_runs", 5, "Interleaved fit runs per arm.")
flags.DEFINE_string("out", None, "JSON path (default: results/scale.json).")

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def _big_model(params):
  import keras  # pylint: disable=import-outside-toplevel
  width = int((params / 4) ** 0.5)
  model = keras.Sequential([keras.Input((width,))] + [
      keras.layers.Dense(width) for _ in range(4)])
  model.compile(keras.optimizers.Adam(1e-3), "mse")
  import numpy as np  # pylint: disable=import-outside-toplevel
  x = np.zeros((8, width), "float32")
  model.train_on_batch(x, x)  # builds the optimizer state
  return model


def checkpoint_part():
  from tfopt.scale.checkpoint import TwoStageCheckpointer  # pylint: disable=import-outside-toplevel
  model = _big_model(FLAGS.params)
  n = model.count_params()
  state_bytes = 4 * (n + sum(int(v.numpy().size)
                             for v in model.optimizer.variables))
  rows = {"two_stage_blocking_s": [], "synchronous_s": [],
          "keras_save_weights_s": [], "two_stage_persist_s": []}
  with tempfile.TemporaryDirectory() as tmp:
    ckpt = TwoStageCheckpointer(os.path.join(tmp, "async"), model)
    sync = TwoStageCheckpointer(os.path.join(tmp, "sync"), model)
    for i in range(FLAGS.repeats):
      start = time.perf_counter()
      ckpt.save(step=i)                     # blocking part only
      rows["two_stage_blocking_s"].append(time.perf_counter() - start)
      start = time.perf_counter()
      ckpt.wait()
      rows["two_stage_persist_s"].append(time.perf_counter() - start)
      start = time.perf_counter()
      sync.persist(sync.snapshot(step=i))   # the same state, synchronously
      rows["synchronous_s"].append(time.perf_counter() - start)
      path = os.path.join(tmp, f"k{i}.weights.h5")
      start = time.perf_counter()
      model.save_weights(path)
      rows["keras_save_weights_s"].append(time.perf_counter() - start)
  med = {k: statistics.median(v) for k, v in rows.items()}
  return {"params": n, "state_bytes": state_bytes, "repeats": FLAGS.repeats,
          "runs": rows, "median_s": med,
          "blocking_ratio": med["synchronous_s"] / med["two_stage_blocking_s"]}


def monitoring_part():
  import keras  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from tfopt.scale.mfu import MFUMonitor  # pylint: disable=import-outside-toplevel
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(512),
                            keras.layers.Dense(512), keras.layers.Dense(10)])
  model.compile(keras.optimizers.Adam(1e-3), "mse")
  x = np.random.default_rng(0).normal(size=(64 * 100, 256)).astype("float32")
  y = np.zeros((len(x), 10), "float32")
  model.fit(x[:640], y[:640], batch_size=64, verbose=0)  # trace

  class Clock(keras.callbacks.Callback):
    """The same clock for both arms: median batch-to-batch time."""
    def __init__(self):
      super().__init__()
      self.times, self.last = [], None
    def on_train_batch_end(self, batch, logs=None):
      now = time.perf_counter()
      if self.last is not None:
        self.times.append(now - self.last)
      self.last = now

  arms = {"without": [], "with_mfu_monitor": []}
  for _ in range(FLAGS.monitor_runs):
    for arm in arms:
      clock = Clock()
      callbacks = [clock]
      if arm == "with_mfu_monitor":
        callbacks.append(MFUMonitor((x[:64], y[:64]), peak_flops=1e12))
      model.fit(x, y, batch_size=64, epochs=1, verbose=0,
                callbacks=callbacks)
      arms[arm].append(statistics.median(clock.times))
  med = {k: statistics.median(v) for k, v in arms.items()}
  return {"step_s": arms, "median_step_s": med,
          "overhead": med["with_mfu_monitor"] / med["without"] - 1}


def main(argv):
  del argv
  out = FLAGS.out or os.path.join(RESULTS, "scale.json")
  result = {"benchmark": "scale", "checkpoint": checkpoint_part(),
            "monitoring": monitoring_part()}
  c, m = result["checkpoint"], result["monitoring"]
  print(f"checkpoint of {c['params'] / 1e6:.1f} M parameters + Adam state "
        f"({c['state_bytes'] / 2**20:.0f} MiB), median of {c['repeats']}:")
  for key, value in c["median_s"].items():
    print(f"  {key:24s} {value * 1e3:9.1f} ms")
  print(f"  blocking: synchronous / two-stage = {c['blocking_ratio']:.1f}x "
        "(goal >= 5x)")
  print("monitoring, median step time:")
  for key, value in m["median_step_s"].items():
    print(f"  {key:24s} {value * 1e3:9.3f} ms")
  print(f"  overhead {m['overhead'] * 100:+.2f} % (goal <= 2 %)")
  with open(out, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  print(f"wrote {out}")


if __name__ == "__main__":
  app.run(main)
