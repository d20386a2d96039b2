"""Keras 3 `model.fit` under MultiWorkerMirroredStrategy (keras-team/keras#20585).

As shipped (Keras 3.x with TF 2.21), `fit` fails on every worker before the
first step, in two private paths of the TensorFlow trainer:

1. `TensorFlowTrainer._maybe_symbolic_build` builds the model from the first
   batch by `strategy.reduce("MEAN", per_replica_batch)`, a collective over
   the *data*; under the multi-worker strategy this converts a `PerReplica`
   to a tensor and raises. Building needs only the shapes, so the fix takes
   this worker's first local replica (no collective, nothing consumed: the
   epoch iterator is created again for training).
2. `reduce_per_replica` reduces the step's logs with `strategy.reduce("MEAN",
   v, axis=0)`; the logs are scalars, and a reduction over axis 0 of a
   scalar raises. The fix reduces scalars with `axis=None` (a mean across
   workers of their per-worker metric results) and leaves the rest alone.

With both fixed, 2 workers train with losses equal to each other and to a
single-process run at the same global batch (tests/scale/test_multiworker).

`patch_keras_for_multi_worker()` applies the fix only after checking the
Keras version and that both private paths still contain the code it
replaces; when they changed it raises `KerasCompatError` (loudly, never a
silent half-patch), and when they no longer contain the bug (a fixed Keras)
it leaves Keras alone and says so. Idempotent; `unpatch()` restores Keras.
"""

from __future__ import annotations

import inspect

# Keras versions on which the fix was verified. A newer one is checked by
# source (see `_SIGNATURES`), so a release that keeps the paths still works.
VERIFIED = ((3, 5), (3, 16))

_SIGNATURES = {
    "_maybe_symbolic_build": "self.distribute_strategy.reduce(",
    "reduce_per_replica": 'strategy.reduce("MEAN", v, axis=0)',
}

_ORIGINAL: dict = {}


class KerasCompatError(RuntimeError):
  """Keras changed the private paths the multi-worker fix replaces."""


def _version() -> tuple:
  import keras  # pylint: disable=import-outside-toplevel
  parts = []
  for piece in keras.__version__.split(".")[:2]:
    digits = "".join(ch for ch in piece if ch.isdigit())
    parts.append(int(digits or 0))
  return tuple(parts)


def _trainer_module():
  try:
    from keras.src.backend.tensorflow import trainer  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    raise KerasCompatError(
        "tfopt's MultiWorkerMirroredStrategy fix needs "
        "keras.src.backend.tensorflow.trainer, which this Keras does not "
        f"have ({err}).") from None
  return trainer


def status() -> str:
  """'patched', 'not needed' (this Keras has no bug in either path) or
  'needed' (unpatched and buggy). Raises KerasCompatError if the private
  paths are gone or changed beyond recognition."""
  trainer = _trainer_module()
  if _ORIGINAL:
    return "patched"
  found = {}
  for name, needle in _SIGNATURES.items():
    owner = trainer.TensorFlowTrainer if name.startswith("_") else trainer
    fn = getattr(owner, name, None)
    if fn is None:
      raise KerasCompatError(
          f"Keras {'.'.join(map(str, _version()))} has no "
          f"keras.src.backend.tensorflow.trainer {name}; tfopt's fix for "
          "MultiWorkerMirroredStrategy (keras-team/keras#20585) must be "
          "revisited for this version.")
    found[name] = needle in inspect.getsource(fn)
  if all(found.values()):
    return "needed"
  if not any(found.values()):
    return "not needed"
  raise KerasCompatError(
      "Keras changed one of the two private paths tfopt patches for "
      f"MultiWorkerMirroredStrategy ({found}); refusing a half patch.")


def patch_keras_for_multi_worker() -> str:
  """Applies the fix (see the module doc); returns `status()` after it."""
  state = status()
  if state != "needed":
    return state
  version = _version()
  if not VERIFIED[0] <= version < VERIFIED[1]:
    # The sources still match, so the patch still applies; say it is
    # unverified rather than refusing a user who upgraded Keras.
    import warnings  # pylint: disable=import-outside-toplevel
    warnings.warn(f"tfopt's MultiWorkerMirroredStrategy fix was verified "
                  f"on Keras {VERIFIED[0]} to {VERIFIED[1]} (exclusive); "
                  f"this is {version}.", RuntimeWarning, stacklevel=2)
  trainer = _trainer_module()
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from keras.src import tree  # pylint: disable=import-outside-toplevel

  original_build = trainer.TensorFlowTrainer._maybe_symbolic_build  # pylint: disable=protected-access
  original_reduce = trainer.reduce_per_replica

  def first_local(strategy, value):
    if isinstance(value, tf.distribute.DistributedValues):
      return strategy.experimental_local_results(value)[0]
    return value

  def _maybe_symbolic_build(self, iterator=None, data_batch=None):
    if self._distribute_strategy is None:  # pylint: disable=protected-access
      return
    if iterator is not None:
      for _, _, it in iterator:
        batch = next(it)
        data_batch = tree.map_structure(
            lambda x: first_local(self.distribute_strategy, x), batch)
        break
    with self.distribute_strategy.scope():
      self._symbolic_build(data_batch=data_batch)  # pylint: disable=protected-access

  def reduce_per_replica(values, strategy, reduction):
    multi_worker = trainer._collective_all_reduce_multi_worker(strategy)  # pylint: disable=protected-access
    if multi_worker and reduction in ("auto", "mean"):
      def mean(v):
        rank = getattr(getattr(v, "shape", None), "rank", None)
        return strategy.reduce("MEAN", v, axis=0 if rank else None)
      return tree.map_structure(mean, values)
    return original_reduce(values, strategy, reduction)

  _ORIGINAL["_maybe_symbolic_build"] = original_build
  _ORIGINAL["reduce_per_replica"] = original_reduce
  trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build  # pylint: disable=protected-access
  trainer.reduce_per_replica = reduce_per_replica
  return status()


def unpatch() -> None:
  """Restores Keras' own functions (no-op if not patched)."""
  if not _ORIGINAL:
    return
  trainer = _trainer_module()
  trainer.TensorFlowTrainer._maybe_symbolic_build = _ORIGINAL.pop(  # pylint: disable=protected-access
      "_maybe_symbolic_build")
  trainer.reduce_per_replica = _ORIGINAL.pop("reduce_per_replica")
