"""Export of a chosen sub-graph: a `.keras` file and a SavedModel.

`export_subgraph` builds `net.subnet(arch)` with the inherited weights,
after recalibrating the path's BatchNorm statistics on calibration data (the
super-network's moving statistics mix every sampled path; the
super-network itself is left as it was), writes `<directory>/model.keras`
and `<directory>/saved_model/` (Keras' `model.export`: a `serve` endpoint
that TF Serving loads), then reloads both and checks that they give the
exported model's outputs on a probe batch. Both are written to temporary
names and renamed into place, so an interrupted export leaves nothing half
written, and an existing export is replaced only with `overwrite=True`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile

import keras
import numpy as np

from tfopt._errors import invalid_argument

KERAS_FILE = "model.keras"
SAVED_MODEL_DIR = "saved_model"


@dataclasses.dataclass
class SubgraphExport:
  """Where the export went and how far the reloaded models' outputs were
  from the exported model's (max absolute difference on the probe)."""
  arch: tuple
  keras_path: str
  saved_model_path: str
  keras_max_abs_diff: float
  saved_model_max_abs_diff: float


def _with_recalibrated_bn(net, arch, x_cal):
  """`net.subnet(arch)` with BatchNorm statistics re-estimated on `x_cal`;
  the super-network's path and statistics are restored."""
  from tfopt.nas.ranking import (path_blocks,  # pylint: disable=import-outside-toplevel
                                 preserved_state, recalibrate_batchnorm)
  with preserved_state(net, path_blocks(net, arch)):
    net.set_arch(arch)
    if x_cal is not None:
      recalibrate_batchnorm(net, x_cal)
    return net.subnet(arch)


def export_subgraph(net, arch, directory: str, x_cal=None, probe=None,
                    overwrite: bool = False, atol: float = 1e-5
                    ) -> SubgraphExport:
  """Exports sub-graph `arch` of `net` (a `SuperNet`) into `directory`.

  Args:
    x_cal: calibration images for BatchNorm (None: keep the super-network's
      statistics, only right for a network trained on this path alone).
    probe: inputs for the reload check (default: 8 rows of `x_cal`, or
      random inputs).
    overwrite: replace an existing export in `directory`.
    atol: the largest output difference the reload check accepts.

  Raises FileExistsError without `overwrite` if an export is there, and
  RuntimeError if a reloaded model does not reproduce the outputs.
  """
  from tfopt.nas.supernet import SuperNet  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  if not isinstance(net, SuperNet):
    raise invalid_argument("net", "a tfopt.nas.SuperNet", type(net).__name__)
  arch = net.space.check_arch(arch)
  keras_path = os.path.join(directory, KERAS_FILE)
  saved_path = os.path.join(directory, SAVED_MODEL_DIR)
  existing = [p for p in (keras_path, saved_path) if os.path.exists(p)]
  if existing and not overwrite:
    raise invalid_argument("directory", "a directory without an export "
                           "(or overwrite=True)", directory, FileExistsError)
  os.makedirs(directory, exist_ok=True)
  model = _with_recalibrated_bn(net, arch, x_cal)
  if probe is None:
    probe = (np.asarray(x_cal[:8]) if x_cal is not None else
             np.random.default_rng(0).normal(
                 size=(8,) + net.space.input_shape))
  probe = np.asarray(probe, "float32")
  expected = keras.ops.convert_to_numpy(model(probe, training=False))
  staging = tempfile.mkdtemp(prefix=".tmp-export-", dir=directory)
  try:
    model.save(os.path.join(staging, KERAS_FILE))
    model.export(os.path.join(staging, SAVED_MODEL_DIR),
                 format="tf_saved_model", verbose=False)
    reloaded = keras.saving.load_model(os.path.join(staging, KERAS_FILE))
    keras_diff = float(np.abs(keras.ops.convert_to_numpy(
        reloaded(probe, training=False)) - expected).max())
    served = tf.saved_model.load(os.path.join(staging, SAVED_MODEL_DIR))
    saved_diff = float(np.abs(np.asarray(served.serve(probe)) -
                              expected).max())
    if max(keras_diff, saved_diff) > atol:
      raise RuntimeError(
          f"The exported sub-graph {arch} does not reproduce its outputs "
          f"after reloading (max |diff|: .keras {keras_diff:.3g}, "
          f"SavedModel {saved_diff:.3g}; atol {atol}).")
    for name, final in ((KERAS_FILE, keras_path),
                        (SAVED_MODEL_DIR, saved_path)):
      if os.path.isdir(final):
        shutil.rmtree(final)
      elif os.path.exists(final):
        os.unlink(final)
      os.replace(os.path.join(staging, name), final)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return SubgraphExport(arch, keras_path, saved_path, keras_diff, saved_diff)
