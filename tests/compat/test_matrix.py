"""The compatibility matrix: every family of `families.FAMILIES` through
every path a user takes, each cell compared with plain Keras (never with
tfopt itself).

Paths (`PATHS`): `hook` (tfopt.compile with fusion), `xla` (with
jit_compile=True), `placed` (m-ETF on 2 logical devices), `spread` (auto on
2 logical devices under a cap below the step's one-device peak),
`mirrored` (built in a MirroredStrategy scope over 2 logical devices, vs
plain Keras under the same strategy), `pruned` (MoE rows: prune_moe at
50 %), `exported` (a SavedModel whose serving signature answers what
`model.predict` does). Every cell runs, in CI too. A family's placed,
spread and mirrored cells run in one process of the family's own (logical
devices exist only if configured before TensorFlow starts:
`_placed_script.py`); a family's cells form one xdist group, so `make
test`'s two test processes each take whole families.

README's compatibility matrix is generated from these cells' outcomes
(`python tools/compat_matrix.py`); `test_readme_matrix_is_generated`
keeps the two in step.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys

import keras
import numpy as np
import pytest

import tfopt
from tests.compat import families as fam

PATHS = ("hook", "xla", "placed", "spread", "mirrored", "pruned",
         "exported")


# Cells where the path does not give plain Keras' result, and why, keyed
# (family, path) -> (status, reason). Each cell's test checks that the
# reason still holds (the day it does not, the test fails and the cell
# becomes an ordinary one):
# - "Keras fails": plain Keras itself cannot run the cell;
# - "XLA declined": the hook's first-batch check finds the XLA step's
#   numbers off plain Keras' and runs the step without XLA, equal to plain
#   Keras (Keras' own jit_compile=True runs it, and its losses move off).
EXCEPTIONS = {
    **{(name, "mirrored"): ("Keras fails", (
        "plain Keras fails under a MirroredStrategy: its symbolic build "
        "averages a sample batch across replicas, and the preprocessor's "
        "bool padding mask has no AddN kernel (Keras' "
        "`_maybe_symbolic_build`; tfopt's hook runs after it and fails the "
        "same way). Feeding the mask as int32 avoids it (the LM rows do)"))
       for name in ("keras-hub GPT-2 CausalLM + preprocessor",
                    "keras-hub BERT classifier + preprocessor")},
    ("keras.applications MobileNet", "xla"): ("XLA declined", (
        "batch norm over 1x1 feature maps (32x32 inputs, stride 32) is "
        "ill-conditioned: XLA's kernels give gradients 0.5-1 % off "
        "TensorFlow's, so the hook runs the step without XLA, equal to "
        "plain Keras; Keras' own jit_compile=True runs it and its losses "
        "end 9 % off its run without XLA")),
}


def applies(family: fam.Family, path: str) -> str:
  """"yes", "n/a" (pruning is for MoE rows) or the cell's status in
  `EXCEPTIONS`."""
  if path == "pruned" and not family.moe:
    return "n/a"
  if (family.name, path) in EXCEPTIONS:
    return EXCEPTIONS[family.name, path][0]
  return "yes"


_SUBPROCESS = ("placed", "spread", "mirrored")


def cells():
  """(family, path) of every cell, each a pytest param, a family's cells
  one after the other in one xdist group: they share the family's plain
  Keras run, its hook-trained model (`trained`) and its logical-devices
  process (`_logical_device_cells`), on one test process."""
  out = []
  for family in fam.FAMILIES:
    for path in PATHS:
      if applies(family, path) == "n/a":
        continue
      marks = [pytest.mark.xdist_group(f"compat: {family.name}")]
      if path in _SUBPROCESS:
        marks.append(pytest.mark.slow)
      out.append(pytest.param(family.name, path,
                              id=f"{family.name}-{path}", marks=marks))
  return out


def _skip_if_missing(family: fam.Family) -> None:
  for module in family.needs:
    if importlib.util.find_spec(module) is None:
      pytest.skip(f"{family.name} needs {module} (make venv installs it)")


FIT = dict(epochs=2, shuffle=False, verbose=0)


@functools.lru_cache(maxsize=None)
def plain_history(name: str) -> dict:
  """Plain Keras' loss and metric trajectory, once per family."""
  family = fam.BY_NAME[name]
  model = family.build()
  model.compile(**family.compile_kwargs())
  return model.fit(**family.data(), **FIT).history


def _hooked(family: fam.Family, **kwargs):
  model = family.build()
  tfopt.compile(model, verbose=False, **family.compile_kwargs(), **kwargs)
  history = model.fit(**family.data(), **FIT).history
  return model, history


