"""prune_moe on a tiny MoE language model: exact sparsity, untouched
non-expert weights, hooks, calibration statistics, bad input."""

import warnings

import keras
import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt import zoo
from tfopt.pruning import (Stats, adapter_for, capture_inputs, find_moe_layers,
                           prune_moe)
from tfopt.pruning.hooks import is_hooked

EXPERT_KERNELS = ("gate_kernel", "up_kernel", "down_kernel")


@pytest.fixture(scope="module")
def tiny():
  keras.utils.set_random_seed(0)
  model = zoo.moe_lm(vocab_size=40, seq_len=8, num_layers=2, d_model=16,
                     num_heads=2, num_experts=4, expert_dim=16).model
  x = np.random.default_rng(0).integers(0, 40, size=(24, 8)).astype("int32")
  weights = {v.path: v.numpy().copy() for v in model.weights}
  return model, x, weights


def _reset(model, weights):
  for v in model.weights:
    v.assign(weights[v.path])


def _is_expert(path):
  return path.rsplit("/", 1)[-1] in EXPERT_KERNELS


@pytest.mark.parametrize("method", ["moe_pruner", "wanda", "sparsegpt"])
@pytest.mark.parametrize("sparsity", [0.5, 0.7])
def test_exact_per_output_sparsity_and_untouched_rest(tiny, method, sparsity):
  model, x, weights = tiny
  _reset(model, weights)
  report = prune_moe(model, x, method=method, sparsity=sparsity, verbose=0)
  assert len(report.masks) == 6
  for v in model.weights:
    value = v.numpy()
    if _is_expert(v.path):
      keep = report.masks[v.path]
      # Every output neuron (column) of every expert lost exactly
      # floor(s * d_in) weights, and those are exactly zero.
      assert (keep.sum(axis=1) == 16 - int(sparsity * 16)).all(), v.path
      assert np.all(value[~keep] == 0)
      if method != "sparsegpt":  # only SparseGPT updates the kept weights
        np.testing.assert_array_equal(value[keep], weights[v.path][keep])
    else:  # router, attention, norms, embeddings: bit for bit
      np.testing.assert_array_equal(value, weights[v.path], err_msg=v.path)


def test_magnitude_is_exact_per_expert_matrix(tiny):
  model, x, weights = tiny
  _reset(model, weights)
  report = prune_moe(model, x, method="magnitude", sparsity=0.6, verbose=0)
  for path, keep in report.masks.items():
    assert (keep.reshape(4, -1).sum(axis=1) == 256 - int(0.6 * 256)).all()
    w = np.abs(weights[path])
    for e in range(4):
      assert w[e][keep[e]].min() >= w[e][~keep[e]].max()


