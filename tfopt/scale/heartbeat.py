"""Progress heartbeats: each worker tells the launcher where it is.

A worker's `HeartbeatWriter` keeps (step, phase, phase start, median step
time, resume step) in memory, updated by the training callbacks, and a
daemon thread writes it every `interval_s` to `<directory>/worker-<i>.json`
(atomically: write, rename). The file lives on the launcher's side (a
directory it created), not in TensorFlow's coordination service, which
dies with worker 0.

The thread keeps beating while the main thread is stuck, so the launcher
tells three situations apart (`assess`):
- **lost**: the file stopped changing (process stopped, e.g. SIGSTOP, or
  wedged entirely): no beat for `timeout_s`;
- **stuck**: beats arrive, but no worker's step advanced for `stuck_s`
  (k x the median step time, with a floor) -- unless the workers are in a
  phase of other work (a process's first step, which traces and compiles;
  validation, checkpoint, restore, the rest of an epoch's end until the
  next step), which is judged by that phase's own budget
  (`PHASE_BUDGET_S`) instead: a slow compile, validation pass or
  checkpoint is not a hang. In synchronous training one
  stuck worker stalls everyone, since the others wait inside the
  collective, so the report names the culprit: the worker longest in the
  host phase (outside the compiled step) or, when all wait inside a step,
  the one with the lowest step;
- **starting**: no step yet (startup is bounded separately);
- **finishing**: every running worker's training returned (phase "done":
  its beat stops on purpose) and the process is writing results or
  shutting down (bounded separately).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import threading
import time

from tfopt._errors import invalid_argument

FORMAT = "tfopt.scale.heartbeat/1"
# The phases of training itself; any other is a pause (HeartbeatWriter).
TRAINING_PHASES = ("host", "step", "first_step")

# Seconds a worker may spend in each phase of non-step work before it is
# taken for stuck (the step-time rule does not apply while it is there).
# "first_step" is a process's first training step: Keras traces it, XLA
# compiles it, `tfopt.compile` captures, rewrites and checks it (seen: 12 s
# for a 2-worker MultiWorkerMirrored step with the hook and XLA on 2 busy
# cores, where the step-time rule's floor took it for a hang at 3 s and
# restarted the job twice).
PHASE_BUDGET_S = {"validation": 600.0, "checkpoint": 300.0,
                  "restore": 300.0, "epoch_end": 300.0,
                  "first_step": 600.0}


def path_for(directory: str, worker: int) -> str:
  return os.path.join(directory, f"worker-{worker}.json")


class HeartbeatWriter:
  """Writes this worker's progress every `interval_s` from a thread.

  `step` is the global step last *completed*; `phase` is "host" (between
  steps: input, callbacks) or "step" (inside the compiled step,
  collectives included), or a pause the launcher judges by its own budget
  (checkpoint, validation, epoch_end, restore; startup and done). The time
  spent in pauses is summed (`paused_s`; `step_end_paused_s` as of the
  last step's end), so that the launcher's step times between two beats
  leave out a pause neither beat showed.
  """

  def __init__(self, directory: str, worker: int, interval_s: float = 0.5,
               attempt: int = 0):
    if not interval_s > 0:
      raise invalid_argument("interval_s", "a positive number of seconds",
                             interval_s)
    self.directory = os.fspath(directory)
    os.makedirs(self.directory, exist_ok=True)
    self.path = path_for(self.directory, worker)
    self.worker = int(worker)
    self.attempt = int(attempt)
    self.interval_s = float(interval_s)
    self.step = -1          # no step completed yet in this attempt
    self.resumed_from = 0
    self.phase = "startup"
    self.phase_since = time.time()
    self._step_times: list = []
    self._last_end = None
    self._paused_s = 0.0  # time in phases outside TRAINING_PHASES so far
    self._end_paused_s = 0.0  # ... as of the last step's end
    self._stop = threading.Event()
    self._thread = None
    self._seq = 0

  def start(self) -> "HeartbeatWriter":
    if self._thread is None:
      self.write()
      self._thread = threading.Thread(target=self._run, daemon=True,
                                      name="tfopt-heartbeat")
      self._thread.start()
    return self

  def stop(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=2 * self.interval_s + 1)
      self._thread = None
    self.write()

  def begin_step(self) -> None:
    """In a step; until this process has ended one, in its first step
    (`first_step`: tracing and compiling, judged by its own budget)."""
    self._enter("step" if self._last_end is not None else "first_step",
                time.time())

  def end_step(self, step: int) -> None:
    now = time.time()
    if self._last_end is not None:
      self._step_times.append(now - self._last_end)
      del self._step_times[:-200]
    self._last_end = now
    self.step = int(step)
    self._enter("host", now)
    self._end_paused_s = self._paused_s

  def set_phase(self, phase: str) -> None:
    self._enter(phase, time.time())

  def _enter(self, phase: str, now: float) -> None:
    """Leaves the current phase for `phase`; a pause left is summed."""
    if self.phase not in TRAINING_PHASES:
      self._paused_s += now - self.phase_since
    self.phase, self.phase_since = phase, now

  def paused_s(self, now: float | None = None) -> float:
    """Seconds spent in pauses so far (the current one included)."""
    now = time.time() if now is None else now
    return self._paused_s + (now - self.phase_since
                             if self.phase not in TRAINING_PHASES else 0.0)

  def median_step_s(self) -> float | None:
    return statistics.median(self._step_times) if self._step_times else None

  def state(self) -> dict:
    self._seq += 1
    now = time.time()
    return {"format": FORMAT, "worker": self.worker, "attempt": self.attempt,
            "pid": os.getpid(), "time": now, "seq": self._seq,
            "step": self.step, "resumed_from": self.resumed_from,
            "phase": self.phase, "phase_since": self.phase_since,
            "median_step_s": self.median_step_s(),
            # When `step` ended (None: none yet), and the pauses summed
            # then and now: step times between two beats, whenever they
            # were written, without the pauses (tfopt.scale.launch).
            "step_end_time": self._last_end,
            "step_end_paused_s": self._end_paused_s,
            "paused_s": self.paused_s(now)}

  def write(self) -> None:
    tmp = f"{self.path}.{os.getpid()}.tmp"
    try:
      with open(tmp, "w", encoding="utf-8") as f:
        json.dump(self.state(), f)
      os.replace(tmp, self.path)
    except OSError:
      pass  # the launcher reads a stale beat as "lost"; never kill training

  def _run(self) -> None:
    while not self._stop.wait(self.interval_s):
      self.write()


def read(directory: str, worker: int) -> dict | None:
  """The worker's last beat, or None if there is none (yet)."""
  try:
    with open(path_for(directory, worker), encoding="utf-8") as f:
      beat = json.load(f)
  except (OSError, ValueError):
    return None
  return beat if beat.get("format") == FORMAT else None


@dataclasses.dataclass
class Assessment:
  """What the beats say: `kind` is "ok", "starting", "finishing", "lost" or
  "stuck";
  `worker` the one to blame (None for ok/starting); `report` one line per
  worker (step, phase, seconds in phase, beat age)."""
  kind: str
  worker: int | None
  report: list
  stalled_s: float = 0.0


def phase_budgets(given=None) -> dict:
  """`PHASE_BUDGET_S` with the `given` {phase: seconds} entries replacing
  theirs; each budget checked."""
  budgets = {**PHASE_BUDGET_S, **dict(given or {})}
  for phase, budget in budgets.items():
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) \
        or not budget > 0:
      raise invalid_argument(f"phase_budget_s[{phase!r}]",
                             "a positive number of seconds", budget)
  return budgets


