"""The model families of the compatibility suite: models no one here wrote
(keras-hub task models and backbones, keras.applications CNNs, Keras RNNs),
each in a tiny random-weight configuration, with the data and the compile
arguments a user would train it with.

One table (`FAMILIES`), read by every battery of `tests/compat` and by the
script that trains them on logical devices (`_placed_script.py`). Nothing is
downloaded: tokenizers are built from in-code vocabularies.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import keras
import numpy as np

SEQ = 16          # tokens per example
VOCAB = 64        # token ids of the tiny LMs without a tokenizer
EXAMPLES = 16     # examples per fit: 2 batches of 8
BATCH = 8

TEXT = ["the quick brown fox", "jumps over the lazy dog", "hello world",
        "keras hub on tensorflow", "a b c d e f g", "graphs of ops",
        "placed on two devices", "pruned experts"] * 2


@dataclasses.dataclass(frozen=True)
class Family:
  """One row of the matrix.

  Attributes:
    name: the row's name in the matrix.
    build: a fresh model, same weights every call (seeded).
    data: the `fit` keyword arguments (x, y, sample_weight, batch_size).
    kind: "lm" (token ids -> next-token logits, weighted by the padding
      mask), "text" (text classification), "image" or "sequence".
    moe: its blocks are mixture-of-experts layers tfopt can prune.
    needs: modules the row needs beyond keras (skipped with the reason
      where missing).
  """
  name: str
  build: Callable[[], keras.Model]
  data: Callable[[], dict]
  kind: str
  moe: bool = False
  needs: tuple[str, ...] = ()

  def compile_kwargs(self) -> dict[str, Any]:
    """What a user passes to `compile` for this kind of model."""
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if self.kind in ("lm", "text"):
      return dict(optimizer=keras.optimizers.Adam(1e-3), loss=loss,
                  weighted_metrics=["sparse_categorical_accuracy"])
    return dict(optimizer=keras.optimizers.Adam(1e-3), loss=loss,
                metrics=["sparse_categorical_accuracy"])


def _seeded(fn):
  def build():
    keras.utils.set_random_seed(0)
    return fn()
  return build


# -- Language models ---------------------------------------------------------
def _lm_batch() -> dict:
  """Token ids, next-token targets and the padding mask as sample weights:
  what a keras-hub CausalLM preprocessor feeds. The mask is int32, the
  dtype the backbones declare (a bool mask fails in plain Keras under a
  MirroredStrategy: "AddN" has no bool kernel)."""
  rng = np.random.default_rng(0)
  ids = rng.integers(1, VOCAB, (EXAMPLES, SEQ + 1)).astype("int32")
  lengths = rng.integers(SEQ // 2, SEQ + 1, EXAMPLES)
  mask = np.arange(SEQ)[None, :] < lengths[:, None]
  x = {"token_ids": np.where(mask, ids[:, :-1], 0).astype("int32"),
       "padding_mask": mask.astype("int32")}
  return dict(x=x, y=np.where(mask, ids[:, 1:], 0).astype("int32"),
              sample_weight=mask.astype("float32"), batch_size=BATCH)


def _hub_lm(task: str, backbone: str, **config):
  def build():
    import keras_hub  # pylint: disable=g-import-not-at-top
    net = getattr(keras_hub.models, backbone)(vocabulary_size=VOCAB,
                                              **config)
    return getattr(keras_hub.models, task)(backbone=net, preprocessor=None)
  return _seeded(build)


def _gpt2_tokenizer():
  """A byte-level BPE vocabulary in code: printable ASCII, the space
  marker and one merge."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  vocab = {"<|endoftext|>": 0}
  for c in [chr(c) for c in range(33, 127)] + ["\u0120", "th"]:
    vocab[c] = len(vocab)
  return keras_hub.models.GPT2Tokenizer(vocabulary=vocab, merges=["t h"])


@_seeded
def _gpt2_causal_lm():
  import keras_hub  # pylint: disable=g-import-not-at-top
  tokenizer = _gpt2_tokenizer()
  preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(
      tokenizer=tokenizer, sequence_length=SEQ)
  backbone = keras_hub.models.GPT2Backbone(
      vocabulary_size=tokenizer.vocabulary_size(), num_layers=2, num_heads=2,
      hidden_dim=32, intermediate_dim=64, max_sequence_length=32)
  return keras_hub.models.GPT2CausalLM(backbone=backbone,
                                       preprocessor=preprocessor)


@_seeded
def _bert_classifier():
  import keras_hub  # pylint: disable=g-import-not-at-top
  words = sorted({w for line in TEXT for w in line.split()})
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
  tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocab)
  preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
      tokenizer=tokenizer, sequence_length=SEQ)
  backbone = keras_hub.models.BertBackbone(
      vocabulary_size=len(vocab), num_layers=2, num_heads=2, hidden_dim=32,
      intermediate_dim=64, max_sequence_length=32, dropout=0.1)
  return keras_hub.models.BertTextClassifier(
      backbone=backbone, preprocessor=preprocessor, num_classes=3)


def _text_data() -> dict:
  return dict(x=list(TEXT), batch_size=BATCH)


def _labelled_text() -> dict:
  return dict(x=list(TEXT), y=np.arange(len(TEXT)) % 3, batch_size=BATCH)


