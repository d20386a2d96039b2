"""A Keras callback that puts CWD's decay fraction in the logs (TensorBoard)."""

from __future__ import annotations

import keras

from tfopt import _fit_steps as fit_steps
from tfopt import summaries
from tfopt._errors import invalid_argument


class DecayFractionLogger(keras.callbacks.Callback):
  """Adds `cwd_decay_fraction` to the epoch logs (and, optionally, batch logs).

  `every_n_batches` counts training steps: with `steps_per_execution=N`
  the value goes into the logs of the calls during which a multiple of it
  completes (its fraction at the call's last step).

  The fraction of decayable coordinates that cautious weight decay decayed at
  the last step: 1.0 is plain decoupled decay, lower means CWD spared
  coordinates whose update pointed away from zero. Put it before
  `keras.callbacks.TensorBoard` in the callback list so TensorBoard writes the
  value. The optimizer needs `track_decay_fraction=True`.

  Reading the value is one scalar device-to-host copy; with
  `every_n_batches` it also runs per batch, which is cheap, hence
  `async_safe`.

  With a `keras.callbacks.TensorBoard` in the same fit
  (`tfopt.summaries`), wherever it stands in the list, the values also go
  to `tfopt/cwd/decay_fraction/step` (at the training step) and
  `tfopt/cwd/decay_fraction/epoch`.
  """

  async_safe = True

  def __init__(self, every_n_batches: int | None = None):
    super().__init__()
    if every_n_batches is not None and (
        isinstance(every_n_batches, bool) or
        not isinstance(every_n_batches, int) or every_n_batches < 1):
      raise invalid_argument("every_n_batches", "a positive integer or None",
                             every_n_batches)
    self.every_n_batches = every_n_batches
    self._summaries = None  # the fit's TensorBoard, if it has one
    self._epoch_first = 0  # the training step before the epoch's first

  def on_train_begin(self, logs=None):
    self._summaries = summaries.for_fit(self.model, self)

  def on_epoch_begin(self, epoch, logs=None):
    # Batch ends may run on Keras' thread pool, late and in any order: a
    # batch's step is the epoch's first (read here, no step in flight)
    # plus its index, not a counter.
    if self._summaries is not None:
      self._epoch_first = summaries.training_step(self.model)

  def on_train_end(self, logs=None):
    if self._summaries is not None:
      self._summaries.flush()

  def _fraction(self) -> float:
    optimizer = self.model.optimizer
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # loss scaling
    if not hasattr(inner, "decay_fraction"):
      raise ValueError(
          "DecayFractionLogger needs a tfopt Cautious optimizer created with "
          f"track_decay_fraction=True. Received: optimizer={inner!r}")
    return float(keras.ops.convert_to_numpy(inner.decay_fraction()))

  def on_train_batch_end(self, batch, logs=None):
    if not self.every_n_batches or logs is None:
      return
    # With steps_per_execution=N one call ends N steps: log where one of
    # them completes a multiple of every_n_batches.
    first, last = fit_steps.call_steps(self, batch)
    n = self.every_n_batches
    if (last + 1) // n > first // n:
      logs["cwd_decay_fraction"] = self._fraction()
      if self._summaries is not None:
        self._summaries.write_scalar("cwd/decay_fraction/step",
                                     logs["cwd_decay_fraction"],
                                     self._epoch_first + last + 1)

  def on_epoch_end(self, epoch, logs=None):
    if logs is not None:
      logs["cwd_decay_fraction"] = self._fraction()
      if self._summaries is not None:
        self._summaries.write_scalar("cwd/decay_fraction/epoch",
                                     logs["cwd_decay_fraction"], epoch)
