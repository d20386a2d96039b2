"""SavedModel export: round trip at two batch sizes, gRPC PredictRequest,
atomic and never overwriting without being asked."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tfopt import zoo
from tfopt.export import predict_over_grpc, saved_model


@pytest.fixture(scope="module")
def cnn():
  tf.random.set_seed(0)
  return zoo.small_cnn(image_size=8).model


def test_keras_round_trip_and_predict_request(cnn, tmp_path):
  path = tmp_path / "model"
  report = saved_model(cnn, path, batch_sizes=(1, 5))
  assert report.inputs == {"image": ((None, 8, 8, 3), "float32")}
  assert report.outputs == ("logits",)
  assert report.max_abs_diff < 1e-5 and report.served_max_abs_diff < 1e-5
  assert "serving_default" in report.cli_output or "inputs['image']" in \
      report.cli_output
  assert report.device_strings == 0
  # An independent reload: the signature answers like the model.
  loaded = tf.saved_model.load(str(path))
  x = np.random.default_rng(1).standard_normal([2, 8, 8, 3]).astype("float32")
  got = loaded.signatures["serving_default"](image=tf.constant(x))["logits"]
  np.testing.assert_allclose(got.numpy(), cnn(x, training=False).numpy(),
                             rtol=1e-5, atol=1e-6)
  # TF Serving's request/response protos over gRPC to tfopt's local
  # servicer (not the model server binary): the answer is the Keras model's.
  served = predict_over_grpc(str(path), {"image": x})
  np.testing.assert_allclose(served["logits"], cnn(x, training=False).numpy(),
                             rtol=1e-5, atol=1e-6)
  assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]


def test_never_overwrites_without_being_asked(cnn, tmp_path):
  path = tmp_path / "model"
  path.mkdir()
  (path / "mine.txt").write_text("user data")
  with pytest.raises(FileExistsError, match="overwrite=True"):
    saved_model(cnn, path, serving_check=False)
  assert (path / "mine.txt").read_text() == "user data"
  saved_model(cnn, path, overwrite=True, serving_check=False)
  assert not (path / "mine.txt").exists()
  assert (path / "saved_model.pb").exists()
  assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]


def test_placement_stripped_by_default_and_kept_on_request(tmp_path):
  v = tf.Variable(tf.ones([4, 2]))

  @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32,
                                              name="x")])
  def f(x):
    with tf.device("/device:CPU:3"):  # a device this process lacks
      return {"y": tf.matmul(x, v) + 1.0}

  stripped = saved_model(f, tmp_path / "a", serving_check=False)
  kept = saved_model(f, tmp_path / "b", keep_placement=True,
                     serving_check=False)
  assert stripped.device_strings == 0 and kept.device_strings > 0
  assert b"CPU:3" not in (tmp_path / "a" / "saved_model.pb").read_bytes()
  assert b"CPU:3" in (tmp_path / "b" / "saved_model.pb").read_bytes()
  assert kept.outputs == ("y",) and kept.max_abs_diff == 0.0


def test_bad_input(cnn, tmp_path):
  with pytest.raises(ValueError, match="Argument `model_or_function`"):
    saved_model(object(), tmp_path / "x")
  with pytest.raises(ValueError, match="Argument `input_signature`"):
    saved_model(tf.function(lambda x: x), tmp_path / "x")
  with pytest.raises(ValueError, match="Argument `batch_sizes`"):
    saved_model(cnn, tmp_path / "x", batch_sizes=(2,))
  with pytest.raises(ValueError, match="existing directory"):
    saved_model(cnn, tmp_path / "missing" / "x")
  assert not (tmp_path / "x").exists()


def test_without_the_serving_package_the_export_is_written_first(
    cnn, tmp_path, monkeypatch, caplog):
  import importlib  # pylint: disable=g-import-not-at-top
  # The module (tfopt.export re-exports its function under the same name).
  module = importlib.import_module("tfopt.export.saved_model")
  monkeypatch.setattr(module, "serving_api_available", lambda: False)
  with caplog.at_level("WARNING", logger="tfopt"):
    report = saved_model(cnn, tmp_path / "auto")   # default: where it exists
  assert report.served_max_abs_diff is None
  assert (tmp_path / "auto" / "saved_model.pb").exists()
  assert "serving_check=False skips" in caplog.text
  assert "tensorflow-serving-api" in caplog.text
  with pytest.raises(ImportError, match=r"SavedModel is written to .*required"
                     r"|SavedModel is written to .*serving_check=False"):
    saved_model(cnn, tmp_path / "required", serving_check=True)
  assert (tmp_path / "required" / "saved_model.pb").exists()
  assert tf.saved_model.load(str(tmp_path / "required")).signatures
