"""tfopt._quiet: native INFO lines dropped from fd 2 inside the block only,
everything else passed on (a child process writes to its real fd 2)."""

import subprocess
import sys

_CHILD = r"""
import os, sys
from tfopt._quiet import native_info_logs_quiet
os.write(2, b"I0000 00:00:17.5   1 before.cc:1] kept: outside the block\n")
with native_info_logs_quiet():
  os.write(2, b"I0000 00:00:1796243473.915411   12903 profiler_session.cc:132] Profiler session started.\n")
  os.write(2, b"2026-12-02 10:00:00.123456: I tensorflow/core/x.cc:1] legacy info\n")
  os.write(2, b"E0000 00:00:17.5   1 session.cc:9] an error stays\n")
  sys.stderr.write("progress 1/2\r")
  sys.stderr.write("progress 2/2\n")
os.write(2, b"after\n")
"""


def test_info_lines_are_dropped_inside_the_block_only():
  done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True,
                        check=True, timeout=60)
  err = done.stderr.decode()
  assert "kept: outside the block" in err
  assert "Profiler session started" not in err and "legacy info" not in err
  assert "an error stays" in err
  assert "progress 1/2\rprogress 2/2\n" in err
  assert err.rstrip().endswith("after")


def test_tfopt_native_logs_passes_everything():
  import os  # pylint: disable=g-import-not-at-top
  done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True,
                        check=True, timeout=60,
                        env=dict(os.environ, TFOPT_NATIVE_LOGS="1"))
  assert "Profiler session started" in done.stderr.decode()
