"""A small data-parallel training job for `tfopt.scale.launch`.

    python -m tfopt.scale.launch --workers=2 -- experiments/scale_train.py \
        --epochs=3 --steps_per_epoch=20

Every worker builds the same model under MultiWorkerMirroredStrategy
(`tfopt.scale.worker.make_strategy`), trains it with the resumable
`tfopt.scale.worker.fit` (two-stage checkpoints every `--checkpoint_every`
steps, heartbeats, preemption, input position restored after a restart)
and writes `<run_dir>/final-worker-<i>.json`: the loss of the final model
on a fixed evaluation batch and a SHA-256 of its weights, so runs with and
without faults can be compared exactly, its MFU (`--mfu`, the default:
its steps timed by `tfopt.scale.mfu.MFUMonitor`, the FLOPs of its share of
the batch) and, on the chief with `--stragglers`, the straggler verdict.
Run without the launcher it trains as one process (worker 0 of 1; `--run_dir` then holds its files), or, under
a cluster manager's TF_CONFIG or SLURM variables, as its task of the job
(`--run_dir` a directory every task can write).

Test hooks (all default off): `--stuck=W:S` makes worker W hang before
step S of the first attempt (alive, heartbeating, not training), and
`--delay_ms=W:MS` (or `W:PCT%`) adds host time before every step of worker
W (a straggler). `--extra_compute=W:MS` makes worker W's compiled step do
about MS ms more real compute (a chain of matmuls inside the step, ahead of
the forward pass; its result enters the batch as an exact zero, so the
weights stay those of a healthy run): a compute-side straggler, invisible
to the host clock. `--stragglers` records step phases (and each step's
compute and sync time, timed inside it) and exchanges them every
`--exchange_every` steps (`tfopt.scale.stragglers.StragglerMonitor`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("epochs", 3, "Epochs.")
flags.DEFINE_integer("steps_per_epoch", 20, "Global batches per epoch.")
flags.DEFINE_integer("batch", 32, "Global batch size.")
flags.DEFINE_integer("width", 64, "Hidden width of the MLP.")
flags.DEFINE_float("dropout", 0.1, "Dropout rate (0 for runs compared with "
                   "a single process at the same global batch).")
flags.DEFINE_integer("checkpoint_every", 5, "Steps between checkpoints.")
flags.DEFINE_integer("seed", 0, "Seed of data and weights.")
flags.DEFINE_string("run_dir", None, "Run directory when not launched by "
                    "tfopt.scale.launch (shared by every task).")
flags.DEFINE_string("stuck", None, "W:S: worker W hangs before step S "
                    "(first attempt only).")
flags.DEFINE_string("delay_ms", None, "W:MS or W:PCT%: extra host time per "
                    "step on worker W.")
flags.DEFINE_string("extra_compute", None, "W:MS: about MS ms of extra "
                    "compute inside every step of worker W.")
flags.DEFINE_bool("stragglers", False, "Record and exchange step phases.")
flags.DEFINE_integer("exchange_every", 10, "Steps between exchanges.")
flags.DEFINE_bool("mfu", True, "Time the steps (tfopt.scale.mfu.MFUMonitor) "
                  "and write this worker's MFU into its final-worker file "
                  "(the launcher's summary pools them per host).")
flags.DEFINE_bool("hook", False, "Train through tfopt.compile's hook (each "
                  "replica's step captured and fused; the all-reduce "
                  "the strategy's own).")
flags.DEFINE_bool("jit_compile", False, "Keras' jit_compile=True (with "
                  "--hook: the captured step marked for XLA).")


def _model(keras):
  return keras.Sequential([
      keras.Input((16,)),
      keras.layers.Dense(FLAGS.width, activation="relu"),
      keras.layers.Dropout(FLAGS.dropout, seed=FLAGS.seed),
      keras.layers.Dense(FLAGS.width, activation="relu"),
      keras.layers.Dense(1)])


def _mfu_monitor(keras, np, env):
  """An MFUMonitor of this worker's steps: the FLOPs of its share of the
  global batch counted on a plain twin of the model (before the seed is
  set: the twin's weights draw nothing from the run's random state)."""
  from tfopt.scale.flops import train_step_flops  # pylint: disable=import-outside-toplevel
  from tfopt.scale.mfu import MFUMonitor  # pylint: disable=import-outside-toplevel
  share = max(1, FLAGS.batch // max(1, env.workers))
  batch = (np.zeros((share, 16), "float32"), np.zeros((share, 1), "float32"))
  twin = _model(keras)
  twin.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
  return MFUMonitor(batch, flops_per_step=train_step_flops(twin, *batch).total)


def _dataset_fn(tf, np):
  rng = np.random.RandomState(FLAGS.seed)
  n = FLAGS.batch * FLAGS.steps_per_epoch
  x = rng.randn(n, 16).astype("float32")
  w = rng.randn(16, 1).astype("float32")
  y = np.tanh(x @ w) + 0.1 * rng.randn(n, 1).astype("float32")

  def dataset_fn(epoch):
    # The epoch's order from NumPy: tf.data's shuffle seeds give another
    # order under a distribution strategy than in one process.
    order = np.random.RandomState(FLAGS.seed * 1000 + epoch).permutation(n)
    ds = tf.data.Dataset.from_tensor_slices((x[order], y[order]))
    return ds.batch(FLAGS.batch, drop_remainder=True)

  return dataset_fn, (x[:256], y[:256])


class _Hooks:
  """The test hooks as a Keras callback (host-side, like a slow input
  pipeline or a wedged Python thread would be)."""

  def __init__(self, keras, env):
    hooks = self
    self.delay_s, self.delay_pct = 0.0, 0.0
    if FLAGS.delay_ms:
      who, amount = FLAGS.delay_ms.split(":")
      if int(who) == env.worker:
        if amount.endswith("%"):
          self.delay_pct = float(amount[:-1]) / 100
        else:
          self.delay_s = float(amount) / 1000
    self.stuck_at = None
    if FLAGS.stuck and env.attempt == 0:
      who, step = FLAGS.stuck.split(":")
      if int(who) == env.worker:
        self.stuck_at = int(step)

    class Callback(keras.callbacks.Callback):
      async_safe = False

      def __init__(self):
        super().__init__()
        self.step = 0
        self.last = None

      def on_train_batch_begin(self, batch, logs=None):
        self.step += 1
        if hooks.stuck_at is not None and self.step >= hooks.stuck_at:
          while True:  # alive, heartbeating, never training again
            time.sleep(3600)
        if hooks.delay_s:
          time.sleep(hooks.delay_s)
        elif hooks.delay_pct and self.last:
          time.sleep(hooks.delay_pct * self.last)
        self._begin = time.perf_counter()

      def on_train_batch_end(self, batch, logs=None):
        self.last = time.perf_counter() - self._begin

    self.callback = Callback()


def _matmuls_for_ms(tf, ms: float) -> int:
  """How many chained 256 x 256 matmuls take about `ms` here (timed)."""
  a = tf.random.normal((256, 256), seed=1) / 16.0

  @tf.function
  def chain(x, n):
    for _ in tf.range(n):
      x = tf.linalg.matmul(x, a)
    return tf.reduce_sum(x)

  chain(a, tf.constant(10)).numpy()
  best = float("inf")
  for _ in range(5):
    start = time.perf_counter()
    chain(a, tf.constant(50)).numpy()
    best = min(best, (time.perf_counter() - start) / 50)
  return max(1, round(ms / 1e3 / best))


def _with_extra_compute(tf, model, matmuls: int) -> None:
  """Worker W's step does `matmuls` chained matmuls before its forward
  pass; the batch gets 0 x their finite sum, so nothing else changes."""
  a = tf.random.normal((256, 256), seed=1) / 16.0
  train_step = model.train_step

  def slower_step(data):
    # tf.while_loop: Keras traces the step without autograph.
    _, x = tf.while_loop(lambda i, x: i < matmuls,
                         lambda i, x: (i + 1, tf.linalg.matmul(x, a)),
                         (tf.constant(0), a))
    zero = tf.cast(0.0 * tf.reduce_sum(x), tf.float32)
    features, labels = data
    return train_step((features + zero, labels))

  model.train_step = slower_step


def main(argv):
  del argv
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tfopt  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  import keras  # pylint: disable=import-outside-toplevel
  from tfopt.scale import worker  # pylint: disable=import-outside-toplevel

  env = worker.WorkerEnv.from_environ()
  if env.run_dir is None and FLAGS.run_dir:
    # Started by a cluster manager (TF_CONFIG, SLURM) or alone: the run
    # directory comes from the flag, the place from the environment.
    env = dataclasses.replace(env, run_dir=os.path.abspath(FLAGS.run_dir))
  strategy = worker.make_strategy(env)
  mfu = _mfu_monitor(keras, np, env) if FLAGS.mfu else None
  keras.utils.set_random_seed(FLAGS.seed)
  dataset_fn, (x_eval, y_eval) = _dataset_fn(tf, np)
  with strategy.scope():
    model = _model(keras)
    compile_args = dict(optimizer=keras.optimizers.Adam(1e-3), loss="mse",
                        jit_compile=FLAGS.jit_compile)
    if FLAGS.hook:
      tfopt.compile(model, verbose=False, **compile_args)
    else:
      model.compile(**compile_args)
  if FLAGS.extra_compute:
    who, ms = FLAGS.extra_compute.split(":")
    if int(who) == env.worker:
      _with_extra_compute(tf, model, _matmuls_for_ms(tf, float(ms)))
  callbacks = [_Hooks(keras, env).callback, *([mfu] if mfu else [])]
  stragglers = None
  if FLAGS.stragglers and env.run_dir:
    from tfopt.scale.stragglers import StragglerMonitor  # pylint: disable=import-outside-toplevel
    stragglers = StragglerMonitor(
        os.path.join(env.run_dir, "phases"), env.worker, env.workers,
        exchange_every=FLAGS.exchange_every, attempt=env.attempt)
    callbacks.append(stragglers)
  result = worker.fit(model, dataset_fn, epochs=FLAGS.epochs,
                      steps_per_epoch=FLAGS.steps_per_epoch,
                      checkpoint_every=FLAGS.checkpoint_every,
                      callbacks=callbacks, env=env)
  loss = float(keras.ops.mean(keras.ops.square(
      model(x_eval, training=False) - y_eval)))
  digest = hashlib.sha256()
  for w in model.get_weights():
    digest.update(np.ascontiguousarray(w).tobytes())
  summary = {"worker": env.worker, "attempt": env.attempt,
             "global_step": result.global_step,
             "resumed_from": result.resumed_from, "final_loss": loss,
             "weights_sha256": digest.hexdigest()}
  if mfu is not None and mfu.step_times:
    summary["mfu"] = mfu.summary()
  if stragglers is not None and stragglers.report is not None:
    # The chief's verdict on the whole attempt (worker indices).
    summary["stragglers"] = {
        "host_side": stragglers.report.stragglers,
        "compute": (stragglers.compute_report.stragglers
                    if stragglers.compute_report is not None else None)}
  if FLAGS.hook:  # what the hook did, per input signature
    summary["hook"] = [report.table() for report in
                       model.train_function.reports.values()]
  if env.run_dir:
    from tfopt._io import atomic_write_text  # pylint: disable=import-outside-toplevel
    atomic_write_text(os.path.join(env.run_dir,
                                   f"final-worker-{env.worker}.json"),
                      json.dumps(summary), overwrite=True)
  print(json.dumps(summary))


if __name__ == "__main__":
  app.run(main)
