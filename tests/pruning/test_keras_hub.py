"""keras-hub's MoE backbones through the adapters, one battery over every
family: the hooked forward pass equals the original, the adapter reproduces
the block's own call, pruning gives the exact sparsity and touches only
expert kernels, and the pruning callback works through `fit`."""

import dataclasses
from typing import Callable

import keras
import numpy as np
import pytest
from keras import ops

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.pruning import (MoE, MoEPruner, adapter_for, capture_inputs,
                           find_moe_layers, installed_masks, prune_moe)
from tfopt.pruning import adapters as adapters_lib
from tfopt.pruning.adapters import HIDDEN
from tfopt.pruning.fallback import StructuralAdapter

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub is installed by `make test` (--no-deps)")

VOCAB, HIDDEN_DIM, SEQ = 50, 32, 8
# Tiny random-weight configs: 2 layers, 4 experts, top-2 (no presets).
COMMON = dict(vocabulary_size=VOCAB, num_layers=2, num_query_heads=2,
              num_key_value_heads=1, hidden_dim=HIDDEN_DIM, num_experts=4,
              top_k=2)
# These tests check masks and outputs, not statistics: an expert with few
# of the 96 calibration tokens must not warn (a TfoptWarning fails a test).
FEW = {"min_tokens": 1}


def _mixtral():
  from keras_hub.src.models.mixtral.mixtral_backbone import MixtralBackbone  # pylint: disable=import-outside-toplevel
  return MixtralBackbone(intermediate_dim=HIDDEN_DIM, **COMMON)


def _qwen():
  from keras_hub.src.models.qwen_moe.qwen_moe_backbone import QwenMoeBackbone  # pylint: disable=import-outside-toplevel
  return QwenMoeBackbone(intermediate_dim=HIDDEN_DIM, moe_intermediate_dim=16,
                         shared_expert_intermediate_dim=16,
                         norm_top_k_prob=True, **COMMON)


def _qwen3():
  from keras_hub.src.models.qwen3_moe.qwen3_moe_backbone import Qwen3MoeBackbone  # pylint: disable=import-outside-toplevel
  # norm_top_k_prob=False: the unnormalized top-k path (Qwen-MoE's row has
  # the normalized one).
  return Qwen3MoeBackbone(intermediate_dim=HIDDEN_DIM, moe_intermediate_dim=16,
                          head_dim=16, norm_top_k_prob=False, **COMMON)


def _qwen3_5():
  from keras_hub.src.models.qwen3_5_moe.qwen3_5_moe_backbone import Qwen3_5MoeBackbone  # pylint: disable=import-outside-toplevel
  # One linear-attention (Gated DeltaNet) and one full-attention layer.
  return Qwen3_5MoeBackbone(
      head_dim=16, moe_intermediate_dim=16, shared_expert_intermediate_size=16,
      layer_types=["linear_attention", "full_attention"],
      linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
      linear_value_head_dim=8, **COMMON)


def _gpt_oss():
  from keras_hub.src.models.gpt_oss.gpt_oss_backbone import GptOssBackbone  # pylint: disable=import-outside-toplevel
  return GptOssBackbone(intermediate_dim=16, head_dim=16, **COMMON)


def _randomize_biases(backbone):
  # GPT-OSS initializes its router and expert biases to zero: random ones,
  # so the tests see whether the adapter adds them where the block does.
  # Its embeddings (stddev 0.01) get stddev 1: else the biases, the same for
  # every token, outweigh the tokens and route all to the same two experts.
  rng = np.random.default_rng(1)
  for v in backbone.weights:
    if v.path.endswith("_bias") or v.path.endswith("router_dense/bias"):
      v.assign(rng.normal(0, 0.1, v.shape).astype(v.dtype))
    elif "token_embedding" in v.path:
      v.assign(rng.normal(0, 1.0, v.shape).astype(v.dtype))


