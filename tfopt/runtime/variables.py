"""Moving a Keras model's own variables onto the devices a plan chose.

TensorFlow fixes a variable's device when the variable is created, and
silently runs every op that reads or updates it there. Keras creates its
variables when a model is built, on the default device, before any plan
exists. So a placed step can only put a weight elsewhere by *moving* it:
`move_variables` creates a `tf.Variable` on the planned device from the
current value, makes the Keras variable hold it, and drops the old one (no
second copy stays behind; `fit`, `evaluate`, `predict`, `save_weights` /
`load_weights` and `Model.save` then act on the moved variables).

This uses one private Keras path, guarded the way `tfopt.scale.compat`
guards its patch: a Keras TensorFlow-backend variable keeps its
`tf.Variable` in `_value` (`keras.src.backend.tensorflow.core.Variable`,
whose own `_initialize` accepts a ready `tf.Variable`), and Keras' TF
optimizer keys its slots by the `tf.Variable`'s `_unique_id`, which the new
variable inherits. Both are checked for every variable before anything is
moved, and after each move the optimizer must find the variable under the
same key; a Keras that changed either raises `KerasCompatError` and
nothing is moved. Verified on Keras 3.15 with TensorFlow 2.21 (`VERIFIED`; another
version gets a warning, and the checks still run);
tests/test_compile_placement.py fails loudly if Keras changes either path.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Mapping, Sequence

from tfopt.scale.compat import KerasCompatError, _version

# Keras versions on which moving was verified (upper bound exclusive).
VERIFIED = ((3, 15), (3, 16))


def keras_variables(model) -> list:
  """Every Keras variable a training step touches, once each: the
  model's, the optimizer's and the metrics'."""
  seen, out = set(), []
  groups = [model.variables,
            getattr(getattr(model, "optimizer", None), "variables", []),
            getattr(model, "metrics_variables", [])]
  for group in groups:
    for var in group:
      if id(var) not in seen:
        seen.add(id(var))
        out.append(var)
  return out


def _check_movable(var) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  value = getattr(var, "_value", None)
  if value is None or getattr(var, "value", None) is not value:
    raise KerasCompatError(
        f"Keras {'.'.join(map(str, _version()))}: variable {var.path!r} "
        f"does not keep its tf.Variable in `_value` as tfopt expects "
        f"(keras.src.backend.tensorflow.core.Variable); tfopt cannot move "
        f"it to a planned device. Verified on Keras {VERIFIED[0]} to "
        f"{VERIFIED[1]} (exclusive).")
  if not isinstance(value, tf.Variable) or not hasattr(value, "_unique_id"):
    raise KerasCompatError(
        f"Variable {var.path!r} holds a {type(value).__name__}, not a "
        f"resource tf.Variable with `_unique_id`; tfopt cannot move it.")


def _key(optimizer, var):
  return None if optimizer is None or not hasattr(optimizer, "_var_key") \
      else optimizer._var_key(var)  # pylint: disable=protected-access


def _moved_copy(value, device: str):
  """A tf.Variable on `device` with `value`'s contents and identity."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.init_scope(), tf.device(device):
    new = tf.Variable(value.read_value(), trainable=value.trainable,
                      name=value.name.split(":")[0], dtype=value.dtype,
                      aggregation=value.aggregation,
                      synchronization=value.synchronization)
  new._unique_id = value._unique_id  # pylint: disable=protected-access
  return new


@dataclasses.dataclass(frozen=True)
class MoveReport:
  """What `move_variables` did: variables moved, and bytes per device of
  every variable it was given (where each now lives)."""
  moved: int
  bytes_per_device: Mapping[str, int]


def move_variables(assignment: Sequence[tuple[object, str]], *,
                   optimizer=None, renew: bool = False) -> MoveReport:
  """Moves each Keras variable of `assignment` ((variable, device string)
  pairs) onto its device.

  Variables already on their device are left alone (with `renew`, they
  get a fresh copy there too: see `renew_variables`). Every variable is
  checked first (nothing moves if one cannot); a failure while moving
  (say, a device out of memory) moves the ones already moved back and
  re-raises. `optimizer`: the model's optimizer, whose slot keys must
  survive the move (checked).
  """
  from tfopt.runtime.session import same_device  # pylint: disable=g-import-not-at-top
  version = _version()
  if not VERIFIED[0] <= version < VERIFIED[1]:
    warnings.warn(f"tfopt moves Keras variables through a private path "
                  f"verified on Keras {VERIFIED[0]} to {VERIFIED[1]} "
                  f"(exclusive); this is {version}. It is checked for every "
                  f"variable.", RuntimeWarning, stacklevel=2)
  items = list(assignment)
  for var, _ in items:
    _check_movable(var)
  done: list[tuple[object, object]] = []  # (variable, its old tf.Variable)
  try:
    for var, device in items:
      old = var._value  # pylint: disable=protected-access
      if same_device(device, old.device) and not renew:
        continue
      key = _key(optimizer, var)
      var._value = _moved_copy(old, device)  # pylint: disable=protected-access
      done.append((var, old))
      if _key(optimizer, var) != key or var.value is not var._value:  # pylint: disable=protected-access
        raise KerasCompatError(
            f"After moving {var.path!r}, Keras no longer finds it under the "
            f"same optimizer key; this Keras keys variables differently from "
            f"{VERIFIED}. Moved back.")
      del old
  except BaseException:
    for var, old in reversed(done):
      var._value = old  # pylint: disable=protected-access
    raise
  moved = len(done)
  done.clear()  # the old tf.Variables go with it
  per_device: dict[str, int] = {}
  for var, _ in items:
    value = var._value  # pylint: disable=protected-access
    per_device[value.device] = per_device.get(value.device, 0) + (
        value.shape.num_elements() * value.dtype.size)
  return MoveReport(moved, per_device)


def renew_variables(variables: Sequence, *, optimizer=None) -> int:
  """Gives each Keras variable a fresh tf.Variable on the device it is on,
  with its value and optimizer key; returns how many.

  Why: once this process connects to a cluster
  (`tf.config.experimental_connect_to_cluster`, what `tfopt.compile` does
  for devices of server tasks), a tf.Variable created before ignores every
  eager assign -- `load_weights`, `set_weights`, a checkpoint's restore --
  without an error, while reads still return its old value (TensorFlow
  2.21, tested in tests/runtime/test_remote_variables.py). A copy made
  after connecting takes assigns again.
  """
  items = [(var, var._value.device) for var in variables]  # pylint: disable=protected-access
  return move_variables(items, optimizer=optimizer, renew=True).moved


def devices_of(variables: Sequence) -> dict[str, str]:
  """Keras variable path -> the device its tf.Variable lives on."""
  return {v.path: v.value.device for v in variables}
