"""N TensorFlow server processes on loopback: a real multi-process cluster.

Each task is its own OS process running `tf.distribute.Server` (see
server.py); a client session connects to task 0's gRPC target and runs a
graph whose nodes carry `/job:worker/task:i/device:CPU:0` device strings, so
every cross-task tensor goes through TensorFlow's own distributed runtime
(rendezvous, gRPC). No home-made RPC.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from tfopt._errors import check_positive_int
from tfopt._net import free_ports
from tfopt.cluster import Cluster
from tfopt.cost.comm import CommModel


def _accepts(port: int) -> bool:
  try:
    with socket.create_connection(("localhost", port), timeout=0.5):
      return True
  except OSError:
    return False


class LoopbackServers:
  """Starts `num_tasks` server processes; a context manager that stops them.

  >>> # with LoopbackServers(2) as servers:
  >>> #   session target: servers.target; devices: servers.device_names
  """

  def __init__(self, num_tasks: int, *, job: str = "worker",
               start_timeout: float = 120.0, log_dir: str | None = None):
    check_positive_int("num_tasks", num_tasks)
    self.job = job
    self.ports = free_ports(num_tasks)
    spec = {job: [f"localhost:{p}" for p in self.ports]}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    self._procs = []
    self._logs = []
    try:
      for i in range(num_tasks):
        log = (open(os.path.join(log_dir, f"{job}{i}.log"), "wb")
               if log_dir else subprocess.DEVNULL)
        self._logs.append(log)
        self._procs.append(subprocess.Popen(
            [sys.executable, "-m", "tfopt.runtime.server",
             f"--cluster={json.dumps(spec)}", f"--job={job}", f"--task={i}"],
            stdout=log, stderr=subprocess.STDOUT, env=env))
      deadline = time.monotonic() + start_timeout
      waiting = list(range(num_tasks))
      while waiting:
        for i in list(waiting):
          if self._procs[i].poll() is not None:
            raise RuntimeError(f"Server task {i} exited with code "
                               f"{self._procs[i].returncode} at start-up "
                               f"(port {self.ports[i]}).")
          if _accepts(self.ports[i]):
            waiting.remove(i)
        if waiting and time.monotonic() > deadline:
          raise TimeoutError(f"Server tasks {waiting} did not listen within "
                             f"{start_timeout} s.")
        time.sleep(0.1)
    except BaseException:
      self.close()
      raise

  @property
  def target(self) -> str:
    """The session target: task 0's gRPC address."""
    return f"grpc://localhost:{self.ports[0]}"

  @property
  def device_names(self) -> list[str]:
    return [f"/job:{self.job}/task:{i}/device:CPU:0"
            for i in range(len(self.ports))]

  def cluster(self, memory_bytes: int | None = None, *,
              comm: CommModel | None = None) -> Cluster:
    """The tasks as a tfopt Cluster (one CPU device each)."""
    return Cluster.uniform(len(self.ports), memory_bytes, device_type="CPU",
                           comm=comm, names=self.device_names)

  def close(self) -> None:
    for proc in self._procs:
      if proc.poll() is None:
        proc.kill()
    for proc in self._procs:
      proc.wait()
    for log in self._logs:
      if log is not subprocess.DEVNULL:
        log.close()
    self._procs = []

  def __enter__(self) -> "LoopbackServers":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
