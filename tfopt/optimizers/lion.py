"""CautiousLion: Keras' Lion with cautious weight decay."""

from __future__ import annotations

import keras
from keras import ops

from tfopt.optimizers.cautious import (CautiousDecayMixin, as_dtype,
                                       check_number)


@keras.saving.register_keras_serializable(package="tfopt")
class CautiousLion(CautiousDecayMixin, keras.optimizers.Lion):
  """Lion whose decoupled weight decay is cautious (CWD).

  u = sign(beta_1 * m + (1 - beta_1) * g); ties of the sign (u = 0) decay.
  With `cautious_weight_decay=False` this is `keras.optimizers.Lion` exactly.
  Lion's updates have unit size, so it wants a 3-10x smaller learning rate
  and a correspondingly larger weight decay than AdamW. As in Keras, the
  default `weight_decay=None` decays nothing: pass one.

  Args:
    learning_rate, weight_decay, beta_1, beta_2 and every Keras base
      argument: as `keras.optimizers.Lion`.
    cautious_weight_decay, decay_exclude_patterns, track_decay_fraction: see
      `CautiousAdamW`.
  """

  def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.99,
               weight_decay=None, cautious_weight_decay=True,
               decay_exclude_patterns=None, track_decay_fraction=False,
               name="cautious_lion", **kwargs):
    check_number("learning_rate", learning_rate, 0, float("inf"),
                 allow_dynamic=True)
    check_number("weight_decay", weight_decay, 0, float("inf"),
                 allow_none=True)
    check_number("beta_1", beta_1, 0, 1, low_open=True, high_open=False)
    check_number("beta_2", beta_2, 0, 1)
    super().__init__(learning_rate=learning_rate, beta_1=beta_1,
                     beta_2=beta_2, weight_decay=weight_decay, name=name,
                     **kwargs)
    self._init_cautious(cautious_weight_decay, decay_exclude_patterns,
                        track_decay_fraction)

  def _descent_step(self, gradient, variable, learning_rate, index):
    # Keras' Lion operations in Keras' order: the step reads the old
    # momentum, then the momentum moves.
    dtype = variable.dtype
    lr = as_dtype(learning_rate, dtype)
    gradient = ops.cast(gradient, dtype)
    beta_1 = as_dtype(self.beta_1, dtype)
    beta_2 = as_dtype(self.beta_2, dtype)
    m = self._momentums[index]
    interpolation = ops.add(ops.multiply(m, beta_1),
                            ops.multiply(gradient, (1.0 - beta_1)))
    step = ops.multiply(lr, ops.sign(interpolation))
    self.assign(m, ops.add(ops.multiply(m, beta_2),
                           ops.multiply(gradient, (1.0 - beta_2))))
    return step, interpolation

  def get_config(self):
    config = super().get_config()
    config.update(self._cautious_config())
    return config