@dataclasses.dataclass(frozen=True)
class Family:
  """One keras-hub MoE family: how to build it, its block class, the
  adapter's kernel names, and from the block's own sublayers the parts of
  its output the routed experts do not make (shared expert, biases).
  `refused` is None where the structural fallback alone maps the block,
  else a regex of the weights its refusal must name."""
  name: str
  build: Callable
  block: str
  kernels: tuple
  shared: Callable | None = None  # (layer, tokens) -> (T, d)
  down_bias: Callable | None = None  # layer -> (E, d) added after `down`
  prepare: Callable | None = None
  refused: str | None = None


def _qwen_shared(layer, tokens):
  return np.asarray(layer.shared_expert_dense(tokens)) * np.asarray(
      ops.sigmoid(layer.shared_expert_gate_dense(tokens)))


def _qwen3_5_shared(layer, tokens):
  return np.asarray(layer.shared_expert(tokens)) * np.asarray(
      ops.sigmoid(layer._shared_expert_gate(tokens)))  # pylint: disable=protected-access


FAMILIES = [
    Family("mixtral", _mixtral, "MixtralSparseMoeBlock",
           ("gate", "up", "down")),
    Family("qwen_moe", _qwen, "QwenSparseMoeBlock", ("gate_up", "down"),
           shared=_qwen_shared,
           refused=r"qwen_sparse_moe_block\w*/shared_expert_gate_dense/kernel "
           r"\(32, 1\)"),
    Family("qwen3_moe", _qwen3, "Qwen3SparseMoeBlock", ("gate_up", "down")),
    Family("qwen3_5_moe", _qwen3_5, "Qwen3_5MoeSparseMoeBlock",
           ("gate_up", "down"), shared=_qwen3_5_shared,
           refused=r"sparse_moe_block/shared_expert/feedforward_gate_dense/"
           r"kernel \(32, 16\)"),
    Family("gpt_oss", _gpt_oss, "GptOssSparseMoeBlock", ("gate_up", "down"),
           down_bias=lambda layer: layer.experts.down_proj_bias.numpy(),
           prepare=_randomize_biases,
           refused=r"experts/gate_up_proj_bias \(4, 32\), .*"
           r"experts/down_proj_bias \(4, 32\)"),
]
ids = lambda families: [f.name for f in families]  # noqa: E731
# The families added after Mixtral and Qwen-MoE, for the `fit` test. Each
# traces a train step (about 5 s); Qwen3.5's, with its Gated DeltaNet
# layer, takes 15-25 s on two cores: slow.
NEW = [pytest.param(f, id=f.name, marks=pytest.mark.slow
                    if f.name == "qwen3_5_moe" else ())
       for f in FAMILIES if f.name in ("qwen3_moe", "qwen3_5_moe", "gpt_oss")]


def _backbone(family):
  keras.utils.set_random_seed(0)
  backbone = family.build()
  if family.prepare is not None:
    family.prepare(backbone)
  return backbone


def _inputs(n=6, seed=0):
  rng = np.random.default_rng(seed)
  return {"token_ids": rng.integers(1, VOCAB, size=(n, SEQ)).astype("int32"),
          "padding_mask": np.ones((n, SEQ), dtype="int32")}


def _block_output(layer, tokens):
  """The block's own call (the oracle) on flattened tokens (T, d)."""
  out = layer(tokens.reshape(-1, SEQ, HIDDEN_DIM))
  return np.asarray(out[0] if isinstance(out, tuple) else out).reshape(
      -1, HIDDEN_DIM)


def _assert_close(actual, desired):
  # float32, summation order differs: within 2e-5 plus 1e-6 of the largest
  # magnitude (the 100x tokens give outputs in the thousands).
  desired = np.asarray(desired)
  np.testing.assert_allclose(
      np.asarray(actual), desired,
      atol=2e-5 + 1e-6 * float(np.max(np.abs(desired))))


