"""Fast two-stage checkpoints (MegaScale): snapshot to host memory, then
persist in the background while training goes on.

Stage 1 (`save`, blocking): every model and optimizer variable is copied to
host memory (NumPy), with the training position (epoch, step in epoch,
global step) and the RNG states (NumPy's global generator, Keras' global
seed generator), and a SHA-256 of the payload. Stage 2 (a background
thread): the snapshot is written to `ckpt-<step>.npz` under a temporary
name, fsync'ed and renamed into place, then the generation list
(`checkpoints.json`) is rewritten the same way; generations beyond `keep`
(default 2) are deleted, only ever files this class wrote (by name pattern
and listed in its generation file). A process killed while persisting
leaves the previous generation intact (the rename never happened);
`restore` checks the newest file's hash and falls back to the previous
generation if it is missing, truncated or corrupt. Only the chief writes
(`is_chief=False` makes `save` a no-op snapshot-free call), so several
workers can share the directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import threading
import time
import zipfile

import numpy as np

from tfopt._errors import invalid_argument
from tfopt._io import atomic_write, atomic_write_text

INDEX = "checkpoints.json"
FORMAT = "tfopt.scale.checkpoint/1"
_NAME = re.compile(r"^ckpt-(\d+)\.npz$")


@dataclasses.dataclass
class Restored:
  """What `restore` found: the training position and which file."""
  path: str
  step: int
  epoch: int
  step_in_epoch: int
  skipped: list  # newer generations that were missing or corrupt


def _variables(model) -> list:
  """(key, variable) of the model's variables (weights and the layers' seed
  generator states, so dropout draws the same masks after a restore) and,
  if built, its optimizer's, keyed by position: Keras uniquifies names per process ("dense_3"), so
  the same model built again has other variable paths but the same order
  and shapes."""
  out = [(f"model/{i:06d}", v) for i, v in enumerate(model.variables)]
  optimizer = getattr(model, "optimizer", None)
  if optimizer is not None and getattr(optimizer, "built", False):
    out += [(f"optimizer/{i:06d}", v)
            for i, v in enumerate(optimizer.variables)]
  return out


def _digest(arrays: dict) -> str:
  h = hashlib.sha256()
  for key in sorted(arrays):
    h.update(key.encode())
    h.update(np.ascontiguousarray(arrays[key]).tobytes())
  return h.hexdigest()


class TwoStageCheckpointer:
  """Two-stage checkpoints of `model` in `directory` (see the module doc).

  Args:
    directory: where generations live (created; must be writable).
    model: a built keras.Model (optimizer state included once built).
    keep: generations kept (>= 2, so a corrupt newest has a fallback).
    is_chief: whether this process writes.
  """

  def __init__(self, directory: str, model, keep: int = 2,
               is_chief: bool = True):
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 2:
      raise invalid_argument("keep", "an integer >= 2 (a corrupt newest "
                             "generation needs a previous one)", keep)
    self.directory = os.fspath(directory)
    self.model = model
    self.keep = keep
    self.is_chief = bool(is_chief)
    self._thread = None
    self._error = None
    self.blocking_seconds: list = []
    if self.is_chief:
      try:
        os.makedirs(self.directory, exist_ok=True)
      except OSError as err:
        raise invalid_argument("directory", f"a directory that can be "
                               f"created ({err.strerror})", self.directory,
                               PermissionError) from None
      if not os.access(self.directory, os.W_OK):
        raise invalid_argument("directory", "a writable directory",
                               self.directory, PermissionError)

  # Saving ------------------------------------------------------------------
  def snapshot(self, step: int, epoch: int = 0, step_in_epoch: int = 0
               ) -> dict:
    """Stage 1: a host-memory copy of the state (blocking, fast)."""
    # `numpy()` of a TF variable returns its current buffer without a copy;
    # TensorFlow copies on write when an update finds the buffer shared, so
    # the snapshot stays as it was while training goes on (tested).
    arrays = {path: v.numpy() for path, v in _variables(self.model)}
    seed_state = keras_seed_state()
    if seed_state is not None:
      arrays["rng/keras_global"] = np.array(seed_state.numpy(), copy=True)
    meta = {"format": FORMAT, "step": int(step), "epoch": int(epoch),
            "step_in_epoch": int(step_in_epoch),
            "numpy_rng": _numpy_rng_state(), "time": time.time(),
            "paths": {key: v.path for key, v in _variables(self.model)}}
    return {"arrays": arrays, "meta": meta}

  def save(self, step: int, epoch: int = 0, step_in_epoch: int = 0,
           blocking: bool = False) -> None:
    """Snapshots now and persists in the background (or before returning
    with `blocking=True`). Waits for the previous persist first, so at most
    one snapshot is in flight; a failed persist is raised here or at
    `wait`."""
    if not self.is_chief:
      return
    self.wait()
    start = time.perf_counter()
    snap = self.snapshot(step, epoch, step_in_epoch)
    self.blocking_seconds.append(time.perf_counter() - start)
    self._thread = threading.Thread(target=self._persist_guarded,
                                    args=(snap,), daemon=True,
                                    name="tfopt-checkpoint")
    self._thread.start()
    if blocking:
      self.wait()

  def wait(self) -> None:
    """Blocks until the background persist finished; re-raises its error."""
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    if self._error is not None:
      error, self._error = self._error, None
      raise error

  def _persist_guarded(self, snap) -> None:
    try:
      self.persist(snap)
    except BaseException as err:  # pylint: disable=broad-except
      self._error = err

  def persist(self, snap) -> str:
    """Stage 2: writes a snapshot as the newest generation."""
    arrays, meta = snap["arrays"], dict(snap["meta"])
    meta["sha256"] = _digest(arrays)
    name = f"ckpt-{meta['step']}.npz"
    path = os.path.join(self.directory, name)

    def write(tmp):
      with open(tmp, "wb") as f:
        np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(),
                                           np.uint8), **arrays)
        f.flush()
        os.fsync(f.fileno())
    atomic_write(path, write, overwrite=True)
    index = self._index()
    generations = [g for g in index["generations"] if g != name] + [name]
    for old in generations[:-self.keep]:
      old_path = os.path.join(self.directory, old)
      if _NAME.match(old) and os.path.exists(old_path):
        os.unlink(old_path)
    index["generations"] = generations[-self.keep:]
    atomic_write_text(os.path.join(self.directory, INDEX),
                      json.dumps(index, indent=1), overwrite=True)
    return path

  def _index(self) -> dict:
    path = os.path.join(self.directory, INDEX)
    if not os.path.exists(path):
      return {"format": FORMAT, "generations": []}
    try:
      with open(path, encoding="utf-8") as f:
        index = json.load(f)
      if index.get("format") != FORMAT:
        raise ValueError(index.get("format"))
      return index
    except (ValueError, OSError):
      # The index is rewritten atomically, so this is someone else's file:
      # rebuild from the generation files this class names.
      names = sorted((n for n in os.listdir(self.directory)
                      if _NAME.match(n)),
                     key=lambda n: int(_NAME.match(n).group(1)))
      return {"format": FORMAT, "generations": names}

  # Restoring ---------------------------------------------------------------
  def latest(self) -> list:
    """Generation files, newest first."""
    if not os.path.isdir(self.directory):
      return []
    index = self._index()
    listed = set(index["generations"])
    extra = [n for n in os.listdir(self.directory)
             if _NAME.match(n) and n not in listed]
    names = index["generations"] + extra
    names = sorted(set(names), key=lambda n: int(_NAME.match(n).group(1)))
    return [os.path.join(self.directory, n) for n in reversed(names)]

  def restore(self) -> Restored | None:
    """Loads the newest intact generation into the model and optimizer;
    None if there is none. Raises a clear error for a checkpoint of a
    different model."""
    self.wait()
    skipped = []
    for path in self.latest():
      loaded = _load(path)
      if loaded is None:
        skipped.append(path)
        continue
      arrays, meta = loaded
      self._assign(arrays, meta, path)
      _set_numpy_rng_state(meta["numpy_rng"])
      return Restored(path, meta["step"], meta["epoch"],
                      meta["step_in_epoch"], skipped)
    return None

  def _assign(self, arrays: dict, meta: dict, path: str) -> None:
    variables = dict(_variables(self.model))
    optimizer = getattr(self.model, "optimizer", None)
    wants_optimizer = any(k.startswith("optimizer/") for k in arrays)
    if wants_optimizer and optimizer is not None and not optimizer.built:
      optimizer.build(self.model.trainable_variables)
      variables = dict(_variables(self.model))
    model_keys = {k for k in arrays if k.startswith(("model/",
                                                     "optimizer/"))}
    missing = sorted(set(variables) - model_keys)
    unexpected = sorted(model_keys - set(variables))
    if missing or unexpected:
      raise invalid_argument(
          "checkpoint", "a checkpoint of this model (variables differ: "
          f"missing {missing[:3]}, unexpected {unexpected[:3]})", path)
    for key, variable in variables.items():
      if tuple(arrays[key].shape) != tuple(variable.shape):
        saved = meta.get("paths", {}).get(key, key)
        raise invalid_argument(
            "checkpoint", f"a checkpoint of this model ({saved} has shape "
            f"{arrays[key].shape}, the model's {variable.path} "
            f"{tuple(variable.shape)})", path)
    for key, variable in variables.items():
      variable.assign(arrays[key])
    seed_state = keras_seed_state()
    if seed_state is not None and "rng/keras_global" in arrays:
      seed_state.assign(arrays["rng/keras_global"])


def keras_seed_state():
  """The state variable of Keras' global seed generator (what unseeded
  `keras.random` calls and dropout draw from), or None where this Keras
  does not have it (a private path: keras.src.random.seed_generator)."""
  try:
    from keras.src.random import seed_generator  # pylint: disable=import-outside-toplevel
    return seed_generator.global_seed_generator().state
  except (ImportError, AttributeError):
    return None


def _numpy_rng_state():
  kind, keys, pos, has_gauss, cached = np.random.get_state()
  return [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]


def _set_numpy_rng_state(state) -> None:
  kind, keys, pos, has_gauss, cached = state
  np.random.set_state((kind, np.array(keys, np.uint32), pos, has_gauss,
                       cached))


def _load(path: str):
  """(arrays, meta) if the file is whole and its hash matches, else None."""
  try:
    with open(path, "rb") as f:
      data = f.read()
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
      arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(arrays.pop("__meta__").tobytes().decode())
  except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile):
    # Unreadable, truncated (a crash mid-write), not an npz or without its
    # meta record: not a whole checkpoint, the caller tries the previous.
    return None
  if meta.get("format") != FORMAT or meta.get("sha256") != _digest(arrays):
    return None
  return arrays, meta
