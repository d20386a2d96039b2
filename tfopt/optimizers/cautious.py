"""Cautious weight decay (CWD), the piece every tfopt optimizer shares.

CWD (Algorithm 1 of the Cautious Weight Decay paper) decays a coordinate only
where the optimizer's update agrees in sign with the parameter:

    x <- x - lr * (u + wd * 1[u * x >= 0] * x)

`u` is the optimizer's update before the learning rate (Adam's
m_hat / (sqrt(v_hat) + eps), Lion's sign, Muon's orthogonalized momentum) and
the mask is taken on the parameter *before* the update. Ties decay: where
u = 0 the mask is 1; where x = 0 the decay term is 0 anyway.

Keras applies decoupled decay in `_apply_weight_decay`, before `update_step`,
from the variable alone. Cautious decay needs the update, so
`CautiousDecayMixin` switches Keras' pre-update decay off and applies decay
inside `update_step` through `decay_then_step`, for both modes:

* `cautious_weight_decay=False`: x <- (x - x * wd * lr) - step, the very
  float operations Keras does, so the numbers equal `keras.optimizers.AdamW`
  / `Lion` / `Muon` bit for bit and checkpoints interchange.
* `cautious_weight_decay=True`: the same with the decay term masked.

Doing the plain decay per variable inside the update step (instead of for all
variables first) changes nothing: neither Adam's, Lion's nor Muon's step reads
the variable. It also makes the decay run inside tf.distribute's per-variable
update, where Keras' own Muon decay is not distribution-aware.
"""

from __future__ import annotations

import contextlib
import math
import re
from typing import Any, Sequence

import keras
from keras import ops

from tfopt._errors import invalid_argument


def cautious_mask(step, variable):
  """Boolean mask of the coordinates CWD decays: step * x >= 0.

  `step` is `lr * u` with lr > 0 (or any tensor with the sign of u), so this
  is the paper's 1[u * x >= 0]. A product that underflows to 0 counts as a
  tie and decays; the decayed amount, lr * wd * |x|, is then negligible.
  (Multiplying signs instead avoids that corner but costs ~1.5% of an AdamW
  step on CPU.)

  >>> import numpy as np
  >>> m = cautious_mask(np.array([1., -1., 0., 2.]), np.array([3., 3., -1., 0.]))
  >>> np.asarray(m).tolist()
  [True, False, True, True]
  """
  return ops.greater_equal(ops.multiply(step, variable), 0)


def decay_then_step(variable, step, weight_decay, learning_rate, cautious,
                    direction=None):
  """Returns `(new_value, mask)` for one variable; `mask` is None if plain.

  new_value = (x - where(mask, x * wd * lr, 0)) - step, with x the value
  before the update. The product keeps Keras' order `x * wd * lr` so that a
  mask of all ones gives exactly Keras' decoupled decay.

  `direction`, if given, is a cheaper tensor with the sign of `step` (Adam's
  first moment, Lion's interpolation) to take the mask from. Under XLA a
  step used twice (mask and subtraction) is computed twice or written to
  memory: taking the sign from Adam's moment instead brought the cautious
  AdamW step from 2.3x Keras' time to parity on a 4-layer Transformer.
  """
  mask = None
  decayed = variable
  if cautious:
    mask = cautious_mask(step if direction is None else direction, variable)
    # Masked first, with a broadcast scalar zero: (where(mask, x, 0) * wd)
    # * lr equals where(mask, x * wd * lr, 0) bit for bit, and every
    # variable-sized tensor of the decay now depends on the update, so it
    # is made just before it is used. (`x * wd * lr` and `zeros_like`
    # depend on nothing: TensorFlow computes them at the start of the step
    # and holds them, per variable, until the update.)
    decayed = ops.where(mask, ops.convert_to_tensor(variable),
                        ops.zeros((), dtype=variable.dtype))
  decay = ops.multiply(ops.multiply(decayed, weight_decay), learning_rate)
  return ops.subtract(ops.subtract(variable, decay), step), mask


