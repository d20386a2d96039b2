"""The profiled workloads tfopt ships as package data, loadable by name.

Four training graphs profiled by the msr-fiddle/dnn-partitioning project (MIT,
the license beside the files in `tfopt/data/costgraphs/LICENSE`), converted to
`tfopt.costgraph/1`. They are part of the installed package: nothing here
reads the repository or a network.

    >>> "msr_gnmt_training_layers" in workload_names()
    True
    >>> len(load_workload("msr_gnmt_training_layers").graph) > 0
    True
"""

from __future__ import annotations

import importlib.resources
import os

from tfopt._errors import invalid_argument
from tfopt.graph.costgraph_io import CostGraph, load_costgraph

_PACKAGE = "tfopt.data"
_FOLDER = "costgraphs"


def _folder():
  return importlib.resources.files(_PACKAGE).joinpath(_FOLDER)


def workload_names() -> tuple[str, ...]:
  """The names of the shipped workloads, sorted."""
  return tuple(sorted(entry.name[:-len(".json")] for entry in _folder().iterdir()
                      if entry.name.endswith(".json")))


def workload_path(name: str) -> str:
  """The file of the shipped workload `name` (a name from `workload_names`)."""
  names = workload_names()
  if name not in names:
    raise invalid_argument("name", f"one of the shipped workloads "
                           f"({', '.join(names)})", name)
  return os.fspath(_folder().joinpath(f"{name}.json"))


def load_workload(name_or_path: str | os.PathLike) -> CostGraph:
  """A shipped workload by name, or a `tfopt.costgraph/1` file by path.

  A string without a path separator or `.json` suffix is taken as a name; a
  missing file or malformed document raises one error naming the path and
  the problem (FileNotFoundError, CostGraphFormatError).
  """
  text = os.fspath(name_or_path)
  if isinstance(text, str) and os.sep not in text and "/" not in text and (
      not text.endswith(".json")) and not os.path.exists(text):
    return load_costgraph(workload_path(text))
  return load_costgraph(text)