@pytest.mark.parametrize("pattern", ["2:4", "4:8"])
@pytest.mark.parametrize("method", ["moe_pruner", "sparsegpt"])
def test_n_of_m(tiny, pattern, method):
  model, x, weights = tiny
  _reset(model, weights)
  n, m = map(int, pattern.split(":"))
  report = prune_moe(model, x, method=method, pattern=pattern, verbose=0)
  for path, keep in report.masks.items():
    assert (keep.reshape(4, 16 // m, m, -1).sum(axis=2) == n).all()
    assert np.all(dict((v.path, v.numpy()) for v in model.weights)[path]
                  [~keep] == 0)
  assert report.sparsity == pytest.approx(0.5)


def test_statistics_are_gated_by_routing(tiny):
  # The first layer's MoE-Pruner scores, from an independent NumPy forward
  # of the router on the captured block inputs.
  model, x, weights = tiny
  _reset(model, weights)
  layer = find_moe_layers(model)[0]
  with capture_inputs([layer]) as capture:
    model(x, training=False)
  tokens = np.concatenate(capture.of(layer)).astype(np.float64)
  logits = tokens @ weights[layer.router.path].astype(np.float64)
  probs = np.exp(logits - logits.max(1, keepdims=True))
  probs /= probs.sum(1, keepdims=True)
  gates = np.zeros_like(probs)
  for t, row in enumerate(probs):
    top = np.argsort(-row)[:2]
    gates[t, top] = row[top] / row[top].sum()
  stats = Stats.zeros(4, 16, hessian=False)
  stats.add(tokens, np.asarray(adapter_for(layer).gates(layer, tokens)))
  expected = np.stack([((gates[:, e:e + 1] * tokens) ** 2).sum(0)
                       for e in range(4)])
  np.testing.assert_allclose(stats.gated_sq, expected, rtol=1e-4)
  assert stats.tokens.sum() == 2 * len(tokens)


def test_hooked_forward_equals_original_and_hooks_always_removed(tiny):
  model, x, weights = tiny
  _reset(model, weights)
  layers = find_moe_layers(model)
  plain = np.asarray(model(x, training=False))
  with capture_inputs(layers) as capture:
    hooked = np.asarray(model(x, training=False))
    assert all(is_hooked(layer) for layer in layers)
  np.testing.assert_array_equal(plain, hooked)
  assert [l.name for l in capture.order] == ["block_0_moe", "block_1_moe"]
  assert not any(is_hooked(layer) for layer in layers)
  with pytest.raises(RuntimeError, match="boom"):
    with capture_inputs(layers):
      raise RuntimeError("boom")
  assert not any(is_hooked(layer) for layer in layers)
  # An error inside the forward pass (wrong input rank) too.
  with pytest.raises(Exception):
    with capture_inputs(layers):
      model(np.zeros((2, 8, 3), "int32"), training=False)
  assert not any(is_hooked(layer) for layer in layers)
  np.testing.assert_array_equal(plain, np.asarray(model(x, training=False)))


def test_expert_without_tokens_warns_and_falls_back(tiny):
  model, x, weights = tiny
  _reset(model, weights)
  layer = find_moe_layers(model)[0]
  router = weights[layer.router.path].copy()
  # Expert 3 never wins: every token entering the router is shifted by a
  # large LayerNorm beta, and expert 3's router column points against it.
  ln = model.get_layer("block_0_ln2")
  beta = weights[ln.beta.path].copy()
  beta[:] = 5.0
  router[:, 3] = -10.0
  layer.router.assign(router)
  ln.beta.assign(beta)
  with pytest.warns(UserWarning, match="'block_0_moe': experts \\[3\\] "
                    "received no calibration token"):
    # min_tokens=1: only the expert without any token warns (with the
    # default, block_1's least used expert, a few tokens short, would too).
    report = prune_moe(model, x, method="moe_pruner", sparsity=0.5,
                       verbose=0, min_tokens=1)
  kernel = weights[layer.gate_kernel.path][3]
  keep = report.masks[layer.gate_kernel.path][3]
  assert (keep.sum(axis=0) == 8).all()
  for o in range(kernel.shape[1]):  # magnitude within each output neuron
    assert np.abs(kernel[keep[:, o], o]).min() >= np.abs(
        kernel[~keep[:, o], o]).max()
  assert any("experts [3]" in w for w in report.warnings)


def test_bad_input(tiny):
  model, x, weights = tiny
  _reset(model, weights)
  with pytest.raises(ValueError, match="Argument `sparsity` must be in "
                     "\\[0, 1\\). Received: sparsity=1.0"):
    prune_moe(model, x, sparsity=1.0, verbose=0)
  with pytest.raises(ValueError, match="Argument `sparsity` must be None or "
                     "0.5 with pattern='2:4'. Received: sparsity=0.6"):
    prune_moe(model, x, sparsity=0.6, pattern="2:4", verbose=0)
  with pytest.raises(ValueError, match="dividing the input dimension 16"):
    prune_moe(model, x, pattern="3:6", verbose=0)
  with pytest.raises(ValueError, match="Argument `data` must be batches of "
                     "shape \\(None, 8\\)"):
    prune_moe(model, x[:, :5], verbose=0)
  with pytest.raises(ValueError, match="Argument `method` must be one of"):
    prune_moe(model, x, method="random", verbose=0)
  dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  with pytest.raises(ValueError, match="recognised MoE layer.*Dense"):
    prune_moe(dense, np.zeros((2, 4)), verbose=0)
  for v in model.weights:  # nothing was changed by the refused calls
    np.testing.assert_array_equal(v.numpy(), weights[v.path])


def test_report_table(tiny):
  model, x, weights = tiny
  _reset(model, weights)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    report = prune_moe(model, x, method="wanda", sparsity=0.5, verbose=0)
  text = report.table()
  assert "wanda 50%" in text and "block_1_moe" in text and "down" in text
  assert report.sparsity == pytest.approx(0.5)
  _reset(model, weights)  # sparsity defaults to 0.5
  assert prune_moe(model, x, method="magnitude",
                   verbose=0).sparsity == pytest.approx(0.5)


def test_also_prune_dense_on_request(tiny):
  model, x, weights = tiny
  _reset(model, weights)
  head = model.get_layer("lm_head")
  report = prune_moe(model, x, method="moe_pruner", sparsity=0.5,
                     also_prune=r"^lm_head$", verbose=0)
  keep = report.masks[head.kernel.path]
  assert keep.shape == (16, 40)
  assert (keep.sum(axis=0) == 8).all()
  assert np.all(head.kernel.numpy()[~keep] == 0)
  # One expert with gate 1 for every token: MoE-Pruner is Wanda over all
  # tokens, |W_ij| * ||x_j||, computed here from the captured head input.
  _reset(model, weights)
  for layer in find_moe_layers(model):  # the head sees pruned experts
    for k in adapter_for(layer).kernels(layer):
      k.variable.assign(np.where(report.masks[k.variable.path],
                                 weights[k.variable.path], 0))
  with capture_inputs([head]) as capture:
    model(x, training=False)
  feats = np.concatenate(capture.of(head)).astype(np.float64)
  score = np.abs(weights[head.kernel.path]) * np.sqrt(
      (feats ** 2).sum(0))[:, None]
  for o in range(40):
    assert score[keep[:, o], o].min() >= score[~keep[:, o], o].max()
  # Everything else outside the experts and the head is untouched.
  for v in model.weights:
    if v.path not in report.masks:
      np.testing.assert_array_equal(v.numpy(), weights[v.path])
  with pytest.raises(ValueError, match="matching at least one Dense"):
    prune_moe(model, x, also_prune="nothing_here", verbose=0)
  with pytest.raises(ValueError, match="only keras.layers.Dense.*"
                     "'block_0_ln1', a LayerNormalization"):
    prune_moe(model, x, also_prune="block_0_ln1", verbose=0)
