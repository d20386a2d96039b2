"""The training steps one batch hook of Keras' `fit` stands for.

With `compile(..., steps_per_execution=N)` Keras runs up to N steps per
call of the train function and calls `on_train_batch_begin` /
`on_train_batch_end` once per call, with the call's first and last step
within the epoch: 0 and N - 1, N and 2N - 1, and so on; the end index is
begin + N - 1 even where the call ran fewer steps. `call_steps` reads a
call's steps from the end index alone (a callback declared `async_safe`
may see the ends late, after the next call began), clipped to the epoch's
length `params["steps"]`. That is exact for data of known length, where
the epoch's short last call is the data running out. It is not for the
epoch's last call in two cases: data of unknown length (a short last call
counts N) and `steps_per_epoch=S` with S not a multiple of N over data
that goes on (Keras then runs N steps in the last call; counted S mod N).
Callbacks that need the exact count correct it from a counter the step
advances (`StepPhaseRecorder`: its timestamp ring's count; `MoEPruner`,
`MFUMonitor`: the optimizer's iterations, `tfopt.summaries.training_step`,
read at an epoch's end or begin: within an epoch every call but the last
runs N steps, so a call's begin index is exact).
"""

from __future__ import annotations


def steps_per_execution(model) -> int:
  """The model's `steps_per_execution` (1 where it has none)."""
  return max(1, int(getattr(model, "steps_per_execution", 1) or 1))


def call_steps(callback, end: int) -> tuple[int, int]:
  """(first, last) step within the epoch of the call whose
  `on_train_batch_end` got `end`: the N steps up to `end`, the last
  clipped to the epoch's length where Keras knows it (`params["steps"]`).

  >>> class Fit:  # a callback's view: N = 4, an epoch of 10 steps
  ...   model = type("Model", (), {"steps_per_execution": 4})()
  ...   params = {"steps": 10}
  >>> call_steps(Fit(), 3), call_steps(Fit(), 11)
  ((0, 3), (8, 9))
  """
  first = max(0, end - steps_per_execution(callback.model) + 1)
  epoch_steps = (getattr(callback, "params", None) or {}).get("steps")
  if isinstance(epoch_steps, int) and epoch_steps > 0:
    end = min(end, epoch_steps - 1)
  return first, max(first, end)


def count(callback, end: int) -> int:
  """How many steps the call ending at `end` ran (>= 1; see `call_steps`)."""
  first, last = call_steps(callback, end)
  return last - first + 1

