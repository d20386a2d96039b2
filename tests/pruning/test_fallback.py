"""The structural fallback on hand-written MoE layers no adapter knows: it
maps router and expert kernels, checks the mapping against the layer's own
call, prunes like a registered adapter, and refuses, naming the weights, what
it cannot reproduce."""

import re

import keras
import numpy as np
import pytest
from keras import ops

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.pruning import MoE, adapter_for, find_moe_layers, prune_moe
from tfopt.pruning.adapters import HIDDEN, INPUT
from tfopt.pruning.fallback import StructuralAdapter

D, SEQ, E, M = 16, 8, 4, 8
FEW = {"min_tokens": 1}  # masks are checked here, not statistics

ACTS = {"silu": ops.silu, "relu": ops.relu, "tanh": ops.tanh,
        "gelu_tanh": lambda x: ops.gelu(x, approximate=True)}


class CustomMoE(keras.layers.Layer):
  """A top-k MoE written without tfopt (its own routing arithmetic), in the
  forms the fallback should map, and some it should refuse.

  experts: "glu" (separate up and gate kernels, up created first),
  "fused" (one (E, d, 2m) kernel, gate the even columns) or "mlp".
  k_attr: the attribute holding k ("_k" hides it from the fallback).
  extra: None, "expert_bias" (an (E, d) bias after `down`) or "norm" (a
  LayerNormalization sublayer on the output).
  """

  def __init__(self, experts="glu", act="silu", normalize=True,
               router_bias=False, k_attr="top_k", extra=None, **kwargs):
    super().__init__(**kwargs)
    self.form, self.act, self.normalize = experts, ACTS[act], normalize
    self.router_bias, self.k_attr, self.extra = router_bias, k_attr, extra
    setattr(self, k_attr, 2)
    self.norm = (keras.layers.LayerNormalization(name="norm")
                 if extra == "norm" else None)

  def build(self, shape):
    add = lambda name, s: self.add_weight(name=name, shape=s)  # noqa: E731
    self.router = add("router", (D, E))
    self.bias = add("router_bias", (E,)) if self.router_bias else None
    if self.form == "glu":
      self.w_up, self.w_gate = add("w_up", (E, D, M)), add("w_gate", (E, D, M))
    else:
      self.w_in = add("w_in", (E, D, 2 * M if self.form == "fused" else M))
    self.w_down = add("w_down", (E, M, D))
    if self.extra == "expert_bias":
      self.expert_bias = add("expert_bias", (E, D))
    if self.norm is not None:
      self.norm.build(shape)

  def _gates(self, tokens):
    logits = tokens @ self.router
    if self.bias is not None:
      logits = logits + self.bias
    k = getattr(self, self.k_attr)
    top_v, top_i = ops.top_k(ops.softmax(logits), k=k)
    if self.normalize:
      top_v = top_v / ops.sum(top_v, axis=-1, keepdims=True)
    return ops.sum(ops.one_hot(top_i, E) * top_v[..., None], axis=1)

  def _hidden(self, tokens):
    if self.form == "glu":
      return (self.act(ops.einsum("td,edm->etm", tokens, self.w_gate))
              * ops.einsum("td,edm->etm", tokens, self.w_up))
    h = ops.einsum("td,edm->etm", tokens, self.w_in)
    if self.form == "fused":
      return self.act(h[..., 0::2]) * h[..., 1::2]
    return self.act(h)

  def call(self, x):
    tokens = ops.reshape(x, (-1, D))
    out = ops.einsum("etm,emd->etd", self._hidden(tokens), self.w_down)
    if self.extra == "expert_bias":
      out = out + self.expert_bias[:, None, :]
    y = ops.einsum("te,etd->td", self._gates(tokens), out)
    if self.norm is not None:
      y = self.norm(y)
    return ops.reshape(y, ops.shape(x))


def _model(moe):
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((SEQ, D)),
                            keras.layers.Dense(D, name="embed"), moe])
  if getattr(moe, "bias", None) is not None:  # zero-initialized: random
    moe.bias.assign(np.random.default_rng(4).normal(0, 0.3, (E,)))
  return model


def _data(n=24, seed=0):
  return np.random.default_rng(seed).normal(size=(n, SEQ, D)).astype(
      "float32")


def _layer_matches(layer, seed=1):
  tokens = np.random.default_rng(seed).normal(size=(3 * SEQ, D)).astype(
      "float32")
  np.testing.assert_allclose(
      np.asarray(adapter_for(layer).combine(layer, tokens)),
      np.asarray(layer(tokens)), atol=1e-5)


