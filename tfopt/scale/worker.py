"""The worker side of a launched job: environment, strategy, resumable fit.

A script started by `tfopt.scale.launch` finds its place in environment
variables the launcher sets (`WorkerEnv.from_environ`); started by a
cluster manager instead, in its TF_CONFIG or SLURM variables
(`tfopt.scale.cluster_env`: the same script runs unchanged, without the
launcher's restarts); run standalone it is worker 0 of 1 with no run
directory. `make_strategy` returns a
MultiWorkerMirroredStrategy (Keras' `fit` patched for it, see
`tfopt.scale.compat`) with the collective timeout the launcher derived
from observed step times, or the default strategy for one worker.

`fit(model, dataset_fn, epochs=..., steps_per_epoch=...)` trains with
everything the launcher relies on:
- resumes from the newest intact two-stage checkpoint, restoring model,
  optimizer and RNG state *and the input position*: `dataset_fn(epoch)`
  must give the same batches in the same order for the same epoch (seed
  the shuffle with the epoch), and the resumed epoch skips the batches
  already trained, so no step is lost or repeated;
- checkpoints every `checkpoint_every` steps (the chief writes);
- heartbeats (step, phase) for the launcher;
- preemption: SIGTERM on any worker makes all workers stop at one agreed
  step (written to the run directory's control file; every worker checks
  it after each step, and workers in synchronous training are at most one
  step apart), the chief saves there, and all exit with `PREEMPTED_EXIT`,
  which the launcher restarts from;
- a per-step record (attempt, global step, batch loss) in
  `<run_dir>/steps/worker-<i>.jsonl` that the launcher stitches into the
  trajectory to count lost or repeated steps;
- with `servers` (the `LoopbackServers` a placed step runs on, see
  `tfopt.compile(placement=...)`): a thread that watches the server
  tasks; when one dies (killed, or by its memory cap), the worker names it,
  closes the others and exits with `TASK_LOST_EXIT`, which the launcher
  restarts from the last checkpoint (the variables on that task are gone,
  so the step cannot go on). The launcher's `kill_task` fault kills the
  last task after a given step.

With a `keras.callbacks.TensorBoard` among `callbacks`, the chief writes
what `fit` itself sees of restarts into its log_dir (`tfopt.summaries`):
at the first step it trains, the scalars `tfopt/restart/resumed_from_step`
and `tfopt/restart/attempt` and the text `tfopt/restart`; at a
preemption's stop step the text `tfopt/restart/preempted`. A lost task or
a crash ends the process inside a step, where no callback runs: the next
attempt's resumed-from step is what TensorBoard shows of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
import time

import keras

from tfopt import summaries
from tfopt._errors import check_positive_int, invalid_argument
from tfopt.scale import heartbeat as hb
from tfopt.scale.checkpoint import TwoStageCheckpointer
from tfopt.scale.cluster_env import place_from_environ
from tfopt.scale.protocol import (CONTROL, ENV_HEARTBEAT, ENV_TIMEOUT,
                                  PREEMPTED_EXIT, TASK_LOST_EXIT,
                                  raise_fault_if_asked)



@dataclasses.dataclass(frozen=True)
class WorkerEnv:
  """Where this process sits in the job (`tfopt.scale.cluster_env`: from
  the launcher, TF_CONFIG or SLURM; `source` says which)."""
  worker: int = 0
  workers: int = 1
  attempt: int = 0
  run_dir: str | None = None
  collective_timeout_s: float | None = None
  heartbeat_s: float = 0.5
  source: str = "single"
  cluster: dict | None = None  # the cluster spec under SLURM

  @property
  def is_chief(self) -> bool:
    return self.worker == 0

  @classmethod
  def from_environ(cls, environ=None) -> "WorkerEnv":
    """The launcher's TFOPT_* variables, else a cluster manager's TF_CONFIG
    or SLURM variables, else worker 0 of 1; TFOPT_RUN_DIR,
    TFOPT_COLLECTIVE_TIMEOUT_S and TFOPT_HEARTBEAT_S beside any of them."""
    env = os.environ if environ is None else environ
    place = place_from_environ(env)
    timeout = env.get(ENV_TIMEOUT)
    return cls(worker=place.worker, workers=place.workers,
               attempt=place.attempt, run_dir=place.run_dir,
               collective_timeout_s=float(timeout) if timeout else None,
               heartbeat_s=float(env.get(ENV_HEARTBEAT, 0.5)),
               source=place.source, cluster=place.cluster)


def make_strategy(env: WorkerEnv | None = None):
  """MultiWorkerMirroredStrategy for several workers (Keras patched, the
  collective timeout set), the default strategy for one. The cluster comes
  from TF_CONFIG (the launcher's or a cluster manager's) or, under SLURM,
  from the spec `WorkerEnv` built from SLURM's variables."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  env = env or WorkerEnv.from_environ()
  if env.workers <= 1 and "TF_CONFIG" not in os.environ:
    return tf.distribute.get_strategy()
  from tfopt.scale.compat import patch_keras_for_multi_worker  # pylint: disable=import-outside-toplevel
  patch_keras_for_multi_worker()
  options = tf.distribute.experimental.CommunicationOptions(
      timeout_seconds=env.collective_timeout_s)
  resolver = None
  if env.cluster is not None:
    # The strategy takes its GPU count from the resolver: a simple one
    # reports none unless told, and every replica would run on the CPU.
    gpus = len(tf.config.list_physical_devices("GPU"))
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(env.cluster), task_type="worker",
        task_id=env.worker, rpc_layer="grpc",
        num_accelerators={"GPU": gpus} if gpus else None)
  return tf.distribute.MultiWorkerMirroredStrategy(
      cluster_resolver=resolver, communication_options=options)


