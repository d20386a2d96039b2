"""Loopback ports for the processes tfopt starts (launcher workers, server
tasks, transfer measurements)."""

from __future__ import annotations

import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list:
  """`count` distinct ports free right now (bound together, then released:
  the OS does not hand the same one out twice meanwhile)."""
  sockets = []
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  try:
    for _ in range(count):
      s = socket.socket(family, socket.SOCK_STREAM)
      s.bind((host, 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()
