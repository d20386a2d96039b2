"""Sparse export of pruned expert kernels, and the SavedModel for serving.

`export_sparse(model, masks, directory)` writes, for each masked variable,
its kept values (row-major order, the variable's dtype) and either a packed
bitmask (1 bit per weight; unstructured) or, for N:M masks, the kept
positions inside each group of M as packed ceil(log2 M)-bit indices; plus
`manifest.json` (format "tfopt.sparse/1": per tensor its path, shape, dtype,
encoding, counts and bytes, and the totals). `load_sparse` rebuilds the
dense arrays bit for bit; `apply_sparse` writes them into a model of the
same architecture. At 50 % the unstructured encoding is 0.5 x 4 + 1/8 bytes
per weight: 0.53x the dense fp32 bytes.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from tfopt._errors import invalid_argument
from tfopt._io import atomic_write, atomic_write_text

FORMAT = "tfopt.sparse/1"


def _nm_of(keep: np.ndarray):
  """(n, m) if every group of m consecutive inputs (axis -2) keeps exactly n,
  for the hardware patterns' m in (4, 8); else None (bitmask)."""
  d_in = keep.shape[-2]
  for m in (4, 8):
    if d_in % m:
      continue
    counts = keep.reshape(*keep.shape[:-2], d_in // m, m,
                          keep.shape[-1]).sum(axis=-2)
    n = int(counts.flat[0]) if counts.size else 0
    if 0 < n < m and np.all(counts == n) and n / m <= 0.5:
      return n, m
  return None


def _pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
  shifts = np.arange(bits - 1, -1, -1, dtype=np.uint8)
  return np.packbits(((values[:, None] >> shifts) & 1).astype(np.uint8))


def _unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
  flat = np.unpackbits(packed)[: count * bits].reshape(count, bits)
  weights = (1 << np.arange(bits - 1, -1, -1)).astype(np.int64)
  return flat.astype(np.int64) @ weights


def _encode(value: np.ndarray, keep: np.ndarray):
  nm = _nm_of(keep)
  if nm is None:
    return {"encoding": "bitmask"}, {
        "values": value[keep], "mask": np.packbits(keep.ravel())}
  n, m = nm
  # Move the input axis (-2) last so each group of m is contiguous.
  groups = np.moveaxis(keep, -2, -1).reshape(-1, m)
  positions = np.nonzero(groups)[1].astype(np.int64)
  vals = np.moveaxis(value, -2, -1).reshape(-1, m)[groups]
  bits = max(1, math.ceil(math.log2(m)))
  return {"encoding": "n:m", "n": n, "m": m, "index_bits": bits}, {
      "values": vals, "indices": _pack_bits(positions, bits)}


def _decode(entry: dict, arrays) -> np.ndarray:
  shape = tuple(entry["shape"])
  dtype = np.dtype(entry["dtype"])
  values = arrays[entry["key"] + ".values"]
  if entry["encoding"] == "bitmask":
    size = int(np.prod(shape))
    keep = np.unpackbits(arrays[entry["key"] + ".mask"])[:size].astype(bool)
    out = np.zeros(size, dtype=dtype)
    out[keep] = values
    return out.reshape(shape)
  n, m, bits = entry["n"], entry["m"], entry["index_bits"]
  moved = shape[:-2] + (shape[-1], shape[-2])
  groups = int(np.prod(moved)) // m
  positions = _unpack_bits(arrays[entry["key"] + ".indices"], bits,
                           groups * n).reshape(groups, n)
  dense = np.zeros((groups, m), dtype=dtype)
  np.put_along_axis(dense, positions, values.reshape(groups, n), axis=1)
  return np.moveaxis(dense.reshape(moved), -1, -2)


