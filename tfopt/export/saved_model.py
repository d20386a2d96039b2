"""SavedModel export for TF Serving, checked before it is handed over.

`saved_model(model_or_function, path)`:
  1. writes a SavedModel with a `serving_default` signature into a temporary
     directory beside `path` (Keras models through `keras.export.
     ExportArchive`, tf.functions through `tf.saved_model.save`);
  2. strips device strings from every graph and function in it, unless
     `keep_placement=True` (a SavedModel naming devices that do not exist
     only loads with soft placement);
  3. checks it with `saved_model_cli show` (the tool TF Serving users run);
  4. reloads it and compares its outputs with the original's at two batch
     sizes;
  5. optionally answers a PredictRequest through TF Serving's protos and
     gRPC service in a local server (`tfopt.export.serving`);
  6. renames the directory into place: the export appears whole or not at
     all, and an existing `path` is only replaced with `overwrite=True`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from tfopt._errors import invalid_argument

SIGNATURE = "serving_default"


@dataclasses.dataclass(frozen=True)
class ExportReport:
  """What was written and what was checked."""
  path: str
  inputs: dict[str, tuple]   # input name -> (shape, dtype)
  outputs: tuple[str, ...]
  placement_kept: bool
  device_strings: int        # device strings left in the SavedModel
  cli_output: str
  batch_sizes: tuple[int, ...]
  max_abs_diff: float        # reloaded vs original, over all checks
  served_max_abs_diff: float | None  # the gRPC PredictRequest check

  def summary(self) -> str:
    served = ("not checked" if self.served_max_abs_diff is None else
              f"max |diff| {self.served_max_abs_diff:.2g}")
    return (f"SavedModel {self.path}: signature {SIGNATURE!r} "
            f"{sorted(self.inputs)} -> {list(self.outputs)}; reloaded at "
            f"batch sizes {list(self.batch_sizes)}: max |diff| "
            f"{self.max_abs_diff:.2g}; PredictRequest over gRPC: {served}; "
            f"device strings kept: {self.device_strings}")


def _keras_model(obj) -> bool:
  try:
    import keras  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  return isinstance(obj, keras.Model)


def _specs_for_model(model) -> list[tf.TensorSpec]:
  if not getattr(model, "inputs", None):
    raise invalid_argument("input_signature", "given for a Keras model "
                           "without `model.inputs` (a subclassed model)",
                           None)
  return [tf.TensorSpec((None,) + tuple(t.shape[1:]), t.dtype,
                        name=_input_name(t, i))
          for i, t in enumerate(model.inputs)]


def _input_name(tensor, index: int) -> str:
  name = getattr(tensor, "name", "") or f"input_{index}"
  return name.split(":")[0].replace("/", "_")


def _write_keras(model, specs, directory: str) -> None:
  import keras  # pylint: disable=g-import-not-at-top

  def serve(*args):
    outputs = model(list(args) if len(args) > 1 else args[0], training=False)
    if isinstance(outputs, dict):
      return outputs
    flat = tf.nest.flatten(outputs)
    out_names = list(getattr(model, "output_names", None) or [])
    if len(out_names) != len(flat):
      out_names = [f"output_{i}" for i in range(len(flat))]
    return dict(zip(out_names, flat))

  archive = keras.export.ExportArchive()
  archive.track(model)
  archive.add_endpoint(SIGNATURE, serve, list(specs))
  archive.write_out(directory, verbose=False)


def _write_function(fn, specs, directory: str) -> None:
  module = tf.Module()
  module.serve = fn
  concrete = fn.get_concrete_function(*specs)
  # Captured variables must be tracked by the saved object.
  module.captured_variables = list(concrete.variables)
  tf.saved_model.save(module, directory, signatures={SIGNATURE: concrete})


def _strip_devices(directory: str, keep: bool) -> int:
  """Clears device strings (unless `keep`); returns how many remain."""
  from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=g-import-not-at-top
  pb_path = os.path.join(directory, "saved_model.pb")
  proto = saved_model_pb2.SavedModel()
  with open(pb_path, "rb") as f:
    proto.ParseFromString(f.read())
  remaining = 0
  for meta in proto.meta_graphs:
    nodes = list(meta.graph_def.node)
    for function in meta.graph_def.library.function:
      nodes.extend(function.node_def)
    for node in nodes:
      if node.device and not keep:
        node.device = ""
      remaining += bool(node.device)
  if not keep:
    with open(pb_path, "wb") as f:
      f.write(proto.SerializeToString())
  return remaining


def _cli_show(directory: str) -> str:
  """`saved_model_cli show` on the signature; raises if it fails."""
  command = [sys.executable, "-m", "tensorflow.python.tools.saved_model_cli",
             "show", "--dir", directory, "--tag_set", "serve",
             "--signature_def", SIGNATURE]
  proc = subprocess.run(command, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                        check=False)
  if proc.returncode != 0 or "inputs" not in proc.stdout:
    raise RuntimeError(f"saved_model_cli could not read the export "
                       f"(exit {proc.returncode}): {proc.stderr[-800:]}")
  return proc.stdout


def sample_batch(specs: Sequence[tf.TensorSpec], batch_size: int,
                 seed: int = 0) -> dict[str, np.ndarray]:
  """Random inputs for a signature: normal floats, small integers."""
  rng = np.random.default_rng(seed)
  batch = {}
  for spec in specs:
    shape = [batch_size if d is None else d for d in spec.shape]
    if spec.dtype.is_floating:
      batch[spec.name] = rng.standard_normal(shape).astype(
          spec.dtype.as_numpy_dtype)
    else:
      batch[spec.name] = rng.integers(0, 2, shape).astype(
          spec.dtype.as_numpy_dtype)
  return batch


def _as_dict(outputs) -> dict[str, np.ndarray]:
  if isinstance(outputs, dict):
    return {k: np.asarray(v) for k, v in outputs.items()}
  flat = tf.nest.flatten(outputs)
  return {f"output_{i}": np.asarray(v) for i, v in enumerate(flat)}


def _paired(expected: dict, got: dict, what: str) -> list[tuple]:
  """(name, expected, got) per output: by name, or in order when the model
  names its single output differently from the signature."""
  if set(expected) == set(got):
    return [(k, expected[k], np.asarray(got[k])) for k in sorted(expected)]
  if len(expected) == len(got) == 1:
    (k, x), (y,) = next(iter(expected.items())), list(got.values())
    return [(k, x, np.asarray(y))]
  raise RuntimeError(f"{what}: outputs {sorted(got)}, expected "
                     f"{sorted(expected)}.")


def _max_diff(expected: dict, got: dict, what: str) -> float:
  worst = 0.0
  for name, x, y in _paired(expected, got, what):
    if x.shape != y.shape or x.dtype != y.dtype:
      raise RuntimeError(f"{what}: output {name!r} has shape {y.shape} "
                         f"{y.dtype}, expected {x.shape} {x.dtype}.")
    worst = max(worst, float(np.max(np.abs(x - y))) if x.size else 0.0)
  return worst


def _install(export_dir: str, path: str, parent: str) -> None:
  """Moves the checked export to `path` (replacing what is there only when
  the caller passed overwrite=True: swapped first, then the old removed)."""
  if os.path.exists(path):
    old = tempfile.mkdtemp(prefix=".tmp-replaced-", dir=parent)
    os.rename(path, os.path.join(old, "previous"))
    os.rename(export_dir, path)
    shutil.rmtree(old, ignore_errors=True)
  else:
    os.rename(export_dir, path)


def serving_api_available() -> bool:
  """Whether TF Serving's API package (`tensorflow-serving-api`) imports."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  try:
    return importlib.util.find_spec("tensorflow_serving.apis") is not None
  except ModuleNotFoundError:
    return False


