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
