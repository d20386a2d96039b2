"""Router-weighted OBS (`prune_moe(method="router_obs")`) against an
explicit NumPy OBS solve: the gate-weighted Hessian summed token by token,
the shrinkage toward the layer's pooled Hessian, and Optimal Brain
Surgeon's sequential update written with inverses of the trailing Hessian
blocks (no Cholesky factor, unlike the implementation)."""

import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.pruning import methods, prune_moe
from tfopt.pruning.patterns import Pattern


def _routing(rng, tokens: int, experts: int, top_k: int = 2):
  """Gates (T, E): softmax over a random top-k, zero elsewhere."""
  logits = rng.normal(size=(tokens, experts)) * 2
  gates = np.zeros_like(logits)
  for t, row in enumerate(logits):
    top = np.argsort(-row)[:top_k]
    p = np.exp(row[top])
    gates[t, top] = p / p.sum()
  return gates


def _obs_oracle(w, h, sparsity, percdamp):
  """OBS column by column on W = w.T (rows = output neurons) with the
  Hessian h: the mask from the saliency w_i^2 / [H_F^-1]_ii at the start
  (F = columns i.. not yet fixed), then each column in turn fixed (zeroed
  where pruned) and its error spread over the columns after it by
  [H_F^-1]_{i,F} / [H_F^-1]_ii."""
  h = h + percdamp * np.mean(np.diag(h)) * np.eye(len(h))
  w = np.array(w, dtype=np.float64).T
  rows, cols = w.shape
  inverses = [np.linalg.inv(h[i:, i:]) for i in range(cols)]
  saliency = w ** 2 / np.array([inv[0, 0] for inv in inverses])[None, :]
  pruned = int(sparsity * cols)
  keep = np.ones_like(w, dtype=bool)
  for r in range(rows):
    keep[r, np.argsort(saliency[r], kind="stable")[:pruned]] = False
  for i in range(cols):
    inv = inverses[i]
    err = np.where(keep[:, i], 0.0, w[:, i]) / inv[0, 0]
    w[:, i:] -= np.outer(err, inv[0, :])
    w[:, i] = np.where(keep[:, i], w[:, i], 0.0)
  return w.T, keep.T


def test_router_obs_is_obs_on_the_gate_weighted_hessian():
  rng = np.random.default_rng(0)
  experts, d_in, d_out, tokens, prior = 3, 6, 4, 40, 4.0
  x = rng.normal(size=(tokens, d_in)) @ rng.normal(size=(d_in, d_in))
  gates = _routing(rng, tokens, experts)
  kernel = rng.normal(size=(experts, d_in, d_out))
  stats = methods.Stats.zeros(experts, d_in, hessian=False,
                              gated_hessian=True)
  stats.add(x[:25], gates[:25])
  stats.add(x[25:], gates[25:])
  new, keep = methods.prune_kernel("router_obs", kernel, stats,
                                   Pattern(sparsity=0.5), percdamp=0.01,
                                   prior_tokens=prior, refit=False)
  refit, refit_keep = methods.prune_kernel(
      "router_obs", kernel, stats, Pattern(sparsity=0.5), percdamp=0.01,
      prior_tokens=prior)  # the default: the kept weights refit
  hessians = np.zeros((experts, d_in, d_in))
  for t in range(tokens):
    for e in range(experts):
      if gates[t, e] > 0:
        hessians[e] += gates[t, e] ** 2 * np.outer(x[t], x[t])
  pooled = hessians.sum(0) / (gates > 0).sum()
  for e in range(experts):
    want, want_keep = _obs_oracle(kernel[e], hessians[e] + prior * pooled,
                                  0.5, 0.01)
    np.testing.assert_array_equal(keep[e], want_keep)
    np.testing.assert_allclose(new[e], want, atol=1e-9)
    # Refit: the same mask; each output neuron's kept weights the least
    # squares fit, through the damped Hessian's square root, of its dense
    # output (lstsq on the kept columns).
    np.testing.assert_array_equal(refit_keep[e], want_keep)
    damped = hessians[e] + prior * pooled
    damped += 0.01 * np.mean(np.diag(damped)) * np.eye(d_in)
    root = np.linalg.cholesky(damped).T  # root.T @ root == damped
    for o in range(d_out):
      kept = want_keep[:, o]
      fit = np.zeros(d_in)
      fit[kept] = np.linalg.lstsq(root[:, kept], root @ kernel[e][:, o],
                                  rcond=None)[0]
      np.testing.assert_allclose(refit[e][:, o], fit, atol=1e-9)
  assert (keep.sum(axis=1) == 3).all()


def test_with_every_gate_one_and_no_prior_it_is_sparsegpt():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(64, 8))
  routed = _routing(rng, 64, 2) > 0
  kernel = rng.normal(size=(2, 8, 5))
  stats = methods.Stats.zeros(2, 8, hessian=True, gated_hessian=True)
  stats.add(x, routed.astype(np.float64))
  for pattern in (Pattern(sparsity=0.5), Pattern(n=2, m=4)):
    for refit in (False, True):
      ours = methods.prune_kernel("router_obs", kernel, stats, pattern,
                                  blocksize=4, prior_tokens=0.0, refit=refit)
      theirs = methods.prune_kernel("sparsegpt", kernel, stats, pattern,
                                    blocksize=4, refit=refit)
      np.testing.assert_array_equal(ours[1], theirs[1])
      np.testing.assert_allclose(ours[0], theirs[0], atol=1e-12)


