"""Built-in models, constructed in code (no downloads), compiled and ready
for `capture_train_step`.

Each builder returns a `ZooModel`: the compiled Keras model and a function
making one example batch (x, y) of a given size. Sizes default to the
published architectures; the small ones (mlp, small_cnn) profile in seconds
on a CPU and are what the tests use.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from tfopt._errors import check_positive_int, invalid_argument


@dataclasses.dataclass(frozen=True)
class ZooModel:
  """A compiled model and a maker of example batches."""
  name: str
  model: Any  # keras.Model; keras is imported lazily.
  make_batch: Callable[[int, int], tuple]

  def batch(self, batch_size: int, seed: int = 0) -> tuple:
    """One example batch (x, y) of `batch_size` rows."""
    check_positive_int("batch_size", batch_size)
    return self.make_batch(batch_size, seed)


def _labelled(shape, classes, integer_inputs=False):
  def make(batch_size, seed):
    rng = np.random.default_rng(seed)
    if integer_inputs:
      x = rng.integers(0, classes, size=(batch_size,) + shape).astype(np.int32)
    else:
      x = rng.standard_normal((batch_size,) + shape).astype(np.float32)
    y_shape = (batch_size,) + (shape if integer_inputs else ())
    y = rng.integers(0, classes, size=y_shape).astype(np.int32)
    return x, y
  return make


def _sparse_ce():
  import keras
  return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def mlp(*, input_dim: int = 784, hidden: tuple[int, ...] = (512, 512),
        classes: int = 10, optimizer: Any = "adam") -> ZooModel:
  """A multi-layer perceptron classifier (MNIST-sized by default)."""
  import keras
  x = inp = keras.Input((input_dim,), name="features")
  for i, width in enumerate(hidden):
    x = keras.layers.Dense(width, activation="relu", name=f"dense_{i}")(x)
  out = keras.layers.Dense(classes, name="logits")(x)
  model = keras.Model(inp, out, name="mlp")
  model.compile(optimizer=optimizer, loss=_sparse_ce())
  return ZooModel("mlp", model, _labelled((input_dim,), classes))


def small_cnn(*, image_size: int = 32, classes: int = 10,
              optimizer: Any = "adam") -> ZooModel:
  """Two conv blocks with batch norm and a dense head (CIFAR-sized)."""
  import keras
  L = keras.layers
  inp = keras.Input((image_size, image_size, 3), name="image")
  x = inp
  for i, filters in enumerate((32, 64)):
    x = L.Conv2D(filters, 3, padding="same", use_bias=False,
                 name=f"conv_{i}")(x)
    x = L.BatchNormalization(name=f"bn_{i}")(x)
    x = L.ReLU(name=f"relu_{i}")(x)
    x = L.MaxPooling2D(name=f"pool_{i}")(x)
  x = L.GlobalAveragePooling2D(name="gap")(x)
  out = L.Dense(classes, name="logits")(x)
  model = keras.Model(inp, out, name="small_cnn")
  model.compile(optimizer=optimizer, loss=_sparse_ce())
  return ZooModel("small_cnn", model,
                  _labelled((image_size, image_size, 3), classes))


def _application(name: str, app_name: str, image_size: int, classes: int,
                 optimizer: Any) -> ZooModel:
  """A keras.applications model with random weights (weights=None)."""
  import keras
  builder = getattr(keras.applications, app_name)
  model = builder(weights=None, input_shape=(image_size, image_size, 3),
                  classes=classes, classifier_activation=None)
  model.compile(optimizer=optimizer, loss=_sparse_ce())
  return ZooModel(name, model, _labelled((image_size, image_size, 3), classes))


def resnet50(*, image_size: int = 224, classes: int = 1000,
             optimizer: Any = "adam") -> ZooModel:
  """keras.applications.ResNet50 with random weights (weights=None)."""
  return _application("resnet50", "ResNet50", image_size, classes, optimizer)


def inception_v3(*, image_size: int = 299, classes: int = 1000,
                 optimizer: Any = "adam") -> ZooModel:
  """keras.applications.InceptionV3 with random weights (weights=None)."""
  if image_size < 75:
    raise invalid_argument("image_size", "at least 75 for Inception-V3",
                           image_size)
  return _application("inception_v3", "InceptionV3", image_size, classes,
                      optimizer)


def _embed(tokens, vocab_size: int, seq_len: int, d_model: int):
  """Token plus learned position embeddings of int tokens (batch, seq)."""
  import keras
  L = keras.layers
  x = L.Embedding(vocab_size, d_model, name="embed")(tokens)
  # Position ids derived from the input tensor so the position embedding is
  # a node of the functional graph (trained and saved); embedding a constant
  # `arange` is evaluated once at construction and frozen into the graph.
  position_ids = keras.ops.cumsum(keras.ops.ones_like(tokens), axis=1) - 1
  return x + L.Embedding(seq_len, d_model, name="pos_embed")(position_ids)


def _causal_attention(x, i: int, d_model: int, num_heads: int):
  """Block i's pre-norm causal self-attention with its residual."""
  import keras
  L = keras.layers
  h = L.LayerNormalization(name=f"block_{i}_ln1")(x)
  h = L.MultiHeadAttention(num_heads, d_model // num_heads,
                           name=f"block_{i}_attn")(h, h, use_causal_mask=True)
  return x + h


