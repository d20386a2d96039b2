"""The relay that holds a job's network namespace (see `netns`).

    python -m tfopt.runtime.relay --control_fd=FD --parent=PID

At start it unshares a new network namespace (loopback up) and says
"ready" on the control socket. Then it receives listening sockets there
(SCM_RIGHTS): each was bound to 127.0.0.1:P in the parent's namespace, and
every connection accepted on it is forwarded to 127.0.0.1:P inside the new
namespace, byte for byte in both directions (splice(2): the bytes do not
pass through Python). It exits when the control socket closes or the
parent dies (the kernel kills it: PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import sys
import threading

_PR_SET_PDEATHSIG = 1
_CHUNK = 1 << 20


def _die_with(parent: int) -> None:
  libc = ctypes.CDLL(None, use_errno=True)
  libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  if os.getppid() != parent:  # died before prctl took effect
    os._exit(0)  # pylint: disable=protected-access


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


def _serve_pair(client: socket.socket, port: int) -> None:
  try:
    upstream = socket.create_connection(("127.0.0.1", port))
  except OSError:
    client.close()  # the task is not listening (yet): the caller retries
    return
  for sock in (client, upstream):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
  back.start()
  _pump(client, upstream)
  back.join()
  client.close()
  upstream.close()


def _accept_loop(listener: socket.socket) -> None:
  port = listener.getsockname()[1]
  while True:
    try:
      client, _ = listener.accept()
    except OSError:
      return
    threading.Thread(target=_serve_pair, args=(client, port),
                     daemon=True).start()


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--control_fd", type=int, required=True)
  parser.add_argument("--parent", type=int, required=True)
  args = parser.parse_args(argv)
  _die_with(args.parent)
  control = socket.socket(fileno=args.control_fd)
  from tfopt.runtime import netns  # pylint: disable=g-import-not-at-top
  netns.unshare_network()  # one thread yet: the whole process moves
  control.sendall(b"ready")
  while True:
    try:
      _, fds, _, _ = socket.recv_fds(control, 64, 256)
    except OSError:
      return 0
    if not fds:
      return 0  # the parent closed the control socket
    for fd in fds:
      threading.Thread(target=_accept_loop, args=(socket.socket(fileno=fd),),
                       daemon=True).start()


if __name__ == "__main__":
  sys.exit(main())