@functools.lru_cache(maxsize=None)
def trained(name: str):
  """The family's model trained through the hook, and its history: the
  hook cell checks it, the exported and pruned cells carry it on (a user
  exports or prunes the model they trained). Kept for the process: xdist
  may run other tests between a family's cells."""
  return _hooked(fam.BY_NAME[name])


def _assert_same_history(got: dict, expected: dict, rtol: float) -> None:
  assert set(got) == set(expected)
  for key in expected:
    np.testing.assert_allclose(got[key], expected[key], rtol=rtol,
                               err_msg=key)


@functools.lru_cache(maxsize=None)
def _logical_device_cells(name: str) -> dict:
  """The family's placed, spread and mirrored cells, from a process with
  2 logical CPUs (`_placed_script.py`: they exist only if configured
  before TensorFlow starts)."""
  done = subprocess.run(
      [sys.executable, "-m", "tests.compat._placed_script", name],
      capture_output=True, text=True, timeout=1500, check=False)
  assert done.returncode == 0, done.stderr[-4000:]
  return json.loads(done.stdout.strip().splitlines()[-1])[name]


def _check_hook(family):
  model, history = trained(family.name)
  _assert_same_history(history, plain_history(family.name), rtol=1e-5)
  reports = list(model.train_function.reports.values())
  assert reports and all("verified on the first batch" in r.table()
                         for r in reports)


def _check_xla(family):
  model, history = _hooked(family, jit_compile=True)
  if applies(family, "xla") == "XLA declined":
    _check_xla_declined(family, model, history)
    return
  # XLA reorders float math: close to plain Keras, not bit-equal.
  _assert_same_history(history, plain_history(family.name), rtol=1e-4)
  reports = list(model.train_function.reports.values())
  assert reports and all(r.xla.startswith("XLA: ") for r in reports), [
      r.xla for r in reports]


def _check_xla_declined(family, model, history):
  # The hook said why, and trained as plain Keras does.
  reports = list(model.train_function.reports.values())
  assert reports and all(r.xla.startswith("XLA not used: The XLA-compiled "
                                          "step computes gradient")
                         for r in reports), [r.xla for r in reports]
  _assert_same_history(history, plain_history(family.name), rtol=1e-5)
  # Keras' own XLA step moves off plain Keras by far more than the cell's
  # tolerance: the numbers, not tfopt, are what XLA changes here.
  model = family.build()
  model.compile(jit_compile=True, **family.compile_kwargs())
  keras_xla = model.fit(**family.data(), **FIT).history["loss"]
  plain = plain_history(family.name)["loss"]
  assert np.max(np.abs(np.subtract(keras_xla, plain)) / np.abs(plain)) > 1e-2


def _check_placed(family, path):
  result = _logical_device_cells(family.name)[path]
  assert result.get("error") is None, result.get("error")
  # Against plain Keras in this process (one device).
  _assert_same_history(result["history"], plain_history(family.name),
                       rtol=1e-5)
  assert result["devices"] == ["/device:CPU:0", "/device:CPU:1"], result
  assert result["verified"] > 0
  if path == "spread":
    # The cap is below the step's one-device peak; every device's
    # simulated peak is within it.
    assert result["cap"] < result["one_device_peak"], result
    assert max(result["peaks"]) <= result["cap"], result


def _check_mirrored(family):
  result = _logical_device_cells(family.name)["mirrored"]
  if applies(family, "mirrored") == "Keras fails":
    for error in (result.get("plain_error"), result.get("hook_error")):
      assert error and "AddN" in error and "bool" in error, result
    return
  assert result.get("error") is None, result.get("error")
  # Plain Keras under the same MirroredStrategy: each replica's step
  # rewritten, the all-reduce and updates Keras'.
  _assert_same_history(result["history"], result["plain"], rtol=1e-5)
  assert set(result["replicas"]) == {2} and result["verified"] > 0


