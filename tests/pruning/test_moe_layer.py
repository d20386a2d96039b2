"""tfopt's MoE layer against a NumPy forward pass; XLA, saving, errors."""

import os

import keras
import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.pruning import MoE


def _numpy_moe(x, router, gate, up, down, top_k):
  tokens = x.reshape(-1, x.shape[-1]).astype(np.float64)
  logits = tokens @ router
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = np.zeros_like(tokens)
  gates = np.zeros_like(probs)
  for t in range(len(tokens)):
    top = np.argsort(-probs[t], kind="stable")[:top_k]
    weights = probs[t, top] / probs[t, top].sum()
    for e, g in zip(top, weights):
      gates[t, e] = g
      a = tokens[t] @ gate[e]
      hidden = a / (1 + np.exp(-a)) * (tokens[t] @ up[e])
      out[t] += g * (hidden @ down[e])
  return out.reshape(x.shape), gates, probs


def _layer(seed=0, **kwargs):
  keras.utils.set_random_seed(seed)
  layer = MoE(num_experts=4, expert_dim=6, top_k=2, **kwargs)
  layer.build((None, 5, 8))
  return layer


def test_forward_matches_numpy():
  layer = _layer()
  x = np.random.default_rng(0).normal(size=(3, 5, 8)).astype("float32")
  w = [np.asarray(v, np.float64) for v in
       (layer.router, layer.gate_kernel, layer.up_kernel, layer.down_kernel)]
  expected, gates, _ = _numpy_moe(x, *w, top_k=2)
  np.testing.assert_allclose(np.asarray(layer(x)), expected, atol=1e-5)
  np.testing.assert_allclose(np.asarray(layer.routing(x.reshape(-1, 8))[0]),
                             gates, atol=1e-6)
  assert ((gates > 0).sum(axis=1) == 2).all()


def test_load_balancing_loss_value():
  layer = _layer(load_balance_coef=0.5)
  x = np.random.default_rng(1).normal(size=(2, 5, 8)).astype("float32")
  w = [np.asarray(v, np.float64) for v in
       (layer.router, layer.gate_kernel, layer.up_kernel, layer.down_kernel)]
  _, gates, probs = _numpy_moe(x, *w, top_k=2)
  f = (gates > 0).mean(axis=0) / 2
  expected = 0.5 * 4 * np.sum(f * probs.mean(axis=0))
  layer(x, training=True)
  assert len(layer.losses) == 1
  assert float(layer.losses[0]) == pytest.approx(expected, rel=1e-5)
  layer(x, training=False)
  assert not layer.losses


def test_trains_under_xla_and_saves(tmp_path):
  keras.utils.set_random_seed(0)
  inp = keras.Input((5, 8))
  out = keras.layers.Dense(3)(MoE(4, 6, name="moe")(inp))
  model = keras.Model(inp, out)
  model.compile("adam", "mse", jit_compile=True)
  rng = np.random.default_rng(2)
  x = rng.normal(size=(16, 5, 8)).astype("float32")
  y = rng.normal(size=(16, 5, 3)).astype("float32")
  before = model.get_layer("moe").router.numpy().copy()
  history = model.fit(x, y, epochs=3, verbose=0)
  assert history.history["loss"][-1] < history.history["loss"][0]
  assert not np.array_equal(before, model.get_layer("moe").router.numpy())
  path = os.path.join(tmp_path, "m.keras")
  model.save(path)
  loaded = keras.saving.load_model(path)
  np.testing.assert_array_equal(loaded.predict(x, verbose=0),
                                model.predict(x, verbose=0))
  assert loaded.get_layer("moe").get_config()["top_k"] == 2


@pytest.mark.parametrize("kwargs,match", [
    ({"num_experts": 1, "expert_dim": 4}, "num_experts.*at least 2"),
    ({"num_experts": 4, "expert_dim": 0}, "expert_dim.*positive integer"),
    ({"num_experts": 4, "expert_dim": 4, "top_k": 5},
     "top_k.*at most num_experts=4"),
    ({"num_experts": 4, "expert_dim": 4, "load_balance_coef": -1},
     "load_balance_coef"),
])
def test_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    MoE(**kwargs)
