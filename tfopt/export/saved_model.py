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
  5. optionally sends a PredictRequest built from TF Serving's protos over
     gRPC to a local `PredictionService` servicer that tfopt runs on the
     reloaded signature (`tfopt.export.serving`): the request/response
     contract a TF Serving client uses, not the model server binary;
  6. renames the directory into place: the export appears whole or not at
     all, and an existing `path` is only replaced with `overwrite=True`.

The signature is flat, one named tensor per input and per output, as TF
Serving's PredictRequest and PredictResponse are. A Keras model may take a
tensor, a list or a (nested) dict of inputs (keras-hub backbones take
`{"token_ids": ..., "padding_mask": ...}`); the signature's inputs are its
leaves, a leaf under a dict key keyed by that key, any other by the name of
its `keras.Input`, and each call packs them back into the model's structure.
Keys are made what TensorFlow keeps as a signature key (characters other
than ASCII letters and digits become `_`, `arg_` prefixes one that does not
start with a letter), so the keys reported are the ones to send.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from tfopt._errors import check_positive_int, invalid_argument

SIGNATURE = "serving_default"
# The length sample batches give a sequence dimension of unknown size: well
# under any model's maximum (keras-hub's position embeddings), over 1 so
# attention mixes positions.
_SAMPLE_LENGTH = 4


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


@dataclasses.dataclass(frozen=True)
class _Export:
  """One object to export: `specs`, the signature's inputs (flat, named by
  their keys); `write(directory)`, which writes the SavedModel; `call(batch)`,
  the original answering a batch keyed like the signature, its outputs keyed
  like the signature's (the oracle every check compares with)."""
  specs: list[tf.TensorSpec]
  write: Callable[[str], None]
  call: Callable[[dict], dict[str, np.ndarray]]


def _keras_model(obj) -> bool:
  try:
    import keras  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  return isinstance(obj, keras.Model)


def _signature_key(name: str) -> str:
  """`name` as TensorFlow keys a signature input (its tf.function argument
  sanitizer, kept to ASCII so the key is also a valid graph node name)."""
  key = re.sub(r"[^A-Za-z0-9]", "_", name)
  return key if re.match(r"[A-Za-z]", key) else "arg_" + key


def _input_name(tensor, index: int) -> str:
  name = getattr(tensor, "name", "") or f"input_{index}"
  return name.split(":")[0]


def _input_structure(model, input_signature):
  """What `model` is called with, leaves to be replaced by the signature's
  tensors: `model.input` (a functional model's tensor, list or nested dict
  of KerasTensors), a Sequential model's one input, or for a model without
  `inputs` (subclassed) the `input_signature` given, as it is arranged."""
  inputs = getattr(model, "inputs", None)
  if inputs:
    try:
      return model.input
    except (AttributeError, ValueError):  # Sequential: only `inputs`
      return inputs[0] if len(inputs) == 1 else list(inputs)
  if input_signature is None:
    raise invalid_argument("input_signature", "given for a Keras model "
                           "without `model.inputs` (a subclassed model)",
                           None)
  if isinstance(input_signature, (list, tuple)) and len(input_signature) == 1:
    return input_signature[0]
  return input_signature


def _keras_specs(model, structure, input_signature) -> list[tf.TensorSpec]:
  """The signature's inputs: one TensorSpec per leaf of `structure`, in
  Keras' flattening order (dicts by sorted key). Without `input_signature`
  they are the model's inputs with a None batch dimension (other dimensions
  and dtypes kept), keyed by dict key or `keras.Input` name; given, it is
  matched leaf by leaf, each spec keyed by its own name where it has one."""
  import keras  # pylint: disable=g-import-not-at-top
  leaves = keras.tree.flatten_with_path(structure)
  keys = [_signature_key(path[-1] if path and isinstance(path[-1], str) else
                         _input_name(leaf, i))
          for i, (path, leaf) in enumerate(leaves)]
  if input_signature is None:
    if len(set(keys)) != len(keys):
      raise invalid_argument(
          "model_or_function", "a model whose inputs have unique keys (dict "
          "keys, else `keras.Input` names), or be given with an "
          "`input_signature` of uniquely named TensorSpecs",
          f"{model.name} with input keys {keys}")
    return [tf.TensorSpec((None,) + tuple(leaf.shape[1:]), leaf.dtype,
                          name=key) for key, (_, leaf) in zip(keys, leaves)]
  given = keras.tree.flatten(input_signature)
  if len(given) != len(leaves) or not all(
      isinstance(s, tf.TensorSpec) for s in given):
    raise invalid_argument(
        "input_signature", f"{len(leaves)} tf.TensorSpecs, one per model "
        f"input (flat in `model.inputs` order, or arranged like "
        f"`model.input`)", input_signature)
  return [tf.TensorSpec(s.shape, s.dtype, name=_signature_key(s.name or key))
          for s, key in zip(given, keys)]


