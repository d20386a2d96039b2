"""Keeping pruned weights at zero while a model trains, and letting go.

A mask is installed as the variable's Keras `constraint`: Keras' optimizers
assign `constraint(variable)` after every update (`BaseOptimizer.apply`), so
`MaskConstraint` multiplies by the 0/1 mask there and the pruned weights are
exactly zero after each step, whatever the optimizer (momentum, weight
decay) did. A constraint is read when the train function is traced, so
`install_masks` rebuilds a model's train function. `strip_pruning` restores
the constraints that were there before.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from tfopt._errors import invalid_argument


class MaskConstraint:
  """`w -> w * mask` (then the constraint that was there before, if any)."""

  def __init__(self, keep: np.ndarray, previous=None):
    self.keep = np.asarray(keep, dtype=bool)
    self.previous = previous

  def __call__(self, w):
    out = w * ops.cast(ops.convert_to_tensor(self.keep), w.dtype)
    return self.previous(out) if self.previous is not None else out

  def get_config(self):
    return {}  # Not serialized: masks are runtime state (see strip_pruning).


def variables_by_path(model) -> dict:
  """{variable.path: variable} for every weight of `model`."""
  return {v.path: v for v in model.weights}


def install_masks(model, masks: dict[str, np.ndarray]) -> None:
  """Zeroes the masked weights and keeps them zero through training.

  `masks` maps variable paths to boolean keep-masks of the variable's shape.
  Re-installing replaces an earlier tfopt mask (it does not stack).
  """
  found = variables_by_path(model)
  for path, keep in masks.items():
    if path not in found:
      raise invalid_argument("masks", f"keyed by paths of {model.name}'s "
                             "variables", path)
    var = found[path]
    keep = np.asarray(keep, dtype=bool)
    if keep.shape != tuple(var.shape):
      raise invalid_argument(f"masks[{path!r}]",
                             f"of shape {tuple(var.shape)}", keep.shape)
    previous = var.constraint
    if isinstance(previous, MaskConstraint):
      previous = previous.previous
    var.assign(ops.convert_to_numpy(var) * keep.astype(var.dtype))
    var.constraint = MaskConstraint(keep, previous)
  _retrace(model)


def installed_masks(model) -> dict[str, np.ndarray]:
  """The masks currently installed on `model`'s variables."""
  return {v.path: v.constraint.keep for v in model.weights
          if isinstance(v.constraint, MaskConstraint)}


def strip_pruning(model) -> dict[str, np.ndarray]:
  """Removes tfopt's mask constraints (weights stay as they are, zeros
  included) and returns the masks that were installed."""
  masks = {}
  for var in model.weights:
    if isinstance(var.constraint, MaskConstraint):
      masks[var.path] = var.constraint.keep
      var.constraint = var.constraint.previous
  _retrace(model)
  return masks


def _retrace(model) -> None:
  # A traced train function captured the old constraints; drop it so the
  # next fit (or the running one, which re-reads the attribute) retraces.
  if getattr(model, "train_function", None) is not None:
    model.make_train_function(force=True)
