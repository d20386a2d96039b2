"""A second network namespace joined to this one by a veth pair, to knock
on the ports a job opened from where another machine on the network would.

The probe namespace gets 10.213.N.2/30, this one's end of the veth
10.213.N.1/30: a connection from the probe to 10.213.N.1:P reaches every
socket here bound to the wildcard address (as TensorFlow's servers bind),
and none bound to 127.0.0.1 or living in another namespace. Everything is
removed on exit. Needs root and `ip` (iproute2).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading

from tfopt.runtime import netns


def unavailable_reason() -> str | None:
  reason = netns.unavailable_reason()
  if reason is None and shutil.which("ip") is None:
    reason = "the `ip` command (iproute2) is missing"
  return reason


def _ip(*args: str) -> None:
  subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class ProbeNamespace:
  """A context manager: the probe namespace and its veth pair."""

  def __init__(self):
    tag = os.getpid() % 100_000
    self.name = f"tfopt-probe-{tag}"
    self.host_end, self.probe_end = f"tfp{tag}a", f"tfp{tag}b"
    subnet = tag % 250
    self.host_ip = f"10.213.{subnet}.1"
    self.probe_ip = f"10.213.{subnet}.2"

  def __enter__(self) -> "ProbeNamespace":
    try:
      _ip("netns", "add", self.name)
      _ip("link", "add", self.host_end, "type", "veth", "peer", "name",
          self.probe_end)
      _ip("link", "set", self.probe_end, "netns", self.name)
      _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_end)
      _ip("link", "set", self.host_end, "up")
      _ip("-n", self.name, "addr", "add", f"{self.probe_ip}/30", "dev",
          self.probe_end)
      _ip("-n", self.name, "link", "set", self.probe_end, "up")
      _ip("-n", self.name, "link", "set", "lo", "up")
    except BaseException:
      self.__exit__()
      raise
    return self

  def __exit__(self, *exc) -> None:
    for args in (("link", "del", self.host_end), ("netns", "del", self.name)):
      subprocess.run(["ip", *args], capture_output=True, timeout=30,
                     check=False)

  def reachable(self, port: int, timeout: float = 2.0) -> bool:
    """Whether a TCP connection from the probe to this namespace's end of
    the veth, port `port`, is accepted."""
    result = {}

    def knock():
      fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
      try:
        netns.set_namespace(fd)
      finally:
        os.close(fd)
      try:
        with socket.create_connection((self.host_ip, port), timeout=timeout):
          result["ok"] = True
      except OSError:
        result["ok"] = False
    thread = threading.Thread(target=knock)
    thread.start()
    thread.join()
    return result["ok"]


def descendants(pid: int) -> list[int]:
  """Every living process below `pid`."""
  children: dict[int, list[int]] = {}
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat", encoding="ascii") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
      continue
    children.setdefault(ppid, []).append(int(entry))
  out, todo = [], [pid]
  while todo:
    for child in children.get(todo.pop(), []):
      out.append(child)
      todo.append(child)
  return out


def _socket_inodes(pid: int) -> set[str]:
  inodes = set()
  try:
    fds = os.listdir(f"/proc/{pid}/fd")
  except OSError:
    return inodes
  for fd in fds:
    try:
      link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
      continue
    if link.startswith("socket:["):
      inodes.add(link[8:-1])
  return inodes


def _listening_by_inode(pid: int) -> dict[str, int]:
  """inode -> port of every listening TCP socket in `pid`'s namespace."""
  out = {}
  for table in ("tcp", "tcp6"):
    try:
      with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
        rows = f.readlines()[1:]
    except OSError:
      continue
    for row in rows:
      cols = row.split()
      if cols[3] == "0A":  # LISTEN
        out[cols[9]] = int(cols[1].rsplit(":", 1)[1], 16)
  return out


def listening_ports(pids) -> dict[int, set[int]]:
  """pid -> the TCP ports its own sockets listen on, in whatever network
  namespace each socket lives (a process may hold sockets of a namespace
  it is not in: the relay's): the processes' socket inodes matched with
  the tables of every namespace among them and this process's."""
  tables: dict[str, int] = {}
  for pid in [os.getpid(), *pids]:
    tables.update(_listening_by_inode(pid))
  return {pid: {tables[i] for i in _socket_inodes(pid) if i in tables}
          for pid in pids}


def namespace_id(pid: int) -> str | None:
  try:
    return os.readlink(f"/proc/{pid}/ns/net")
  except OSError:
    return None


def processes_in(namespace: str) -> list[int]:
  """The processes whose network namespace is `namespace` (net:[inode])."""
  return [int(e) for e in os.listdir("/proc")
          if e.isdigit() and namespace_id(int(e)) == namespace]


def holders(namespace: str) -> list[int]:
  """The processes inside `namespace` (net:[inode]) or holding an fd of
  it: while there is one, the namespace exists."""
  found = set(processes_in(namespace))
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      fds = os.listdir(f"/proc/{entry}/fd")
    except OSError:
      continue
    for fd in fds:
      try:
        if os.readlink(f"/proc/{entry}/fd/{fd}") == namespace:
          found.add(int(entry))
          break
      except OSError:
        continue
  return sorted(found)


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(
    [0, 0, 0, 4, 0, 0, 0, 0, 0])  # and an empty SETTINGS frame


def grpc_answers(port: int, namespace_of: int | None = None) -> bool:
  """Whether 127.0.0.1:`port` answers an HTTP/2 client preface with bytes
  (a gRPC server does: its SETTINGS), from this process's namespace or,
  with `namespace_of`, from the namespace of that pid."""
  result = {}

  def knock():
    if namespace_of is not None:
      fd = os.open(f"/proc/{namespace_of}/ns/net", os.O_RDONLY)
      try:
        netns.set_namespace(fd)
      finally:
        os.close(fd)
    try:
      with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.settimeout(5)
        s.sendall(HTTP2_PREFACE)
        result["ok"] = bool(s.recv(64))
    except OSError:
      result["ok"] = False
  thread = threading.Thread(target=knock)
  thread.start()
  thread.join()
  return result["ok"]