class _Preemption:
  """SIGTERM -> a stop step agreed through the control file."""

  def __init__(self, env: WorkerEnv, margin: int = 2, resumed_from: int = 0):
    self.env = env
    # A control file of a run this one resumed (a standalone rerun keeps
    # attempt 0) asked for a step already behind us: not for us.
    self.resumed_from = resumed_from
    self.margin = margin
    self.signalled = False
    self.stop_at = None
    self.reason = None
    self._previous = None
    self._path = (os.path.join(env.run_dir, CONTROL) if env.run_dir
                  else None)

  def install(self) -> None:
    self._previous = signal.signal(signal.SIGTERM, self._on_signal)

  def uninstall(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def _on_signal(self, signum, frame):  # pylint: disable=unused-argument
    self.signalled = True

  def check(self, step: int) -> bool:
    """Called after every step; True when this worker must stop now."""
    if self.signalled and self.stop_at is None:
      self._announce(step + self.margin)
    if self.stop_at is None and self._path and os.path.exists(self._path):
      try:
        with open(self._path, encoding="utf-8") as f:
          control = json.load(f)
        if control.get("attempt") == self.env.attempt and \
            int(control["stop_at_step"]) > self.resumed_from:
          self.stop_at = int(control["stop_at_step"])
          self.reason = control.get("reason")
      except (OSError, ValueError, KeyError):
        pass  # half-written by a peer: read again after the next step
    return self.stop_at is not None and step >= self.stop_at

  def _announce(self, stop_at: int) -> None:
    self.stop_at = stop_at
    self.reason = f"SIGTERM on worker {self.env.worker}"
    if self._path is None:
      return
    from tfopt._io import atomic_write_text  # pylint: disable=import-outside-toplevel
    text = json.dumps({"attempt": self.env.attempt, "stop_at_step": stop_at,
                       "reason": self.reason})
    try:
      atomic_write_text(self._path, text, overwrite=True)
    except (OSError, ValueError) as err:  # ValueError: its directory is gone
      # This worker still stops at `stop_at` (it checkpoints first); its
      # peers, who read the file, stop at their next checkpoint instead.
      import logging  # pylint: disable=import-outside-toplevel
      logging.getLogger("tfopt").warning(
          "worker %s could not tell its peers to stop at step %d (%s: %s); "
          "they stop at their next checkpoint", self.env.worker, stop_at,
          self._path, err)


class _Progress(keras.callbacks.Callback):
  """Global step, heartbeats, checkpoints, preemption and the step log.

  `async_safe = False`: the step counter, the heartbeat phase and the
  per-step loss must be read when the batch ends."""

  async_safe = False

  def __init__(self, env, beat, checkpointer, preemption, every, steps_log,
               kill_task=None):
    super().__init__()
    self.kill_task = kill_task
    self.env = env
    self.beat = beat
    self.checkpointer = checkpointer
    self.preemption = preemption
    self.every = every
    self.steps_log = steps_log
    self.global_step = 0
    self.epoch = 0
    self.offset = 0           # batches skipped in this epoch (resume)
    self.in_epoch = 0         # batches of this epoch done, skipped included
    self.preempted = False
    self._mean = None
    self._count = 0
    self._pending: list = []
    self._summaries = None  # the fit's TensorBoard (chief), if it has one
    self._announced = False  # the resume written (first segment only)

  def on_train_begin(self, logs=None):
    if self._announced or not self.env.is_chief:
      return
    self._announced = True
    self._summaries = summaries.for_fit(self.model, self)
    if self._summaries is None:
      return
    step = self.global_step
    self._summaries.write_scalar("restart/resumed_from_step", step, step)
    self._summaries.write_scalar("restart/attempt", self.env.attempt, step)
    self._summaries.write_text(
        "restart", f"attempt {self.env.attempt}: "
        + (f"resumed from step {step} ({self.offset} batches into its "
           f"epoch)" if step else "started at step 0"),
        step)
    self._summaries.flush()

  def flush_log(self) -> None:
    if self.steps_log is not None and self._pending:
      self.steps_log.write("".join(
          json.dumps({"attempt": self.env.attempt, "step": step,
                      "loss": loss, "mean": mean}) + "\n"
          for step, loss, mean in self._pending))
      self.steps_log.flush()
    self._pending = []

  def on_train_end(self, logs=None):
    self.flush_log()

  def on_epoch_begin(self, epoch, logs=None):
    self.epoch = epoch
    self._mean, self._count = None, 0

  def on_epoch_end(self, epoch, logs=None):
    # What follows until the next step -- the callbacks' epoch and train
    # ends, a new `model.fit` and its dataset -- is epoch-end work, judged
    # by its own budget on the launcher's side, not by the step time.
    if self.beat:
      self.beat.set_phase("epoch_end")

  def on_train_batch_end(self, batch, logs=None):
    self.global_step += 1
    if self.beat:
      self.beat.end_step(self.global_step)
    if self.steps_log is not None and logs and "loss" in logs:
      # Keras logs the running mean of the epoch; recover the batch loss.
      mean = float(logs["loss"])
      self._count += 1
      loss = mean if self._mean is None else (
          mean * self._count - self._mean * (self._count - 1))
      self._mean = mean
      # Buffered (a write per step costs more than the 2 % budget of a fast
      # step); flushed before every checkpoint, so every step up to a
      # resume point is on disk.
      self._pending.append((self.global_step, loss, mean))
    in_epoch = self.in_epoch = self.offset + batch + 1
    stop = self.preemption.check(self.global_step)
    if stop or self.global_step % self.every == 0:
      self.flush_log()
    if self.checkpointer and (stop or self.global_step % self.every == 0):
      if self.beat:
        self.beat.set_phase("checkpoint")
      self.checkpointer.save(self.global_step, self.epoch, in_epoch,
                             blocking=stop)
      if self.beat:
        self.beat.set_phase("host")
    if stop:
      self.preempted = True
      self.model.stop_training = True
      if self._summaries is not None:
        self._summaries.write_text(
            "restart/preempted", f"attempt {self.env.attempt}: preempted, "
            f"stopped at step {self.global_step} (checkpoint saved)",
            self.global_step)
        self._summaries.flush()
    # Last: a fault the launcher asked for at this step (--inject) lands
    # here, after the step and its checkpoint, as a crash would.
    raise_fault_if_asked(self.global_step, kill_task=self.kill_task)


class _StepBegin(keras.callbacks.Callback):
  """Marks the heartbeat "in step". Placed after every other callback, so
  host work in their batch-begin hooks counts as host time (a worker stuck
  there is named as the one outside the collective)."""

  async_safe = False

  def __init__(self, beat):
    super().__init__()
    self.beat = beat

  def on_train_batch_begin(self, batch, logs=None):
    self.beat.begin_step()

  # Keras evaluates validation_data at the epoch's end: a phase of its own,
  # with its own budget on the launcher's side (not a hang).
  def on_test_begin(self, logs=None):
    self.beat.set_phase("validation")

  def on_test_end(self, logs=None):
    self.beat.set_phase("epoch_end")  # validation runs at the epoch's end


class _TaskWatch:
  """Watches a worker's server tasks (`fit(servers=...)`). A task that is
  gone ends the worker with TASK_LOST_EXIT, named on stderr (the
  launcher's log tail), the other tasks closed (their processes and
  memory cgroups). Usually the step fails first (its RPC to the task is
  reset): `fit` asks `lost` and exits once its step log is flushed. A step
  that waits on the dead task instead is ended by the watching thread,
  `grace_s` after it saw the task go."""

  def __init__(self, servers, interval_s: float = 0.2, grace_s: float = 5.0):
    self.servers = servers
    self.interval_s = interval_s
    self.grace_s = grace_s
    self._stop = threading.Event()
    self._thread = None

  def start(self) -> None:
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name="tfopt-task-watch")
    self._thread.start()

  def stop(self) -> None:
    self._stop.set()

  def kill_last(self) -> str:
    """Kills the last server task (the `kill_task` fault); returns which."""
    task = len(self.servers.pids) - 1
    pid = self.servers.pids[task]
    os.kill(pid, signal.SIGKILL)
    return f"server task {task} (pid {pid})"

  def lost(self, wait_s: float = 0.0) -> str | None:
    """Which task is gone and how, waiting up to `wait_s` for one to be
    (a reset connection can arrive before the process is reaped)."""
    deadline = time.monotonic() + wait_s
    while True:
      gone = self.servers.exited()
      if gone:
        name, code = sorted(gone.items())[0]
        return (f"server task {name} " +
                (f"killed by signal {-code}" if code < 0 else
                 f"exited with {code}"))
      if time.monotonic() >= deadline:
        return None
      time.sleep(self.interval_s)

  def exit_lost(self, what: str) -> None:
    print(f"tfopt: {what} during training; its variables are gone: the "
          f"worker exits with {TASK_LOST_EXIT} to be restarted from the "
          f"last checkpoint", file=sys.stderr, flush=True)
    try:
      self.servers.close()
    finally:
      os._exit(TASK_LOST_EXIT)  # pylint: disable=protected-access

  def _run(self) -> None:
    while not self._stop.wait(self.interval_s):
      what = self.lost()
      if what is not None:
        if not self._stop.wait(self.grace_s):
          self.exit_lost(what)
        return


