"""Shared fixtures: tiny graphs with hand-computed answers, shared data."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tfopt.compile's default calibration measures this machine (seconds, once)
# and its plans then follow this VM's speed, which jumps ~1.7x: the suite's
# plans use Baechi's fixed model unless a test asks for "auto" or the
# default (tests/test_calibration_cache.py; subprocesses inherit this).
os.environ.setdefault("TFOPT_CALIBRATION", "none")

import tfopt  # noqa: E402,F401  (loads OR-Tools before TensorFlow)
import pytest  # noqa: E402

pytest_plugins = ["tests.strict_skips"]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
  """Under `make test`'s parallel pass (--dist loadgroup), the tests that
  share one of our module- or session-scoped fixtures form an xdist group,
  so the fixture is built once, in one process, not once per worker (the
  demo's fixture runs the whole job). Tests with a group keep theirs."""
  for item in items:
    if item.get_closest_marker("xdist_group"):
      continue
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
      last = defs[-1]
      # baseid "": a plugin's fixture (tmp_path_factory), not ours.
      if last.scope in ("module", "package", "session") and last.baseid:
        item.add_marker(pytest.mark.xdist_group(f"fixtures of {last.baseid}"))
        break

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


@pytest.fixture
def mfu_ticking_clock(monkeypatch):
  """MFUMonitor's clock ticks one second per read: a call of the batch
  hooks (one read) lasts exactly 1 s, so per-step times are known exactly."""
  from tfopt.scale import mfu as mfu_module  # pylint: disable=g-import-not-at-top
  ticks = iter(range(100_000))

  class Clock:
    perf_counter = staticmethod(lambda: float(next(ticks)))

  monkeypatch.setattr(mfu_module, "time", Clock)
