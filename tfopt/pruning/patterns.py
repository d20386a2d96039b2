"""Sparsity patterns and exact mask selection (NumPy).

A kernel is (d_in, d_out) in Keras layout; an output neuron is a column.
- Unstructured at ratio s: each comparison group loses exactly
  floor(s * group_size) weights, the lowest-scored (stable order on ties).
  Groups: "output" (each column, as Wanda and MoE-Pruner compare weights
  within an output neuron) or "matrix" (the whole kernel, as magnitude
  pruning is defined).
- N:M: in every column, each run of M consecutive inputs keeps exactly its N
  highest-scored weights (2:4 and 4:8 are 50 %). d_in must be divisible by M.
Masks are boolean, True = kept.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from tfopt._errors import invalid_argument


@dataclasses.dataclass(frozen=True)
class Pattern:
  """Either `sparsity` in [0, 1) (unstructured) or `n` of every `m` kept."""
  sparsity: float | None = None
  n: int | None = None
  m: int | None = None

  @property
  def structured(self) -> bool:
    return self.m is not None

  @property
  def ratio(self) -> float:
    """The fraction of weights removed."""
    return 1.0 - self.n / self.m if self.structured else self.sparsity

  def __str__(self) -> str:
    return f"{self.n}:{self.m}" if self.structured else f"{self.sparsity:.0%}"


def parse_pattern(sparsity=None, pattern=None) -> Pattern:
  """A `Pattern` from `sparsity` (a float in [0, 1)) or `pattern`.

  `pattern` is "unstructured" (then `sparsity` is needed), "N:M" (e.g.
  "2:4"), or a `Pattern`.
  """
  if isinstance(pattern, Pattern):
    return pattern
  if pattern in (None, "unstructured"):
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)):
      raise invalid_argument("sparsity", "a number in [0, 1)", sparsity)
    if not 0.0 <= sparsity < 1.0:
      raise invalid_argument("sparsity", "in [0, 1)", sparsity)
    return Pattern(sparsity=float(sparsity))
  match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(pattern))
  if not match:
    raise invalid_argument("pattern", '"unstructured" or "N:M" such as "2:4"',
                           pattern)
  n, m = int(match.group(1)), int(match.group(2))
  if not 0 < n < m:
    raise invalid_argument("pattern", "N:M with 0 < N < M", pattern)
  if sparsity is not None and abs(sparsity - (1 - n / m)) > 1e-9:
    raise invalid_argument(
        "sparsity", f"None or {1 - n / m} with pattern={pattern!r}", sparsity)
  return Pattern(n=n, m=m)


def resolve_pattern(sparsity=None, pattern=None,
                    default: float = 0.5) -> Pattern:
  """`parse_pattern` where an unstructured sparsity left as None means
  `default`; with an N:M pattern a sparsity other than 1 - N/M is refused."""
  if pattern in (None, "unstructured") and sparsity is None:
    sparsity = default
  return parse_pattern(sparsity, pattern)


def check_divides(pattern: Pattern, d_in: int, where: str) -> None:
  """Raises when an N:M pattern's M does not divide the input dimension."""
  if pattern.structured and d_in % pattern.m:
    raise invalid_argument(
        "pattern", f"N:M with M dividing the input dimension {d_in} of "
        f"{where}", str(pattern))


def select_mask(scores: np.ndarray, pattern: Pattern,
                group: str = "output") -> np.ndarray:
  """Keep-mask for `scores` (..., d_in, d_out); leading axes are separate
  kernels (e.g. experts). Exact counts, lowest scores pruned."""
  scores = np.asarray(scores, dtype=np.float64)
  *lead, d_in, d_out = scores.shape
  if pattern.structured:
    n, m = pattern.n, pattern.m
    grouped = scores.reshape(*lead, d_in // m, m, d_out)
    order = np.argsort(grouped, axis=-2, kind="stable")
    keep = np.ones_like(grouped, dtype=bool)
    np.put_along_axis(keep, order[..., : m - n, :], False, axis=-2)
    return keep.reshape(scores.shape)
  if group == "output":
    k = int(pattern.sparsity * d_in)
    order = np.argsort(scores, axis=-2, kind="stable")
    keep = np.ones_like(scores, dtype=bool)
    np.put_along_axis(keep, order[..., :k, :], False, axis=-2)
    return keep
  if group == "matrix":
    flat = scores.reshape(*lead, d_in * d_out)
    k = int(pattern.sparsity * d_in * d_out)
    order = np.argsort(flat, axis=-1, kind="stable")
    keep = np.ones_like(flat, dtype=bool)
    np.put_along_axis(keep, order[..., :k], False, axis=-1)
    return keep.reshape(scores.shape)
  raise invalid_argument("group", '"output" or "matrix"', group)