def as_dtype(value, dtype):
  """`value` as a tensor of `dtype`; Python numbers converted directly.

  `ops.cast(0.2, "float64")` goes through float32 (0.2 becomes
  0.20000000298...), which would cap float64 training at float32 accuracy.
  """
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return ops.convert_to_tensor(value, dtype=dtype)
  return ops.cast(value, dtype)


def densify(gradient):
  """A dense gradient; TF `IndexedSlices` (Embedding) summed into a tensor.

  Keras' element-wise ops act on the slices of an `IndexedSlices` one by
  one, so when an index occurs twice in a batch Keras' own AdamW updates
  differently from the same gradient in dense form (see
  tests/optimizers/test_keras_integration.py). The moments are dense
  anyway, so densifying first costs nothing the update would not pay.
  """
  if keras.backend.backend() == "tensorflow":
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if isinstance(gradient, tf.IndexedSlices):
      return tf.convert_to_tensor(gradient)
  return gradient


def check_number(name: str, value: Any, low: float, high: float,
                 low_open: bool = False, high_open: bool = True,
                 allow_none: bool = False, allow_dynamic: bool = False):
  """Raises a Keras-style error unless `low <(=) value <(=) high`.

  Schedules, callables and tensors (`allow_dynamic`) are passed through: they
  are only known while training.
  """
  if value is None and allow_none:
    return value
  if not isinstance(value, bool) and isinstance(value, (int, float)):
    ok_low = value > low if low_open else value >= low
    ok_high = value < high if high_open else value <= high
    if ok_low and ok_high:
      return value
  elif allow_dynamic and value is not None and not isinstance(
      value, (bool, str)):
    return value
  interval = (("(" if low_open else "[") + f"{low:g}, {high:g}" +
              (")" if high_open else "]"))
  raise invalid_argument(name, f"a number in the range {interval}", value)


def compile_patterns(name: str, patterns: Sequence[str] | None):
  """Compiles user regexes, naming the argument and the pattern that fails."""
  if patterns is None:
    return (), ()
  if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
    raise invalid_argument(name, "a list of regular-expression strings",
                           patterns)
  compiled = []
  for pattern in patterns:
    try:
      compiled.append(re.compile(pattern))
    except re.error as e:
      raise invalid_argument(
          name, f"a list of valid regular expressions ({pattern!r}: {e})",
          list(patterns)) from None
  return tuple(patterns), tuple(compiled)


