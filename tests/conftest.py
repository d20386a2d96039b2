"""Shared fixtures: tiny graphs with hand-computed answers, shared data."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tfopt  # noqa: E402,F401  (loads OR-Tools before TensorFlow)
import pytest  # noqa: E402

pytest_plugins = ["tests.strict_skips"]

@pytest.fixture
def costgraph_files():
  """The MSR costgraph files shipped as package data (tfopt/data)."""
  import pathlib  # pylint: disable=g-import-not-at-top
  from tfopt.graph import workload_names, workload_path  # pylint: disable=g-import-not-at-top
  files = [pathlib.Path(workload_path(name)) for name in workload_names()]
  assert len(files) == 4, files  # the four MSR workloads ship with tfopt
  return files


@pytest.fixture
def two_pinned_cores():
  """Two cores to pin two server tasks to, or a clean skip saying why
  (CI's machines have two)."""
  from tfopt.runtime.processes import pinned_cpus  # pylint: disable=g-import-not-at-top
  try:
    return pinned_cpus(2)
  except ValueError as err:
    pytest.skip(f"needs two cores to pin two tasks: {err}")
