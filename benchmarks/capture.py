"""Capture and profile cost of real training steps, ours vs Keras' own path.

    python -m benchmarks.capture            # resnet50 and inception_v3, batch 32
    python -m benchmarks.capture --models=mlp,small_cnn --batch_size=8

For each model, in one process, side by side:
  ours:     capture_train_step (trace `train_step` once at a fixed batch,
            inline, lift variables, build the OpGraph), then profile_step
            (1 warm-up + N traced Session steps, ops one at a time).
  baseline: Keras' own route to a traced step -- the first
            `model.train_on_batch` call (traces Keras' train function and
            runs one step) -- and its steady-state step time.
Also: the analytic roofline estimate's total compute against the profiled
total. Prints a table of seconds and ratios and writes
benchmarks/results/capture.json.
"""

from __future__ import annotations

import json
import os
import platform
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["resnet50", "inception_v3"], "Zoo models.")
flags.DEFINE_integer("batch_size", 32, "Batch size.")
flags.DEFINE_integer("steps", 3, "Traced profiling steps.")
flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "results",
                                        "capture.json"), "Results JSON.")


def _measure(name: str, batch_size: int, steps: int) -> dict:
  import keras
  import tensorflow as tf

  from tfopt import zoo
  from tfopt.cost.analytic import estimate_costs
  from tfopt.cost.profile import profile_step
  from tfopt.graph import capture_train_step

  keras.utils.set_random_seed(0)
  t0 = time.perf_counter()
  ours = zoo.build(name)
  x, y = ours.batch(batch_size)
  t1 = time.perf_counter()
  step = capture_train_step(ours.model, x=x, y=y)
  t2 = time.perf_counter()
  costs = profile_step(step, inputs=[*tf.nest.flatten(x), *tf.nest.flatten(y)],
                       steps=steps, warmup=1)
  t3 = time.perf_counter()
  analytic = estimate_costs(step.graph)
  # Baseline: a fresh copy of the model through Keras' own path.
  base = zoo.build(name)
  t4 = time.perf_counter()
  base.model.train_on_batch(x, y)
  t5 = time.perf_counter()
  base.model.train_on_batch(x, y)
  base.model.train_on_batch(x, y)
  t6 = time.perf_counter()
  return {
      "model": name, "batch_size": batch_size,
      "ops": len(step.graph), "edges": len(step.graph.edges),
      "variables": len(step.variables),
      "profiled_ops": costs.num_profiled(),
      "build_s": t1 - t0,
      "capture_s": t2 - t1,
      "profile_s": t3 - t2,
      "profile_steps": steps + 1,
      "profile_s_per_step": (t3 - t2) / (steps + 1),
      "profiled_total_compute_ms": costs.total_compute_us() / 1e3,
      "analytic_total_compute_ms": analytic.total_compute_us() / 1e3,
      "analytic_vs_profiled": (analytic.total_compute_us() /
                               costs.total_compute_us()),
      "keras_first_step_s": t5 - t4,
      "keras_step_s": (t6 - t5) / 2,
      "capture_vs_keras_first_step": (t2 - t1) / (t5 - t4),
      "profiled_step_vs_keras_step": ((t3 - t2) / (steps + 1)) / ((t6 - t5) / 2),
  }


def main(argv):
  del argv
  import tensorflow as tf
  rows = [_measure(m, FLAGS.batch_size, FLAGS.steps) for m in FLAGS.models]
  header = (f"{'model':<14}{'ops':>7}{'capture s':>11}{'keras 1st s':>13}"
            f"{'ratio':>7}{'prof s/step':>13}{'keras s/step':>14}{'ratio':>7}"
            f"{'analytic/profiled':>19}")
  print(header)
  for r in rows:
    print(f"{r['model']:<14}{r['ops']:>7}{r['capture_s']:>11.1f}"
          f"{r['keras_first_step_s']:>13.1f}"
          f"{r['capture_vs_keras_first_step']:>7.2f}"
          f"{r['profile_s_per_step']:>13.1f}{r['keras_step_s']:>14.1f}"
          f"{r['profiled_step_vs_keras_step']:>7.2f}"
          f"{r['analytic_vs_profiled']:>19.2f}")
  os.makedirs(os.path.dirname(FLAGS.out), exist_ok=True)
  with open(FLAGS.out + ".tmp", "w") as f:
    json.dump({"benchmark": "capture", "tensorflow": tf.__version__,
               "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
               "rows": rows}, f, indent=2)
  os.replace(FLAGS.out + ".tmp", FLAGS.out)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
