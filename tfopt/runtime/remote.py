"""Tasks of TensorFlow's distributed runtime as devices of this process.

`tfopt.compile(..., devices=["/job:worker/task:1/device:CPU:0", ...])`
trains on tasks of a cluster: server processes that tfopt started on this
machine (`LoopbackServers`, whose `spec` is passed as `cluster=`) or real
hosts running `tf.distribute.Server`, described the same way (a
`TF_CONFIG`-style dict or JSON string, or the `TF_CONFIG` environment
variable). `connect` makes the cluster's devices devices of this process's
eager runtime (`tf.config.experimental_connect_to_cluster`; this process
joins as job "localhost", its server inside the job's network namespace
where the tasks are `LoopbackServers`'), so Keras variables can live on them and a
`tf.function` runs across them, every cross-task tensor going through
TensorFlow's own rendezvous and gRPC.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Mapping

from tfopt._errors import invalid_argument
from tfopt.runtime import netns

# The spec this process is connected to (connecting again with another
# invalidates every tensor on the old remote devices).
_CONNECTED: dict[str, list[str]] | None = None


def parse_cluster(cluster: Any) -> dict[str, list[str]]:
  """{job: [host:port, ...]} from a dict, a `tf.train.ClusterSpec`, a JSON
  string, a TF_CONFIG-style {"cluster": {...}}, or None (the TF_CONFIG
  environment variable)."""
  source = cluster
  if cluster is None:
    text = os.environ.get("TF_CONFIG")
    if not text:
      raise invalid_argument(
          "cluster", "a cluster spec ({job: [host:port, ...]}) or the "
          "TF_CONFIG environment variable when `devices` name tasks of "
          "other jobs", None)
    cluster = text
  if hasattr(cluster, "as_dict"):  # tf.train.ClusterSpec
    cluster = cluster.as_dict()
  if isinstance(cluster, str):
    try:
      cluster = json.loads(cluster)
    except json.JSONDecodeError as err:
      raise invalid_argument("cluster", "a JSON cluster spec or TF_CONFIG",
                             f"{source!r} ({err})") from None
  if isinstance(cluster, Mapping) and "cluster" in cluster:
    cluster = cluster["cluster"]
  ok = isinstance(cluster, Mapping) and cluster and all(
      isinstance(job, str) and job and isinstance(addrs, (list, tuple)) and
      addrs and all(isinstance(a, str) and ":" in a for a in addrs)
      for job, addrs in cluster.items())
  if not ok:
    raise invalid_argument("cluster", "a mapping {job name: [\"host:port\", "
                           "...]} with at least one task", source)
  if "localhost" in cluster:
    raise invalid_argument("cluster", "a spec without a job named "
                           "'localhost' (this process joins as that job)",
                           source)
  return {job: list(addrs) for job, addrs in cluster.items()}


def connect(cluster: Any, timeout_s: float = 30.0) -> dict[str, list[str]]:
  """Connects this process's eager runtime to the cluster (once per spec).

  A tf.Variable created before this call ignores eager assigns after it,
  silently (TensorFlow 2.21): `tfopt.compile` renews its model's variables
  (`tfopt.runtime.variables.renew_variables`); variables of other models
  made before need the same, or to be made after connecting.

  Raises ValueError naming the cluster when a task does not answer within
  `timeout_s`."""
  global _CONNECTED
  spec = parse_cluster(cluster)
  if _CONNECTED == spec:
    return spec
  if _CONNECTED is not None:
    raise invalid_argument(
        "cluster", f"the cluster this process is already connected to "
        f"({_CONNECTED}): connecting to another would invalidate every "
        f"tensor on the first", spec)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  _check_reachable(spec, timeout_s)
  job = netns.holding([a for addrs in spec.values() for a in addrs])
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(spec), rpc_layer="grpc")
  # Tasks of this process's job namespace call back to this process's own
  # server (job "localhost"): it is made inside the namespace, where only
  # they reach it. On an initialised eager context TensorFlow starts it in
  # the call; the context (its thread pools, where ops run) is made
  # before, outside, so ops keep this machine's network.
  context.ensure_initialized()
  if job is None:
    resolver = _with_reachable_client(spec, resolver)
  with job.entered() if job else contextlib.nullcontext():
    tf.config.experimental_connect_to_cluster(
        resolver, make_master_device_default=False)
  _CONNECTED = spec
  return spec


def client_address(spec: Mapping[str, list[str]]) -> str | None:
  """This process's address on the route to the cluster's first task that
  is not on loopback, or None where every task is (this machine)."""
  import ipaddress  # pylint: disable=g-import-not-at-top
  import socket  # pylint: disable=g-import-not-at-top
  for address in (a for addrs in spec.values() for a in addrs):
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
      family, _, _, _, where = socket.getaddrinfo(
          host, int(port), type=socket.SOCK_DGRAM)[0]
      if ipaddress.ip_address(where[0]).is_loopback:
        continue
      with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(where)  # picks the route; sends nothing
        mine = probe.getsockname()[0]
    except (OSError, ValueError):
      continue
    if not ipaddress.ip_address(mine).is_loopback:
      return mine
  return None


def _with_reachable_client(spec, resolver):
  """`resolver` with this process's own job ("localhost") at an address the
  tasks reach, where they are on other hosts.

  Left out, `connect_to_cluster` names this process "localhost:PORT", and
  a task on another host that calls back (a tensor of this process a
  function there reads) dials itself. Its server binds the port on every
  interface; the address is the one on the route to the tasks."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfopt._net import free_ports  # pylint: disable=g-import-not-at-top
  mine = client_address(spec)
  if mine is None:
    return resolver
  (port,) = free_ports(1, host=mine)
  host = f"[{mine}]" if ":" in mine else mine
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec({**spec, "localhost": [f"{host}:{port}"]}),
      rpc_layer="grpc")


