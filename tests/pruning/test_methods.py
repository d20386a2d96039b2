"""Pruning criteria and mask selection against hand computation and NumPy
loops (no TensorFlow)."""

import numpy as np
import pytest

from tfopt.pruning import methods, patterns
from tfopt.pruning.patterns import Pattern, parse_pattern, select_mask


def test_select_mask_output_group_exact_per_column():
  rng = np.random.default_rng(0)
  scores = rng.normal(size=(3, 20, 7))
  keep = select_mask(scores, Pattern(sparsity=0.55), "output")
  # floor(0.55 * 20) = 11 pruned in every column of every expert.
  assert (keep.sum(axis=1) == 9).all()
  # ... and they are the 11 lowest of their column.
  for e in range(3):
    for o in range(7):
      col = scores[e, :, o]
      assert set(np.argsort(col)[:11]) == set(np.flatnonzero(~keep[e, :, o]))


def test_select_mask_matrix_group_exact_per_expert():
  scores = np.arange(2 * 4 * 5, dtype=float).reshape(2, 4, 5)[:, ::-1]
  keep = select_mask(scores, Pattern(sparsity=0.5), "matrix")
  assert (keep.reshape(2, -1).sum(axis=1) == 10).all()
  for e in range(2):
    assert np.all(scores[e][keep[e]].min() > scores[e][~keep[e]].max())


