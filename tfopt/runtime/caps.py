"""OS-enforced memory caps for server processes, and their measured peaks.

A placement plan keeps each device under `memory_per_device` on paper; a
cap makes it true at run time. For CPU devices in separate processes
(`LoopbackServers`), `MemoryCap` puts a process in its own memory cgroup
with a limit: once the process's memory *grows* past the limit (after it
joined the group: pages it held before stay charged to its old group), the
kernel OOM-kills it (exit status -9 / 137). Both cgroup versions are
supported: v1's memory controller (`memory.limit_in_bytes`,
`memory.max_usage_in_bytes`, `memory.failcnt`) and v2 (`memory.max`,
`memory.peak`, `memory.events`), under the caller's own group so that the
caps nest inside whatever limits the caller has. Creating groups needs
write access (root, or a delegated subtree); `unavailable_reason()` says
why caps cannot be set here, for tests to skip on.

`ProcessPeak` measures a process's peak resident memory above a baseline
(VmHWM minus the VmRSS at the baseline, after resetting the high-water mark
through /proc/PID/clear_refs), with or without a cap.
"""

from __future__ import annotations

import os
import time

from tfopt._errors import check_positive_int

_V1_ROOT = "/sys/fs/cgroup/memory"
_V2_ROOTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")


def _own_group(version: int) -> str:
  """This process's cgroup path for the memory hierarchy ("/" if none)."""
  try:
    with open("/proc/self/cgroup", encoding="ascii") as f:
      lines = f.read().splitlines()
  except OSError:
    return "/"
  for line in lines:
    _, controllers, path = line.split(":", 2)
    if version == 1 and "memory" in controllers.split(","):
      return path
    if version == 2 and controllers == "":
      return path
  return "/"


def _writable_dir(path: str) -> bool:
  return os.path.isdir(path) and os.access(path, os.W_OK)


def _writable_group(version: int, root: str) -> tuple[int, str] | tuple[None, str]:
  """(version, where new groups go: this process's own group under `root`,
  else `root`), or (None, why neither is writable)."""
  own = os.path.join(root, _own_group(version).lstrip("/"))
  for path in (own, root):
    if _writable_dir(path):
      return version, path
  return None, (f"the cgroup v{version} memory hierarchy at {root} is not "
                f"writable by this user (uid {os.getuid()})")


def _base() -> tuple[int, str] | tuple[None, str]:
  """(version, directory new groups go in), or (None, why not)."""
  if os.path.isfile(os.path.join(_V1_ROOT, "memory.limit_in_bytes")):
    return _writable_group(1, _V1_ROOT)
  for root in _V2_ROOTS:
    controllers = os.path.join(root, "cgroup.controllers")
    if not os.path.isfile(controllers):
      continue
    with open(controllers, encoding="ascii") as f:
      if "memory" in f.read().split():
        return _writable_group(2, root)
  return None, "no cgroup memory controller is mounted (v1 at " \
               f"{_V1_ROOT} or v2 with the memory controller enabled)"


def unavailable_reason() -> str | None:
  """None when memory caps can be set here, else why not."""
  version, where = _base()
  return None if version is not None else where


class MemoryCap:
  """A memory cgroup with a limit; `add(pid)` puts a process under it.

  >>> # cap = MemoryCap("worker0", 256 << 20); cap.add(pid)
  >>> # ... cap.peak_bytes, cap.oom_kills; cap.remove()
  """

  def __init__(self, name: str, limit_bytes: int):
    check_positive_int("limit_bytes", limit_bytes)
    version, where = _base()
    if version is None:
      raise PermissionError(f"Memory caps are not available here: {where}.")
    self.version = version
    self.limit_bytes = limit_bytes
    self.path = os.path.join(where, f"tfopt-{os.getpid()}-{name}")
    os.makedirs(self.path, exist_ok=True)
    if version == 1:
      self._write("memory.limit_in_bytes", limit_bytes)
      # No swap to spill into: a process over the limit is killed.
      if os.path.exists(os.path.join(self.path, "memory.memsw.limit_in_bytes")):
        try:
          self._write("memory.memsw.limit_in_bytes", limit_bytes)
        except OSError:
          pass  # swap accounting off: memory.limit_in_bytes alone applies
    else:
      self._write("memory.max", limit_bytes)
      self._write("memory.swap.max", 0, missing_ok=True)

  def _write(self, leaf: str, value, *, missing_ok: bool = False) -> None:
    path = os.path.join(self.path, leaf)
    if missing_ok and not os.path.exists(path):
      return
    with open(path, "w", encoding="ascii") as f:
      f.write(str(value))

  def _read(self, leaf: str) -> str:
    with open(os.path.join(self.path, leaf), encoding="ascii") as f:
      return f.read()

  def add(self, pid: int) -> None:
    """Moves process `pid` into the group (its later growth is charged)."""
    self._write("cgroup.procs", pid)

  def reset_peak(self) -> None:
    """Starts the peak afresh (v1; v2's memory.peak cannot be reset on
    older kernels and is left alone)."""
    if self.version == 1:
      self._write("memory.max_usage_in_bytes", 0)

  @property
  def usage_bytes(self) -> int:
    leaf = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
    return int(self._read(leaf))

  @property
  def peak_bytes(self) -> int:
    """The most the group held at once since it was made or reset."""
    if self.version == 1:
      return int(self._read("memory.max_usage_in_bytes"))
    try:
      return int(self._read("memory.peak"))
    except FileNotFoundError:
      return self.usage_bytes

  @property
  def oom_kills(self) -> int:
    """Processes of the group the kernel killed at the limit."""
    leaf = "memory.oom_control" if self.version == 1 else "memory.events"
    for line in self._read(leaf).splitlines():
      key, _, value = line.partition(" ")
      if key == "oom_kill":
        return int(value)
    return 0

  def remove(self, timeout_s: float = 5.0) -> None:
    """Removes the group once its processes have exited (waits a little)."""
    deadline = time.monotonic() + timeout_s
    while True:
      try:
        os.rmdir(self.path)
        return
      except FileNotFoundError:
        return
      except OSError:
        if time.monotonic() > deadline:
          raise
        time.sleep(0.05)


def _status_kb(pid: int, key: str) -> int:
  with open(f"/proc/{pid}/status", encoding="ascii") as f:
    for line in f:
      if line.startswith(key + ":"):
        return int(line.split()[1])
  raise KeyError(f"/proc/{pid}/status has no {key}")


class ProcessPeak:
  """A process's peak resident memory above a baseline taken now."""

  def __init__(self, pid: int):
    self.pid = pid
    self.reset()

  def reset(self) -> None:
    """The baseline is the current RSS; the high-water mark restarts."""
    try:
      with open(f"/proc/{self.pid}/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
      pass  # not ours to reset: the peak then includes earlier growth
    self.baseline_bytes = _status_kb(self.pid, "VmRSS") * 1024

  @property
  def peak_bytes(self) -> int:
    """VmHWM now, minus the baseline."""
    return max(0, _status_kb(self.pid, "VmHWM") * 1024 - self.baseline_bytes)
