"""The step in Keras' `fit` timed two ways, for benchmarks that set a
measured step beside a prediction:

- per step: every step's time from the previous step's end to its own (what
  fit spends between two steps counts), in fits of `long` steps with a
  step clock, the first WARMUP of each fit left out (the iterator's start,
  the first call);
- by difference: (time of a fit of `long` steps - time of a fit of `short`
  steps) / (long - short), both fits without callbacks, so that fit's
  fixed costs cancel out (the benchmarks' measure before the per-step one).

The clocked fit runs the callback synchronously (Keras converts the logs
at every step), the differenced ones do not; "outside" (in `summary`:
`outside_steps_ms`) is each clocked fit's wall time less the time inside
its steps' intervals, "in_hooks" (`in_hooks_ms`) each step from its batch
begin to its batch end, the step function's call.
"""

from __future__ import annotations

import statistics
import time

WARMUP = 2  # steps of each clocked fit not counted


def step_clock():
  """A Keras callback keeping each step's wall time in its last fit:
  `times` from one step's end to the next's (the first from its begin),
  `hook_times` from a step's begin to its end."""
  import keras  # pylint: disable=import-outside-toplevel

  class StepClock(keras.callbacks.Callback):

    def on_train_begin(self, logs=None):
      self.times, self.hook_times, self.last = [], [], None

    def on_train_batch_begin(self, batch, logs=None):
      self.began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
      now = time.perf_counter()
      self.hook_times.append(now - self.began)
      self.times.append(now - (self.began if self.last is None
                               else self.last))
      self.last = now

  return StepClock()


def timed_fits(model, x, y, *, batch: int, short: int, long: int,
               rounds: int) -> dict:
  """`rounds` rounds of a fit of `short` steps, one of `long` (both
  without callbacks) and one of `long` with the step clock, on the first
  samples of `x`, `y`. Returns lists in seconds: "steps" (every clocked
  step after WARMUP), "in_hooks" (the same steps, begin to end),
  "differences" (one per round), "outside" (one per clocked fit)."""
  if long - short < 1 or short < 1 or long <= WARMUP + 1:
    raise ValueError(f"Arguments `short`, `long` must satisfy 1 <= short < "
                     f"long, long > {WARMUP + 1}. Received: short={short}, "
                     f"long={long}")
  clock = step_clock()

  def fit_s(count, callbacks=()):
    began = time.perf_counter()
    model.fit(x[:batch * count], y[:batch * count], batch_size=batch,
              epochs=1, shuffle=False, verbose=0, callbacks=list(callbacks))
    return time.perf_counter() - began

  out = {"steps": [], "in_hooks": [], "differences": [], "outside": []}
  for _ in range(rounds):
    short_s, long_s = fit_s(short), fit_s(long)
    out["differences"].append((long_s - short_s) / (long - short))
    clocked_s = fit_s(long, [clock])
    out["steps"] += clock.times[WARMUP:]
    out["in_hooks"] += clock.hook_times[WARMUP:]
    out["outside"].append(clocked_s - sum(clock.times))
  return out


def summary(timed: dict) -> dict:
  """What a benchmark row records from `timed_fits` (milliseconds): the
  per-step median, quartiles, mean and maximum, the in-hooks median, each
  round's difference and the median time outside the steps."""
  steps = [s * 1e3 for s in timed["steps"]]
  return {"measured_ms": statistics.median(steps),
          "step_quartiles_ms": statistics.quantiles(steps, n=4),
          "step_mean_ms": statistics.fmean(steps),
          "step_max_ms": max(steps),
          "in_hooks_ms": statistics.median(timed["in_hooks"]) * 1e3,
          "per_step_ms": [s * 1e3 for s in timed["differences"]],
          "outside_steps_ms": statistics.median(timed["outside"]) * 1e3,
          "warmup": WARMUP}
