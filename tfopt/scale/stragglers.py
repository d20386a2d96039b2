"""Straggler detection from step-phase timings (MegaScale).

Per worker and step the time splits into the **host gap** (from the end of
the previous step to the start of this one: input pipeline, callbacks,
Python) and the **in-step** time (the compiled step, collectives
included). In synchronous data parallelism every worker's in-step time
stretches to the slowest worker's, because the all-reduce waits for it: so
per-worker total step time blames everyone equally and the in-step time
blames the *healthy* workers (they wait longest inside the collective).
The straggler is the worker whose **host gap** (or, for a slow device, the
compute before the collective) is long: it arrives late.

A worker whose *compute* is slow (a slower core, a throttled machine)
arrives late at the collective too, but inside the step, where the host
clock cannot see it: every worker's in-step time is the slowest's. So, as
MegaScale times compute and communication per rank, `time_step_phases`
puts `tf.timestamp()` ops into the compiled step itself -- at its start,
once the gradients exist (before the optimizer's all-reduce) and at its
end -- into a ring on the device that the recorder reads back once per
`StepTimer.window` steps, giving per step **compute** (forward and
backward) and **sync** (all-reduce wait, update, metrics). The slow worker
has the long compute and the short wait; the healthy ones wait for it.
`detect(compute, sync)` scores compute lateness the way it scores host
gaps.

`StepPhaseRecorder` (a Keras callback) records (step, host gap, in-step,
and with `time_compute` compute and sync) per batch, with wall-clock begin
times; `chrome_trace` merges several
workers' records into one Chrome trace JSON (chrome://tracing, Perfetto,
TensorBoard's trace viewer), one row per worker. `detect(host_gap, in_step)` takes [workers, steps] arrays and
scores each worker per step:
- relative score: the worker's host gap minus the median host gap of the
  *other* workers at that step (seconds late; leaving the worker out keeps
  the full delay visible with 2 workers, where the median of all would
  halve it);
- individual score: the worker's host gap over its own median (how much
  worse than usual);
and names a worker a straggler when its relative lateness exceeds
`threshold_s` and `threshold_ratio` x the median step time in at least
`min_fraction` of the steps. `heatmap_png` draws the lateness matrix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time

import keras
import numpy as np

from tfopt import _fit_steps as fit_steps
from tfopt import summaries
from tfopt._errors import invalid_argument
from tfopt._io import atomic_write_text


@dataclasses.dataclass
class StragglerReport:
  """`lateness[w, s]` seconds late; `stragglers` worker indices, worst
  first; `fraction[w]` of steps where w was flagged."""
  lateness: np.ndarray
  individual: np.ndarray
  fraction: np.ndarray
  stragglers: list
  median_step_s: float


def detect(host_gap, in_step, threshold_s: float = 0.002,
           threshold_ratio: float = 0.1, min_fraction: float = 0.5
           ) -> StragglerReport:
  """Scores workers from [workers, steps] host-gap and in-step seconds."""
  host_gap = np.asarray(host_gap, np.float64)
  in_step = np.asarray(in_step, np.float64)
  if host_gap.ndim != 2 or host_gap.shape != in_step.shape or \
      host_gap.shape[0] < 2 or host_gap.shape[1] < 1:
    raise invalid_argument("host_gap", "a [workers >= 2, steps >= 1] array "
                           "shaped like in_step", host_gap.shape)
  if not 0 < min_fraction <= 1:
    raise invalid_argument("min_fraction", "a fraction in (0, 1]",
                           min_fraction)
  others = np.stack([np.median(np.delete(host_gap, w, axis=0), axis=0)
                     for w in range(host_gap.shape[0])])
  lateness = host_gap - others
  own = np.median(host_gap, axis=1, keepdims=True)
  individual = host_gap / np.maximum(own, 1e-9)
  median_step = float(np.median(host_gap + in_step))
  cut = max(threshold_s, threshold_ratio * median_step)
  flagged = lateness > cut
  fraction = flagged.mean(axis=1)
  order = np.argsort(-fraction, kind="stable")
  stragglers = [int(w) for w in order if fraction[w] >= min_fraction]
  return StragglerReport(lateness, individual, fraction, stragglers,
                         median_step)


@dataclasses.dataclass
class StepTimer:
  """Where the step's timestamps land: `rows[k % window]` = [start,
  gradients ready, end] (seconds) of this worker's k-th timed step, `count`
  the steps timed so far. A ring written on the device, read by the host
  once per `window` steps at most (a read per step costs a sync: 7 % of a
  4 ms step here)."""
  rows: object
  count: object
  window: int

  def read_since(self, before: int) -> tuple[list, int]:
    """(the rows of the steps timed since `count` was `before`, oldest
    first, None for those the ring no longer holds; `count` now)."""
    rows, count = self.rows.numpy(), int(self.count.numpy())
    return [tuple(float(t) for t in rows[k % self.window])
            if count - k <= self.window and k >= 0 else None
            for k in range(before, count)], count


def time_step_phases(model, window: int = 64):
  """Puts timestamps into `model`'s training step (idempotent) and returns
  the `StepTimer` they land in: [step start, gradients ready, step end] in
  seconds (`tf.timestamp()`), this worker's own, written by every step.

  The step start is tied to the batch (the forward pass cannot begin
  before it), "gradients ready" to every gradient and ahead of the
  optimizer's `apply_gradients` (where a distribution strategy all-reduces
  them), the end to the step's outputs. Call before the train function is
  made (Keras traces `model.train_step` then).

  Returns None, timing nothing, for a model compiled with
  `jit_compile=True`: XLA has no kernel for `Timestamp`. Inside
  `untimed(model)` the step traces without the timestamps (for XLA-based
  FLOP counts of the same step)."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  timer = getattr(model, "_tfopt_step_timer", None)
  if timer is not None:
    return timer
  if getattr(model, "jit_compile", False) is True:
    return None
  # Each worker writes and reads its own timestamps: under a strategy
  # sync-on-read variables read as their first local replica's value (no
  # all-reduce, no averaging across workers); without one, plain ones.
  local = dict(trainable=False,
               synchronization=tf.VariableSynchronization.ON_READ,
               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  with tf.init_scope():
    timer = StepTimer(
        tf.Variable(tf.zeros([window, 3], tf.float64),
                    name="tfopt_step_times", **local),
        tf.Variable(tf.constant(0, tf.int64), name="tfopt_steps_timed",
                    **local), window)
  ready: list = []
  applied: list = []
  optimizer = model.optimizer
  apply_gradients = optimizer.apply_gradients
  train_step = model.train_step

  def timed_apply_gradients(grads_and_vars, *args, **kwargs):
    if getattr(model, "_tfopt_untimed", False):
      return apply_gradients(grads_and_vars, *args, **kwargs)
    pairs = list(grads_and_vars)
    grads = [g for g, _ in pairs if g is not None]
    with tf.control_dependencies(grads):
      stamp = tf.timestamp()
    ready.append(stamp)
    with tf.control_dependencies([stamp]):
      pairs = [(None if g is None else tf.identity(g), v) for g, v in pairs]
    out = apply_gradients(pairs, *args, **kwargs)
    # Reads of the updated variables (automatic control dependencies order
    # them after the optimizer's writes, which need the all-reduced
    # gradients): the step's end waits for the all-reduce.
    applied.extend(tf.convert_to_tensor(getattr(v, "value", v))
                   for _, v in pairs)
    return out

  def timed_train_step(data):
    if getattr(model, "_tfopt_untimed", False):
      return train_step(data)
    ready.clear()
    applied.clear()
    start = tf.timestamp()
    with tf.control_dependencies([start]):
      data = tf.nest.map_structure(
          lambda t: tf.identity(t) if tf.is_tensor(t) else t, data)
    logs = train_step(data)
    with tf.control_dependencies(tf.nest.flatten(logs) + applied):
      end = tf.timestamp()
    middle = ready[-1] if ready else end
    slot = tf.math.floormod(timer.count, window)
    timer.rows.assign(tf.tensor_scatter_nd_update(
        timer.rows, [[slot]], [tf.stack([start, middle, end])]))
    timer.count.assign_add(1)
    return logs

  optimizer.apply_gradients = timed_apply_gradients
  model.train_step = timed_train_step
  model._tfopt_step_timer = timer  # pylint: disable=protected-access
  return timer


@contextlib.contextmanager
def untimed(model):
  """Within it, `model`'s step traces without `time_step_phases`' ops."""
  before = getattr(model, "_tfopt_untimed", False)
  model._tfopt_untimed = True  # pylint: disable=protected-access
  try:
    yield model
  finally:
    model._tfopt_untimed = before  # pylint: disable=protected-access


class StepPhaseRecorder(keras.callbacks.Callback):
  """Records host gap and in-step time of every training batch, and with
  `time_compute` the step's compute and sync time read from inside it.

  `host_gap[i]` is the time from the previous batch's end (or train begin)
  to batch i's begin; `in_step[i]` from batch i's begin to its end;
  `compute[i]` / `sync[i]` from the step's own timestamps
  (`time_step_phases`). With `steps_per_execution=N` Keras calls the
  batch hooks once per N steps: entry i is then a call, its compute and
  sync the sums over the call's steps. `async_safe = False` because the
  clock must be read when the batch begins and ends, not when a thread
  pool gets to the callback.
  """

  async_safe = False

  def __init__(self, time_compute: bool = False):
    super().__init__()
    self.time_compute = bool(time_compute)
    self.host_gap: list = []
    self.in_step: list = []
    self.compute: list = []
    self.sync: list = []
    self.begin_wall: list = []  # time.time() at each batch begin
    self._begin = None
    self._last_end = None
    self._timer = None
    self._unread: list = []  # per call not read back yet, its steps
    self._timed = 0  # the ring's count at the last read

  @property
  def _unread_steps(self) -> int:
    return sum(self._unread)

  def set_model(self, model):
    super().set_model(model)
    if self.time_compute and self._timer is None:
      per_call = fit_steps.steps_per_execution(model)
      self._timer = time_step_phases(model, window=max(64, 2 * per_call))
      if self._timer is None:
        logging.getLogger("tfopt").warning(
            "%s: no compute timing inside an XLA-compiled step (XLA has no "
            "Timestamp kernel); host-side phases only", type(self).__name__)
        self.time_compute = False
      # A train function traced before the timestamps existed has none.
      elif getattr(model, "train_function", None) is not None:
        model.make_train_function(force=True)

  def on_train_begin(self, logs=None):
    per_call = fit_steps.steps_per_execution(self.model)
    if self._timer is not None and self._timer.window < per_call:
      # A ring made before, for fewer steps per call (or a recompile).
      logging.getLogger("tfopt").warning(
          "%s: the step's timestamp ring (%d steps) is smaller than "
          "steps_per_execution=%d; host-side phases only",
          type(self).__name__, self._timer.window, per_call)
      self._timer, self.time_compute = None, False
    if self._timer is not None:
      self._timed = int(self._timer.count.numpy())
    self._last_end = time.perf_counter()

  def on_epoch_begin(self, epoch, logs=None):
    self._last_end = time.perf_counter()

  def on_epoch_end(self, epoch, logs=None):
    # The epoch's last call can have run other than the hooks say
    # (tfopt._fit_steps): read before the next epoch's calls come, so
    # that the ring's count settles it.
    self.collect()

  def on_train_batch_begin(self, batch, logs=None):
    self._begin = time.perf_counter()
    self.begin_wall.append(time.time())
    self.host_gap.append(self._begin - self._last_end)

  def on_train_batch_end(self, batch, logs=None):
    self._last_end = time.perf_counter()
    self.in_step.append(self._last_end - self._begin)
    if self._timer is not None:
      self._unread.append(fit_steps.count(self, batch))
      # Read before the ring could overwrite a step not read yet.
      if self._unread_steps + fit_steps.steps_per_execution(self.model) > \
          self._timer.window:
        self.collect()

  def on_train_end(self, logs=None):
    self.collect()

  def collect(self) -> None:
    """Reads the steps timed since the last read into `compute` / `sync`
    (one device read; done before the ring fills, at each epoch end and
    at train end)."""
    if self._timer is None or not self._unread:
      return
    rows, self._timed = self._timer.read_since(self._timed)
    calls = list(self._unread)
    # The ring counted every step: what the hooks' count missed (or
    # counted more) is the last call's, the only one that can be short.
    calls[-1] = max(1, calls[-1] + len(rows) - sum(calls))
    for steps in calls:  # a call's steps: their sums
      own, rows = rows[:steps], rows[steps:]
      if any(row is None for row in own) or len(own) < steps:
        self.compute.append(float("nan"))  # overwritten before this read
        self.sync.append(float("nan"))
        continue
      self.compute.append(sum(ready - start for start, ready, _ in own))
      self.sync.append(sum(end - ready for _, ready, end in own))
    self._unread = []


class StragglerMonitor(StepPhaseRecorder):
  """Records this worker's step phases and exchanges them every
  `exchange_every` steps through `directory` (one JSON-lines file per
  worker: attempt, step, host gap, in-step, compute, sync, begin time;
  appended, so a shared filesystem is all the workers need). The chief
  (worker 0) then reads every worker's records of the same steps, runs
  `detect` on the last window -- host gaps, and (`time_compute`, the
  default) the compute time measured inside the step -- appends the
  verdict to `<directory>/reports.jsonl` (step, time, stragglers and
  compute_stragglers, lateness per worker) and, with `tensorboard_dir`,
  writes the scalars `stragglers/late_ms/worker_<w>` and
  `stragglers/flagged/worker_<w>` there; with a
  `keras.callbacks.TensorBoard` in the same fit, the same scalars go into
  its log_dir too, tagged `tfopt/stragglers/...` (`tfopt.summaries`).
  At the end of training the chief scores
  the whole run (`report`) and writes `heatmap.png` and `trace.json` (the
  merged Chrome trace) into `directory`.

  `async_safe = False` (inherited): the clock is read at batch begin/end.
  With `steps_per_execution=N` it works in calls of the train function,
  as the recorder does: `exchange_every` counts calls and a record's
  `step` is the call's index (all workers run the same calls).
  """

  def __init__(self, directory: str, worker: int, workers: int,
               exchange_every: int = 50, attempt: int = 0,
               tensorboard_dir: str | None = None, time_compute: bool = True,
               **detect_kwargs):
    super().__init__(time_compute=time_compute)
    if isinstance(exchange_every, bool) or not isinstance(
        exchange_every, int) or exchange_every < 2:
      raise invalid_argument("exchange_every", "an integer >= 2",
                             exchange_every)
    if not 0 <= worker < workers:
      raise invalid_argument("worker", f"in [0, workers={workers})", worker)
    self.directory = os.fspath(directory)
    os.makedirs(self.directory, exist_ok=True)
    self.worker, self.workers = int(worker), int(workers)
    self.exchange_every = exchange_every
    self.attempt = int(attempt)
    self.detect_kwargs = detect_kwargs
    self.reports: list = []      # the chief's verdict per exchange
    self.report = None           # the chief's verdict on the whole run
    self.compute_report = None   # ... from the compute times
    self._flushed = 0
    self._offsets = [0] * self.workers
    self._cache: list = [{} for _ in range(self.workers)]
    self._tensorboard_dir = tensorboard_dir
    self._fit_summaries = None  # the chief's fit's TensorBoard, if any
    # False while tfopt.scale.worker.fit runs segments: it calls finish_run.
    self.final_segment = True

  def _path(self, worker: int) -> str:
    return os.path.join(self.directory, f"worker-{worker}.jsonl")

  def on_train_begin(self, logs=None):
    super().on_train_begin(logs)
    if self.worker == 0:  # only the chief scores
      self._fit_summaries = summaries.for_fit(self.model, self)

  def on_train_batch_end(self, batch, logs=None):
    super().on_train_batch_end(batch, logs)
    self.maybe_exchange()

  def maybe_exchange(self) -> None:
    """Flushes and (chief) scores once `exchange_every` new steps exist."""
    if len(self.in_step) - self._flushed >= self.exchange_every:
      self._flush()
      if self.worker == 0:
        self._exchange()

  def on_train_end(self, logs=None):
    self._flush()
    if self.final_segment:
      self.finish_run()

  def finish_run(self) -> None:
    """The chief's end-of-run report: `report`, heatmap.png, trace.json.
    Called at the end of `fit`, or, under `tfopt.scale.worker.fit` (one
    `model.fit` per epoch segment, `final_segment` False), once after the
    last segment and after the heartbeat says "done": drawing takes
    seconds, which a watcher would otherwise take for a stuck step."""
    if self.worker == 0 and self.workers > 1:
      aligned = self._read_all()
      if aligned is not None:
        self.report = detect(aligned[0], aligned[1], **self.detect_kwargs)
        compute = self._compute_of(aligned[2])
        if compute is not None:
          self.compute_report = detect(*compute, **self.detect_kwargs)
        heatmap_png(os.path.join(self.directory, "heatmap.png"),
                    self.report, overwrite=True)
        common = aligned[2]
        chrome_trace(os.path.join(self.directory, "trace.json"),
                     {f"worker {w}": _Phases(
                         [r[s]["begin"] for s in common],
                         [r[s]["gap"] for s in common],
                         [r[s]["in_step"] for s in common])
                      for w, r in enumerate(self._cache)}, overwrite=True)

  def _flush(self) -> None:
    self.collect()
    timed = len(self.compute) == len(self.in_step)
    lines = [json.dumps({"attempt": self.attempt, "step": i,
                         "gap": self.host_gap[i], "in_step": self.in_step[i],
                         "begin": self.begin_wall[i],
                         **({"compute": self.compute[i], "sync": self.sync[i]}
                            if timed else {})})
             for i in range(self._flushed, len(self.in_step))]
    if lines:
      with open(self._path(self.worker), "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    self._flushed = len(self.in_step)

  def _refresh(self) -> None:
    """Parses what the workers appended since the last call (complete
    lines only: a worker may be writing), so an exchange costs the new
    steps, not the whole run."""
    for w in range(self.workers):
      try:
        with open(self._path(w), "rb") as f:
          f.seek(self._offsets[w])
          chunk = f.read()
      except OSError:
        continue  # that worker has not flushed yet
      end = chunk.rfind(b"\n") + 1
      for line in chunk[:end].splitlines():
        try:
          rec = json.loads(line)
        except ValueError:
          continue
        if rec.get("attempt") == self.attempt:
          self._cache[w][rec["step"]] = rec
      self._offsets[w] += end

  def _read_all(self, last: int | None = None):
    """[workers, steps] host gaps and in-step times of the steps every
    worker has flushed (this attempt; the `last` n of them), and
    their steps; None before every worker flushed once."""
    self._refresh()
    if not all(self._cache):
      return None
    top = min(max(c) for c in self._cache)
    first = 0 if last is None else max(0, top - last + 1)
    common = [s for s in range(first, top + 1)
              if all(s in c for c in self._cache)]
    if not common:
      return None
    per_worker = self._cache
    gap = np.array([[r[s]["gap"] for s in common] for r in per_worker])
    run = np.array([[r[s]["in_step"] for s in common] for r in per_worker])
    return gap, run, common

  def _compute_of(self, steps):
    """[workers, steps] compute and sync seconds of `steps`, where every
    worker timed them inside the step; else None."""
    if not all("compute" in r[s] for r in self._cache for s in steps):
      return None
    return (np.array([[r[s]["compute"] for s in steps] for r in self._cache]),
            np.array([[r[s]["sync"] for s in steps] for r in self._cache]))

  def _exchange(self) -> None:
    if self.workers < 2:
      return
    aligned = self._read_all(last=self.exchange_every)
    if aligned is None:
      return
    gap, run, common = aligned
    report = detect(gap, run, **self.detect_kwargs)
    step = common[-1]
    entry = {"step": step, "time": time.time(),
             "stragglers": report.stragglers,
             "late_ms": [float(x) for x in
                         1e3 * np.median(report.lateness, axis=1)],
             "flagged": [float(x) for x in report.fraction]}
    compute = self._compute_of(common)
    if compute is not None:
      slow = detect(*compute, **self.detect_kwargs)
      entry.update(
          compute_stragglers=slow.stragglers,
          compute_late_ms=[float(x) for x in
                           1e3 * np.median(slow.lateness, axis=1)],
          compute_ms=[float(x) for x in 1e3 * np.median(compute[0], axis=1)],
          sync_ms=[float(x) for x in 1e3 * np.median(compute[1], axis=1)])
    self.reports.append(entry)
    with open(os.path.join(self.directory, "reports.jsonl"), "a",
              encoding="utf-8") as f:
      f.write(json.dumps(entry) + "\n")
    self._scalars(entry)

  def _scalars(self, entry: dict) -> None:
    """The verdict's scalars into `tensorboard_dir` and the fit's
    TensorBoard (the core summary op: no tensorboard package needed)."""
    writers = ([summaries.for_directory(self._tensorboard_dir)]
               if self._tensorboard_dir else [])
    if self._fit_summaries is not None:
      writers.append(self._fit_summaries)
    for writer in writers:
      for w in range(self.workers):
        for name in ("late_ms", "flagged"):
          writer.write_scalar(f"stragglers/{name}/worker_{w}",
                              entry[name][w], entry["step"])
      writer.flush()


@dataclasses.dataclass
class _Phases:
  begin_wall: list
  host_gap: list
  in_step: list


def chrome_trace(path: str, workers: dict, overwrite: bool = False) -> dict:
  """Writes a Chrome trace of the workers' step phases.

  `workers` maps a worker name to a `StepPhaseRecorder` (or any object with
  `begin_wall`, `host_gap` and `in_step` lists). Each step becomes two
  complete events on the worker's row: "host gap" (ending at the step's
  begin) and "step" (from its begin, for its in-step time). Timestamps are
  wall-clock, so traces of several processes line up. Returns the trace.
  """
  if not isinstance(workers, dict) or not workers:
    raise invalid_argument("workers", "a non-empty {name: recorder} dict",
                           workers)
  events = []
  for pid, (name, rec) in enumerate(sorted(workers.items())):
    if not len(rec.begin_wall) == len(rec.host_gap) == len(rec.in_step):
      raise invalid_argument(f"workers[{name!r}]", "a recorder with as many "
                             "begin times as phases", len(rec.begin_wall))
    events.append({"name": "process_name", "ph": "M", "pid": pid,
                   "args": {"name": str(name)}})
    for step, (begin, gap, run) in enumerate(zip(
        rec.begin_wall, rec.host_gap, rec.in_step)):
      events.append({"name": "host gap", "ph": "X", "pid": pid, "tid": 0,
                     "ts": (begin - gap) * 1e6, "dur": gap * 1e6,
                     "args": {"step": step}})
      events.append({"name": "step", "ph": "X", "pid": pid, "tid": 0,
                     "ts": begin * 1e6, "dur": run * 1e6,
                     "args": {"step": step}})
  trace = {"traceEvents": events, "displayTimeUnit": "ms"}
  atomic_write_text(path, json.dumps(trace), overwrite=overwrite)
  return trace


def heatmap_png(path: str, report: StragglerReport,
                overwrite: bool = False) -> None:
  """Workers x steps, colour = milliseconds late; stragglers named."""
  from tfopt._plot import pyplot, save_png  # pylint: disable=import-outside-toplevel
  plt = pyplot()
  workers = len(report.lateness)
  fig, ax = plt.subplots(figsize=(8, 1.8 + 0.4 * workers))
  image = ax.imshow(report.lateness * 1e3, aspect="auto", cmap="magma",
                    interpolation="nearest")
  fig.colorbar(image, ax=ax, label="ms late vs\nthe others' median")
  ax.set_yticks(range(workers))
  ax.set_xlabel("step")
  ax.set_ylabel("worker")
  ax.set_title("stragglers: " + (", ".join(f"worker {w}" for w in
                                            report.stragglers) or "none"))
  fig.tight_layout()
  save_png(fig, path, overwrite=overwrite)