def _causal_lm(name: str, vocab_size: int, seq_len: int, num_layers: int,
               d_model: int, num_heads: int, feed_forward, optimizer
               ) -> ZooModel:
  """Pre-norm causal LM: embeddings, blocks of attention and
  `feed_forward(h, i)` (each with its residual), final norm, vocabulary
  head; compiled."""
  import keras
  L = keras.layers
  tokens = keras.Input((seq_len,), dtype="int32", name="tokens")
  x = _embed(tokens, vocab_size, seq_len, d_model)
  for i in range(num_layers):
    x = _causal_attention(x, i, d_model, num_heads)
    x = x + feed_forward(L.LayerNormalization(name=f"block_{i}_ln2")(x), i)
  x = L.LayerNormalization(name="final_ln")(x)
  logits = L.Dense(vocab_size, name="lm_head")(x)
  model = keras.Model(tokens, logits, name=name)
  model.compile(optimizer=optimizer, loss=_sparse_ce())
  return ZooModel(name, model,
                  _labelled((seq_len,), vocab_size, integer_inputs=True))


def transformer_lm(*, vocab_size: int = 8000, seq_len: int = 128,
                   num_layers: int = 4, d_model: int = 256, num_heads: int = 4,
                   d_ff: int = 1024, optimizer: Any = "adam") -> ZooModel:
  """A causal Transformer language model: a stack of pre-norm blocks."""
  import keras
  L = keras.layers

  def mlp_block(h, i):
    h = L.Dense(d_ff, activation="gelu", name=f"block_{i}_ff1")(h)
    return L.Dense(d_model, name=f"block_{i}_ff2")(h)

  return _causal_lm("transformer_lm", vocab_size, seq_len, num_layers,
                    d_model, num_heads, mlp_block, optimizer)


def moe_lm(*, vocab_size: int = 256, seq_len: int = 128, num_layers: int = 2,
           d_model: int = 128, num_heads: int = 4, num_experts: int = 8,
           expert_dim: int = 128, top_k: int = 2,
           load_balance_coef: float = 0.01,
           optimizer: Any = "adam") -> ZooModel:
  """A causal mixture-of-experts language model (byte-level by default):
  pre-norm blocks of attention and a `tfopt.pruning.MoE` feed-forward
  (Mixtral-style top-k SwiGLU experts). MoE layers are named block_{i}_moe."""
  from tfopt.pruning.moe_layer import MoE

  def moe_block(h, i):
    return MoE(num_experts, expert_dim, top_k=top_k,
               load_balance_coef=load_balance_coef, name=f"block_{i}_moe")(h)

  return _causal_lm("moe_lm", vocab_size, seq_len, num_layers, d_model,
                    num_heads, moe_block, optimizer)