def _serving_check_wanted(serving_check: bool | None, path: str) -> bool:
  """True: run it (its package missing is an error naming the written
  SavedModel); None: run it where the package exists, else say how to get
  it; False: skip."""
  if serving_check is False:
    return False
  if serving_api_available():
    return True
  how = ("pip install --no-deps 'tensorflow-serving-api>=2.18,<2.22' "
         "(--no-deps keeps your TensorFlow build); serving_check=False skips "
         "the check")
  if serving_check:
    raise ImportError(f"The SavedModel is written to {path}, but its TF "
                      f"Serving check needs the `tensorflow-serving-api` "
                      f"package: {how}.")
  logging.getLogger("tfopt").warning(
      "SavedModel written to %s; its TF Serving check was skipped: %s.",
      path, how)
  return False


def saved_model(model_or_function: Any, path: str | os.PathLike, *,
                input_signature: Sequence[tf.TensorSpec] | None = None,
                overwrite: bool = False, keep_placement: bool = False,
                batch_sizes: Sequence[int] = (1, 3),
                serving_check: bool | None = None,
                rtol: float = 1e-5, atol: float = 1e-5) -> ExportReport:
  """Exports a Keras model or tf.function as a checked SavedModel.

  Args:
    model_or_function: a functional/sequential keras.Model, or a tf.function
      (with `input_signature` here or on the function).
    path: the SavedModel directory to create.
    input_signature: TensorSpecs with a None batch dimension (Keras models:
      default from `model.inputs`).
    overwrite: replace an existing `path`.
    keep_placement: keep device strings (a placed export); loading it on
      other hardware then needs soft placement.
    batch_sizes: two (or more) batch sizes the reloaded model is compared at.
    serving_check: also answer a PredictRequest over TF Serving's gRPC API
      in a local server, after the SavedModel is written. None (default):
      where the `tensorflow-serving-api` package exists, else skipped with
      a warning saying how to get it; True: required (an ImportError when
      the package is missing, the SavedModel already written); False: skip.
    rtol, atol: tolerance of the reload comparison.
  """
  path = os.path.abspath(os.fspath(path))
  parent = os.path.dirname(path)
  if not os.path.isdir(parent):
    raise invalid_argument("path", "in an existing directory", path)
  if os.path.exists(path) and not overwrite:
    raise invalid_argument("path", "a path that does not exist yet (pass "
                           "overwrite=True to replace it)", path,
                           FileExistsError)
  sizes = tuple(batch_sizes)
  if len(sizes) < 2 or any(isinstance(b, bool) or not isinstance(b, int) or
                           b <= 0 for b in sizes):
    raise invalid_argument("batch_sizes", "at least two positive integers",
                           batch_sizes)
  if _keras_model(model_or_function):
    specs = list(input_signature or _specs_for_model(model_or_function))
    write = _write_keras
    call = lambda batch: model_or_function(  # noqa: E731
        [batch[s.name] for s in specs] if len(specs) > 1 else
        batch[specs[0].name], training=False)
  elif hasattr(model_or_function, "get_concrete_function"):
    specs = list(input_signature or
                 getattr(model_or_function, "input_signature", None) or [])
    if not specs:
      raise invalid_argument("input_signature", "given for a tf.function "
                             "without one", input_signature)
    write = _write_function
    call = lambda batch: model_or_function(  # noqa: E731
        *[batch[s.name] for s in specs])
  else:
    raise invalid_argument("model_or_function", "a keras.Model or a "
                           "tf.function", type(model_or_function).__name__)
  names = [s.name for s in specs]
  if any(not n for n in names) or len(set(names)) != len(names):
    raise invalid_argument("input_signature", "TensorSpecs with unique "
                           "names", names)
  staging = tempfile.mkdtemp(prefix=".tmp-export-", dir=parent)
  try:
    export_dir = os.path.join(staging, "model")
    write(model_or_function, specs, export_dir)
    remaining = _strip_devices(export_dir, keep_placement)
    cli = _cli_show(export_dir)
    loaded = tf.saved_model.load(export_dir)
    if SIGNATURE not in loaded.signatures:
      raise RuntimeError(f"The export has no {SIGNATURE!r} signature: "
                         f"{list(loaded.signatures)}")
    signature = loaded.signatures[SIGNATURE]
    worst, outputs = 0.0, ()
    for i, size in enumerate(sizes):
      batch = sample_batch(specs, size, seed=i)
      expected = _as_dict(call(batch))
      got = _as_dict(signature(**{k: tf.constant(v)
                                  for k, v in batch.items()}))
      outputs = tuple(sorted(got))
      what = f"reloaded export at batch {size}"
      diff = _max_diff(expected, got, what)
      if not all(np.allclose(x, y, rtol=rtol, atol=atol)
                 for _, x, y in _paired(expected, got, what)):
        raise RuntimeError(f"The reloaded export differs from the original "
                           f"at batch size {size}: max |diff| {diff:.3g}.")
      worst = max(worst, diff)
    del loaded, signature
    _install(export_dir, path, parent)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  # The SavedModel is in place before the serving check: a missing package
  # or a failed check never costs the user the export.
  served = None
  if _serving_check_wanted(serving_check, path):
    from tfopt.export.serving import predict_over_grpc  # pylint: disable=g-import-not-at-top
    batch = sample_batch(specs, sizes[0], seed=7)
    response = predict_over_grpc(path, batch)
    served = _max_diff(_as_dict(call(batch)), response,
                       "PredictRequest answer")
    if served > atol + rtol * 10:
      raise RuntimeError(f"The PredictRequest answer of the SavedModel at "
                         f"{path} differs from the model: max |diff| "
                         f"{served:.3g}.")
  return ExportReport(path, {s.name: (tuple(s.shape.as_list()), s.dtype.name)
                             for s in specs}, outputs, keep_placement,
                      remaining, cli, sizes, worst, served)