@dataclasses.dataclass
class FitResult:
  """What `fit` did: steps trained now, where it started, whether it was
  preempted (the script should then `sys.exit(PREEMPTED_EXIT)`; `fit` does
  so itself with `exit_on_preemption=True`), and the history per epoch."""
  global_step: int
  resumed_from: int
  preempted: bool
  history: dict


def fit(model, dataset_fn, *, epochs: int, steps_per_epoch: int,
        checkpoint_dir: str | None = None, checkpoint_every: int = 50,
        callbacks=(), env: WorkerEnv | None = None, verbose: int = 0,
        exit_on_preemption: bool = True, validation_data=None,
        validation_steps: int | None = None, servers=None) -> FitResult:
  """Resumable `model.fit` for launched jobs (see the module doc).

  Args:
    model: a compiled, built keras.Model (under the strategy's scope).
    dataset_fn: epoch -> tf.data.Dataset of global batches, the same for
      the same epoch on every call and every worker. Order the epoch with
      NumPy (a permutation seeded by the epoch): tf.data's `shuffle(seed=)`
      gives another order under a distribution strategy than in one
      process.
    epochs, steps_per_epoch: the run's length (`steps_per_epoch` batches
      are taken from each epoch's dataset).
    checkpoint_dir: two-stage checkpoints (default `<run_dir>/checkpoints`
      when launched; None standalone means no checkpoints).
    checkpoint_every: steps between checkpoints.
    validation_data, validation_steps: evaluated at each epoch's end, as
      Keras' fit does; the heartbeat says "validation" meanwhile, which the
      launcher gives its own budget (`phase_budget_s`).
    servers: the `tfopt.runtime.LoopbackServers` the model's placed step
      runs on: watched while training (a task that dies ends this worker
      with `TASK_LOST_EXIT`), and the target of `kill_task` faults.
  """
  _check_fit_arguments(model, dataset_fn, epochs, steps_per_epoch,
                       checkpoint_every, validation_steps)
  env = env or WorkerEnv.from_environ()
  if checkpoint_dir is None and env.run_dir:
    checkpoint_dir = os.path.join(env.run_dir, "checkpoints")
  checkpointer = (TwoStageCheckpointer(checkpoint_dir, model,
                                       is_chief=env.is_chief)
                  if checkpoint_dir else None)
  beat, steps_log = _run_files(env)
  start_epoch, skip, start_step = _restore(model, checkpointer, beat,
                                           steps_per_epoch)
  preemption = _Preemption(env, resumed_from=start_step)
  watch = _TaskWatch(servers) if servers is not None else None
  progress = _Progress(env, beat, checkpointer, preemption, checkpoint_every,
                       steps_log, kill_task=watch.kill_last if watch else None)
  progress.global_step = start_step
  if beat:
    beat.resumed_from = beat.step = start_step
    beat.set_phase("host")
    beat.start()
  preemption.install()
  if watch is not None:
    watch.start()
  # Callbacks with an end-of-run report (StragglerMonitor) write it once,
  # after the last segment, not at every segment's on_train_end.
  finishers = [cb for cb in callbacks if hasattr(cb, "finish_run")]
  for cb in finishers:
    cb.final_segment = False
  lost = None
  try:
    history = _train_epochs(
        model, dataset_fn, progress,
        [progress, *callbacks, *([_StepBegin(beat)] if beat else [])],
        range(start_epoch, epochs), skip, steps_per_epoch, verbose,
        {"validation_data": validation_data,
         "validation_steps": validation_steps})
    _final_checkpoint(checkpointer, progress, start_step, checkpoint_every)
  except Exception:  # pylint: disable=broad-except
    # A step that failed because a server task died: restart, not crash.
    lost = watch.lost(wait_s=2.0) if watch is not None else None
    if lost is None:
      raise
  finally:
    if watch is not None:
      watch.stop()
    for cb in finishers:
      cb.final_segment = True  # also after an exception: plain fit again
    progress.flush_log()  # an exception still logs its steps; kill -9 not
    preemption.uninstall()
    if beat:
      beat.set_phase("done")
      beat.stop()
    if steps_log:
      steps_log.close()
  if lost is not None:
    watch.exit_lost(lost)  # the steps logged and flushed first
  # After the beat says "done": the watcher counts this as finishing.
  for cb in finishers:
    cb.finish_run()
  result = FitResult(progress.global_step, start_step, progress.preempted,
                     history)
  if result.preempted and exit_on_preemption:
    sys.stdout.flush()
    sys.exit(PREEMPTED_EXIT)
  return result


