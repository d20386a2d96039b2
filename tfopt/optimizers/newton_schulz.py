"""Newton-Schulz orthogonalization and Muon's update scaling, as functions.

`newton_schulz(g)` approximates U V^T of g = U S V^T with the quintic
iteration X <- a X + (b A + c A^2) X, A = X X^T, using the coefficients
published with Muon, (a, b, c) = (3.4445, -4.7750, 2.0315), five steps, on
g / (||g||_F + 1e-7). Tall matrices are transposed so that A is the small
Gram matrix. The operation order is Keras' (`Muon.zeropower_via_newtonschulz5`)
so tfopt's Muon step equals Keras' bit for bit; unlike Keras' Muon the whole
step runs in the variable's dtype, float64 included.
"""

from __future__ import annotations

import math

from keras import ops

MUON_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
SCALE_MODES = ("rms", "keller", "none")


def _swap_last_axes(x):
  order = list(range(len(x.shape)))
  order[-2], order[-1] = order[-1], order[-2]
  return ops.transpose(x, order)


def newton_schulz(x, steps: int = 5, coefficients=MUON_COEFFICIENTS,
                  epsilon: float = 1e-7):
  """Approximately orthogonalizes the last two axes of `x` (>= 2-D).

  The result has singular values in roughly [0.7, 1.2] (not exactly 1: the
  coefficients trade accuracy for a steep slope at zero).

  >>> import numpy as np
  >>> g = np.random.default_rng(0).normal(size=(8, 4))
  >>> s = np.linalg.svd(np.asarray(newton_schulz(g)), compute_uv=False)
  >>> bool(s.min() > 0.6 and s.max() < 1.25)
  True
  """
  rows, cols = x.shape[-2], x.shape[-1]
  a, b, c = coefficients
  tall = rows > cols
  if tall:
    x = _swap_last_axes(x)
  # sqrt(sum(x^2)) rather than ops.norm: Keras' JAX norm returns float32
  # for float64 input; on TensorFlow both are the same operations.
  frobenius = ops.sqrt(ops.sum(ops.square(x), axis=(-2, -1), keepdims=True))
  x = x / (frobenius + epsilon)
  for _ in range(steps):
    gram = x @ _swap_last_axes(x)
    poly = b * gram + c * gram @ gram
    x = a * x + poly @ x
  if tall:
    x = _swap_last_axes(x)
  return x


def scale_factors(rows: int, cols: int, scale_mode: str,
                  rms_rate: float = 0.2) -> tuple[float, ...]:
  """The factors Muon multiplies its orthogonalized update by, in order.

  * "rms" (Moonlight): sqrt(max(rows, cols)) then rms_rate, which gives the
    update the RMS of an AdamW update, so AdamW's lr and wd carry over. Two
    factors, applied one after the other as Keras does.
  * "keller" (Keller Jordan's Muon): sqrt(max(1, fan_out / fan_in)). His
    PyTorch weights are (out, in) and scale by sqrt(max(1, size(-2) /
    size(-1))); a Keras kernel is (in, out) -- `rows` is fan-in, `cols`
    fan-out -- so here sqrt(max(1, cols / rows)).
  * "none": no scaling.

  >>> scale_factors(64, 16, "rms")
  (8.0, 0.2)
  >>> scale_factors(16, 64, "keller")    # 16 inputs, 64 outputs
  (2.0,)
  >>> scale_factors(64, 16, "keller")    # more inputs than outputs
  (1.0,)
  >>> scale_factors(64, 16, "none")
  ()
  """
  if scale_mode == "rms":
    return (math.sqrt(max(rows, cols)), rms_rate)
  if scale_mode == "keller":
    return (math.sqrt(max(1.0, cols / rows)),)
  return ()