def _check_pruned(family):
  from tfopt.pruning import prune_moe  # pylint: disable=g-import-not-at-top
  from tfopt.pruning.adapters import adapter_for, find_moe_layers  # pylint: disable=g-import-not-at-top
  model, _ = trained(family.name)
  reference = family.build()
  reference.set_weights(model.get_weights())
  data = family.data()
  prune_moe(model, data["x"], sparsity=0.5)
  # Independent of tfopt's metric: half of every expert kernel is zero, and
  # the pruned model computes exactly what plain Keras computes with those
  # zeros written into the unpruned model's expert kernels by NumPy.
  pruned = set()
  for layer in find_moe_layers(model):
    for kernel in adapter_for(layer).kernels(layer):
      value = keras.ops.convert_to_numpy(kernel.variable)
      assert abs((value == 0).mean() - 0.5) < 0.01, kernel.name
      pruned.add(id(kernel.variable))
  assert pruned
  for var, ref in zip(model.weights, reference.weights):
    if id(var) in pruned:
      ref.assign(keras.ops.convert_to_numpy(ref) *
                 (keras.ops.convert_to_numpy(var) != 0))
  x = {k: v[:4] for k, v in data["x"].items()}
  np.testing.assert_allclose(model.predict(x, verbose=0),
                             reference.predict(x, verbose=0), atol=1e-5)


def _check_exported(family, tmp_path):
  from tfopt.export import saved_model  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model, _ = trained(family.name)
  # A task model with a preprocessor serves its backbone's tensors: the
  # preprocessor's strings are tokenized outside the SavedModel.
  pre = getattr(model, "preprocessor", None)
  target = model if pre is None else _without_preprocessor(model)
  report = saved_model(target, tmp_path / "model", serving_check=None)
  assert report.max_abs_diff <= 1e-5, report
  loaded = tf.saved_model.load(str(tmp_path / "model"))
  serve = loaded.signatures["serving_default"]
  x = _sample_inputs(family, pre)
  expected = target.predict(x, verbose=0)
  got = serve(**{k: tf.constant(v) for k, v in _keyed(target, x).items()})
  (got,) = got.values() if len(got) == 1 else (got,)
  if isinstance(expected, dict):
    for key, value in expected.items():
      np.testing.assert_allclose(got[key].numpy(), value, atol=1e-5)
  else:
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5)


def _without_preprocessor(task):
  """The task's model without its preprocessor (same weights)."""
  return keras.Model(task.inputs, task.outputs, name=f"{task.name}_tensors")


def _sample_inputs(family, preprocessor):
  """Three examples of what the model without its preprocessor takes:
  the preprocessor's own output for text, else the family's data."""
  x = family.data()["x"]
  if preprocessor is not None:
    x = keras.utils.unpack_x_y_sample_weight(preprocessor(x[:3]))[0]
    return {k: keras.ops.convert_to_numpy(v) for k, v in x.items()}
  if isinstance(x, dict):
    return {k: v[:3] for k, v in x.items()}
  return x[:3]


def _keyed(model, x) -> dict:
  """The serving signature's keyword inputs for batch `x`, in the model's
  input dtypes (a client sends what the signature declares)."""
  if not isinstance(x, dict):
    (tensor,) = model.inputs
    x = {tensor.name: x}
  dtypes = ({k: t.dtype for k, t in model.input.items()}
            if isinstance(model.input, dict) else
            {k: model.inputs[0].dtype for k in x})
  return {k: np.asarray(v).astype(dtypes[k]) for k, v in x.items()}


@pytest.mark.parametrize("name,path", cells())
def test_cell(name, path, tmp_path, record_property):
  record_property("cell", (name, path))  # tools/compat_matrix.py reads it
  family = fam.BY_NAME[name]
  _skip_if_missing(family)
  if path == "hook":
    _check_hook(family)
  elif path == "xla":
    _check_xla(family)
  elif path in ("placed", "spread"):
    _check_placed(family, path)
  elif path == "mirrored":
    _check_mirrored(family)
  elif path == "pruned":
    _check_pruned(family)
  else:
    _check_exported(family, tmp_path)


def test_readme_matrix_is_generated():
  # README's and the guide's tables are tools/compat_matrix.py's rendering
  # of the committed results, which cover exactly the suite's cells, each
  # passed in the run that wrote them.
  import pathlib  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(__file__).resolve().parents[2]
  spec = importlib.util.spec_from_file_location(
      "compat_matrix", root / "tools" / "compat_matrix.py")
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  results = json.loads(tool.RESULTS.read_text())
  assert results["paths"] == list(PATHS)
  expected = {(f.name, p): ("passed" if applies(f, p) == "yes" else
                            applies(f, p))
              for f in fam.FAMILIES for p in PATHS}
  assert {(r["family"], p): v for r in results["rows"]
          for p, v in r["cells"].items()} == expected
  table = tool.render(results)
  for page in tool.PAGES:
    text = page.read_text()
    assert f"{tool.BEGIN}\n{table}\n{tool.END}" in text, page
