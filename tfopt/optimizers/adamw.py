"""CautiousAdamW: Keras' AdamW with cautious weight decay."""

from __future__ import annotations

import keras
from keras import ops

from tfopt.optimizers.cautious import (CautiousDecayMixin, as_dtype,
                                       check_number)


def adam_step(optimizer, gradient, variable, learning_rate, m, v, v_hat,
              beta_1, beta_2, epsilon):
  """Updates Adam's moments in place; returns the step `lr * u` and `m`.

  `m` (the new first moment) has the sign of the step wherever the step
  does not underflow: alpha > 0 and sqrt(v) + eps > 0.

  The float operations, their order and the dtype casts are Keras' own
  (`keras.optimizers.Adam.update_step`), so a caller that subtracts the step
  reproduces Keras bit for bit. Keras' epsilon sits outside the bias
  correction: step = lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps).
  """
  dtype = variable.dtype
  lr = as_dtype(learning_rate, dtype)
  gradient = ops.cast(gradient, dtype)
  local_step = ops.cast(optimizer.iterations + 1, dtype)
  beta_1_power = ops.power(as_dtype(beta_1, dtype), local_step)
  beta_2_power = ops.power(as_dtype(beta_2, dtype), local_step)
  alpha = lr * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)
  optimizer.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - beta_1))
  optimizer.assign_add(
      v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - beta_2))
  if v_hat is not None:
    optimizer.assign(v_hat, ops.maximum(v_hat, v))
    v = v_hat
  return ops.divide(ops.multiply(m, alpha), ops.add(ops.sqrt(v), epsilon)), m


@keras.saving.register_keras_serializable(package="tfopt")
class CautiousAdamW(CautiousDecayMixin, keras.optimizers.AdamW):
  """AdamW whose decoupled weight decay is cautious (CWD).

  x <- x - lr * (u + wd * 1[u * x >= 0] * x), u = Adam's update. With
  `cautious_weight_decay=False` this is `keras.optimizers.AdamW`: same
  variables in the same order, same numbers.

  Args:
    learning_rate, weight_decay, beta_1, beta_2, epsilon, amsgrad and every
      Keras base argument (clipnorm, use_ema, loss_scale_factor,
      gradient_accumulation_steps, ...): as `keras.optimizers.AdamW`.
    cautious_weight_decay: bool, mask the decay (default True).
    decay_exclude_patterns: regexes on variable paths never decayed, e.g.
      `[r"bias$", r"layer_normalization"]`; adds to
      `exclude_from_weight_decay()`.
    track_decay_fraction: keep the fraction of coordinates decayed at the last
      step (`decay_fraction()`, `DecayFractionLogger`).

  >>> opt = CautiousAdamW(learning_rate=1e-3, weight_decay=0.1)
  >>> opt.cautious_weight_decay
  True
  """

  def __init__(self, learning_rate=0.001, weight_decay=0.004, beta_1=0.9,
               beta_2=0.999, epsilon=1e-7, amsgrad=False,
               cautious_weight_decay=True, decay_exclude_patterns=None,
               track_decay_fraction=False, name="cautious_adamw", **kwargs):
    check_number("learning_rate", learning_rate, 0, float("inf"),
                 allow_dynamic=True)
    check_number("weight_decay", weight_decay, 0, float("inf"))
    check_number("beta_1", beta_1, 0, 1)
    check_number("beta_2", beta_2, 0, 1)
    check_number("epsilon", epsilon, 0, float("inf"))
    super().__init__(learning_rate=learning_rate, weight_decay=weight_decay,
                     beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                     amsgrad=amsgrad, name=name, **kwargs)
    self._init_cautious(cautious_weight_decay, decay_exclude_patterns,
                        track_decay_fraction)

  def _descent_step(self, gradient, variable, learning_rate, index):
    return adam_step(
        self, gradient, variable, learning_rate, self._momentums[index],
        self._velocities[index],
        self._velocity_hats[index] if self.amsgrad else None,
        self.beta_1, self.beta_2, self.epsilon)

  def get_config(self):
    config = super().get_config()
    config.update(self._cautious_config())
    return config
