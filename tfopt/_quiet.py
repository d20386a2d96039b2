"""TensorFlow's native INFO logs kept out of the user's terminal while tfopt
profiles or traces a step, and only then.

TensorFlow reads its C++ log level once per process (TF_CPP_MIN_LOG_LEVEL),
so tfopt cannot lower it for its own calls without changing it for the
user's. Instead, while a tfopt call runs, file descriptor 2 goes through a
pipe: lines in the native log format at INFO level ("I0000 00:00:...",
"2026-12-02 10:00:00.000: I ...") and the profiler's "GPU trace was not
collected" warning (tfopt traces CPU steps on purpose) are dropped;
everything else -- warnings, errors, Python's own output, progress bars --
is passed on as it comes. `TFOPT_NATIVE_LOGS=1` passes everything.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading

_DROPPED = re.compile(
    rb"^(I\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w.]+:\d+\]"
    rb"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: I "
    rb"|W\d{4} .*xplane_to_step_stats.cc:\d+\] GPU trace was not collected)")
# A partial line that may still become a dropped one is held until its end.
_MAYBE_LOG = re.compile(rb"^(I\d{0,4}( |$)|\d{1,4}(-|$)|W\d{0,4}( |$))")

_lock = threading.Lock()
_depth = 0


def dropped(line: bytes) -> bool:
  """Whether one line of native stderr is one tfopt keeps quiet.

  >>> dropped(b"I0000 00:00:1796243473.915411   12903 profiler_session.cc:132] Profiler session started.")
  True
  >>> dropped(b"W0000 00:00:1.2 12903 xplane_to_step_stats.cc:84] GPU trace was not collected.")
  True
  >>> dropped(b"E0000 00:00:1.2 12903 session.cc:1] out of memory")
  False
  >>> dropped(b"Epoch 1/2")
  False
  """
  return bool(_DROPPED.match(line))


def _forward(read_fd: int, write_fd: int) -> None:
  buffer = b""
  while True:
    chunk = os.read(read_fd, 65536)
    if not chunk:
      break
    buffer += chunk
    lines = buffer.split(b"\n")
    buffer = lines.pop()
    out = b"".join(line + b"\n" for line in lines if not dropped(line))
    if buffer and not _MAYBE_LOG.match(buffer):
      out, buffer = out + buffer, b""   # a progress bar's \r update
    if out:
      os.write(write_fd, out)
  if buffer and not dropped(buffer):
    os.write(write_fd, buffer)


@contextlib.contextmanager
def native_info_logs_quiet():
  """Drops TensorFlow's native INFO lines from fd 2 inside the block (see
  the module docstring); nests; does nothing when fd 2 cannot be swapped."""
  global _depth
  if os.environ.get("TFOPT_NATIVE_LOGS", "") not in ("", "0"):
    yield
    return
  with _lock:
    _depth += 1
    outer = _depth > 1
  if outer:
    try:
      yield
    finally:
      with _lock:
        _depth -= 1
    return
  try:
    sys.stderr.flush()
    saved = os.dup(2)
    read_fd, write_fd = os.pipe()
  except OSError:
    with _lock:
      _depth -= 1
    yield
    return
  thread = threading.Thread(target=_forward, args=(read_fd, saved),
                            name="tfopt-quiet-stderr", daemon=True)
  thread.start()
  os.dup2(write_fd, 2)
  os.close(write_fd)
  try:
    yield
  finally:
    try:
      sys.stderr.flush()
    except (OSError, ValueError):  # a closed or broken stderr: nothing to keep
      pass
    os.dup2(saved, 2)     # closes the pipe's last write end: the reader ends
    thread.join(timeout=5)
    os.close(read_fd)
    os.close(saved)
    with _lock:
      _depth -= 1
