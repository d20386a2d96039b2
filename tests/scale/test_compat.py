"""The MultiWorkerMirroredStrategy fix for Keras' private paths: applied
only when both paths still hold the code it replaces; loud otherwise.
(That it makes 2 workers train like one process is in
test_multiworker_e2e.)"""

import keras
import pytest

from tfopt.scale import compat


@pytest.fixture(autouse=True)
def _restore():
  yield
  compat.unpatch()


def test_private_paths_still_hold_the_bug_this_fix_replaces():
  # Fails loudly the day Keras changes `_maybe_symbolic_build` or
  # `reduce_per_replica`: the fix must then be revisited (or dropped, when
  # status says "not needed").
  assert compat.status() == "needed", (
      f"Keras {keras.__version__}: revisit tfopt.scale.compat")


def test_patch_is_idempotent_and_reversible():
  from keras.src.backend.tensorflow import trainer
  original = trainer.reduce_per_replica
  assert compat.patch_keras_for_multi_worker() == "patched"
  patched = trainer.reduce_per_replica
  assert patched is not original
  assert compat.patch_keras_for_multi_worker() == "patched"
  assert trainer.reduce_per_replica is patched
  compat.unpatch()
  assert trainer.reduce_per_replica is original
  assert compat.status() == "needed"


def test_single_process_fit_is_unchanged_by_the_patch():
  import numpy as np
  x = np.random.RandomState(0).randn(64, 4).astype("float32")
  y = x.sum(1, keepdims=True)

  def train():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                     shuffle=False).history["loss"]

  before = train()
  compat.patch_keras_for_multi_worker()
  assert train() == before


def test_changed_private_paths_are_refused(monkeypatch):
  monkeypatch.setitem(compat._SIGNATURES, "reduce_per_replica",
                      "code keras no longer has")
  with pytest.raises(compat.KerasCompatError, match="half patch"):
    compat.patch_keras_for_multi_worker()
  monkeypatch.setitem(compat._SIGNATURES, "_maybe_symbolic_build",
                      "code keras no longer has")
  assert compat.patch_keras_for_multi_worker() == "not needed"
  monkeypatch.setitem(compat._SIGNATURES, "gone_function", "x")
  with pytest.raises(compat.KerasCompatError, match="gone_function"):
    compat.status()
