"""Lazy attributes for package `__init__`s: names whose modules import
TensorFlow are resolved on first use, so reading a costgraph file or
computing a critical path does not pay for importing TensorFlow."""

from __future__ import annotations

import importlib
from typing import Callable, Mapping


def lazy_getattr(package: str, names: Mapping[str, str]) -> Callable:
  """A module `__getattr__` resolving `names` (attribute -> module)."""

  def __getattr__(name: str):
    if name in names:
      return getattr(importlib.import_module(names[name]), name)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")

  return __getattr__
