"""The training steps one batch hook of Keras' `fit` stands for.

With `compile(..., steps_per_execution=N)` Keras runs N steps per call of
the train function and calls `on_train_batch_begin` / `on_train_batch_end`
once per call, with the call's first and last step within the epoch: 0 and
N - 1, N and 2N - 1, and so on. The last call of an epoch whose length is
not a multiple of N runs fewer steps but is still passed begin + N - 1. A
callback that counts steps, times them or acts at a step reads its call's
steps here, from the end index alone (a callback declared `async_safe`
may see the ends late and after the next call began).
"""

from __future__ import annotations


def steps_per_execution(model) -> int:
  """The model's `steps_per_execution` (1 where it has none)."""
  return max(1, int(getattr(model, "steps_per_execution", 1) or 1))


def call_steps(callback, end: int) -> tuple[int, int]:
  """(first, last) step within the epoch of the call whose
  `on_train_batch_end` got `end`: the N steps up to `end`, the last
  clipped to the epoch's length where Keras knows it (`params["steps"]`).
  Where it does not (a dataset of unknown length), an epoch's short last
  call counts N."""
  first = max(0, end - steps_per_execution(callback.model) + 1)
  epoch_steps = (getattr(callback, "params", None) or {}).get("steps")
  if isinstance(epoch_steps, int) and epoch_steps > 0:
    end = min(end, epoch_steps - 1)
  return first, max(first, end)


def count(callback, end: int) -> int:
  """How many steps the call ending at `end` ran (>= 1)."""
  first, last = call_steps(callback, end)
  return last - first + 1
