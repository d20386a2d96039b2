"""Config files for the experiment scripts: Python files in
experiments/configs/ that define `CONFIG = {...}`, whose docstring gives the
exact command and the expected result. Flags stay few; the knobs live in the
config.

Two ways a script reads one: `load_config` (train.py: the config's keys are
the script's own knobs, with defaults) and `apply_config` (every other
script: the keys are the script's flag names; a flag given on the command
line wins over the config, the config wins over the flag's default).
"""

from __future__ import annotations

import json
import os
import runpy
from typing import Any, Mapping

from absl import app, flags


def read_config(path: str) -> dict:
  """The CONFIG dict of a config file; usage errors say what is wrong."""
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
  return config


def load_config(path: str | None, defaults: Mapping[str, Any]) -> dict:
  """`defaults` updated with the file's CONFIG; unknown keys are refused."""
  if not path:
    return dict(defaults)
  config = read_config(path)
  unknown = sorted(set(config) - set(defaults))
  if unknown:
    raise app.UsageError(f"--config={path} has unknown keys {unknown}; "
                         f"known: {sorted(defaults)}.")
  return {**defaults, **config}


def define_config_flag() -> None:
  """The script's --config flag (call once, at module level)."""
  flags.DEFINE_string("config", None, "Config file (experiments/configs/"
                      "*.py): CONFIG = {flag_name: value}; flags given on the "
                      "command line win.")


def apply_config(flag_values: flags.FlagValues = flags.FLAGS) -> dict:
  """Sets the flags named in --config's CONFIG, except those given on the
  command line. Returns what it set. Keys must be flags of the script (not
  --config itself); values are checked by the flag's own parser (enums,
  integers, lists); a dict for a string flag is passed as JSON."""
  path = flag_values["config"].value
  if not path:
    return {}
  config = read_config(path)
  known = _script_flags(flag_values)
  unknown = sorted(set(config) - set(known))
  if unknown:
    raise app.UsageError(f"--config={path} has unknown keys {unknown}; "
                         f"known: {known}.")
  applied = {}
  for name, value in config.items():
    flag = flag_values[name]
    if flag.present:
      continue  # the command line wins
    if isinstance(value, dict) and isinstance(flag.default, (str, type(None))):
      value = json.dumps(value)
    try:
      flag.parse(value)
    except (flags.IllegalFlagValueError, ValueError, TypeError) as err:
      raise app.UsageError(f"--config={path}: {name}={value!r} is not a "
                           f"valid --{name}: {err}") from None
    applied[name] = flag.value
  try:
    flag_values.validate_all_flags()
  except flags.IllegalFlagValueError as err:
    raise app.UsageError(f"--config={path}: {err}") from None
  return applied


def _script_flags(flag_values: flags.FlagValues) -> list[str]:
  """The script's own flags: all but absl's (logging, help, ...) and
  --config."""
  names = set()
  for module, module_flags in flag_values.flags_by_module_dict().items():
    if not module.startswith("absl."):
      names.update(f.name for f in module_flags)
  names.discard("config")
  return sorted(names)


def load_calibration_flag(path: str):
  """The calibration file a script's --calibration names; a bad file is a
  usage error naming the flag and the problem."""
  from tfopt.calibration import CalibrationError, load_calibration  # pylint: disable=g-import-not-at-top
  try:
    return load_calibration(path)
  except (CalibrationError, FileNotFoundError) as err:
    raise app.UsageError(f"--calibration: {err}") from None
