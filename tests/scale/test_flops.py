"""FLOPs of a compiled train step from its XLA HLO, against hand-derived
analytic counts: Dense (no input gradient for the first layer), Conv
(strides, padding taps not counted), attention (batched matmuls, Einsum)."""

import keras
import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.scale.flops import hlo_flops, train_step_flops


def _compiled(model):
  model.compile(keras.optimizers.SGD(0.1), "mse")
  return model


def test_dense_mlp():
  b, sizes = 4, [6, 5, 3, 2]
  model = _compiled(keras.Sequential(
      [keras.Input((sizes[0],))] +
      [keras.layers.Dense(n, activation="relu") for n in sizes[1:]]))
  x = np.zeros((b, sizes[0]), "float32")
  y = np.zeros((b, sizes[-1]), "float32")
  fwd = [2 * b * i * o for i, o in zip(sizes, sizes[1:])]
  # Backward: weight gradients everywhere, input gradients except for the
  # first layer (its input is data, not a variable).
  expected = sum(fwd) + sum(fwd) + sum(fwd[1:])
  assert train_step_flops(model, x, y).total == expected


def _useful_pairs(in_size, kernel, stride, pad_lo, out_size):
  return sum(1 for o in range(out_size) for t in range(kernel)
             if 0 <= o * stride + t - pad_lo < in_size)


@pytest.mark.parametrize("stride,padding", [(1, "valid"), (2, "valid"),
                                            (1, "same"), (2, "same")])
def test_conv(stride, padding):
  b, h, cin, cout, k = 2, 9, 3, 4, 3
  model = _compiled(keras.Sequential([
      keras.Input((h, h, cin)),
      keras.layers.Conv2D(cout, k, strides=stride, padding=padding),
      keras.layers.Conv2D(cout, k, strides=stride, padding=padding),
      keras.layers.GlobalAveragePooling2D()]))
  x = np.zeros((b, h, h, cin), "float32")
  y = np.zeros((b, cout), "float32")
  expected = 0
  size = h
  for layer, ci in zip(model.layers[:2], (cin, cout)):
    out = layer.compute_output_shape((b, size, size, ci))[1]
    pad_lo = max((out - 1) * stride + k - size, 0) // 2 \
        if padding == "same" else 0
    pairs = _useful_pairs(size, k, stride, pad_lo, out) ** 2
    fwd = 2 * b * cout * ci * pairs
    expected += fwd * (2 if layer is model.layers[0] else 3)
    size = out
  assert train_step_flops(model, x, y).total == expected


def test_attention_counts_the_batched_matmuls():
  b, t, d, heads, dh = 2, 5, 8, 2, 3
  inputs = keras.Input((t, d))
  out = keras.layers.MultiHeadAttention(heads, dh)(inputs, inputs)
  model = _compiled(keras.Model(inputs, out))
  x = np.zeros((b, t, d), "float32")
  y = np.zeros((b, t, d), "float32")
  qkv = 3 * 2 * b * t * d * heads * dh
  scores = 2 * b * heads * t * t * dh
  mix = 2 * b * heads * t * t * dh
  proj = 2 * b * t * heads * dh * d
  # Q/K/V: forward + weight gradient (the input is data); scores, mixing
  # and the output projection: forward + two gradients.
  expected = 2 * qkv + 3 * (scores + mix + proj)
  count = train_step_flops(model, x, y)
  assert count.total == expected
  assert set(count.by_kind()) == {"dot"}


def test_hlo_text_errors_and_grouped_conv():
  text = ("%c = f32[1,4,4,6]{3,2,1,0} convolution(f32[1,4,4,6]{3,2,1,0} %a, "
          "f32[3,3,2,6]{3,2,1,0} %w), window={size=3x3 pad=1_1x1_1}, "
          "dim_labels=b01f_01io->b01f, feature_group_count=3")
  # 3 groups of 2 input channels: 2 * 6 outputs * 2 in/group * 10^2 pairs
  # (4 outputs x 3 taps, minus the 2 padding taps, per dimension).
  assert hlo_flops(text).total == 2 * 1 * 6 * 2 * 10 * 10
  with pytest.raises(ValueError, match="Argument `model` must be a compiled"):
    train_step_flops(keras.Sequential([keras.Input((2,))]), None)
  with pytest.raises(ValueError, match="Argument `text`"):
    hlo_flops(b"bytes")
