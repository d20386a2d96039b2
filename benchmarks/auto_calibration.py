"""Predicted against measured steps with tfopt.compile's default calibration,
on models that are not in the runtime benchmark.

    python -m benchmarks.auto_calibration

What a user gets from `tfopt.compile(model, ..., placement="auto",
devices=<2 logical CPUs>)` without running `tfopt-calibrate` by hand: for
each model, in a fresh process (traced profiles drift in a process that
profiled other models), the hook's predicted step (the chosen plan's
simulated makespan, `HookReport.predicted_us`) against the step `fit`
really takes, with Baechi's model of the machine (`calibration=None`:
its PCIe-like link, devices computing apart; mode "none") and with no
`calibration` argument (mode "default": `calibration="auto"`, this
machine's, measured once and cached: `tfopt.calibration_cache`). The
measured step: `benchmarks._timing` per step (the median of every step's
time from the previous step's end, in clocked fits of `long` steps), with
the median over rounds of its difference of two unclocked fits beside it
("difference", the measure before: two whole fits' noise lands on
long - short steps, and it also charges whatever of fit's time outside
the step intervals grows with the fit's length: `outside_steps_ms` is
that time per clocked fit; in the results committed before the per-step
measure, one process's rounds spread up to 5.9x, MobileNet's 15-87 ms).
Each model
and mode runs in `repeats` fresh processes, the modes alternating; the row
is the run with the median ratio (the lower one of two), every run's ratio
beside it: this VM's speed jumps between moments, and a profile taken
before a jump predicts the step after it wrong by the jump.

Models: a branchy CNN (an Inception-style block: 1x1, 3x3 and pooled
branches concatenated, twice), keras.applications MobileNet (alpha 0.25,
32x32 inputs) and an LSTM text classifier. Writes
benchmarks/results/auto_calibration.json; the calibration cache is a
temporary directory, so the first "default" run measures this machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from benchmarks._timing import WARMUP, summary, timed_fits  # noqa: E402

FLAGS = flags.FLAGS
MODELS = ("branchy_cnn", "mobilenet", "lstm")
flags.DEFINE_list("models", list(MODELS), "Models to run.")
flags.DEFINE_integer("rounds", 5, "Timing rounds per model and mode.")
flags.DEFINE_integer("repeats", 2, "Fresh processes per model and mode, "
                     "alternating the modes (this VM's speed jumps between "
                     "moments; one process can land in a slow one).")
flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "results",
                                        "auto_calibration.json"),
                    "Results JSON.")
flags.DEFINE_string("one", None, "Internal: run one model:mode here and "
                    "print its row as JSON.")
BATCH = 32
SHORT, LONG = 4, 16  # steps per timed fit


def _build(name: str):
  """The model and a batch source (numpy arrays), seeded."""
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(0)
  layers = keras.layers
  if name == "branchy_cnn":
    inp = keras.Input((32, 32, 3))
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(inp)
    for width in (32, 48):
      a = layers.Conv2D(width, 1, activation="relu")(x)
      b = layers.Conv2D(width, 3, padding="same", activation="relu")(x)
      c = layers.Conv2D(width, 1, activation="relu")(
          layers.MaxPooling2D(3, 1, padding="same")(x))
      x = layers.MaxPooling2D()(layers.Concatenate()([a, b, c]))
    out = layers.Dense(10)(layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inp, out)
    x = rng.random((BATCH * LONG, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, BATCH * LONG)
  elif name == "mobilenet":
    model = keras.applications.MobileNet(
        input_shape=(32, 32, 3), alpha=0.25, weights=None, classes=10,
        classifier_activation=None)
    x = rng.random((BATCH * LONG, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, BATCH * LONG)
  elif name == "lstm":
    inp = keras.Input((40,), dtype="int32")
    h = layers.LSTM(96)(layers.Embedding(2000, 48)(inp))
    model = keras.Model(inp, layers.Dense(4)(h))
    x = rng.integers(0, 2000, (BATCH * LONG, 40)).astype(np.int32)
    y = rng.integers(0, 4, BATCH * LONG)
  else:
    raise app.UsageError(f"--models must name {list(MODELS)}. Received: "
                         f"{name}")
  return model, x, y


def _row(name: str, mode: str, rounds: int, cache: str) -> dict:
  """One model and calibration mode, timed here (2 logical CPUs)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices("CPU")[0],
      [tf.config.LogicalDeviceConfiguration()] * 2)
  import keras  # pylint: disable=g-import-not-at-top
  import tfopt  # pylint: disable=g-import-not-at-top
  os.environ["TFOPT_CACHE_DIR"] = cache
  os.environ.pop("TFOPT_CALIBRATION", None)  # the default is "auto"
  model, x, y = _build(name)
  started = time.perf_counter()
  # Mode "default": what a user gets without the argument.
  chosen = {"calibration": None} if mode == "none" else {}
  tfopt.compile(model, optimizer="adam", verbose=False,
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True),
                placement="auto", devices=["/device:CPU:0", "/device:CPU:1"],
                **chosen)
  model.fit(x[:BATCH * 2], y[:BATCH * 2], batch_size=BATCH, verbose=0)
  compile_s = time.perf_counter() - started
  (report,) = model.train_function.reports.values()

  timed = summary(timed_fits(model, x, y, batch=BATCH, short=SHORT,
                             long=LONG, rounds=rounds))
  difference_ms = statistics.median(timed["per_step_ms"])
  return {"model": name, "mode": mode, "placer": report.placer,
          "devices_used": len(report.devices_used),
          "predicted_ms": report.predicted_us / 1e3, **timed,
          "measured_over_predicted": timed["measured_ms"] * 1e3
                                     / report.predicted_us,
          "difference_ms": difference_ms,
          "difference_over_predicted": difference_ms * 1e3
                                       / report.predicted_us,
          "first_fit_s": compile_s, "cluster": report.cluster_source}