@pytest.mark.parametrize("method", ["moe_pruner", "sparsegpt"])
def test_fallback_prunes_like_the_registered_layer(method):
  # CustomMoE("glu") computes what tfopt's MoE computes; with the same
  # weights, the fallback must prune it exactly as MoE's adapter does.
  custom_model = _model(CustomMoE(name="custom_moe"))
  moe_model = _model(MoE(num_experts=E, expert_dim=M, name="moe"))
  moe = moe_model.layers[-1]
  custom = custom_model.layers[-1]
  moe_model.layers[0].set_weights(custom_model.layers[0].get_weights())
  for name, var in [("router", moe.router), ("w_gate", moe.gate_kernel),
                    ("w_up", moe.up_kernel), ("w_down", moe.down_kernel)]:
    var.assign(getattr(custom, name))
  x = _data()
  np.testing.assert_allclose(custom_model(x), moe_model(x), atol=1e-5)
  assert find_moe_layers(custom_model) == [custom]
  adapter = adapter_for(custom)
  assert isinstance(adapter, StructuralAdapter)
  assert "silu(x w_gate) * (x w_up)" in adapter.describe()
  got = prune_moe(custom_model, x, method=method, sparsity=0.5, verbose=0,
                  **FEW)
  want = prune_moe(moe_model, x, method=method, sparsity=0.5, verbose=0,
                   **FEW)
  for name, var in [("w_gate", moe.gate_kernel), ("w_up", moe.up_kernel),
                    ("w_down", moe.down_kernel)]:
    path = getattr(custom, name).path
    np.testing.assert_array_equal(got.masks[path], want.masks[var.path])
    np.testing.assert_allclose(getattr(custom, name).numpy(), var.numpy(),
                               atol=1e-5)
  np.testing.assert_allclose(custom_model(x), moe_model(x), atol=1e-5)


FORMS = {  # name: (CustomMoE kwargs, expected (kernel, stage) list)
    "fused_interleaved_gelu_router_bias": (
        dict(experts="fused", act="gelu_tanh", router_bias=True,
             k_attr="num_experts_per_tok"),
        [("w_in", INPUT), ("w_down", HIDDEN)]),
    "mlp_relu_unnormalized_k_unstated": (
        dict(experts="mlp", act="relu", normalize=False, k_attr="_k"),
        [("w_in", INPUT), ("w_down", HIDDEN)]),
    "glu_silu": (dict(), [("w_up", INPUT), ("w_gate", INPUT),
                          ("w_down", HIDDEN)]),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_fallback_maps_verifies_and_prunes(form):
  kwargs, kernels = FORMS[form]
  model = _model(CustomMoE(name="custom_moe", **kwargs))
  layer = model.layers[-1]
  assert find_moe_layers(model) == [layer]
  adapter = adapter_for(layer)
  assert adapter is adapter_for(layer)  # verified once, then cached
  assert [(k.name, k.stage) for k in adapter.kernels(layer)] == kernels
  assert adapter.top_k(layer) == 2 and adapter.num_experts(layer) == E
  _layer_matches(layer)
  router = layer.router.numpy().copy()
  report = prune_moe(model, _data(), method="moe_pruner", sparsity=0.5,
                     verbose=0, **FEW)
  assert len(report.masks) == len(kernels)
  for k in adapter.kernels(layer):
    keep = report.masks[k.variable.path]
    assert (keep.sum(axis=1) == keep.shape[1] // 2).all()
    assert np.all(k.variable.numpy()[~keep] == 0)
  np.testing.assert_array_equal(layer.router.numpy(), router)
  _layer_matches(layer, seed=2)  # the pruned variables are the layer's own
  assert np.isfinite(np.asarray(model(_data(4)))).all()


def test_fallback_leaves_a_registered_layer_inside_a_custom_block_alone():
  class Block(keras.layers.Layer):
    def __init__(self, **kwargs):
      super().__init__(**kwargs)
      self.moe = MoE(num_experts=E, expert_dim=M, name="inner_moe")
      self.proj = keras.layers.Dense(D, name="proj")

    def build(self, shape):
      self.moe.build(shape)
      self.proj.build(shape)

    def call(self, x):
      return self.proj(self.moe(x))

  model = _model(Block(name="block"))
  assert [layer.name for layer in find_moe_layers(model)] == ["inner_moe"]


@pytest.mark.parametrize("kwargs,named,why", [
    (dict(extra="expert_bias"), [r"custom_moe/expert_bias \(4, 16\)"],
     "outside its map"),
    (dict(extra="norm"), [r"custom_moe/norm/gamma \(16,\)",
                          r"custom_moe/norm/beta \(16,\)"], "outside its map"),
    (dict(act="tanh"), [r"custom_moe/router \(16, 4\)",
                        r"custom_moe/w_up \(4, 16, 8\)",
                        r"custom_moe/w_down \(4, 8, 16\)"],
     "no expert function"),
], ids=["expert_bias", "norm", "tanh_experts"])
def test_fallback_refuses_naming_the_weights(kwargs, named, why):
  model = _model(CustomMoE(name="custom_moe", **kwargs))
  before = {v.path: v.numpy().copy() for v in model.weights}
  with pytest.raises(ValueError) as info:
    prune_moe(model, _data(), sparsity=0.5, verbose=0, **FEW)
  message = str(info.value)
  assert message.startswith("Argument `layer` must be an MoE layer tfopt "
                            "can map")
  assert "Layer 'custom_moe' (CustomMoE) has no registered adapter" in message
  assert why in message
  for pattern in named:
    assert re.search(pattern, message), message
  assert message.endswith("Received: layer='custom_moe (CustomMoE)'")
  for v in model.weights:  # refused before anything was written
    np.testing.assert_array_equal(v.numpy(), before[v.path])
