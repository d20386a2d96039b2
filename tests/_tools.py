"""The repository's tools/ scripts as modules, for their tests."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_tool(name: str):
  """tools/<name>.py, loaded fresh (tools/ is not a package)."""
  spec = importlib.util.spec_from_file_location(
      name, ROOT / "tools" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
