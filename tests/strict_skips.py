"""`--strict-skips`: a run that skips a test fails, unless the skip's
reason matches one of ALLOWED_SKIPS.

A test skipped where the machine cannot run it (no root for memory caps,
one core for pinned tasks, a package missing) passes unseen; `make test`,
which CI runs, uses this option so such a skip turns CI red instead. A
skip that is legitimate on CI's machines is listed here, with why.
"""

from __future__ import annotations

import re

import pytest

# Regexes on skip reasons allowed under --strict-skips; none today (CI's
# machines run every test: root for the caps, two cores, the packages
# `make venv` installs).
ALLOWED_SKIPS: tuple[str, ...] = ()

_SKIPPED = pytest.StashKey[list]()
_CONFIG: list = [None]  # the run's config (reports do not carry it)


def pytest_addoption(parser):
  parser.addoption(
      "--strict-skips", action="store_true", default=False,
      help="fail the run when a test is skipped for a reason not in "
      "tests/strict_skips.py's ALLOWED_SKIPS")


def pytest_configure(config):
  config.stash[_SKIPPED] = []
  _CONFIG[0] = config


def _reason(report) -> str:
  longrepr = report.longrepr
  if isinstance(longrepr, tuple) and len(longrepr) == 3:
    return str(longrepr[2]).removeprefix("Skipped: ")
  return str(longrepr)


def pytest_runtest_logreport(report):
  if not report.skipped or hasattr(report, "wasxfail"):
    return
  config = _CONFIG[0]
  reason = _reason(report)
  if not any(re.search(allowed, reason) for allowed in ALLOWED_SKIPS):
    config.stash[_SKIPPED].append((report.nodeid, reason))


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
  config = session.config
  skipped = config.stash[_SKIPPED]
  if not config.getoption("--strict-skips") or not skipped:
    return
  lines = "\n".join(f"  {nodeid}: {reason}" for nodeid, reason in skipped)
  reporter = config.pluginmanager.get_plugin("terminalreporter")
  message = (f"--strict-skips: {len(skipped)} test(s) skipped for reasons "
             f"not in tests/strict_skips.py's ALLOWED_SKIPS:\n{lines}")
  if reporter is not None:
    reporter.write_line(message, red=True)
  session.exitstatus = pytest.ExitCode.TESTS_FAILED