def _keyed_outputs(model, outputs) -> dict:
  """The signature's outputs: a dict's leaves by key (a nested dict's by
  their keys joined with `_`), else (a tensor, a list) by the model's
  output names where they are one per output and unique, else `output_i`."""
  import keras  # pylint: disable=g-import-not-at-top
  if isinstance(outputs, dict):
    return {"_".join(str(p) for p in path): value
            for path, value in keras.tree.flatten_with_path(outputs)}
  flat = keras.tree.flatten(outputs)
  names = list(getattr(model, "output_names", None) or [])
  if len(names) != len(flat) or len(set(names)) != len(names):
    names = [f"output_{i}" for i in range(len(flat))]
  return dict(zip(names, flat))


def _keras_export(model, input_signature) -> _Export:
  import keras  # pylint: disable=g-import-not-at-top
  structure = _input_structure(model, input_signature)
  specs = _keras_specs(model, structure, input_signature)

  def run(flat):
    inputs = keras.tree.pack_sequence_as(structure, list(flat))
    return _keyed_outputs(model, model(inputs, training=False))

  def write(directory: str) -> None:
    archive = keras.export.ExportArchive()
    archive.track(model)
    # Positional TensorSpecs: the signature is flat, keyed by their names.
    archive.add_endpoint(SIGNATURE, lambda *args: run(args), list(specs))
    archive.write_out(directory, verbose=False)

  return _Export(specs, write, lambda batch: _as_dict(
      run([batch[s.name] for s in specs])))


def _function_export(fn, input_signature) -> _Export:
  specs = list(input_signature or getattr(fn, "input_signature", None) or [])
  if not specs:
    raise invalid_argument("input_signature", "given for a tf.function "
                           "without one", input_signature)
  if not all(isinstance(s, tf.TensorSpec) for s in specs):
    raise invalid_argument("input_signature", "a flat sequence of "
                           "tf.TensorSpecs for a tf.function",
                           input_signature)
  return _Export(specs, lambda directory: _write_function(fn, specs,
                                                          directory),
                 lambda batch: _as_dict(fn(*[batch[s.name] for s in specs])))


def _exporter(model_or_function, input_signature) -> _Export:
  """How `model_or_function` is written and called; bad input raised."""
  if _keras_model(model_or_function):
    export = _keras_export(model_or_function, input_signature)
  elif hasattr(model_or_function, "get_concrete_function"):
    export = _function_export(model_or_function, input_signature)
  else:
    raise invalid_argument("model_or_function", "a keras.Model or a "
                           "tf.function", type(model_or_function).__name__)
  names = [s.name for s in export.specs]
  if any(not n for n in names) or len(set(names)) != len(names):
    raise invalid_argument("input_signature", "TensorSpecs with unique "
                           "names", names)
  return export


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
                 seed: int = 0, length: int = _SAMPLE_LENGTH
                 ) -> dict[str, np.ndarray]:
  """Inputs for a signature, keyed by TensorSpec name.

  A None first (batch) dimension becomes `batch_size`, any other None
  dimension (a sequence length) `length`. Floats are standard normal.
  Integers and booleans are 0 or 1: valid token ids, segment ids and class
  indices for any vocabulary of two or more. Integer or boolean inputs named
  like a mask (`padding_mask`) are all ones instead: every position present,
  as in an unpadded batch (a row masked out entirely would only exercise a
  softmax over nothing).
  """
  check_positive_int("batch_size", batch_size)
  check_positive_int("length", length)
  rng = np.random.default_rng(seed)
  batch = {}
  for spec in specs:
    if not isinstance(spec, tf.TensorSpec) or not spec.name or \
        spec.shape.rank is None:
      raise invalid_argument("specs", "named tf.TensorSpecs of known rank",
                             spec)
    dtype = spec.dtype
    if not (dtype.is_floating or dtype.is_integer or dtype.is_bool):
      raise invalid_argument("specs", "TensorSpecs of float, integer or "
                             "bool dtype", spec)
    shape = [d if d is not None else batch_size if i == 0 else length
             for i, d in enumerate(spec.shape.as_list())]
    if dtype.is_floating:
      value = rng.standard_normal(shape)
    elif "mask" in spec.name.lower():
      value = np.ones(shape)
    else:
      value = rng.integers(0, 2, shape)
    batch[spec.name] = value.astype(dtype.as_numpy_dtype)
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


def _compare_reloaded(export_dir: str, export: _Export, sizes, rtol: float,
                      atol: float) -> tuple[float, tuple[str, ...]]:
  """Reloads the export and compares its signature with the original at
  each batch size (a sequence dimension also grows, one per check); returns
  the worst |diff| and the signature's output keys."""
  loaded = tf.saved_model.load(export_dir)
  if SIGNATURE not in loaded.signatures:
    raise RuntimeError(f"The export has no {SIGNATURE!r} signature: "
                       f"{list(loaded.signatures)}")
  signature = loaded.signatures[SIGNATURE]
  worst, outputs = 0.0, ()
  for i, size in enumerate(sizes):
    batch = sample_batch(export.specs, size, seed=i, length=_SAMPLE_LENGTH + i)
    expected = export.call(batch)
    got = _as_dict(signature(**{k: tf.constant(v) for k, v in batch.items()}))
    outputs = tuple(sorted(got))
    what = f"reloaded export at batch {size}"
    diff = _max_diff(expected, got, what)
    if not all(np.allclose(x, y, rtol=rtol, atol=atol)
               for _, x, y in _paired(expected, got, what)):
      raise RuntimeError(f"The reloaded export differs from the original "
                         f"at batch size {size}: max |diff| {diff:.3g}.")
    worst = max(worst, diff)
  return worst, outputs


