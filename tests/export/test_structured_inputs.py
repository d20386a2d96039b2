"""SavedModel export of models called with a dict, a list or a nested dict
(keras-hub backbones: `token_ids`, `padding_mask`): the serving signature is
keyed by the input names and answers like `model.predict`, reloaded and over
TF Serving's PredictRequest."""

import dataclasses
import os
from typing import Callable

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfopt.export import SIGNATURE, predict_over_grpc, sample_batch, saved_model

BATCH, LENGTH = 2, 7   # not what the export's own checks use


def _padding_mask(rng, batch=BATCH, length=LENGTH):
  """A padded batch: the first row full, the others cut short."""
  lengths = [length] + list(rng.integers(2, length, batch - 1))
  return (np.arange(length)[None, :] < np.array(lengths)[:, None]).astype(
      "int32")


def _token_ids(rng, vocabulary, batch=BATCH, length=LENGTH):
  return rng.integers(0, vocabulary, (batch, length)).astype("int32")


def _bert():
  import keras_hub  # pylint: disable=g-import-not-at-top
  return keras_hub.models.BertBackbone(
      vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16,
      intermediate_dim=32, max_sequence_length=16)


def _gpt2():
  import keras_hub  # pylint: disable=g-import-not-at-top
  return keras_hub.models.GPT2Backbone(
      vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16,
      intermediate_dim=32, max_sequence_length=16)


def _two_input_list():
  """A float and an int input (embedded), two outputs as a list."""
  features = keras.Input((5,), name="features")
  category = keras.Input((), dtype="int32", name="category")
  embedded = keras.layers.Embedding(4, 3, name="embed")(category)
  hidden = keras.layers.Dense(8, activation="relu", name="hidden")(
      keras.layers.Concatenate()([features, embedded]))
  score = keras.layers.Dense(1, name="score")(hidden)
  return keras.Model([features, category], [score, hidden])


def _nested_dict():
  """Text (dict keys unlike the `keras.Input` names) beside an image;
  outputs a nested dict."""
  ids = keras.Input((None,), dtype="int32", name="ids")
  mask = keras.Input((None,), dtype="int32", name="text_mask")
  image = keras.Input((4, 4, 3), name="image")
  embedded = keras.layers.Embedding(10, 4)(ids)
  weights = keras.ops.cast(mask, "float32")[:, :, None]
  pooled = keras.ops.sum(embedded * weights, axis=1) / keras.ops.maximum(
      keras.ops.sum(weights, axis=1), 1.0)
  pixels = keras.layers.Dense(4)(keras.layers.Flatten()(image))
  logits = keras.layers.Dense(3)(keras.layers.Concatenate()([pooled, pixels]))
  return keras.Model(
      {"text": {"token_ids": ids, "padding_mask": mask}, "image": image},
      {"logits": logits, "text": {"pooled": pooled}})


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  build: Callable[[], keras.Model]
  # rng -> what model.predict takes (the model's own structure).
  inputs: Callable[[np.random.Generator], object]
  # that structure -> the signature's keyword inputs.
  keyed: Callable[[object], dict]
  specs: dict            # report.inputs: key -> (shape, dtype)
  # model.predict's answer -> the signature's outputs.
  outputs: Callable[[object], dict]


def _backbone_inputs(rng, with_segments=False):
  x = {"token_ids": _token_ids(rng, 100), "padding_mask": _padding_mask(rng)}
  if with_segments:
    x["segment_ids"] = rng.integers(0, 2, (BATCH, LENGTH)).astype("int32")
  return x


SEQUENCE = ((None, None), "int32")
CASES = [
    Case("bert_backbone", _bert,
         lambda rng: _backbone_inputs(rng, with_segments=True), dict,
         {"token_ids": SEQUENCE, "segment_ids": SEQUENCE,
          "padding_mask": SEQUENCE}, dict),
    Case("gpt2_backbone", _gpt2, _backbone_inputs, dict,
         {"token_ids": SEQUENCE, "padding_mask": SEQUENCE},
         lambda y: {"layer_norm": y}),
    # keras-hub Llama: tests/compat (its CausalLM, exported after training).
    Case("list_of_two_inputs", _two_input_list,
         lambda rng: [rng.standard_normal((BATCH, 5)).astype("float32"),
                      rng.integers(0, 4, (BATCH,)).astype("int32")],
         lambda x: {"features": x[0], "category": x[1]},
         {"features": ((None, 5), "float32"), "category": ((None,), "int32")},
         lambda y: {"score": y[0], "hidden": y[1]}),
    Case("nested_dict_inputs", _nested_dict,
         lambda rng: {"text": {"token_ids": _token_ids(rng, 10),
                               "padding_mask": _padding_mask(rng)},
                      "image": rng.standard_normal((BATCH, 4, 4, 3)).astype(
                          "float32")},
         lambda x: {**x["text"], "image": x["image"]},
         {"token_ids": SEQUENCE, "padding_mask": SEQUENCE,
          "image": ((None, 4, 4, 3), "float32")},
         lambda y: {"logits": y["logits"], "text_pooled": y["text"]["pooled"]}),
]


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: c.name if isinstance(c, Case) else None)
def test_structured_inputs_round_trip_and_predict_request(case, tmp_path):
  keras.utils.set_random_seed(0)
  model = case.build()
  path = str(tmp_path / case.name)
  report = saved_model(model, path, batch_sizes=(1, 3))
  assert report.inputs == case.specs
  x = case.inputs(np.random.default_rng(1))
  expected = case.outputs(model.predict(x, verbose=0))
  assert report.outputs == tuple(sorted(expected))
  assert report.max_abs_diff < 1e-5 and report.served_max_abs_diff < 1e-5

  # An independent reload: keyword inputs by the model's input names.
  signature = tf.saved_model.load(path).signatures[SIGNATURE]
  _, declared = signature.structured_input_signature
  assert {k: (tuple(s.shape.as_list()), s.dtype.name)
          for k, s in declared.items()} == case.specs
  keyed = case.keyed(x)
  got = signature(**{k: tf.constant(v) for k, v in keyed.items()})
  assert sorted(got) == sorted(expected)
  for key, value in expected.items():
    np.testing.assert_allclose(got[key].numpy(), value, rtol=1e-5, atol=1e-5,
                               err_msg=key)
  # The same batch as a TF Serving PredictRequest.
  served = predict_over_grpc(path, keyed)
  for key, value in expected.items():
    np.testing.assert_allclose(served[key], value, rtol=1e-5, atol=1e-5,
                               err_msg=key)
  assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]


