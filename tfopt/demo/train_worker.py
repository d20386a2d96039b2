"""Stage 2's worker, started by `tfopt.scale.launch` (one worker):

    python -m tfopt.demo.train_worker SPEC.json

Starts the server tasks its placed step runs on (`LoopbackServers`, each
in a memory cgroup of `os_limit_bytes`), loads the chosen model,
`tfopt.compile`s it with CautiousAdamW and `placement="auto"` on those
tasks with a cap of `cap_bytes` per device, and trains it with
`tfopt.scale.worker.fit` (heartbeats, checkpoints, resume; the tasks
watched: a task that dies ends the worker with `TASK_LOST_EXIT` and the
launcher restarts it from the last checkpoint). Writes, per attempt,
under `out_dir`: each step's time (`steps-<attempt>.jsonl`), what the hook
did (`attempt-<attempt>.json`: the plan, its Gantt chart, predicted and
OS-measured peaks, where the variables went) and, when training ends, the
final weights (`final.weights.h5`).

The spec (JSON): model, data (.npz of token_ids, padding_mask, y,
sample_weight), out_dir, tasks, cap_bytes, os_limit_bytes, epochs,
steps_per_epoch, batch_size, learning_rate, weight_decay,
checkpoint_every, seed.
"""

import json
import os
import sys
import time

# The launcher's TF_CONFIG describes a data-parallel job of one worker;
# this one places its step on server tasks of its own (`cluster=` below).
os.environ.pop("TF_CONFIG", None)


class _StepTimes:
  """Seconds between consecutive step ends, appended to a JSON-lines file
  in step order (the MFU curve's input): the n-th line of an attempt is
  the n-th step that attempt logged in the launcher's step log."""

  def __init__(self, path: str, attempt: int):
    self.path, self.attempt = path, attempt
    self.step = 0
    self.last = None

  def callback(self):
    import keras  # pylint: disable=g-import-not-at-top
    outer = self

    class Callback(keras.callbacks.Callback):
      async_safe = False  # the clock must be read when the step ends

      def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        outer.step += 1
        with open(outer.path, "a", encoding="utf-8") as f:
          f.write(json.dumps({
              "attempt": outer.attempt, "index": outer.step,
              "seconds": None if outer.last is None else now - outer.last,
          }) + "\n")
        outer.last = now

      def on_epoch_begin(self, epoch, logs=None):
        outer.last = None  # the first step of a fit includes its start-up

    return Callback()


def _dataset_fn(data, batch_size: int):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x = {"token_ids": data["token_ids"], "padding_mask": data["padding_mask"]}

  def dataset(epoch):
    order = np.random.RandomState(epoch).permutation(len(data["y"]))
    parts = ({k: v[order] for k, v in x.items()}, data["y"][order],
             data["sample_weight"][order])
    return tf.data.Dataset.from_tensor_slices(parts).batch(
        batch_size, drop_remainder=True)

  return dataset


def _hook_record(model, servers, spec, attempt: int) -> dict:
  """What the hook did on the servers, and a Gantt chart of its plan."""
  from tfopt.simulate.gantt import draw_gantt  # pylint: disable=g-import-not-at-top
  (report,) = model.train_function.reports.values()
  gantt = os.path.join(spec["out_dir"], f"gantt-{attempt}.png")
  draw_gantt(report.plan.schedule, gantt, overwrite=True,
             title=f"placed step ({report.placer}): predicted "
                   f"{report.predicted_us / 1e3:.1f} ms",
             device_names=[d.split("/job:")[-1] for d in
                           servers.device_names])
  return {"attempt": attempt, "placer": report.placer,
          "table": report.table(), "plan_table": report.plan.table(),
          "predicted_us": report.predicted_us,
          "single_device_us": report.single_device_us,
          "predicted_peak_bytes": list(report.peak_bytes),
          "devices_used": list(report.devices_used),
          "variable_bytes": report.variable_bytes,
          "ops_verified": report.ops_verified,
          "os_peak_bytes": servers.peak_bytes(),
          "gantt_png": gantt}


def main(spec_path: str) -> int:
  with open(spec_path, encoding="utf-8") as f:
    spec = json.load(f)
  import numpy as np  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  import keras_hub  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  import tfopt  # pylint: disable=g-import-not-at-top
  from tfopt.optimizers import CautiousAdamW  # pylint: disable=g-import-not-at-top
  from tfopt.runtime import LoopbackServers  # pylint: disable=g-import-not-at-top
  from tfopt.scale import worker  # pylint: disable=g-import-not-at-top
  env = worker.WorkerEnv.from_environ()
  data = dict(np.load(spec["data"]))
  times = _StepTimes(os.path.join(spec["out_dir"],
                                  f"steps-{env.attempt}.jsonl"), env.attempt)
  with LoopbackServers(spec["tasks"],
                       memory_limit_bytes=spec["os_limit_bytes"]) as servers:
    keras.utils.set_random_seed(spec["seed"])
    model = keras.saving.load_model(spec["model"], compile=False)
    tfopt.compile(
        model, optimizer=CautiousAdamW(spec["learning_rate"],
                                       weight_decay=spec["weight_decay"]),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        placement="auto", devices=servers.device_names,
        cluster=servers.spec, memory_per_device=spec["cap_bytes"],
        verbose=False)

    class Placed(keras.callbacks.Callback):
      """Records the hook's plan once the first step placed it."""

      def __init__(self):
        super().__init__()
        self.done = False

      def on_train_batch_end(self, batch, logs=None):
        if self.done:
          return
        self.done = True
        record = _hook_record(self.model, servers, spec, env.attempt)
        path = os.path.join(spec["out_dir"], f"attempt-{env.attempt}.json")
        with open(path, "w", encoding="utf-8") as f:
          json.dump(record, f, indent=1, default=float)

    result = worker.fit(
        model, _dataset_fn(data, spec["batch_size"]), epochs=spec["epochs"],
        steps_per_epoch=spec["steps_per_epoch"],
        checkpoint_every=spec["checkpoint_every"],
        callbacks=[Placed(), times.callback()],
        env=env, servers=servers)
    if env.is_chief:
      model.save_weights(os.path.join(spec["out_dir"], "final.weights.h5"))
      with open(os.path.join(spec["out_dir"], "final.json"), "w",
                encoding="utf-8") as f:
        json.dump({"global_step": result.global_step,
                   "resumed_from": result.resumed_from,
                   "os_peak_bytes": servers.peak_bytes()}, f)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1]))
