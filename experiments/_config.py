"""Config files for the experiment scripts: Python files beside them that
define `CONFIG = {...}`, whose docstring gives the exact command and the
expected result. Flags stay few; the knobs live in the config."""

from __future__ import annotations

import os
import runpy
from typing import Any, Mapping

from absl import app


def load_config(path: str | None, defaults: Mapping[str, Any]) -> dict:
  """`defaults` updated with the file's CONFIG; unknown keys are refused."""
  if not path:
    return dict(defaults)
  if not os.path.isfile(path):
    raise app.UsageError(f"--config={path} does not exist; configs live in "
                         f"experiments/configs/ (e.g. "
                         f"experiments/configs/train_digits_mlp.py).")
  try:
    namespace = runpy.run_path(path)
  except Exception as err:  # pylint: disable=broad-except
    raise app.UsageError(f"--config={path} could not be read: "
                         f"{type(err).__name__}: {err}") from None
  config = namespace.get("CONFIG")
  if not isinstance(config, dict):
    raise app.UsageError(f"--config={path} must define CONFIG = {{...}}.")
  unknown = sorted(set(config) - set(defaults))
  if unknown:
    raise app.UsageError(f"--config={path} has unknown keys {unknown}; "
                         f"known: {sorted(defaults)}.")
  return {**defaults, **config}