def export_sparse(model, masks: dict, directory: str,
                  overwrite: bool = False) -> dict:
  """Writes the masked variables of `model` sparsely; returns the manifest.

  Refuses to replace an existing export unless `overwrite=True`.
  """
  manifest_path = os.path.join(directory, "manifest.json")
  if os.path.exists(manifest_path) and not overwrite:
    raise invalid_argument("directory", "a new directory (or pass "
                           "overwrite=True to replace the export there)",
                           directory, FileExistsError)
  found = {v.path: v for v in model.weights}
  arrays, tensors = {}, []
  for i, (path, keep) in enumerate(sorted(masks.items())):
    if path not in found:
      raise invalid_argument("masks", f"keyed by paths of {model.name}'s "
                             "variables", path)
    value = np.asarray(found[path].numpy())
    keep = np.asarray(keep, dtype=bool)
    if keep.shape != value.shape:
      raise invalid_argument(f"masks[{path!r}]", f"of shape {value.shape}",
                             keep.shape)
    if np.any(value[~keep] != 0):
      raise invalid_argument(
          "masks", f"masks whose pruned weights are zero in the model "
          f"(install or apply them first); {path} has non-zero pruned "
          "weights", path)
    meta, parts = _encode(value, keep)
    key = f"t{i}"
    for name, arr in parts.items():
      arrays[f"{key}.{name}"] = arr
    sparse_bytes = sum(a.nbytes for a in parts.values())
    tensors.append({"path": path, "key": key, "shape": list(value.shape),
                    "dtype": value.dtype.name, "kept": int(keep.sum()),
                    "size": int(keep.size), "bytes": int(sparse_bytes),
                    "dense_bytes": int(value.nbytes), **meta})
  dense = sum(t["dense_bytes"] for t in tensors)
  sparse = sum(t["bytes"] for t in tensors)
  manifest = {"format": FORMAT, "model": model.name, "tensors": tensors,
              "bytes": sparse, "dense_bytes": dense,
              "ratio": sparse / dense if dense else None}
  os.makedirs(directory, exist_ok=True)

  def write(tmp: str) -> None:
    with open(tmp, "wb") as f:  # a file object: savez would append ".npz"
      np.savez(f, **arrays)

  atomic_write(os.path.join(directory, "tensors.npz"), write, overwrite=True)
  atomic_write_text(manifest_path, json.dumps(manifest, indent=1),
                    overwrite=True)
  return manifest


def load_sparse(directory: str) -> dict[str, np.ndarray]:
  """{variable path: dense array} from an `export_sparse` directory."""
  manifest_path = os.path.join(directory, "manifest.json")
  if not os.path.exists(manifest_path):
    raise invalid_argument("directory", "a directory written by "
                           "export_sparse (with manifest.json)", directory,
                           FileNotFoundError)
  with open(manifest_path, encoding="utf-8") as f:
    manifest = json.load(f)
  if manifest.get("format") != FORMAT:
    raise invalid_argument("directory", f"an export in format {FORMAT}",
                           manifest.get("format"))
  with np.load(os.path.join(directory, "tensors.npz")) as arrays:
    return {t["path"]: _decode(t, arrays) for t in manifest["tensors"]}


def apply_sparse(model, directory: str) -> list[str]:
  """Assigns the exported tensors to `model`'s variables of the same paths;
  returns the paths written."""
  found = {v.path: v for v in model.weights}
  dense = load_sparse(directory)
  for path, value in dense.items():
    if path not in found or tuple(found[path].shape) != value.shape:
      raise invalid_argument(
          "model", f"a model with variable {path!r} of shape {value.shape}",
          model.name)
  for path, value in dense.items():
    found[path].assign(value)
  return sorted(dense)


def export_saved_model(model, directory: str, overwrite: bool = False):
  """A SavedModel of the (stripped) pruned model for TF Serving, via Keras'
  `model.export` (a `serve` endpoint). Masks are not needed at inference:
  the pruned weights are zeros in the variables."""
  if os.path.exists(directory) and not overwrite:
    raise invalid_argument("directory", "a new path (or overwrite=True)",
                           directory, FileExistsError)
  from tfopt.pruning.masks import strip_pruning  # pylint: disable=import-outside-toplevel
  masks = strip_pruning(model)
  try:
    model.export(directory, format="tf_saved_model", verbose=False)
  finally:
    if masks:
      from tfopt.pruning.masks import install_masks  # pylint: disable=import-outside-toplevel
      install_masks(model, masks)
  return directory
