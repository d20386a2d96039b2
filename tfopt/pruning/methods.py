"""Pruning criteria for stacked expert kernels (E, d_in, d_out), in NumPy.

- `magnitude`: |W|, compared over the whole expert matrix (the baseline as
  Wanda's reference code defines it).
- `wanda`: |W_ij| * ||X_j||, the input norm over the tokens routed to the
  expert (or over all tokens, `wanda_tokens="all"`), compared within each
  output neuron.
- `moe_pruner`: MoE-Pruner's Eq. 9, |W_ij| * ||X_j * Gate_j||, where the norm
  runs over the tokens routed to the expert and each token's input is
  weighted by its router gate for that expert; compared within each output
  neuron. With every gate equal it ranks exactly like routed Wanda.
- `sparsegpt`: SparseGPT's column-by-column OBS update with the per-expert
  Hessian X^T X of the routed tokens, mask chosen adaptively per block,
  1 % dampening; the remaining weights are updated to compensate.
- `router_obs`: the same OBS update (and OBS mask choice) with each routed
  token weighted by its router gate, H_e = sum_t g_te^2 x_t x_t^T: the
  expert's output enters the layer's output as g_te * f_e(x_t), so this is
  the Hessian of the layer's own output error, where SparseGPT's weighs a
  token the router barely uses like one it relies on. An expert that saw
  few tokens has a rank-poor, noisy H_e: it is shrunk toward the layer's
  pooled statistics, H_e + k * P, P the per-token mean of all experts'
  gated Hessians and k = `prior_tokens` pseudo-tokens (128 by default:
  little for an expert with thousands of tokens, most of the Hessian for
  one with a handful; one with none is pruned by P alone). 128 was chosen
  on the reference MoE LM by the perplexity of held-out windows that its
  benchmark does not report (0, 128, 512, 2048, 8192 tried, calibration
  seeds 0 and 1): with no prior, router-OBS lost to SparseGPT at 50 % on
  one seed; 128-512 won on both, at 50 % and 2:4; 2048 and more drowned
  the experts' own statistics and lost. Once the mask is chosen, the kept
  weights are solved for exactly (`masked_refit`: per output neuron the
  least-squares optimum of the same gated error for that mask, which
  SparseGPT's column-by-column update only approaches, since it never
  revisits the columns already fixed); `refit=False` skips it. On the
  same held-out windows (seeds 0 and 1, prior 128) the refit lowered
  perplexity / dense from 1.035-1.039 to 1.028-1.031 at 50 % and from
  1.053-1.056 to 1.040 at 2:4, and 128 stayed as good a prior as any
  with it (32 tied; 0, 512 and 2048 lost). SparseGPT keeps the paper's
  update (no refit) unless asked.

`Stats` holds what each needs per expert; `prune_kernel` turns a kernel,
its stats and a pattern into (new kernel, keep-mask).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfopt._errors import invalid_argument
from tfopt.pruning.patterns import Pattern, select_mask

METHODS = ("moe_pruner", "wanda", "magnitude", "sparsegpt", "router_obs")
OBS_METHODS = ("sparsegpt", "router_obs")


@dataclasses.dataclass
class Stats:
  """Calibration statistics of one stacked kernel's inputs, per expert.

  gated_sq: (E, d_in) sum over routed tokens of (gate * x)^2.
  routed_sq: (E, d_in) sum over routed tokens of x^2.
  all_sq: (E, d_in) sum over all tokens of x^2 (same row for INPUT kernels).
  hessian: (E, d_in, d_in) sum over routed tokens of x x^T, or None.
  tokens: (E,) number of routed tokens.
  gated_hessian: (E, d_in, d_in) sum over routed tokens of g^2 x x^T, or
    None.
  """
  gated_sq: np.ndarray
  routed_sq: np.ndarray
  all_sq: np.ndarray
  tokens: np.ndarray
  hessian: np.ndarray | None = None
  gated_hessian: np.ndarray | None = None

  @classmethod
  def zeros(cls, experts: int, d_in: int, hessian: bool,
            gated_hessian: bool = False) -> "Stats":
    z = lambda *s: np.zeros(s, dtype=np.float64)  # noqa: E731
    return cls(z(experts, d_in), z(experts, d_in), z(experts, d_in),
               np.zeros(experts, dtype=np.int64),
               z(experts, d_in, d_in) if hessian else None,
               z(experts, d_in, d_in) if gated_hessian else None)

  def add(self, x: np.ndarray, gates: np.ndarray) -> None:
    """Accumulates one batch. `x` is (T, d_in) shared by all experts or
    (E, T, d_in) per expert; `gates` (T, E), zero where not routed."""
    x = np.asarray(x, dtype=np.float64)
    gates = np.asarray(gates, dtype=np.float64)
    routed = gates > 0
    sq = x * x
    if x.ndim == 2:
      self.gated_sq += (gates * gates).T @ sq
      self.routed_sq += routed.T.astype(np.float64) @ sq
      self.all_sq += sq.sum(axis=0)[None, :]
    else:
      self.gated_sq += np.einsum("te,etj->ej", gates * gates, sq)
      self.routed_sq += np.einsum("te,etj->ej", routed.astype(np.float64), sq)
      self.all_sq += sq.sum(axis=1)
    self.tokens += routed.sum(axis=0)
    if self.hessian is None and self.gated_hessian is None:
      return
    for e in range(gates.shape[1]):
      rows = x[routed[:, e]] if x.ndim == 2 else x[e][routed[:, e]]
      if self.hessian is not None:
        self.hessian[e] += rows.T @ rows
      if self.gated_hessian is not None:
        weighted = rows * gates[routed[:, e], e][:, None]
        self.gated_hessian[e] += weighted.T @ weighted

  def router_hessians(self, prior_tokens: float) -> np.ndarray:
    """(E, d_in, d_in): each expert's gated Hessian shrunk toward the
    layer's pooled per-token one by `prior_tokens` pseudo-tokens (see the
    module doc)."""
    total = int(self.tokens.sum())
    if total == 0:
      return self.gated_hessian.copy()
    pooled = self.gated_hessian.sum(axis=0) / total
    return self.gated_hessian + prior_tokens * pooled[None]


def scores(method: str, kernel: np.ndarray, stats: Stats | None,
           wanda_tokens: str = "routed") -> np.ndarray:
  """Importance of each weight of `kernel` (E, d_in, d_out); higher = kept."""
  w = np.abs(np.asarray(kernel, dtype=np.float64))
  if method == "magnitude":
    return w
  if method == "wanda":
    if wanda_tokens not in ("routed", "all"):
      raise invalid_argument("wanda_tokens", '"routed" or "all"',
                             wanda_tokens)
    sq = stats.routed_sq if wanda_tokens == "routed" else stats.all_sq
    return w * np.sqrt(sq)[:, :, None]
  if method == "moe_pruner":
    return w * np.sqrt(stats.gated_sq)[:, :, None]
  raise invalid_argument("method", f"one of {METHODS}", method)


def comparison_group(method: str) -> str:
  return "matrix" if method == "magnitude" else "output"


def _block_counts(d_in: int, blocksize: int, sparsity: float) -> list[int]:
  """Pruned weights per row in each column block, summing to
  int(sparsity * d_in) exactly (cumulative rounding)."""
  total = int(sparsity * d_in)
  starts = list(range(0, d_in, blocksize)) + [d_in]
  marks = [round(total * s / d_in) for s in starts]
  marks[-1] = total
  return [b - a for a, b in zip(marks, marks[1:])]


def sparsegpt(kernel: np.ndarray, hessian: np.ndarray, pattern: Pattern,
              blocksize: int = 128, percdamp: float = 0.01,
              refit: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """SparseGPT on one kernel (d_in, d_out) with Hessian (d_in, d_in).

  Works on W = kernel.T (rows = output neurons, columns = inputs) as the
  paper does. Returns (pruned kernel (d_in, d_out), keep-mask). Each output
  neuron loses exactly int(s * d_in) weights (unstructured; the per-block
  counts add up to it) or keeps N of every M (N:M). With `refit`, the
  kept weights are then solved for exactly (`masked_refit`).
  """
  w = np.array(kernel, dtype=np.float64).T
  h = np.array(hessian, dtype=np.float64)
  rows, cols = w.shape
  dead = np.diag(h) == 0
  h[dead, dead] = 1.0
  w[:, dead] = 0.0
  original = w.copy()
  damp = percdamp * float(np.mean(np.diag(h)))
  h[np.diag_indices(cols)] += damp
  try:
    hinv = np.linalg.cholesky(np.linalg.inv(h)).T  # upper: inv(H) = U^T U
  except np.linalg.LinAlgError:
    # Not positive definite even after dampening (rank-poor calibration):
    # a heavier dampening, as the reference implementation's users do.
    h[np.diag_indices(cols)] += 10 * damp + 1e-8
    hinv = np.linalg.cholesky(np.linalg.inv(h)).T
  keep = np.ones_like(w, dtype=bool)
  counts = (None if pattern.structured
            else _block_counts(cols, blocksize, pattern.sparsity))
  for b, i1 in enumerate(range(0, cols, blocksize)):
    i2 = min(i1 + blocksize, cols)
    w1 = w[:, i1:i2].copy()
    q1 = np.zeros_like(w1)
    err1 = np.zeros_like(w1)
    hinv1 = hinv[i1:i2, i1:i2]
    keep1 = np.ones_like(w1, dtype=bool)
    if counts is not None and counts[b]:
      tmp = w1 ** 2 / np.diag(hinv1)[None, :] ** 2
      order = np.argsort(tmp, axis=1, kind="stable")
      np.put_along_axis(keep1, order[:, : counts[b]], False, axis=1)
    for i in range(i2 - i1):
      if pattern.structured and i % pattern.m == 0:
        tmp = (w1[:, i:i + pattern.m] ** 2
               / np.diag(hinv1)[None, i:i + pattern.m] ** 2)
        order = np.argsort(tmp, axis=1, kind="stable")
        np.put_along_axis(keep1[:, i:i + pattern.m],
                          order[:, : pattern.m - pattern.n], False, axis=1)
      col = w1[:, i]
      q = np.where(keep1[:, i], col, 0.0)
      q1[:, i] = q
      err = (col - q) / hinv1[i, i]
      w1[:, i:] -= np.outer(err, hinv1[i, i:])
      err1[:, i] = err
    w[:, i1:i2] = q1
    keep[:, i1:i2] = keep1
    w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
  if refit:
    w = masked_refit(original, keep, h)
  return w.T, keep.T


def masked_refit(w: np.ndarray, keep: np.ndarray, hessian: np.ndarray,
                 chunk_bytes: int = 64 << 20) -> np.ndarray:
  """The kept weights that minimise the layer's output error for a fixed
  mask: per row r (an output neuron) of `w` (rows, d_in),
  min over w'_K of (w' - w_r)^T H (w' - w_r) with w'_P = 0 for the pruned
  inputs P, whose optimum is w'_K = w_K + H_KK^-1 H_KP w_P.

  SparseGPT's column-by-column update reaches it only approximately: the
  error of pruning column i is spread over the columns after i, never the
  kept ones before it. Rows keep different inputs, so each row is its own
  |K| x |K| system; rows keeping as many inputs (every row under N:M and
  under SparseGPT's per-row counts) are solved in batches whose H_KK and
  H_KP blocks take at most about `chunk_bytes` (at least one row). Cost:
  rows x |K|^3 / 3 multiply-adds.
  """
  keep = np.asarray(keep, dtype=bool)
  out = np.zeros_like(w)
  kept = keep.sum(axis=1)
  for count in np.unique(kept):
    rows = np.flatnonzero(kept == count)
    if count == 0:
      continue
    # H_KK and H_KP of a row: |K| x d_in float64 values.
    step = max(1, chunk_bytes // (8 * int(count) * keep.shape[1]))
    for lo in range(0, len(rows), step):
      batch = rows[lo:lo + step]
      k_idx = np.stack([np.flatnonzero(keep[r]) for r in batch])
      p_idx = np.stack([np.flatnonzero(~keep[r]) for r in batch])
      h_kk = hessian[k_idx[:, :, None], k_idx[:, None, :]]
      h_kp = hessian[k_idx[:, :, None], p_idx[:, None, :]]
      w_p = np.take_along_axis(w[batch], p_idx, axis=1)
      w_k = np.take_along_axis(w[batch], k_idx, axis=1)
      delta = np.linalg.solve(
          h_kk, np.einsum("bkp,bp->bk", h_kp, w_p)[..., None])[..., 0]
      out[batch[:, None], k_idx] = w_k + delta
  return out


def prune_kernel(method: str, kernel: np.ndarray, stats: Stats | None,
                 pattern: Pattern, *, wanda_tokens: str = "routed",
                 blocksize: int = 128, percdamp: float = 0.01,
                 fallback_experts=(), prior_tokens: float = 128.0,
                 refit: bool | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
  """(pruned kernel, keep-mask) for a stacked kernel (E, d_in, d_out).

  Experts listed in `fallback_experts` (no calibration tokens) are pruned
  by magnitude within each output neuron instead, the caller warns;
  router_obs has none (the layer's pooled Hessian stands in). `refit`
  (OBS methods): solve the kept weights exactly after the mask is chosen
  (`masked_refit`); None: router_obs does, sparsegpt (as the paper) not.
  """
  if refit is None:
    refit = method == "router_obs"
  if refit and method not in OBS_METHODS:
    raise invalid_argument("refit", f"None or False with method={method!r} "
                           f"(it refits the kept weights of the OBS methods "
                           f"{OBS_METHODS})", refit)
  kernel = np.asarray(kernel, dtype=np.float64)
  fallback = set(int(e) for e in fallback_experts)
  if method in OBS_METHODS:
    if method == "router_obs":
      hessians, fallback = stats.router_hessians(prior_tokens), set()
    else:
      hessians = stats.hessian
    new = np.empty_like(kernel)
    keep = np.empty(kernel.shape, dtype=bool)
    for e in range(kernel.shape[0]):
      if e in fallback:
        keep[e] = select_mask(np.abs(kernel[e]), pattern, "output")
        new[e] = np.where(keep[e], kernel[e], 0.0)
      else:
        new[e], keep[e] = sparsegpt(kernel[e], hessians[e], pattern,
                                    blocksize, percdamp, refit)
    return new, keep
  s = scores(method, kernel, stats, wanda_tokens)
  if fallback and method != "magnitude":
    for e in fallback:
      s[e] = np.abs(kernel[e])
  keep = select_mask(s, pattern, comparison_group(method))
  return np.where(keep, kernel, 0.0), keep
