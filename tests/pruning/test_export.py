"""Sparse export: bit-exact round trip, size, N:M indices; SavedModel."""

import json
import os

import keras
import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt import zoo
from tfopt.pruning import (apply_sparse, export_saved_model, export_sparse,
                           installed_masks, load_sparse, prune_moe)
from tfopt.pruning import export as export_lib


@pytest.fixture(scope="module")
def model_and_data():
  keras.utils.set_random_seed(0)
  zm = zoo.moe_lm(vocab_size=40, seq_len=8, num_layers=2, d_model=16,
                  num_heads=2, num_experts=4, expert_dim=16)
  # 64 sequences: every expert gets prune_moe's min_tokens (16 would
  # leave one short, and its warning fails the test).
  x, _ = zm.batch(64)
  return zm.model, x, zm.model.get_weights()


@pytest.mark.parametrize("pattern,sparsity,encoding", [
    (None, 0.5, "bitmask"), (None, 0.7, "bitmask"), ("2:4", None, "n:m"),
    ("4:8", None, "n:m")])
def test_round_trip_bit_exact(tmp_path, model_and_data, pattern, sparsity,
                              encoding):
  model, x, weights = model_and_data
  model.set_weights(weights)
  report = prune_moe(model, x, method="sparsegpt", sparsity=sparsity,
                     pattern=pattern, verbose=0)
  manifest = export_sparse(model, report.masks, str(tmp_path / "sparse"))
  assert manifest["format"] == "tfopt.sparse/1"
  assert {t["encoding"] for t in manifest["tensors"]} == {encoding}
  on_disk = json.loads((tmp_path / "sparse" / "manifest.json").read_text())
  assert on_disk == manifest
  dense = load_sparse(str(tmp_path / "sparse"))
  values = {v.path: v.numpy() for v in model.weights}
  for path in report.masks:
    assert dense[path].dtype == values[path].dtype
    np.testing.assert_array_equal(dense[path], values[path])
    assert dense[path].tobytes() == values[path].tobytes()  # bit for bit
  # Into a fresh model of the same architecture: identical outputs.
  fresh = keras.models.clone_model(model)
  fresh.set_weights(weights)
  assert sorted(apply_sparse(fresh, str(tmp_path / "sparse"))) == sorted(
      report.masks)
  np.testing.assert_array_equal(np.asarray(fresh(x)), np.asarray(model(x)))
  if sparsity == 0.5 or pattern == "2:4":
    assert manifest["ratio"] <= 0.54
  # Counted bytes are the stored arrays' bytes.
  with np.load(tmp_path / "sparse" / "tensors.npz") as arrays:
    assert manifest["bytes"] == sum(arrays[k].nbytes for k in arrays.files)


def test_bit_packing_round_trip():
  rng = np.random.default_rng(0)
  for bits in (1, 2, 3, 4):
    values = rng.integers(0, 2 ** bits, size=37)
    packed = export_lib._pack_bits(values, bits)  # pylint: disable=protected-access
    assert packed.nbytes == -(-37 * bits // 8)
    np.testing.assert_array_equal(
        export_lib._unpack_bits(packed, bits, 37), values)  # pylint: disable=protected-access


def test_refusals(tmp_path, model_and_data):
  model, x, weights = model_and_data
  model.set_weights(weights)
  report = prune_moe(model, x, sparsity=0.5, verbose=0)
  target = str(tmp_path / "sparse")
  export_sparse(model, report.masks, target)
  before = (tmp_path / "sparse" / "manifest.json").read_bytes()
  with pytest.raises(FileExistsError, match="overwrite=True"):
    export_sparse(model, report.masks, target)
  assert (tmp_path / "sparse" / "manifest.json").read_bytes() == before
  export_sparse(model, report.masks, target, overwrite=True)
  model.set_weights(weights)  # pruned weights no longer zero
  with pytest.raises(ValueError, match="non-zero pruned weights"):
    export_sparse(model, report.masks, str(tmp_path / "other"))
  with pytest.raises(FileNotFoundError, match="Argument `directory`"):
    load_sparse(str(tmp_path / "missing"))


def test_saved_model_serves_pruned_model(tmp_path, model_and_data):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  model, x, weights = model_and_data
  model.set_weights(weights)
  prune_moe(model, x, pattern="2:4", install=True, verbose=0)
  masks = installed_masks(model)
  path = export_saved_model(model, str(tmp_path / "serving"))
  assert installed_masks(model).keys() == masks.keys()  # reinstalled
  loaded = tf.saved_model.load(path)
  np.testing.assert_allclose(loaded.serve(x).numpy(),
                             model.predict(x, verbose=0), atol=1e-5)
  with pytest.raises(FileExistsError):
    export_saved_model(model, path)
  assert os.path.exists(os.path.join(path, "saved_model.pb"))
