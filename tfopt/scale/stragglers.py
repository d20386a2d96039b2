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

`StepPhaseRecorder` (a Keras callback) records (step, host gap, in-step)
per batch, with wall-clock begin times; `chrome_trace` merges several
workers' records into one Chrome trace JSON (chrome://tracing, Perfetto,
TensorBoard's trace viewer), one row per worker. `detect(host_gap, in_step)` takes [workers, steps] arrays and
scores each worker per step:
- relative score: the worker's host gap minus the median host gap of all
  workers at that step (seconds late);
- individual score: the worker's host gap over its own median (how much
  worse than usual);
and names a worker a straggler when its relative lateness exceeds
`threshold_s` and `threshold_ratio` x the median step time in at least
`min_fraction` of the steps. `heatmap_png` draws the lateness matrix.
"""

from __future__ import annotations

import dataclasses
import time

import keras
import numpy as np

from tfopt._errors import invalid_argument
from tfopt._io import atomic_write, atomic_write_text


@dataclasses.dataclass
class StragglerReport:
  """`lateness[w, s]` seconds late; `stragglers` worker indices, worst
  first; `fraction[w]` of steps where w was flagged."""
  lateness: np.ndarray
  individual: np.ndarray
  fraction: np.ndarray
  stragglers: list
  median_step_s: float


def detect(host_gap, in_step, threshold_s: float = 0.005,
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
  lateness = host_gap - np.median(host_gap, axis=0, keepdims=True)
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


class StepPhaseRecorder(keras.callbacks.Callback):
  """Records host gap and in-step time of every training batch.

  `host_gap[i]` is the time from the previous batch's end (or train begin)
  to batch i's begin; `in_step[i]` from batch i's begin to its end. Reads
  the clock only; `async_safe = False` because the clock must be read when
  the batch begins and ends, not when a thread pool gets to the callback.
  """

  async_safe = False

  def __init__(self):
    super().__init__()
    self.host_gap: list = []
    self.in_step: list = []
    self.begin_wall: list = []  # time.time() at each batch begin
    self._begin = None
    self._last_end = None

  def on_train_begin(self, logs=None):
    self._last_end = time.perf_counter()

  def on_epoch_begin(self, epoch, logs=None):
    self._last_end = time.perf_counter()

  def on_train_batch_begin(self, batch, logs=None):
    self._begin = time.perf_counter()
    self.begin_wall.append(time.time())
    self.host_gap.append(self._begin - self._last_end)

  def on_train_batch_end(self, batch, logs=None):
    self._last_end = time.perf_counter()
    self.in_step.append(self._last_end - self._begin)


def chrome_trace(path: str, workers: dict, overwrite: bool = False) -> dict:
  """Writes a Chrome trace of the workers' step phases.

  `workers` maps a worker name to a `StepPhaseRecorder` (or any object with
  `begin_wall`, `host_gap` and `in_step` lists). Each step becomes two
  complete events on the worker's row: "host gap" (ending at the step's
  begin) and "step" (from its begin, for its in-step time). Timestamps are
  wall-clock, so traces of several processes line up. Returns the trace.
  """
  import json  # pylint: disable=import-outside-toplevel
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
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(8, 1.2 + 0.4 * len(report.lateness)))
  image = ax.imshow(report.lateness * 1e3, aspect="auto", cmap="magma",
                    interpolation="nearest")
  fig.colorbar(image, ax=ax, label="ms later than the median worker")
  ax.set_xlabel("step")
  ax.set_ylabel("worker")
  ax.set_title("stragglers: " + (", ".join(f"worker {w}" for w in
                                            report.stragglers) or "none"))
  try:
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"),
                 overwrite=overwrite)
  finally:
    plt.close(fig)