@pytest.mark.parametrize("n,m", [(2, 4), (4, 8), (1, 4)])
def test_select_mask_n_of_m_groups(n, m):
  rng = np.random.default_rng(1)
  scores = rng.normal(size=(2, 16, 3))
  keep = select_mask(scores, Pattern(n=n, m=m))
  groups = keep.reshape(2, 16 // m, m, 3)
  assert (groups.sum(axis=2) == n).all()
  # The kept ones are the top n of each group.
  s = scores.reshape(2, 16 // m, m, 3)
  assert np.all(np.where(groups, s, np.inf).min(axis=2)
                >= np.where(groups, -np.inf, s).max(axis=2))


def test_ties_pruned_in_stable_order():
  keep = select_mask(np.zeros((1, 4, 1)), Pattern(sparsity=0.5))
  assert keep[0, :, 0].tolist() == [False, False, True, True]


@pytest.mark.parametrize("kwargs,match", [
    ({"sparsity": 1.0}, "in \\[0, 1\\)"),
    ({"sparsity": -0.1}, "in \\[0, 1\\)"),
    ({"sparsity": "half"}, "a number in \\[0, 1\\)"),
    ({"pattern": "3:2"}, "0 < N < M"),
    ({"pattern": "dense"}, "N:M"),
    ({"sparsity": 0.6, "pattern": "2:4"}, "None or 0.5"),
])
def test_parse_pattern_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    parse_pattern(**{"sparsity": None, **kwargs})


def test_nm_must_divide_input_dim():
  with pytest.raises(ValueError, match="dividing the input dimension 30 of "
                     "moe/down.*Received: pattern='4:8'"):
    patterns.check_divides(Pattern(n=4, m=8), 30, "moe/down")


def _stats_by_loops(x, gates):
  """sum over tokens of (g x)^2 and of routed x^2, token by token."""
  t_count, e_count = gates.shape
  gated = np.zeros((e_count, x.shape[1]))
  routed = np.zeros_like(gated)
  for t in range(t_count):
    for e in range(e_count):
      if gates[t, e] > 0:
        gated[e] += (gates[t, e] * x[t]) ** 2
        routed[e] += x[t] ** 2
  return gated, routed


def test_moe_pruner_metric_matches_eq9_by_hand():
  # 5 tokens, 3 experts, top-2 gates set by hand (0 = not routed).
  gates = np.array([[0.7, 0.3, 0.0], [0.0, 0.5, 0.5], [0.9, 0.0, 0.1],
                    [0.2, 0.8, 0.0], [0.0, 0.4, 0.6]])
  rng = np.random.default_rng(2)
  x = rng.normal(size=(5, 4))
  w = rng.normal(size=(3, 4, 6))
  stats = methods.Stats.zeros(3, 4, hessian=True)
  stats.add(x[:2], gates[:2])  # two batches accumulate
  stats.add(x[2:], gates[2:])
  gated, routed = _stats_by_loops(x, gates)
  np.testing.assert_allclose(stats.gated_sq, gated, rtol=1e-12)
  np.testing.assert_allclose(stats.routed_sq, routed, rtol=1e-12)
  assert stats.tokens.tolist() == [3, 4, 3]
  np.testing.assert_allclose(stats.hessian[0], x[[0, 2, 3]].T @ x[[0, 2, 3]],
                             rtol=1e-12)
  score = methods.scores("moe_pruner", w, stats)
  for e in range(3):
    for j in range(4):
      for o in range(6):
        assert score[e, j, o] == pytest.approx(
            abs(w[e, j, o]) * np.sqrt(gated[e, j]), rel=1e-12)
  np.testing.assert_allclose(methods.scores("wanda", w, stats),
                             np.abs(w) * np.sqrt(routed)[:, :, None])
  np.testing.assert_allclose(
      methods.scores("wanda", w, stats, wanda_tokens="all"),
      np.abs(w) * np.sqrt((x ** 2).sum(0))[None, :, None])


def test_moe_pruner_with_constant_gates_equals_routed_wanda():
  rng = np.random.default_rng(3)
  x = rng.normal(size=(40, 8))
  routed = rng.random((40, 4)) < 0.5
  gates = np.where(routed, 0.5, 0.0)
  w = rng.normal(size=(4, 8, 5))
  stats = methods.Stats.zeros(4, 8, hessian=False)
  stats.add(x, gates)
  pattern = Pattern(sparsity=0.5)
  _, keep_mp = methods.prune_kernel("moe_pruner", w, stats, pattern)
  _, keep_wanda = methods.prune_kernel("wanda", w, stats, pattern)
  np.testing.assert_array_equal(keep_mp, keep_wanda)
  # With gates that differ per token the two rank differently somewhere.
  stats2 = methods.Stats.zeros(4, 8, hessian=False)
  stats2.add(x, np.where(routed, rng.random((40, 4)) + 0.01, 0.0))
  _, a = methods.prune_kernel("moe_pruner", w, stats2, pattern)
  _, b = methods.prune_kernel("wanda", w, stats2, pattern)
  assert not np.array_equal(a, b)


def test_per_expert_hidden_inputs():
  # HIDDEN-stage stats: expert e's own activations (E, T, d).
  rng = np.random.default_rng(4)
  h = rng.normal(size=(2, 6, 3))
  gates = np.array([[1, 0], [0.5, 0.5], [0, 1], [0.2, 0.8], [1, 0], [0, 1.]])
  stats = methods.Stats.zeros(2, 3, hessian=False)
  stats.add(h, gates)
  for e in range(2):
    routed = gates[:, e] > 0
    np.testing.assert_allclose(
        stats.gated_sq[e], ((gates[routed, e][:, None] * h[e][routed]) ** 2)
        .sum(0))


def test_sparsegpt_first_column_is_the_obs_update():
  # Pruning only input 0 of each output neuron: SparseGPT's update must be
  # Optimal Brain Surgeon's closed form w - w_0 / [H^-1]_00 * [H^-1]_0,:.
  rng = np.random.default_rng(5)
  x = rng.normal(size=(200, 6)) @ rng.normal(size=(6, 6))
  h = x.T @ x
  w = rng.normal(size=(6, 3))
  w[0] = 1e-3  # the least salient input of every output neuron
  new, keep = methods.sparsegpt(w, h, Pattern(sparsity=1 / 6 + 1e-9),
                                blocksize=128, percdamp=0.0)
  assert (~keep).sum(axis=0).tolist() == [1, 1, 1]
  assert not keep[0].any()
  hinv = np.linalg.inv(h)
  expected = w - np.outer(hinv[:, 0] / hinv[0, 0], w[0])
  np.testing.assert_allclose(new, expected, atol=1e-9)


def test_sparsegpt_update_reduces_output_error():
  # The OBS updates of the kept weights must cut the layer's output error
  # well below that of zeroing the same weights without updating.
  rng = np.random.default_rng(6)
  x = rng.normal(size=(512, 32)) @ rng.normal(size=(32, 32))
  w = rng.normal(size=(32, 16))
  h = x.T @ x
  for pattern in (Pattern(sparsity=0.5), Pattern(n=2, m=4)):
    new, keep = methods.sparsegpt(w, h, pattern, blocksize=8)
    if pattern.structured:
      assert (keep.reshape(8, 4, 16).sum(1) == 2).all()
    else:
      assert (keep.sum(axis=0) == 16).all()
    assert np.all(new[~keep] == 0)
    err_gpt = np.linalg.norm(x @ (new - w))
    err_masked = np.linalg.norm(x @ (np.where(keep, w, 0) - w))
    assert err_gpt < 0.8 * err_masked


def test_refit_is_the_least_squares_fit_of_the_kept_weights():
  # For the mask SparseGPT chose, each output neuron's kept weights solved
  # exactly (lstsq of the dense output on the kept inputs' columns): the
  # output error at or below the OBS update's, the mask unchanged.
  rng = np.random.default_rng(7)
  x = rng.normal(size=(400, 24)) @ rng.normal(size=(24, 24))
  w = rng.normal(size=(24, 12))
  h = x.T @ x
  for pattern in (Pattern(sparsity=0.5), Pattern(n=2, m=4)):
    obs, keep = methods.sparsegpt(w, h, pattern, blocksize=8, percdamp=0.0)
    refit, refit_keep = methods.sparsegpt(w, h, pattern, blocksize=8,
                                          percdamp=0.0, refit=True)
    np.testing.assert_array_equal(refit_keep, keep)
    assert np.all(refit[~keep] == 0)
    for o in range(w.shape[1]):
      want = np.zeros(24)
      want[keep[:, o]] = np.linalg.lstsq(x[:, keep[:, o]], x @ w[:, o],
                                         rcond=None)[0]
      np.testing.assert_allclose(refit[:, o], want, rtol=1e-7, atol=1e-9)
      assert (np.linalg.norm(x @ (refit[:, o] - w[:, o])) <=
              np.linalg.norm(x @ (obs[:, o] - w[:, o])) + 1e-9)


def test_refit_rows_keeping_different_counts():
  # masked_refit batches rows by how many inputs they keep; rows keeping
  # 1, 3 and all 4 inputs, and one keeping none, each solved on its own.
  rng = np.random.default_rng(8)
  x = rng.normal(size=(50, 4))
  h = x.T @ x
  w = rng.normal(size=(4, 4))  # rows = output neurons
  keep = np.array([[True, False, False, False], [True, True, False, True],
                   [True] * 4, [False] * 4])
  out = methods.masked_refit(w, keep, h, chunk_bytes=1)
  for r in range(4):
    want = np.zeros(4)
    if keep[r].any():
      want[keep[r]] = np.linalg.lstsq(x[:, keep[r]], x @ w[r],
                                      rcond=None)[0]
    np.testing.assert_allclose(out[r], want, atol=1e-9)


def test_block_counts_add_up():
  assert sum(methods._block_counts(300, 128, 0.5)) == 150  # pylint: disable=protected-access
  assert methods._block_counts(256, 128, 0.7) == [90, 89]  # pylint: disable=protected-access


def test_starved_experts_fall_back_to_magnitude():
  rng = np.random.default_rng(7)
  w = rng.normal(size=(2, 8, 3))
  stats = methods.Stats.zeros(2, 8, hessian=True)
  stats.add(rng.normal(size=(10, 8)), np.tile([[1.0, 0.0]], (10, 1)))
  for method in ("moe_pruner", "wanda", "sparsegpt"):
    new, keep = methods.prune_kernel(method, w, stats, Pattern(sparsity=0.5),
                                     fallback_experts=[1])
    np.testing.assert_array_equal(
        keep[1], select_mask(np.abs(w[1]), Pattern(sparsity=0.5)))
    np.testing.assert_array_equal(new[1], np.where(keep[1], w[1], 0))


def test_unknown_method():
  with pytest.raises(ValueError, match="Argument `method` must be one of"):
    methods.scores("random", np.ones((1, 2, 2)), None)