class CautiousDecayMixin:
  """Moves weight decay into the update step and makes it optionally cautious.

  Mixed in before a Keras optimizer class, which must provide
  `_descent_step(gradient, variable, learning_rate, index)
  -> (step, direction)`: update the optimizer's slots and return the step
  `lr * u` that would be subtracted, without touching the variable, and
  either None or a tensor with the sign of `u` that is cheaper to read
  than the step (see `decay_then_step`). Subclasses may override
  `_weight_decay_for(variable)` (Muon decays its two groups differently).

  Arguments handled here (all serialized by `get_config`):
    cautious_weight_decay: bool, default True.
    decay_exclude_patterns: regexes; a variable whose `path` matches any is
      not decayed (in addition to Keras' `exclude_from_weight_decay`).
    track_decay_fraction: bool; keep one scalar per decayed variable with
      the number of coordinates decayed at the last step, read with
      `decay_fraction()`. Off by default: it adds optimizer variables.
  """

  def _init_cautious(self, cautious_weight_decay, decay_exclude_patterns,
                     track_decay_fraction):
    if not isinstance(cautious_weight_decay, bool):
      raise invalid_argument("cautious_weight_decay", "a bool",
                             cautious_weight_decay)
    if not isinstance(track_decay_fraction, bool):
      raise invalid_argument("track_decay_fraction", "a bool",
                             track_decay_fraction)
    self.cautious_weight_decay = cautious_weight_decay
    self.track_decay_fraction = track_decay_fraction
    (self.decay_exclude_patterns,
     self._decay_exclude_regexes) = compile_patterns("decay_exclude_patterns",
                                                     decay_exclude_patterns)

  # -- build -----------------------------------------------------------------

  def _prepare_build(self, var_list):
    """Hook run before the Keras build creates slots (Muon: routing)."""

  def build(self, var_list):
    if self.built:
      return
    self._prepare_build(var_list)
    super().build(var_list)
    rates, counters, total = [], [], 0
    for var in var_list:
      rate = (self._weight_decay_for(var)
              if self._use_weight_decay(var) else None)
      if rate is not None and float(rate) == 0.0:
        rate = None
      rates.append(rate)
      counter = None
      if rate is not None and self.track_decay_fraction:
        counter = self._add_scalar_beside(var, "cwd_decayed")
        total += int(math.prod(var.shape))
      counters.append(counter)
    # Python floats / None per variable index: decided once, at build time.
    self._cwd_rates = tuple(rates)
    self._cwd_counters = counters
    self._cwd_total = total

  def _add_scalar_beside(self, var, name):
    # tf.distribute wants every variable an update touches to live beside it
    # (as slots do); other backends have no strategy.
    strategy = getattr(self, "_distribution_strategy", None)
    ctx = (strategy.extended.colocate_vars_with(var.value)
           if strategy is not None and hasattr(var, "value")
           else contextlib.nullcontext())
    with ctx:
      return self.add_variable(shape=(), dtype="float32",
                               name=f"{var.path.replace('/', '_')}_{name}")

  def _weight_decay_for(self, variable):
    del variable
    return self.weight_decay

  def _use_weight_decay(self, variable):
    path = getattr(variable, "path", variable.name)
    if any(r.search(path) for r in self._decay_exclude_regexes):
      return False
    return super()._use_weight_decay(variable)

  # -- update ----------------------------------------------------------------

  def _apply_weight_decay(self, variables):
    # Decay happens in `update_step`, where the update is known.
    del variables

  def update_step(self, gradient, variable, learning_rate):
    index = self._get_variable_index(variable)
    gradient = densify(gradient)
    step, direction = self._descent_step(gradient, variable, learning_rate,
                                         index)
    rate = self._cwd_rates[index]
    if rate is None:
      self.assign_sub(variable, step)
      return
    new_value, mask = decay_then_step(
        variable, step, as_dtype(rate, variable.dtype),
        as_dtype(learning_rate, variable.dtype), self.cautious_weight_decay,
        direction)
    self.assign(variable, new_value)
    counter = self._cwd_counters[index]
    if counter is not None:
      decayed = (ops.sum(ops.cast(mask, "float32")) if mask is not None
                 else ops.cast(ops.size(variable), "float32"))
      self.assign(counter, decayed)

  # -- diagnostics and config -----------------------------------------------

  def decay_fraction(self):
    """Fraction of decayable coordinates decayed at the last update step.

    Needs `track_decay_fraction=True` and a built optimizer. 1.0 means CWD
    decayed everything (plain AdamW); 0.0 that every update disagreed.
    """
    if not self.track_decay_fraction:
      raise ValueError(
          "`decay_fraction()` needs the optimizer to be created with "
          "`track_decay_fraction=True`. Received: track_decay_fraction=False")
    if not self.built:
      raise ValueError("`decay_fraction()` needs a built optimizer: call "
                       "`optimizer.build(model.trainable_variables)` or train "
                       "one step first.")
    counters = [c for c in self._cwd_counters if c is not None]
    if not counters:
      return ops.convert_to_tensor(0.0)
    decayed = counters[0].value
    for counter in counters[1:]:
      decayed = ops.add(decayed, counter.value)
    return ops.divide(decayed, float(self._cwd_total))

  def _cautious_config(self):
    return {
        "cautious_weight_decay": self.cautious_weight_decay,
        "decay_exclude_patterns": list(self.decay_exclude_patterns),
        "track_decay_fraction": self.track_decay_fraction,
    }