def _check_fit_arguments(model, dataset_fn, epochs, steps_per_epoch,
                         checkpoint_every, validation_steps) -> None:
  check_positive_int("epochs", epochs)
  check_positive_int("steps_per_epoch", steps_per_epoch)
  check_positive_int("checkpoint_every", checkpoint_every)
  if validation_steps is not None:
    check_positive_int("validation_steps", validation_steps)
  if not callable(dataset_fn):
    raise invalid_argument("dataset_fn", "a function epoch -> "
                           "tf.data.Dataset", type(dataset_fn).__name__)
  if getattr(model, "steps_per_execution", 1) != 1:
    raise invalid_argument("model", "compiled with steps_per_execution=1 "
                           "(heartbeats, checkpoints and preemption count "
                           "single steps)", model.steps_per_execution)


def _run_files(env):
  """The heartbeat writer and the step log of a launched worker (None,
  None standalone)."""
  if not env.run_dir:
    return None, None
  beat = hb.HeartbeatWriter(os.path.join(env.run_dir, "heartbeats"),
                            env.worker, env.heartbeat_s, env.attempt)
  os.makedirs(os.path.join(env.run_dir, "steps"), exist_ok=True)
  steps_log = open(os.path.join(env.run_dir, "steps",  # pylint: disable=consider-using-with
                                f"worker-{env.worker}.jsonl"), "a",
                   encoding="utf-8")
  return beat, steps_log


