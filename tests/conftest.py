"""Shared fixtures: tiny graphs with hand-computed answers, shared data."""

import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tfopt  # noqa: E402,F401  (loads OR-Tools before TensorFlow)
import pytest  # noqa: E402

SHARED_COSTGRAPHS = (pathlib.Path(__file__).resolve().parents[2] / "shared" /
                     "data" / "costgraphs")


@pytest.fixture
def costgraph_files():
  """The MSR costgraph files from ../shared, or a clean skip when absent."""
  files = sorted(SHARED_COSTGRAPHS.glob("*.json"))
  if not files:
    pytest.skip(f"no costgraph files under {SHARED_COSTGRAPHS}")
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
