"""keras-hub's Mixtral and Qwen-MoE backbones through the adapters: the
hooked forward pass equals the original, the adapter reproduces the block,
and pruning touches only expert kernels."""

import keras
import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.pruning import (adapter_for, capture_inputs, find_moe_layers,
                           prune_moe)

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub is installed by `make test` (--no-deps)")


def _mixtral():
  from keras_hub.src.models.mixtral.mixtral_backbone import MixtralBackbone  # pylint: disable=import-outside-toplevel
  return MixtralBackbone(vocabulary_size=50, num_layers=2, num_query_heads=2,
                         num_key_value_heads=1, hidden_dim=16,
                         intermediate_dim=16, num_experts=4, top_k=2)


def _qwen():
  from keras_hub.src.models.qwen_moe.qwen_moe_backbone import QwenMoeBackbone  # pylint: disable=import-outside-toplevel
  return QwenMoeBackbone(vocabulary_size=50, num_layers=2, num_query_heads=2,
                         num_key_value_heads=1, hidden_dim=16,
                         intermediate_dim=16, moe_intermediate_dim=8,
                         shared_expert_intermediate_dim=8, num_experts=4,
                         top_k=2, norm_top_k_prob=True)


def _inputs(n=6, seq=8, seed=0):
  rng = np.random.default_rng(seed)
  return {"token_ids": rng.integers(1, 50, size=(n, seq)).astype("int32"),
          "padding_mask": np.ones((n, seq), dtype="int32")}


@pytest.mark.parametrize("build,kernels", [
    (_mixtral, ["gate", "up", "down"]), (_qwen, ["gate_up", "down"])])
def test_adapter_reproduces_block_and_hooks_are_transparent(build, kernels):
  keras.utils.set_random_seed(0)
  backbone = build()
  x = _inputs()
  plain = np.asarray(backbone(x))
  layers = find_moe_layers(backbone)
  assert len(layers) == 2
  with capture_inputs(layers) as capture:
    hooked = np.asarray(backbone(x))
  np.testing.assert_array_equal(plain, hooked)  # bit for bit
  for layer in layers:
    adapter = adapter_for(layer)
    assert [k.name for k in adapter.kernels(layer)] == kernels
    tokens = capture.of(layer)[0]
    out = layer(tokens.reshape(6, 8, 16))[0]
    routed = np.asarray(adapter.combine(layer, tokens))
    if hasattr(layer, "shared_expert_dense"):  # Qwen: + gated shared expert
      shared = np.asarray(layer.shared_expert_dense(tokens)) * np.asarray(
          keras.ops.sigmoid(layer.shared_expert_gate_dense(tokens)))
      routed = routed + shared
    np.testing.assert_allclose(routed, np.asarray(out).reshape(-1, 16),
                               atol=1e-5)
    gates = np.asarray(adapter.gates(layer, tokens))
    assert ((gates > 0).sum(axis=1) == 2).all()  # every expert computed,
    # but each token counts only for its two routed experts.


@pytest.mark.parametrize("build", [_mixtral, _qwen])
def test_pruning_touches_only_experts(build):
  keras.utils.set_random_seed(0)
  backbone = build()
  before = {v.path: v.numpy().copy() for v in backbone.weights}
  report = prune_moe(backbone, _inputs(12), method="moe_pruner",
                     pattern="2:4", batch_size=6, verbose=0)
  assert report.masks
  for v in backbone.weights:
    if v.path in report.masks:
      keep = report.masks[v.path]
      d_in = keep.shape[1]
      assert (keep.reshape(4, d_in // 4, 4, -1).sum(axis=2) == 2).all()
      assert np.all(v.numpy()[~keep] == 0)
    else:  # router, attention, shared expert, norms, embeddings
      np.testing.assert_array_equal(v.numpy(), before[v.path],
                                    err_msg=v.path)