def _check_reproduces(family, layer, tokens, count_routed=True):
  adapter = adapter_for(layer)
  routed = np.asarray(adapter.combine(layer, tokens))
  if family.shared is not None:
    routed = routed + family.shared(layer, tokens)
  _assert_close(routed, _block_output(layer, tokens))
  gates = np.asarray(adapter.gates(layer, tokens))
  assert gates.shape == (len(tokens), 4)
  # Every expert is computed, but each token counts for its top-2 only
  # (not checked on huge tokens, where a second gate underflows to 0).
  assert not count_routed or ((gates > 0).sum(axis=1) == 2).all()
  # The HIDDEN kernel's input, as the engine calibrates on it.
  down = [k for k in adapter.kernels(layer) if k.stage == HIDDEN][0]
  outputs = np.einsum("etm,emh->eth",
                      np.asarray(adapter.expert_hidden(layer, tokens)),
                      down.variable.numpy())
  if family.down_bias is not None:
    outputs = outputs + family.down_bias(layer)[:, None, :]
  _assert_close(outputs, adapter.expert_outputs(layer, tokens))


@pytest.mark.parametrize("family", FAMILIES, ids=ids(FAMILIES))
def test_adapter_reproduces_block_and_hooks_are_transparent(family):
  backbone = _backbone(family)
  x = _inputs()
  plain = np.asarray(backbone(x))
  layers = find_moe_layers(backbone)
  assert [type(layer).__name__ for layer in layers] == [family.block] * 2
  with capture_inputs(layers) as capture:
    hooked = np.asarray(backbone(x))
  np.testing.assert_array_equal(plain, hooked)  # bit for bit
  rng = np.random.default_rng(2)
  for layer in layers:
    assert tuple(k.name for k in adapter_for(layer).kernels(layer)) == (
        family.kernels)
    _check_reproduces(family, layer, capture.of(layer)[0])
    noise = rng.normal(size=(2 * SEQ, HIDDEN_DIM)).astype("float32")
    _check_reproduces(family, layer, noise)
    # Large activations: GPT-OSS's clamps (limit 7) take effect (on about
    # a quarter of its gate and half of its up activations).
    _check_reproduces(family, layer, 100 * noise, count_routed=False)


