"""`--strict-skips` (make test) fails a run that skips a test for a reason
not allowed, and leaves runs without skips, or without the option, alone."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pytest(tmp_path, body, *options):
  test = tmp_path / "test_sample.py"
  test.write_text(body)
  return subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "tests.strict_skips",
       "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(tmp_path),
       *options, str(test)],
      cwd=ROOT, capture_output=True, text=True, check=False,
      env={**os.environ, "PYTHONPATH": ROOT})


SKIPS = """
import pytest

def test_runs():
  assert True

@pytest.mark.skipif(True, reason="memory caps unavailable: no root")
def test_cannot_run_here():
  pass

def test_skips_itself():
  pytest.skip("needs two cores")

@pytest.mark.xfail(strict=True, reason="known")
def test_known_failure():
  assert False
"""


def test_a_skipped_test_fails_the_run_naming_it_and_why(tmp_path):
  result = _pytest(tmp_path, SKIPS, "--strict-skips")
  assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout
  assert "2 test(s) skipped" in result.stdout
  assert ("test_cannot_run_here: memory caps unavailable: no root"
          in result.stdout)
  assert "test_skips_itself: needs two cores" in result.stdout
  assert "test_known_failure" not in result.stdout.split("--strict-skips")[1]


def test_without_the_option_or_without_skips_the_run_passes(tmp_path):
  assert _pytest(tmp_path, SKIPS).returncode == 0
  passing = "def test_runs():\n  assert True\n"
  result = _pytest(tmp_path, passing, "--strict-skips")
  assert result.returncode == 0, result.stdout


def test_a_skip_in_a_parallel_worker_fails_the_run(tmp_path):
  # make test runs the suite in xdist workers: their skips reach the
  # controller's report, and the run fails there.
  result = _pytest(tmp_path, SKIPS, "--strict-skips", "-n", "2")
  assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout
  assert "2 test(s) skipped" in result.stdout
  assert "test_skips_itself: needs two cores" in result.stdout