def gnmt(*, vocab_size: int = 8000, seq_len: int = 16, units: int = 256,
         encoder_layers: int = 2, decoder_layers: int = 2,
         optimizer: Any = "adam") -> ZooModel:
  """A GNMT-like LSTM encoder-decoder with attention.

  The LSTMs are unrolled (`unroll=True`), so every time step's ops are
  separate, placeable ops -- as in the GNMT graphs Baechi placed -- rather
  than one opaque `While` loop.
  """
  import keras
  L = keras.layers
  source = keras.Input((seq_len,), dtype="int32", name="source")
  target_in = keras.Input((seq_len,), dtype="int32", name="target_in")
  x = L.Embedding(vocab_size, units, name="src_embed")(source)
  x = L.Bidirectional(L.LSTM(units // 2, return_sequences=True, unroll=True),
                      name="encoder_0")(x)
  for i in range(1, encoder_layers):
    x = x + L.LSTM(units, return_sequences=True, unroll=True,
                   name=f"encoder_{i}")(x)
  memory = x
  y = L.Embedding(vocab_size, units, name="tgt_embed")(target_in)
  for i in range(decoder_layers):
    y = L.LSTM(units, return_sequences=True, unroll=True,
               name=f"decoder_{i}")(y)
    if i == 0:
      context = L.Attention(name="attention")([y, memory])
      y = L.Concatenate(name="attend")([y, context])
  logits = L.Dense(vocab_size, name="logits")(y)
  model = keras.Model([source, target_in], logits, name="gnmt")
  model.compile(optimizer=optimizer, loss=_sparse_ce())

  def make(batch_size, seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, vocab_size, (batch_size, seq_len)).astype(np.int32)
    tgt = rng.integers(0, vocab_size, (batch_size, seq_len)).astype(np.int32)
    out = rng.integers(0, vocab_size, (batch_size, seq_len)).astype(np.int32)
    return [src, tgt], out

  return ZooModel("gnmt", model, make)


def towers(*, input_dim: int = 512, towers: int = 2,  # pylint: disable=redefined-outer-name
           depth: int = 6, width: int = 1024, classes: int = 10,
           optimizer: Any = "adam") -> ZooModel:
  """A wide multi-tower MLP: `towers` parallel stacks of `depth`
  Dense(`width`, relu) layers reading one input, concatenated into the
  classifier. Its towers are independent until the concatenation (and
  after it, back to it): the branchy model that placement on devices that
  really compute apart can run side by side (`tfopt.placement.m_branch`).
  """
  import keras
  for name, value in (("towers", towers), ("depth", depth),
                      ("width", width), ("input_dim", input_dim)):
    check_positive_int(name, value)
  inp = keras.Input((input_dim,), name="features")
  outs = []
  for t in range(towers):
    x = inp
    for i in range(depth):
      x = keras.layers.Dense(width, activation="relu",
                             name=f"tower{t}_dense{i}")(x)
    outs.append(x)
  x = (keras.layers.Concatenate(name="join")(outs) if towers > 1
       else outs[0])
  out = keras.layers.Dense(classes, name="logits")(x)
  model = keras.Model(inp, out, name="towers")
  model.compile(optimizer=optimizer, loss=_sparse_ce())
  return ZooModel("towers", model, _labelled((input_dim,), classes))


BUILDERS = {"mlp": mlp, "small_cnn": small_cnn, "resnet50": resnet50,
            "inception_v3": inception_v3, "transformer_lm": transformer_lm,
            "moe_lm": moe_lm, "gnmt": gnmt, "towers": towers}


def build(name: str, **kwargs) -> ZooModel:
  """Builds zoo model `name` (one of `BUILDERS`) with keyword overrides."""
  if name not in BUILDERS:
    raise invalid_argument("name", f"one of {sorted(BUILDERS)}", name)
  return BUILDERS[name](**kwargs)
