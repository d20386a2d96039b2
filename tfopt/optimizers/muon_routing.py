"""Which variables Muon orthogonalizes, decided once and inspectable.

Keras' own Muon sends every variable that is not 2-D to AdamW and every 2-D
one to Muon. On a Transformer that is backwards twice: the 3-D query/key/
value/output kernels of `MultiHeadAttention` (the matrices Muon is for) fall
back to AdamW, while the attention *biases*, 2-D of shape (heads, head_dim),
get orthogonalized. `route_variable` fixes both (routing="tfopt"):

1. `exclude_layers` regexes (on the variable path) -> AdamW.
2. embeddings (path contains "embedding") -> AdamW when `exclude_embeddings`.
3. biases and normalization parameters (variable name bias, gamma, beta,
   moving_*) -> AdamW, whatever their rank.
4. 2-D -> Muon on the matrix itself.
5. 3-D (EinsumDense / MultiHeadAttention kernels) -> Muon on a matrix:
   the output projection (path contains "attention_output", shape
   (heads, head_dim, d_model)) as (heads * head_dim, d_model); any other
   3-D kernel, e.g. the query (d_model, heads, head_dim), as
   (d_model, heads * head_dim).
6. 4-D conv kernels (kh, kw, c_in, c_out) -> Muon on (kh * kw * c_in, c_out)
   when `muon_conv_kernels`, else AdamW.
7. everything else (0-/1-D, 5-D+) -> AdamW.

routing="keras" reproduces Keras' rule exactly, for checkpoints that must
interchange with `keras.optimizers.Muon`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Mapping, Sequence

ROUTINGS = ("tfopt", "keras")
_NON_MATRIX_NAMES = re.compile(r"(^|_)(bias|beta|gamma|moving_mean|"
                               r"moving_variance)$")


@dataclasses.dataclass(frozen=True)
class Route:
  """Where one variable goes.

  Attributes:
    path: the variable's path, e.g. "mha/query/kernel".
    shape: the variable's shape.
    optimizer: "muon" or "adamw".
    matrix_shape: (rows, cols) Muon orthogonalizes, None for AdamW.
    reason: why, in words.
  """
  path: str
  shape: tuple[int, ...]
  optimizer: str
  matrix_shape: tuple[int, int] | None
  reason: str


def route_variable(path: str, name: str, shape: Sequence[int], *,
                   routing: str = "tfopt", exclude_embeddings: bool = True,
                   exclude_layers: Sequence[re.Pattern | str] = (),
                   muon_conv_kernels: bool = False) -> Route:
  """Routes one variable; see the module docstring for the rules.

  >>> route_variable("mha/query/kernel", "kernel", (64, 4, 16)).matrix_shape
  (64, 64)
  >>> route_variable("mha/query/bias", "bias", (4, 16)).optimizer
  'adamw'
  >>> route_variable("mha/query/bias", "bias", (4, 16), routing="keras").optimizer
  'muon'
  """
  shape = tuple(int(d) for d in shape)

  def adamw(reason):
    return Route(path, shape, "adamw", None, reason)

  def muon(rows, cols, reason):
    return Route(path, shape, "muon", (rows, cols), reason)

  if routing == "keras":
    # keras.optimizers.Muon._should_use_adamw, in its order.
    if len(shape) != 2:
      return adamw("not 2-D (Keras rule)")
    if exclude_embeddings and "embedding" in path.lower():
      return adamw("embedding")
    for pattern in exclude_layers:
      if re.search(pattern, path):
        return adamw(f"matches exclude_layers {_pattern_text(pattern)!r}")
    return muon(shape[0], shape[1], "2-D (Keras rule)")

  for pattern in exclude_layers:
    if re.search(pattern, path):
      return adamw(f"matches exclude_layers {_pattern_text(pattern)!r}")
  if exclude_embeddings and "embedding" in path.lower():
    return adamw("embedding")
  if _NON_MATRIX_NAMES.search(name):
    return adamw("bias / normalization parameter")
  if len(shape) == 2:
    return muon(shape[0], shape[1], "2-D kernel")
  if len(shape) == 3:
    if "attention_output" in path:
      return muon(shape[0] * shape[1], shape[2],
                  "3-D attention output kernel as (heads*head_dim, d_model)")
    return muon(shape[0], shape[1] * shape[2],
                "3-D kernel as (d_in, heads*head_dim)")
  if len(shape) == 4:
    if muon_conv_kernels:
      return muon(math.prod(shape[:3]), shape[3],
                  "conv kernel as (kh*kw*c_in, c_out)")
    return adamw("conv kernel (muon_conv_kernels=False)")
  return adamw(f"{len(shape)}-D")


def _pattern_text(pattern) -> str:
  return pattern.pattern if isinstance(pattern, re.Pattern) else str(pattern)


def format_routing_table(routes: Mapping[str, Route] | Sequence[Route]) -> str:
  """A fixed-width table of routes, one variable per line."""
  if isinstance(routes, Mapping):
    routes = list(routes.values())
  rows = [("path", "shape", "optimizer", "matrix", "reason")]
  for r in routes:
    rows.append((r.path, "x".join(map(str, r.shape)) or "scalar", r.optimizer,
                 "x".join(map(str, r.matrix_shape)) if r.matrix_shape else "-",
                 r.reason))
  widths = [max(len(row[i]) for row in rows) for i in range(4)]
  return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths))
                   + "  " + row[4] for row in rows)
