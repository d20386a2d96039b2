"""Profile a built-in model's training step and write it as a costgraph.

    tfopt-profile --model=inception_v3 --batch_size=32 \
        --out=/tmp/inception_v3.json

prints a summary (ops, total compute, memory, critical path, lower bound) and
writes a `tfopt.costgraph/1` file. `--measure_comm` also times tensor copies
(1 B to 64 MiB) between two TensorFlow tasks on loopback and prints the fitted
latency + bandwidth with its residual. `--analytic` skips profiling and uses the
roofline estimate. Model sizes are the zoo's defaults; `--model_kwargs` takes
overrides as JSON, e.g. '{"image_size": 75}'.
"""

from __future__ import annotations

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402
from tfopt.cli._main import run_main  # noqa: E402

from tfopt.cli._config import apply_config, define_config_flag  # noqa: E402

from tfopt import zoo  # noqa: E402

FLAGS = flags.FLAGS
define_config_flag()
flags.DEFINE_enum("model", "mlp", sorted(zoo.BUILDERS), "Zoo model to profile.")
flags.DEFINE_integer("batch_size", 32, "Batch size of the traced step.")
flags.DEFINE_string("out", None, "Write the costgraph JSON here.")
flags.DEFINE_bool("overwrite", False, "Replace --out if it exists.")
flags.DEFINE_integer("steps", 3, "Traced steps; op time is their median.")
flags.DEFINE_integer("warmup", 1, "Untraced warm-up steps.")
flags.DEFINE_bool("analytic", False, "Estimate costs instead of profiling.")
flags.DEFINE_string("model_kwargs", "{}", "JSON dict of zoo overrides.")
flags.DEFINE_integer("devices", 4, "Device count for the lower bound.")
flags.DEFINE_bool("measure_comm", False, "Also measure tensor copies between "
                  "two TF tasks on loopback and print the fitted CommModel.")


def main(argv):
  del argv
  apply_config()
  import numpy as np
  import tensorflow as tf

  from tfopt.cost import analytic
  from tfopt.cost.profile import profile_step
  from tfopt.graph import (capture_train_step, format_summary, graph_summary,
                           save_costgraph)

  if FLAGS.out and os.path.exists(FLAGS.out) and not FLAGS.overwrite:
    raise app.UsageError(f"--out={FLAGS.out} exists; pass --overwrite to "
                         "replace it.")
  try:
    kwargs = json.loads(FLAGS.model_kwargs)
  except json.JSONDecodeError as err:
    raise app.UsageError(f"--model_kwargs is not JSON: {err}") from None
  np.random.seed(0)
  tf.random.set_seed(0)
  start = time.perf_counter()
  model = zoo.build(FLAGS.model, **kwargs)
  x, y = model.batch(FLAGS.batch_size)
  step = capture_train_step(model.model, x=x, y=y)
  captured = time.perf_counter()
  if FLAGS.analytic:
    costs = analytic.estimate_costs(step.graph)
  else:
    costs = profile_step(step, inputs=[*tf.nest.flatten(x), *tf.nest.flatten(y)],
                         steps=FLAGS.steps, warmup=FLAGS.warmup, progress=True)
  done = time.perf_counter()
  print(format_summary(graph_summary(step.graph, costs, FLAGS.devices)))
  print(f"capture          {captured - start:.1f} s (build + trace + inline)")
  print(f"{'estimate' if FLAGS.analytic else 'profile':<17}"
        f"{done - captured:.1f} s")
  if FLAGS.measure_comm:
    from tfopt.cost.comm_measure import measure_comm_model
    fit, points = measure_comm_model()
    print("transfers        " + ", ".join(
        f"{b} B: {t:.0f} us" for b, t in points[::3]))
    print(f"comm fit         {fit}")
  if FLAGS.out:
    save_costgraph(FLAGS.out, step.graph, costs, overwrite=FLAGS.overwrite,
                   source=f"tfopt tfopt-profile --model={FLAGS.model} "
                   f"--batch_size={FLAGS.batch_size}; {costs.source}")
    print(f"wrote            {FLAGS.out}")


def run() -> None:
  """The console script's entry point."""
  run_main(main, __doc__)


if __name__ == "__main__":
  run()