# -- Images and sequences ----------------------------------------------------
def _images(size: int = 32) -> Callable[[], dict]:
  def data():
    rng = np.random.default_rng(0)
    return dict(x=rng.standard_normal((EXAMPLES, size, size, 3)).astype(
        "float32"), y=rng.integers(0, 3, EXAMPLES), batch_size=BATCH)
  return data


@_seeded
def _hub_resnet():
  import keras_hub  # pylint: disable=g-import-not-at-top
  backbone = keras_hub.models.ResNetBackbone(
      input_conv_filters=[64], input_conv_kernel_sizes=[3],
      stackwise_num_filters=[64, 32], stackwise_num_blocks=[1, 1],
      stackwise_num_strides=[1, 2], block_type="basic_block",
      image_shape=(32, 32, 3))
  return keras_hub.models.ResNetImageClassifier(backbone=backbone,
                                                num_classes=3)


@_seeded
def _mobilenet():
  # MobileNet (v1): depthwise convolutions and batch norm. MobileNetV2 at
  # alpha 0.35 took 36 s for its hook row on 2 cores, this 16 s.
  return keras.applications.MobileNet(
      input_shape=(32, 32, 3), alpha=0.25, weights=None, classes=3,
      classifier_activation=None)


@_seeded
def _hub_efficientnet():
  # Two MBConv stages with squeeze-and-excite: B0's blocks, not its depth
  # (keras.applications' EfficientNetB0 took 110 s for one row on 2 cores).
  import keras_hub  # pylint: disable=g-import-not-at-top
  backbone = keras_hub.models.EfficientNetBackbone(
      stackwise_width_coefficients=[1.0, 1.0],
      stackwise_depth_coefficients=[1.0, 1.0],
      stackwise_kernel_sizes=[3, 3], stackwise_num_repeats=[1, 2],
      stackwise_input_filters=[16, 16], stackwise_output_filters=[16, 24],
      stackwise_expansion_ratios=[1, 4],
      stackwise_squeeze_and_excite_ratios=[0.25, 0.25],
      stackwise_strides=[1, 2], stackwise_block_types=["v1", "v1"],
      stackwise_force_input_filters=[0, 0],
      stackwise_nores_option=[False, False], num_features=64,
      input_shape=(32, 32, 3))
  return keras_hub.models.EfficientNetImageClassifier(backbone=backbone,
                                                      num_classes=3)


def _rnn(layer: str):
  @_seeded
  def build():
    inputs = keras.Input((10, 8))
    h = getattr(keras.layers, layer)(16, return_sequences=True)(inputs)
    h = getattr(keras.layers, layer)(16)(h)
    return keras.Model(inputs, keras.layers.Dense(3)(h))
  return build


def _sequences() -> dict:
  rng = np.random.default_rng(0)
  return dict(x=rng.standard_normal((EXAMPLES, 10, 8)).astype("float32"),
              y=rng.integers(0, 3, EXAMPLES), batch_size=BATCH)


_HUB = ("keras_hub",)
_TEXT = ("keras_hub", "tensorflow_text")

FAMILIES = [
    Family("keras-hub GPT-2 CausalLM + preprocessor", _gpt2_causal_lm,
           _text_data, "lm", needs=_TEXT),
    Family("keras-hub Llama CausalLM", _hub_lm(
        "LlamaCausalLM", "LlamaBackbone", num_layers=2, num_query_heads=4,
        num_key_value_heads=2, hidden_dim=32, intermediate_dim=64),
           _lm_batch, "lm", needs=_HUB),
    Family("keras-hub Gemma CausalLM", _hub_lm(
        "GemmaCausalLM", "GemmaBackbone", num_layers=2, num_query_heads=2,
        num_key_value_heads=1, hidden_dim=32, intermediate_dim=64,
        head_dim=16), _lm_batch, "lm", needs=_HUB),
    Family("keras-hub BERT classifier + preprocessor", _bert_classifier,
           _labelled_text, "text", needs=_TEXT),
    Family("keras-hub Mixtral CausalLM", _hub_lm(
        "MixtralCausalLM", "MixtralBackbone", num_layers=2, num_query_heads=4,
        num_key_value_heads=2, hidden_dim=32, intermediate_dim=32,
        num_experts=4, top_k=2), _lm_batch, "lm", moe=True, needs=_HUB),
    Family("keras-hub Qwen3-MoE CausalLM", _hub_lm(
        "Qwen3MoeCausalLM", "Qwen3MoeBackbone", num_layers=2,
        num_query_heads=4, num_key_value_heads=2, hidden_dim=32,
        intermediate_dim=64, moe_intermediate_dim=32, num_experts=4,
        head_dim=8, top_k=2), _lm_batch, "lm", moe=True, needs=_HUB),
    Family("keras-hub GPT-OSS CausalLM", _hub_lm(
        "GptOssCausalLM", "GptOssBackbone", num_layers=2, num_query_heads=4,
        num_key_value_heads=2, hidden_dim=32, intermediate_dim=32,
        num_experts=4, top_k=2, head_dim=8), _lm_batch, "lm", moe=True,
           needs=_HUB),
    Family("keras-hub ResNet classifier", _hub_resnet, _images(), "image",
           needs=_HUB),
    Family("keras.applications MobileNet", _mobilenet, _images(), "image"),
    Family("keras-hub EfficientNet classifier", _hub_efficientnet,
           _images(), "image", needs=_HUB),
    Family("Keras LSTM", _rnn("LSTM"), _sequences, "sequence"),
]

BY_NAME = {f.name: f for f in FAMILIES}