class ProgressWatch:
  """Launcher side: reads the beats of `workers` and assesses them.

  Args:
    timeout_s: a beat older than this (while the process runs) is lost.
    stuck_factor: stuck after this many median step times without progress.
    min_stuck_s: but never sooner than this (the first steps compile).
    phase_budget_s: {phase: seconds} for epoch-end work (default
      `PHASE_BUDGET_S`; given entries replace those phases' budgets).
  """

  def __init__(self, directory: str, workers: int, timeout_s: float = 5.0,
               stuck_factor: float = 10.0, min_stuck_s: float = 10.0,
               attempt: int = 0, phase_budget_s=None):
    self.directory = os.fspath(directory)
    self.workers = workers
    self.timeout_s = timeout_s
    self.stuck_factor = stuck_factor
    self.min_stuck_s = min_stuck_s
    self.attempt = attempt
    self.phase_budget_s = phase_budgets(phase_budget_s)
    self._best_step = -1
    self._progress_time = time.time()
    self.beats: dict = {}

  def stuck_after_s(self) -> float:
    medians = [b["median_step_s"] for b in self.beats.values()
               if b and b.get("median_step_s")]
    if not medians:
      return self.min_stuck_s
    return max(self.min_stuck_s, self.stuck_factor * max(medians))

  def poll(self, now: float | None = None, running=None) -> Assessment:
    """Reads the beats; `running` (default all) are the workers whose
    process is still running: only they can be lost or stuck."""
    now = time.time() if now is None else now
    running = set(range(self.workers)) if running is None else set(running)
    beats = {}
    for w in range(self.workers):
      beat = read(self.directory, w)
      beats[w] = beat if beat and beat.get("attempt") == self.attempt \
          else None
    self.beats = beats
    report = [_describe(w, b, now) for w, b in beats.items()]
    present = {w: b for w, b in beats.items() if b is not None}
    # "done": training returned and the beat stopped on purpose; the
    # process may still be writing its results or shutting TF down.
    done = {w for w, b in present.items() if b["phase"] == "done"}
    lost = [w for w, b in present.items() if w in running and w not in done
            and now - b["time"] > self.timeout_s]
    if lost:
      worst = max(lost, key=lambda w: (now - present[w]["time"], -w))
      return Assessment("lost", worst, report)
    steps = [b["step"] for b in present.values()]
    if len(present) < self.workers or max(steps, default=-1) < 0:
      return Assessment("starting", None, report)
    if running and running <= done:
      return Assessment("finishing", None, report)
    top = max(steps)
    if top > self._best_step:
      self._best_step, self._progress_time = top, now
    alive = {w: b for w, b in present.items()
             if w in running and w not in done}
    # Epoch-end work beats with its phase: judged by its own budget, and
    # the step clock starts again after it (else a checkpoint or a new
    # epoch's set-up just under the step rule's limit, followed by one
    # ordinary step, was taken for a hang).
    busy = {w: now - b["phase_since"] for w, b in alive.items()
            if b["phase"] in self.phase_budget_s}
    over = [w for w, spent in busy.items()
            if spent > self.phase_budget_s[alive[w]["phase"]]]
    stalled = now - self._progress_time
    if busy and not over:
      self._progress_time = now
      return Assessment("ok", None, report, stalled)
    if over or stalled > self.stuck_after_s():
      culprit = (max(over, key=lambda w: (busy[w], -w)) if over
                 else _culprit(alive or present, now))
      return Assessment("stuck", culprit, report, stalled)
    return Assessment("ok", None, report, stalled)

  def max_step(self) -> int:
    return max((b["step"] for b in self.beats.values() if b), default=-1)


def _describe(worker: int, beat: dict | None, now: float) -> str:
  if beat is None:
    return f"worker {worker}: no heartbeat"
  return (f"worker {worker}: step {beat['step']}, phase {beat['phase']} for "
          f"{now - beat['phase_since']:.1f}s, last beat {now - beat['time']:.1f}s "
          f"ago (pid {beat['pid']})")


def _culprit(beats: dict, now: float) -> int:
  """The stuck worker: longest outside the step (in the host phase), else the
  lowest step, else the longest in its phase."""
  outside = [w for w, b in beats.items() if b["phase"] != "step"]
  if outside and len(outside) < len(beats):
    return max(outside, key=lambda w: (now - beats[w]["phase_since"], -w))
  lowest = min(b["step"] for b in beats.values())
  candidates = [w for w, b in beats.items() if b["step"] == lowest]
  return max(candidates, key=lambda w: (now - beats[w]["phase_since"], -w))
