"""One private network namespace for the TensorFlow servers of this job.

TensorFlow's gRPC servers bind every interface (`*:PORT`, there is no bind
option) and its distributed runtime has no authentication: whoever reaches
a port runs any graph in that process (tensorflow/tensorflow#11689). The
server tasks tfopt starts on this machine (`LoopbackServers`, the tasks of
placed steps, the launcher's workers) therefore run inside one network
namespace made for this process, whose only interface is its own loopback:
nothing outside it can route a packet to them.

The namespace is held by a relay process (`tfopt.runtime.relay`) that
unshares it at start. Every task port P is reserved here as a listener on
127.0.0.1:P in this process's namespace and handed to the relay, which
forwards each connection to localhost:P inside the job's namespace. So the
cluster spec's `localhost:P` means the same task on both sides: this
process (the client) reaches it through the relay, tasks reach each other
directly, and the one listener outside the namespace is on 127.0.0.1,
which another host or namespace cannot route to. `entered()` runs a call
with the calling thread inside the namespace: `tfopt.runtime.remote.connect`
connects there, so the client's own TensorFlow server (tasks call back to
it) listens inside too, and threads TensorFlow starts meanwhile stay there.

Nothing outlives the job: the namespace has no name in the file system (it
ends with its last process); the relay is killed by the kernel when this
process dies (PR_SET_PDEATHSIG) and the tasks exit when their parent is
gone. Needs Linux and CAP_SYS_ADMIN (root); `unavailable_reason()` says
what is missing elsewhere, and `LoopbackServers(allow_exposed=True)` /
`TFOPT_ALLOW_EXPOSED_SERVERS=1` runs the servers exposed, with a warning.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import warnings

CLONE_NEWNET = 0x40000000
ALLOW_EXPOSED_ENV = "TFOPT_ALLOW_EXPOSED_SERVERS"
_CAP_SYS_ADMIN = 21
_SIOCGIFFLAGS, _SIOCSIFFLAGS = 0x8913, 0x8914
_IFF_UP = 0x1
_PR_SET_PDEATHSIG = 1

_LOCK = threading.Lock()
_JOB: "JobNamespace | None" = None


def _libc():
  libc = ctypes.CDLL(None, use_errno=True)
  libc.unshare.argtypes = [ctypes.c_int]
  libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
  return libc


def _check(result: int, what: str) -> None:
  if result != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare_network() -> None:
  """Moves the calling thread (the process, when it has one thread) into a
  new network namespace and brings its loopback up."""
  _check(_libc().unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
  loopback_up()


def loopback_up() -> None:
  """Sets `lo` up in the calling thread's network namespace (a new one has
  it down)."""
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    request = struct.pack("16sh", b"lo", 0)
    flags = struct.unpack("16sh", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
    fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


def set_namespace(fd: int) -> None:
  """Moves the calling thread into the network namespace `fd` refers to."""
  _check(_libc().setns(fd, CLONE_NEWNET), "setns(CLONE_NEWNET)")


@contextlib.contextmanager
def entered(fd: int):
  """The calling thread inside the network namespace `fd` refers to for the
  block (threads it starts meanwhile stay there); back afterwards."""
  home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
  try:
    set_namespace(fd)
    try:
      yield
    finally:
      set_namespace(home)
  finally:
    os.close(home)


def enter_fd(fd: int) -> None:
  """Moves the calling thread into the network namespace `fd` refers to
  and closes it: what a task started inside the job's namespace (given
  the fd by `pass_fds`) does first, before it has other threads."""
  try:
    set_namespace(fd)
  finally:
    os.close(fd)


def unavailable_reason() -> str | None:
  """Why this process cannot make a network namespace, or None."""
  if not sys.platform.startswith("linux"):
    return f"network namespaces are Linux-only (this is {sys.platform})"
  if not os.path.exists("/proc/self/ns/net"):
    return "/proc/self/ns/net is missing (no network namespaces here)"
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      caps = next(line for line in f if line.startswith("CapEff:"))
  except (OSError, StopIteration):
    return "the process's capabilities cannot be read"
  if not int(caps.split()[1], 16) >> _CAP_SYS_ADMIN & 1:
    return (f"making one needs CAP_SYS_ADMIN (root); this process runs as "
            f"uid {os.geteuid()} without it")
  return None


class JobNamespace:
  """The network namespace this process's server tasks run in (one per
  process, see `job_namespace`). `fd` holds it open (it lives as long as
  this process, or any process inside it); children enter it through that
  fd (`pass_fds`), never through a path a reused pid could redirect."""

  def __init__(self, start_timeout: float = 30.0):
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    env = dict(os.environ, TFOPT_TENSORFLOW_ONLY="1")
    self._control = parent
    self._lock = threading.Lock()
    self._errors = tempfile.TemporaryFile()  # pylint: disable=consider-using-with
    self._relay = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-m", "tfopt.runtime.relay",
         f"--control_fd={child.fileno()}", f"--parent={os.getpid()}"],
        pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=self._errors)
    child.close()
    parent.settimeout(start_timeout)
    try:
      answer, fds, _, _ = socket.recv_fds(parent, 64, 1)
    except OSError:
      answer, fds = b"", []
    parent.settimeout(None)
    if answer != b"ready" or len(fds) != 1:
      self._relay.kill()
      self._relay.wait()
      self._errors.seek(0)
      err = self._errors.read().decode(errors="replace").strip()
      raise OSError(f"The job's network namespace could not be made: "
                    f"{err.splitlines()[-1] if err else answer!r}")
    self.fd = fds[0]
    self.ports: set[int] = set()

  @property
  def relay_pid(self) -> int:
    return self._relay.pid

  @property
  def identity(self) -> str:
    """The namespace as /proc shows it ("net:[inode]")."""
    return os.readlink(f"/proc/self/fd/{self.fd}")

  def alive(self) -> bool:
    return self._relay.poll() is None

  def reserve_ports(self, count: int) -> list[int]:
    """`count` ports that tasks inside the namespace listen on; each is
    held here as 127.0.0.1:P, relayed into the namespace for this process
    alone."""
    listeners = []
    try:
      for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listeners.append(s)
        s.bind(("127.0.0.1", 0))
        s.listen(64)
      with self._lock:
        socket.send_fds(self._control, [b"listen"],
                        [s.fileno() for s in listeners])
      ports = [s.getsockname()[1] for s in listeners]
    finally:
      for s in listeners:
        s.close()
    self.ports.update(ports)
    return ports

  def release_ports(self, ports) -> None:
    """Stops relaying `ports` (their tasks are gone)."""
    ports = [p for p in ports if p in self.ports]
    if not ports or not self.alive():
      return
    with self._lock:
      self._control.send(b"close " + ",".join(map(str, ports)).encode())
    self.ports.difference_update(ports)

  @contextlib.contextmanager
  def entered(self):
    """The calling thread inside the namespace for the block (threads it
    starts meanwhile stay there); back where it was afterwards."""
    with entered(self.fd):
      yield self

  def run_inside(self, fn, *args):
    """fn(*args) on a short-lived thread inside the namespace."""
    result: dict = {}

    def target():
      try:
        set_namespace(self.fd)
        result["value"] = fn(*args)
      except BaseException as err:  # pylint: disable=broad-except
        result["error"] = err
    thread = threading.Thread(target=target, name="tfopt-netns")
    thread.start()
    thread.join()
    if "error" in result:
      raise result["error"]
    return result["value"]

  def close(self) -> None:
    if self._relay.poll() is None:
      self._relay.kill()
    self._relay.wait()
    self._control.close()
    self._errors.close()
    if self.fd >= 0:
      os.close(self.fd)
      self.fd = -1


def _close_job() -> None:
  if _JOB is not None:
    _JOB.close()


def _check_relay(job: JobNamespace) -> JobNamespace:
  if not job.alive():
    raise RuntimeError(
        f"The relay of this process's job network namespace (pid "
        f"{job.relay_pid}) exited with code {job._relay.returncode}: its "  # pylint: disable=protected-access
        "server tasks can no longer be reached from this process. Start the "
        "job again in a new process.")
  return job


def job_namespace() -> JobNamespace:
  """This process's job namespace, made on first use (raises OSError with
  the reason where it cannot be made; RuntimeError when its relay died)."""
  global _JOB
  with _LOCK:
    if _JOB is None:
      reason = unavailable_reason()
      if reason is not None:
        raise OSError(reason)
      atexit.register(_close_job)
      _JOB = JobNamespace()
    return _check_relay(_JOB)


def _forget_after_fork() -> None:
  """A forked child is another process: the parent's relay is not its
  own (it bridges for the parent alone)."""
  global _JOB, _LOCK
  _JOB, _LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def current() -> JobNamespace | None:
  """The job namespace if one was made (RuntimeError when its relay
  died)."""
  return None if _JOB is None else _check_relay(_JOB)


def holding(addresses) -> JobNamespace | None:
  """The job namespace when every "host:port" is one of its relayed
  loopback ports, else None (a real cluster's hosts)."""
  job = current()
  if job is None or not addresses:
    return None
  for addr in addresses:
    host, _, port = addr.rpartition(":")
    if host not in ("localhost", "127.0.0.1") or not port.isdigit() or (
        int(port) not in job.ports):
      return None
  return job


def allow_exposed(argument: bool = False) -> bool:
  """The opt-in to exposed servers: the argument or the environment."""
  return bool(argument) or os.environ.get(ALLOW_EXPOSED_ENV, "") not in (
      "", "0", "false", "False")


def exposure_refused(what: str, reason: str) -> PermissionError:
  """The error where servers cannot be confined and nobody opted in."""
  return PermissionError(
      f"{what} would listen on every network interface of this machine, "
      f"and TensorFlow's distributed runtime runs any graph for whoever "
      f"connects; tfopt confines them to a private network namespace, which "
      f"needs {reason}. Run as root, or opt in to exposed servers with "
      f"`allow_exposed=True` (or {ALLOW_EXPOSED_ENV}=1, or "
      f"--allow_exposed_servers) on a machine whose network you trust.")


def warn_exposed(what: str, ports, reason: str | None = None) -> None:
  """The one warning where servers run exposed by the user's choice."""
  reason = reason or unavailable_reason() or "the namespace could not be made"
  warnings.warn(
      f"{what} listen on ports {sorted(ports)} of every network interface, "
      f"unconfined ({reason}): anyone who can reach this machine can run "
      f"graphs in them, read and write files, and read the model's "
      f"weights (opted in: allow_exposed, {ALLOW_EXPOSED_ENV} or "
      f"confine=False).",
      RuntimeWarning, stacklevel=3)


def confine(what: str, allow_exposed_servers: bool) -> JobNamespace | None:
  """The job namespace for servers described by `what`, or None where it
  cannot be made and the user opted in to exposed servers (the caller then
  warns with the ports, `warn_exposed`); PermissionError where it cannot be
  made and nobody opted in."""
  try:
    return job_namespace()
  except OSError as err:
    if allow_exposed(allow_exposed_servers):
      return None
    raise exposure_refused(what, str(err)) from None


def main(argv=None) -> int:
  """`python -m tfopt.runtime.netns --enter_fd=FD -- COMMAND...`: runs
  COMMAND inside the network namespace of the inherited fd FD (the
  launcher's workers), killed by the kernel when the thread that started
  it ends (PR_SET_PDEATHSIG survives the exec: a worker never outlives a
  launcher that crashed)."""
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
  parser.add_argument("--enter_fd", type=int, required=True)
  parser.add_argument("--parent", type=int, required=True)
  parser.add_argument("command", nargs="+")
  args = parser.parse_args(argv)
  enter_fd(args.enter_fd)
  _libc().prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
  if os.getppid() != args.parent:  # the launcher died before prctl
    return 1
  os.execvp(args.command[0], args.command)
  return 127  # not reached


if __name__ == "__main__":
  sys.exit(main())