def answers(address: str, timeout_s: float = 1.0) -> bool:
  """Whether the task at "host:port" accepts a TCP connection. Asked inside
  the job's network namespace where the address is one of its tasks:
  outside, the relay accepts for a task that is not (or no longer) there."""
  import socket  # pylint: disable=g-import-not-at-top
  host, _, port = address.rpartition(":")

  def knock() -> bool:
    try:
      with socket.create_connection((host, int(port)), timeout=timeout_s):
        return True
    except (OSError, ValueError):
      return False
  job = netns.holding([address])
  return job.run_inside(knock) if job else knock()


def _check_reachable(spec, timeout_s: float) -> None:
  import time  # pylint: disable=g-import-not-at-top
  for job, addrs in spec.items():
    for i, addr in enumerate(addrs):
      deadline = time.monotonic() + timeout_s
      while not answers(addr):
        if time.monotonic() > deadline:
          raise invalid_argument(
              "devices", f"tasks that are running (task /job:{job}/task:"
              f"{i} at {addr} does not answer)", spec) from None
        time.sleep(0.2)


def connected_spec() -> dict[str, list[str]] | None:
  """The cluster this process is connected to, if any."""
  return None if _CONNECTED is None else dict(_CONNECTED)


def task_address(spec: Mapping[str, list[str]], device: str) -> str:
  """"host:port" of the task `device` names."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  parsed = tf.DeviceSpec.from_string(device)
  addrs = spec.get(parsed.job or "", [])
  task = parsed.task or 0
  if task >= len(addrs):
    raise invalid_argument("devices", f"devices of the cluster {dict(spec)}",
                           device)
  return addrs[task]


def session_target(spec: Mapping[str, list[str]], device: str) -> str:
  """The gRPC target of the task `device` names (a Session run there
  reaches every task of the cluster)."""
  return f"grpc://{task_address(spec, device)}"


def task_hosts(spec: Mapping[str, list[str]], devices) -> list[str]:
  """Per device string, the host its task runs on (its address without the
  port); devices of this process are on "localhost"."""
  hosts = []
  for device in devices:
    if not is_remote(device):
      hosts.append("localhost")
      continue
    hosts.append(task_address(spec, device).rpartition(":")[0])
  return hosts


def task_of(device: str) -> tuple[str, int] | None:
  """(job, task) of a task's device string; None for this process's.

  >>> task_of("/job:worker/task:1/device:CPU:0"), task_of("/device:CPU:0")
  (('worker', 1), None)
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not is_remote(device):
    return None
  parsed = tf.DeviceSpec.from_string(device)
  return parsed.job, parsed.task or 0


def is_remote(device: str) -> bool:
  """Whether a device string names a task of another job."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  job = tf.DeviceSpec.from_string(device).job
  return job not in (None, "localhost")


def device_type(device: str) -> str:
  """A device string's type, upper case ("CPU" where it names none)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return (tf.DeviceSpec.from_string(device).device_type or "CPU").upper()


def in_process_cpus(devices) -> bool:
  """Whether every device string names a CPU device of this process."""
  return all(not is_remote(d) and device_type(d) == "CPU" for d in devices)