def _served_diff(path: str, export: _Export, size: int, rtol: float,
                 atol: float) -> float:
  """A PredictRequest (TF Serving's protos, over gRPC to tfopt's local
  servicer) compared with the original; returns the max |diff|."""
  from tfopt.export.serving import predict_over_grpc  # pylint: disable=g-import-not-at-top
  batch = sample_batch(export.specs, size, seed=7)
  served = _max_diff(export.call(batch), predict_over_grpc(path, batch),
                     "PredictRequest answer")
  if served > atol + rtol * 10:
    raise RuntimeError(f"The PredictRequest answer of the SavedModel at "
                       f"{path} differs from the model: max |diff| "
                       f"{served:.3g}.")
  return served


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


def _destination(path, overwrite: bool) -> tuple[str, str]:
  """The absolute export path and its (existing) parent directory."""
  path = os.path.abspath(os.fspath(path))
  parent = os.path.dirname(path)
  if not os.path.isdir(parent):
    raise invalid_argument("path", "in an existing directory", path)
  if os.path.exists(path) and not overwrite:
    raise invalid_argument("path", "a path that does not exist yet (pass "
                           "overwrite=True to replace it)", path,
                           FileExistsError)
  return path, parent


def _batch_sizes(batch_sizes) -> tuple[int, ...]:
  sizes = tuple(batch_sizes)
  if len(sizes) < 2 or any(isinstance(b, bool) or not isinstance(b, int) or
                           b <= 0 for b in sizes):
    raise invalid_argument("batch_sizes", "at least two positive integers",
                           batch_sizes)
  return sizes


def saved_model(model_or_function: Any, path: str | os.PathLike, *,
                input_signature: Any = None,
                overwrite: bool = False, keep_placement: bool = False,
                batch_sizes: Sequence[int] = (1, 3),
                serving_check: bool | None = None,
                rtol: float = 1e-5, atol: float = 1e-5) -> ExportReport:
  """Exports a Keras model or tf.function as a checked SavedModel.

  The `serving_default` signature takes one tensor per model input, keyed
  by the input's dict key (keras-hub backbones: `token_ids`,
  `padding_mask`, ...) or else its `keras.Input` name, with the model's
  dtypes and shapes (batch dimension None; unknown sequence dimensions stay
  None). Its outputs: a dict output's entries by key (BERT's
  `sequence_output`, `pooled_output`; nested keys joined with `_`); a
  tensor or list by the model's output names (`model.output_names`), or
  `output_0`, `output_1`, ... where those are not one per output; a
  tf.function's as `tf.saved_model.save` keys them.

  Args:
    model_or_function: a functional/sequential keras.Model (its inputs a
      tensor, a list or a nested dict), or a tf.function (with
      `input_signature` here or on the function).
    path: the SavedModel directory to create.
    input_signature: TensorSpecs with a None batch dimension (Keras models:
      default from `model.inputs`; given, one per input, flat in
      `model.inputs` order or arranged like `model.input`, a named spec
      keyed by its name).
    overwrite: replace an existing `path`.
    keep_placement: keep device strings (a placed export); loading it on
      other hardware then needs soft placement.
    batch_sizes: two (or more) batch sizes the reloaded model is compared at.
    serving_check: also answer a PredictRequest of TF Serving's protos over
      gRPC in a local servicer (not the model server binary), after the
      SavedModel is written. None (default):
      where the `tensorflow-serving-api` package exists, else skipped with
      a warning saying how to get it; True: required (an ImportError when
      the package is missing, the SavedModel already written); False: skip.
    rtol, atol: tolerance of the reload comparison.

  Returns:
    An ExportReport; the checks compare with the model called on
    `sample_batch` inputs (token ids 0 or 1, masks of ones).
  """
  path, parent = _destination(path, overwrite)
  sizes = _batch_sizes(batch_sizes)
  export = _exporter(model_or_function, input_signature)
  staging = tempfile.mkdtemp(prefix=".tmp-export-", dir=parent)
  try:
    export_dir = os.path.join(staging, "model")
    export.write(export_dir)
    remaining = _strip_devices(export_dir, keep_placement)
    cli = _cli_show(export_dir)
    worst, outputs = _compare_reloaded(export_dir, export, sizes, rtol, atol)
    _install(export_dir, path, parent)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  # The SavedModel is in place before the serving check: a missing package
  # or a failed check never costs the user the export.
  served = None
  if _serving_check_wanted(serving_check, path):
    served = _served_diff(path, export, sizes[0], rtol, atol)
  return ExportReport(path, {s.name: (tuple(s.shape.as_list()), s.dtype.name)
                             for s in export.specs}, outputs, keep_placement,
                      remaining, cli, sizes, worst, served)
