"""A Keras callback that puts CWD's decay fraction in the logs (TensorBoard)."""

from __future__ import annotations

import keras

from tfopt._errors import invalid_argument


class DecayFractionLogger(keras.callbacks.Callback):
  """Adds `cwd_decay_fraction` to the epoch logs (and, optionally, batch logs).

  The fraction of decayable coordinates that cautious weight decay decayed at
  the last step: 1.0 is plain decoupled decay, lower means CWD spared
  coordinates whose update pointed away from zero. Put it before
  `keras.callbacks.TensorBoard` in the callback list so TensorBoard writes the
  value. The optimizer needs `track_decay_fraction=True`.

  Reading the value is one scalar device-to-host copy; with
  `every_n_batches` it also runs per batch, which is cheap, hence
  `async_safe`.
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

  def _fraction(self) -> float:
    optimizer = self.model.optimizer
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # loss scaling
    if not hasattr(inner, "decay_fraction"):
      raise ValueError(
          "DecayFractionLogger needs a tfopt Cautious optimizer created with "
          f"track_decay_fraction=True. Received: optimizer={inner!r}")
    return float(keras.ops.convert_to_numpy(inner.decay_fraction()))

  def on_train_batch_end(self, batch, logs=None):
    if self.every_n_batches and logs is not None and (
        (batch + 1) % self.every_n_batches == 0):
      logs["cwd_decay_fraction"] = self._fraction()

  def on_epoch_end(self, epoch, logs=None):
    if logs is not None:
      logs["cwd_decay_fraction"] = self._fraction()
