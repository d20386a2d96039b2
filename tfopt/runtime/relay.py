"""The relay that makes a job's network namespace and bridges into it (see
`netns`).

    python -m tfopt.runtime.relay --control_fd=FD --parent=PID

At start it unshares a new network namespace (loopback up), keeps an fd
of it, returns its main thread to the parent's namespace and sends
"ready" with the namespace's fd on the control socket (a SOCK_SEQPACKET
socketpair: one message each). Then it takes messages there:
- "listen" with listening sockets (SCM_RIGHTS), each bound to 127.0.0.1:P
  in the parent's namespace: every connection accepted on one is forwarded
  to 127.0.0.1:P inside the job's namespace, byte for byte both ways
  (splice(2): the bytes do not pass through Python) -- if it comes from a
  socket the parent process holds; any other peer (another user's process,
  another program) is closed at once;
- "close P,P,...": stop listening on those ports.
It exits when the control socket ends (the parent closed it or died) or
its parent is gone.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time

_CHUNK = 1 << 20


def _watch_parent(parent: int) -> None:
  def watch():
    while os.getppid() == parent:
      time.sleep(1.0)
    os._exit(0)  # pylint: disable=protected-access
  threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _peer_inode(peer_port: int, port: int) -> str | None:
  """The inode of the socket at the other end of a connection accepted on
  127.0.0.1:`port` from local port `peer_port`, read from this thread's
  namespace's TCP tables (the parent's namespace). Both tables: a client
  may connect from an IPv6 socket to the IPv4-mapped ::ffff:127.0.0.1, as
  gRPC does."""
  want = (f"{peer_port:04X}", f"{port:04X}")
  for table in ("tcp", "tcp6"):
    with open(f"/proc/thread-self/net/{table}", encoding="ascii") as f:
      for row in f.readlines()[1:]:
        cols = row.split()
        if (cols[1].rsplit(":", 1)[1], cols[2].rsplit(":", 1)[1]) == want:
          return cols[9]
  return None


def _held_by(pid: int, inode: str) -> bool:
  target = f"socket:[{inode}]"
  try:
    fds = os.listdir(f"/proc/{pid}/fd")
  except OSError:
    return False
  for fd in fds:
    try:
      if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
        return True
    except OSError:
      continue
  return False


def _pump(src: socket.socket, dst: socket.socket) -> None:
  """Copies src to dst until src ends, then ends dst's sending side."""
  r, w = os.pipe()
  try:
    while True:
      n = os.splice(src.fileno(), w, _CHUNK)
      if n == 0:
        break
      while n:
        n -= os.splice(r, dst.fileno(), n)
  except OSError:
    pass
  finally:
    os.close(r)
    os.close(w)
    for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
      try:
        sock.shutdown(how)
      except OSError:
        pass


class Relay:
  """The relay's state: the job namespace's fd, the parent, listeners."""

  def __init__(self, parent: int, job_fd: int):
    self.parent = parent
    self.job_fd = job_fd
    self.listeners: dict[int, socket.socket] = {}

  def serve_pair(self, client: socket.socket, port: int) -> None:
    from tfopt.runtime import netns  # pylint: disable=g-import-not-at-top
    try:
      peer = client.getpeername()
      inode = _peer_inode(peer[1], port)
      if inode is None or not _held_by(self.parent, inode):
        print(f"relay: refused a connection to port {port} from {peer} "
              f"(socket inode {inode}), not process {self.parent}'s",
              file=sys.stderr, flush=True)
        client.close()  # not the job's own process
        return
      netns.set_namespace(self.job_fd)  # this thread: the upstream side
      upstream = socket.create_connection(("127.0.0.1", port))
    except OSError:
      client.close()  # the task is not listening (yet): the caller retries
      return
    for sock in (client, upstream):
      sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_pump, args=(upstream, client),
                            daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()

  def accept_loop(self, listener: socket.socket, port: int) -> None:
    while True:
      try:
        client, _ = listener.accept()
      except OSError:
        return  # closed
      try:
        threading.Thread(target=self.serve_pair, args=(client, port),
                         daemon=True).start()
      except RuntimeError:
        client.close()  # no thread to be had: refuse this one, go on

  def handle(self, message: bytes, fds: list) -> None:
    if message == b"listen":
      for fd in fds:
        listener = socket.socket(fileno=fd)
        port = listener.getsockname()[1]
        self.listeners[port] = listener
        threading.Thread(target=self.accept_loop, args=(listener, port),
                         daemon=True).start()
    elif message.startswith(b"close "):
      for port in message[6:].decode().split(","):
        listener = self.listeners.pop(int(port), None)
        if listener is not None:
          try:
            listener.shutdown(socket.SHUT_RDWR)
          except OSError:
            pass
          listener.close()


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--control_fd", type=int, required=True)
  parser.add_argument("--parent", type=int, required=True)
  args = parser.parse_args(argv)
  if os.getppid() != args.parent:
    return 0
  control = socket.socket(fileno=args.control_fd)
  from tfopt.runtime import netns  # pylint: disable=g-import-not-at-top
  home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
  netns.unshare_network()  # one thread yet
  job_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
  netns.set_namespace(home)  # accept and read /proc here, connect there
  os.close(home)
  _watch_parent(args.parent)
  socket.send_fds(control, [b"ready"], [job_fd])
  relay = Relay(args.parent, job_fd)
  while True:
    try:
      message, fds, _, _ = socket.recv_fds(control, 65536, 200)
    except OSError:
      return 0
    if not message and not fds:
      return 0  # the parent closed the control socket, or died
    relay.handle(message, fds)


if __name__ == "__main__":
  sys.exit(main())