def _restore(model, checkpointer, beat, steps_per_epoch):
  """(epoch, batches to skip in it, global step) to start from: the newest
  whole checkpoint's, or the beginning."""
  if not checkpointer:
    return 0, 0, 0
  if beat:
    beat.set_phase("restore")
  scope = getattr(model, "distribute_strategy", None)
  with scope.scope() if scope is not None else contextlib.nullcontext():
    restored = checkpointer.restore()
  if restored is None:
    return 0, 0, 0
  epoch, skip = restored.epoch, restored.step_in_epoch
  if skip >= steps_per_epoch:
    epoch, skip = epoch + 1, 0
  return epoch, skip, restored.step


def _train_epochs(model, dataset_fn, progress, callbacks, epochs, skip,
                  steps_per_epoch, verbose, validation) -> dict:
  """One `model.fit` per epoch (the first resumed `skip` batches in), until
  the last or a preemption; the merged history."""
  history: dict = {}
  for epoch in epochs:
    offset = skip if epoch == epochs.start else 0
    steps = steps_per_epoch - offset
    dataset = dataset_fn(epoch)
    if offset:
      dataset = dataset.skip(offset)
    progress.offset = offset
    h = model.fit(dataset.take(steps), initial_epoch=epoch,
                  epochs=epoch + 1, steps_per_epoch=steps,
                  callbacks=callbacks, verbose=verbose, **validation)
    for key, values in h.history.items():
      history.setdefault(key, []).extend(values)
    if progress.preempted:
      break
  return history


def _final_checkpoint(checkpointer, progress, start_step, every) -> None:
  """The last steps saved (unless a checkpoint already holds them or the
  run was preempted, which saved at its stop step), and every save done."""
  if not checkpointer:
    return
  if not progress.preempted and progress.global_step > start_step and \
      progress.global_step % every:
    checkpointer.save(progress.global_step, progress.epoch,
                      progress.in_epoch, blocking=True)
  checkpointer.wait()
