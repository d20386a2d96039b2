"""Per-step wall times in Keras' `fit`, for benchmarks that set a step's
measured time beside a prediction."""

from __future__ import annotations

import time


def step_clock():
  """A Keras callback keeping each step's wall time in its last fit:
  `times` from one step's end to the next's (the first from its begin:
  what fit spends between two steps counts), `hook_times` from a step's
  begin to its end."""
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