def _check_granularity(keep, method):
  e, d_in, d_out = keep.shape
  if method == "magnitude":  # one comparison group per expert matrix
    assert (keep.sum(axis=(1, 2)) == d_in * d_out // 2).all()
  elif method == "wanda":  # 2:4 along the inputs of every output neuron
    assert (keep.reshape(e, d_in // 4, 4, d_out).sum(axis=2) == 2).all()
  else:  # per output neuron
    assert (keep.sum(axis=1) == d_in // 2).all()


@pytest.mark.parametrize("method,sparsity,pattern", [
    ("moe_pruner", 0.5, None), ("magnitude", 0.5, None),
    ("wanda", None, "2:4")], ids=["moe_pruner", "magnitude", "wanda-2:4"])
@pytest.mark.parametrize("family", FAMILIES, ids=ids(FAMILIES))
def test_half_sparsity_in_experts_only(family, method, sparsity, pattern):
  backbone = _backbone(family)
  before = {v.path: v.numpy().copy() for v in backbone.weights}
  report = prune_moe(backbone, _inputs(12), method=method, sparsity=sparsity,
                     pattern=pattern, batch_size=6, verbose=0, **FEW)
  expected = {k.variable.path for layer in find_moe_layers(backbone)
              for k in adapter_for(layer).kernels(layer)}
  assert set(report.masks) == expected
  assert len(expected) == 2 * len(family.kernels)
  assert report.sparsity == 0.5
  for v in backbone.weights:
    if v.path in report.masks:
      keep = report.masks[v.path]
      _check_granularity(keep, method)
      assert np.all(v.numpy()[~keep] == 0)  # exactly half zeros
      np.testing.assert_array_equal(v.numpy()[keep], before[v.path][keep])
    else:  # router, biases, attention, shared expert, norms, embeddings
      np.testing.assert_array_equal(v.numpy(), before[v.path],
                                    err_msg=v.path)
  out = np.asarray(backbone(_inputs()))
  assert out.shape == (6, SEQ, HIDDEN_DIM) and np.isfinite(out).all()


def _masks_by_name(model, report):
  """The report's masks in layer order, keyed by (layer index, variable
  name): two builds of one family name their layers apart."""
  return {(i, k.variable.name): report.masks[k.variable.path]
          for i, layer in enumerate(find_moe_layers(model))
          for k in adapter_for(layer).kernels(layer)}


@pytest.mark.parametrize("family", FAMILIES, ids=ids(FAMILIES))
def test_structural_fallback_alone_on_hub_blocks(family, monkeypatch):
  # As if no keras-hub adapter existed (the next family): the fallback maps
  # the blocks it can reproduce and prunes them exactly as their adapters
  # do, and refuses the others naming the weights it could not map.
  x = _inputs(12)
  adapted = _backbone(family)
  want = prune_moe(adapted, x, sparsity=0.5, batch_size=6, verbose=0, **FEW)
  monkeypatch.setattr(adapters_lib, "_REGISTRY",
                      {MoE: adapters_lib.TfoptMoEAdapter()})
  monkeypatch.setattr(adapters_lib, "_hub_checked", True)
  alone = _backbone(family)
  if family.refused is not None:
    with pytest.raises(ValueError, match=f"Layer '.*' \\({family.block}\\) "
                       f"has no registered adapter.*{family.refused}"):
      prune_moe(alone, x, sparsity=0.5, batch_size=6, verbose=0, **FEW)
    return
  assert all(isinstance(adapter_for(layer), StructuralAdapter)
             for layer in find_moe_layers(alone))
  got = prune_moe(alone, x, sparsity=0.5, batch_size=6, verbose=0, **FEW)
  want_masks = _masks_by_name(adapted, want)
  got_masks = _masks_by_name(alone, got)
  assert list(got_masks) == list(want_masks)
  for key, keep in want_masks.items():
    np.testing.assert_array_equal(got_masks[key], keep, err_msg=str(key))
  np.testing.assert_allclose(np.asarray(alone(_inputs())),
                             np.asarray(adapted(_inputs())), atol=1e-5)


def _lm(backbone):
  logits = keras.layers.Dense(VOCAB, name="lm_head")(backbone.output)
  model = keras.Model(backbone.input, logits)
  model.compile(keras.optimizers.Adam(1e-2),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=False)
  return model


@pytest.mark.parametrize("family", NEW)
def test_pruner_callback_through_fit(family):
  model = _lm(_backbone(family))
  x = _inputs(16, seed=3)
  y = np.roll(x["token_ids"], -1, axis=1)
  pruner = MoEPruner(_inputs(12), method="moe_pruner", sparsity=0.5,
                     batch_size=6, **FEW)
  before = {v.path: v.numpy().copy() for v in model.weights}
  history = model.fit(x, y, batch_size=4, epochs=1, verbose=0,
                      callbacks=[pruner])
  assert np.isfinite(history.history["loss"]).all()
  assert len(pruner.reports) == 1
  masks = installed_masks(model)
  assert set(masks) == set(pruner.reports[0].masks)
  assert len(masks) == 2 * len(family.kernels)
  for v in model.weights:
    if v.path in masks:
      keep = masks[v.path]
      assert (keep.sum(axis=1) == keep.shape[1] // 2).all()
      assert np.all(v.numpy()[~keep] == 0), v.path  # zeros kept in training
      assert not np.array_equal(v.numpy()[keep], before[v.path][keep])


def test_missing_hub_module_leaves_the_others(monkeypatch):
  monkeypatch.setattr(adapters_lib, "_REGISTRY", {})
  blocks = (("keras_hub.src.models.no_such_model.decoder", "NoSuchBlock",
             adapters_lib.MixtralAdapter),
            ("keras_hub.src.models.gpt_oss.gpt_oss_decoder", "NoSuchClass",
             adapters_lib.GptOssAdapter)) + adapters_lib._HUB_BLOCKS  # pylint: disable=protected-access
  registered = adapters_lib._register_keras_hub(blocks)  # pylint: disable=protected-access
  assert registered == [f.block for f in FAMILIES]
  assert len(adapters_lib._REGISTRY) == len(FAMILIES)  # pylint: disable=protected-access