def _one_process(name: str, mode: str, cache: str) -> dict:
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.auto_calibration",
       f"--one={name}:{mode}:{cache}", f"--rounds={FLAGS.rounds}"],
      capture_output=True, text=True, check=True,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  return json.loads(next(line[4:] for line in done.stdout.splitlines()
                         if line.startswith("ROW ")))


def _median_run(found: list[dict]) -> dict:
  """The run whose measured / predicted is the median (the lower middle
  for an even count), with every run's ratio beside it."""
  ordered = sorted(found, key=lambda r: r["measured_over_predicted"])
  row = dict(ordered[(len(ordered) - 1) // 2])
  row["runs"] = [r["measured_over_predicted"] for r in found]
  row["difference_runs"] = [r["difference_over_predicted"] for r in found]
  return row


def main(argv):
  del argv
  if FLAGS.one:
    name, mode, cache = FLAGS.one.split(":", 2)
    print("ROW " + json.dumps(_row(name, mode, FLAGS.rounds, cache)))
    return
  from tfopt._io import atomic_write_text  # pylint: disable=g-import-not-at-top
  rows = []
  with tempfile.TemporaryDirectory() as cache:
    for name in FLAGS.models:
      runs = {"none": [], "default": []}
      for _ in range(FLAGS.repeats):
        for mode in runs:
          row = _one_process(name, mode, cache)
          runs[mode].append(row)
          print(f"{name:12s} {mode:8s} {row['placer']:>22s} predicted "
                f"{row['predicted_ms']:7.2f} ms  measured "
                f"{row['measured_ms']:7.2f} ms  meas/pred "
                f"{row['measured_over_predicted']:5.2f}", flush=True)
      rows += [_median_run(found) for found in runs.values()]
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  doc = {"benchmark": "auto_calibration", "tensorflow": tf.__version__,
         "cpu_count": os.cpu_count(), "rounds": FLAGS.rounds,
         "repeats": FLAGS.repeats, "batch_size": BATCH,
         "steps": [SHORT, LONG], "warmup": WARMUP, "rows": rows}
  atomic_write_text(FLAGS.out, json.dumps(doc, indent=1) + "\n",
                    overwrite=True)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
