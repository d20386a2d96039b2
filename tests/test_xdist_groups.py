"""`make test`'s parallel pass keeps an xdist group on one worker: the
compatibility matrix's family cells and the demo's tests share expensive
per-process results (a family's logical-devices run, the demo itself)
only if their group runs in one process. pytest 9.2 with pytest-xdist 3.8
silently spread every group (pyproject.toml pins pytest below 9.2)."""

import os
import subprocess
import sys

SAMPLE = """
import os
import pytest

GROUPS = [pytest.param(i, marks=pytest.mark.xdist_group(f"compat: family {i % 3}"))
          for i in range(12)]

@pytest.mark.parametrize("i", GROUPS)
def test_cell(i, tmp_path_factory):
  out = os.environ["SAMPLE_OUT"]
  with open(os.path.join(out, str(i)), "w") as f:
    f.write(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_a_group_runs_on_one_worker(tmp_path):
  (tmp_path / "test_sample.py").write_text(SAMPLE)
  out = tmp_path / "out"
  out.mkdir()
  done = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
       "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir",
       str(tmp_path), str(tmp_path / "test_sample.py")],
      capture_output=True, text=True, check=False,
      env={**os.environ, "SAMPLE_OUT": str(out)})
  assert done.returncode == 0, done.stdout + done.stderr
  workers = {i: (out / str(i)).read_text() for i in range(12)}
  for group in range(3):
    assert len({w for i, w in workers.items() if i % 3 == group}) == 1, \
        workers
  assert len(set(workers.values())) == 2  # and the groups are spread