def test_sample_batch_is_valid_for_token_models():
  specs = [tf.TensorSpec((None, None), tf.int32, name="token_ids"),
           tf.TensorSpec((None, None), tf.int32, name="padding_mask"),
           tf.TensorSpec((None, None), tf.bool, name="attention_mask"),
           tf.TensorSpec((None, 4, 4, 3), tf.float32, name="image")]
  batch = sample_batch(specs, 3, length=6)
  assert {k: (v.shape, v.dtype.name) for k, v in batch.items()} == {
      "token_ids": ((3, 6), "int32"), "padding_mask": ((3, 6), "int32"),
      "attention_mask": ((3, 6), "bool"), "image": ((3, 4, 4, 3), "float32")}
  # Token ids inside any vocabulary of two; masks keep every position.
  assert set(np.unique(batch["token_ids"])) <= {0, 1}
  assert batch["padding_mask"].all() and batch["attention_mask"].all()
  assert batch["image"].std() > 0.5


def _clashing_keys():
  """Two dicts with the same inner key: the leaves' keys repeat."""
  a = keras.Input((2,), name="a_x")
  b = keras.Input((2,), name="b_x")
  return keras.Model({"a": {"x": a}, "b": {"x": b}},
                     keras.layers.Add(name="sum")([a, b]))


def test_bad_input_is_named(tmp_path):
  model = _clashing_keys()
  with pytest.raises(ValueError, match=r"Argument `model_or_function` must "
                     r"be a model whose inputs have unique keys.*"
                     r"\['x', 'x'\]"):
    saved_model(model, tmp_path / "m")
  with pytest.raises(ValueError, match=r"Argument `input_signature` must be "
                     r"2 tf.TensorSpecs, one per model input"):
    saved_model(model, tmp_path / "m",
                input_signature=[tf.TensorSpec((None, 2), name="x")])
  with pytest.raises(ValueError, match=r"Argument `input_signature` must be "
                     r"2 tf.TensorSpecs"):
    saved_model(model, tmp_path / "m", input_signature={"a": (None, 2),
                                                        "b": (None, 2)})
  with pytest.raises(ValueError, match=r"Argument `input_signature` must be "
                     r"a flat sequence of tf.TensorSpecs"):
    saved_model(tf.function(lambda x: x), tmp_path / "m",
                input_signature={"x": tf.TensorSpec((None,))})
  with pytest.raises(ValueError, match=r"Argument `specs` must be "
                     r"TensorSpecs of float, integer or bool dtype"):
    sample_batch([tf.TensorSpec((None,), tf.string, name="text")], 2)
  with pytest.raises(ValueError, match=r"Argument `batch_size` must be a "
                     r"positive integer"):
    sample_batch([tf.TensorSpec((None,), name="x")], 0)
  assert not os.listdir(tmp_path)


def test_clashing_keys_export_under_an_input_signature(tmp_path):
  model = _clashing_keys()
  spec = lambda name: tf.TensorSpec((None, 2), tf.float32, name=name)
  report = saved_model(model, tmp_path / "m", serving_check=False,
                       input_signature={"a": {"x": spec("a_x")},
                                        "b": {"x": spec("b_x")}})
  assert report.inputs == {"a_x": ((None, 2), "float32"),
                           "b_x": ((None, 2), "float32")}
  a, b = np.ones((2, 2), "float32"), np.full((2, 2), 2.0, "float32")
  signature = tf.saved_model.load(str(tmp_path / "m")).signatures[SIGNATURE]
  np.testing.assert_allclose(
      signature(a_x=tf.constant(a), b_x=tf.constant(b))["sum"].numpy(),
      model.predict({"a": {"x": a}, "b": {"x": b}}, verbose=0))