def test_an_expert_without_tokens_is_pruned_by_the_pooled_hessian():
  rng = np.random.default_rng(2)
  x = rng.normal(size=(30, 8))
  gates = np.zeros((30, 2))
  gates[:, 0] = rng.uniform(0.2, 1.0, 30)  # expert 1 sees nothing
  kernel = rng.normal(size=(2, 8, 3))
  stats = methods.Stats.zeros(2, 8, hessian=False, gated_hessian=True)
  stats.add(x, gates)
  new, _ = methods.prune_kernel("router_obs", kernel, stats,
                                Pattern(sparsity=0.5), prior_tokens=16.0,
                                fallback_experts=[1])
  pooled = (gates[:, :1] * x).T @ (gates[:, :1] * x) / 30
  want, _ = methods.sparsegpt(kernel[1], 16.0 * pooled, Pattern(sparsity=0.5),
                              refit=True)
  np.testing.assert_allclose(new[1], want, atol=1e-12)
  magnitude = np.where(np.abs(kernel[1]) >= np.median(
      np.abs(kernel[1]), axis=0), kernel[1], 0)
  assert not np.allclose(new[1], magnitude)


def test_it_cuts_the_gate_weighted_output_error_below_sparsegpts():
  # Tokens the router relies on (gate ~0.9) and tokens it barely uses
  # (gate ~0.05) come from different input distributions: SparseGPT fits
  # both alike, router-OBS the expert's share of the layer's output.
  wins = []
  for seed in range(5):
    rng = np.random.default_rng(seed)
    d_in, d_out = 32, 16
    strong = rng.normal(size=(300, d_in)) @ rng.normal(size=(d_in, d_in))
    weak = rng.normal(size=(300, d_in)) @ rng.normal(size=(d_in, d_in)) * 3
    x = np.concatenate([strong, weak])
    g = np.concatenate([rng.uniform(0.8, 1.0, 300),
                        rng.uniform(0.01, 0.1, 300)])
    kernel = rng.normal(size=(1, d_in, d_out))
    stats = methods.Stats.zeros(1, d_in, hessian=True, gated_hessian=True)
    stats.add(x, g[:, None])
    errors = {}
    for method in ("sparsegpt", "router_obs"):
      new, _ = methods.prune_kernel(method, kernel, stats,
                                    Pattern(sparsity=0.5), blocksize=8)
      errors[method] = np.linalg.norm(g[:, None] * (x @ (new[0] -
                                                         kernel[0])))
    wins.append(errors["router_obs"] < 0.9 * errors["sparsegpt"])
  assert all(wins)


@pytest.fixture(scope="module")
def tiny_moe():
  import keras  # pylint: disable=import-outside-toplevel
  from tfopt import zoo  # pylint: disable=import-outside-toplevel
  keras.utils.set_random_seed(0)
  model = zoo.moe_lm(vocab_size=40, seq_len=8, num_layers=2, d_model=16,
                     num_heads=2, num_experts=4, expert_dim=16).model
  x = np.random.default_rng(0).integers(0, 40, size=(24, 8)).astype("int32")
  return model, x, {v.path: v.numpy().copy() for v in model.weights}


def test_prune_moe_router_obs_on_a_model(tiny_moe):
  model, x, weights = tiny_moe
  for pattern in ({"sparsity": 0.5}, {"pattern": "2:4"}):
    for v in model.weights:
      v.assign(weights[v.path])
    report = prune_moe(model, x, method="router_obs", verbose=0, **pattern)
    assert report.method == "router_obs" and len(report.masks) == 6
    for v in model.weights:
      if v.path in report.masks:
        keep = report.masks[v.path]
        assert np.all(v.numpy()[~keep] == 0)
        groups = keep.reshape(keep.shape[0], -1, 4, keep.shape[-1])
        assert (groups.sum(axis=2) == 2).all() if "pattern" in pattern \
            else (keep.sum(axis=1) == keep.shape[1] // 2).all()
        # The kept weights moved: the OBS update compensates.
        assert not np.array_equal(v.numpy()[keep], weights[v.path][keep])
      else:
        np.testing.assert_array_equal(v.numpy(), weights[v.path])


def test_bad_arguments_name_themselves(tiny_moe):
  model, x, weights = tiny_moe
  for v in model.weights:
    v.assign(weights[v.path])
  with pytest.raises(ValueError, match=r"Argument `prior_tokens` must be a "
                     r"finite number >= 0. Received: prior_tokens=-1"):
    prune_moe(model, x, method="router_obs", prior_tokens=-1, verbose=0)
  with pytest.raises(ValueError, match="Argument `previous_masks`.*"
                     "router_obs"):
    prune_moe(model, x, method="router_obs", previous_masks={"a": 1},
              verbose=0)
  with pytest.raises(ValueError, match="Argument `blocksize` must be a "
                     "multiple of M=4"):
    prune_moe(model, x, method="router_obs", pattern="2:4", blocksize=6,
              verbose=0)
  with pytest.raises(ValueError, match=r"Argument `refit` must be True, "
                     r"False or None. Received: refit='yes'"):
    prune_moe(model, x, method="router_obs", refit="yes", verbose=0)
  with pytest.raises(ValueError, match=r"Argument `refit` must be None or "
                     r"False with method='wanda'"):
    prune_moe(model, x, method="wanda", refit=True, verbose=0)
  for v in model.weights:  # nothing was changed by the refused calls
    np.testing.assert_array_equal(v.numpy(), weights[v.path])
