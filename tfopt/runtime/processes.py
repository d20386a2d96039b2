"""N TensorFlow server processes on loopback: a real multi-process cluster.

Each task is its own OS process running `tf.distribute.Server` (see
server.py); a client session connects to task 0's gRPC target and runs a
graph whose nodes carry `/job:worker/task:i/device:CPU:0` device strings, so
every cross-task tensor goes through TensorFlow's own distributed runtime
(rendezvous, gRPC). No home-made RPC. The tasks run inside this process's
private network namespace (`tfopt.runtime.netns`): TensorFlow binds every
interface and lets whoever connects run graphs, so nothing outside this
process and its tasks can reach them. Several jobs (workers and parameter
servers) make the cluster a ParameterServerStrategy connects to.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from tfopt._errors import check_positive_int, invalid_argument
from tfopt._native import tensorflow_only_env
from tfopt._net import free_ports
from tfopt.cluster import Cluster
from tfopt.cost.comm import CommModel
from tfopt.runtime import caps, netns, remote


def _task_counts(num_tasks, job: str) -> dict[str, int]:
  """{job: count} from an int or a mapping, every count a positive int."""
  if isinstance(num_tasks, Mapping):
    if not num_tasks or not all(isinstance(name, str) and name
                                for name in num_tasks):
      raise invalid_argument("num_tasks", "a positive int or a non-empty "
                             "mapping {job name: positive int}", num_tasks)
    for name, count in num_tasks.items():
      check_positive_int(f"num_tasks[{name!r}]", count)
    return dict(num_tasks)
  check_positive_int("num_tasks", num_tasks)
  return {job: num_tasks}


def pinned_cpus(num_tasks: int) -> list[list[int]]:
  """One core per task, the cores this process may use in order: what
  `LoopbackServers(n, cpus=pinned_cpus(n), intra_op_threads=1)` pins. Raises
  ValueError when there are fewer cores than tasks."""
  check_positive_int("num_tasks", num_tasks)
  cores = sorted(os.sched_getaffinity(0))
  if num_tasks > len(cores):
    raise invalid_argument("num_tasks", f"at most the {len(cores)} cores this "
                           f"process may use ({cores}), one per pinned task",
                           num_tasks)
  return [[c] for c in cores[:num_tasks]]


def _check_cpus(cpus, num_tasks: int) -> list[list[int]] | None:
  if cpus is None:
    return None
  usable = os.sched_getaffinity(0)
  try:
    out = [sorted({int(c) for c in cores}) for cores in cpus]
  except (TypeError, ValueError):
    out = None
  if out is None or len(out) != num_tasks or not all(out) or any(
      isinstance(c, bool) for cores in cpus for c in cores):
    raise invalid_argument("cpus", f"one non-empty list of core numbers per "
                           f"task ({num_tasks} tasks)", cpus)
  outside = sorted({c for cores in out for c in cores} - usable)
  if outside:
    raise invalid_argument("cpus", f"cores this process may use "
                           f"({sorted(usable)}); not {outside}", cpus)
  return out


def stop_tasks(procs, logs) -> None:
  """Kills server task processes, waits for them and closes their logs."""
  for proc in procs:
    if proc.poll() is None:
      proc.kill()
  for proc in procs:
    proc.wait()
  for log in logs:
    if log is not subprocess.DEVNULL:
      log.close()


class LoopbackServers:
  """Starts server processes on loopback; a context manager that stops them.

  `num_tasks` is a task count for one job (`job`, "worker" by default) or a
  mapping {job: task count}, e.g. {"worker": 2, "ps": 1} for
  ParameterServerStrategy (whose coordinator, the client, joins as
  "chief"). Tasks are ordered job by job as given.

  >>> # with LoopbackServers(2) as servers:
  >>> #   session target: servers.target; devices: servers.device_names
  >>> # with LoopbackServers({"worker": 2, "ps": 1}) as servers:
  >>> #   tf.train.ClusterSpec(servers.spec)
  """

  def __init__(self, num_tasks: int | Mapping[str, int], *,
               job: str = "worker", start_timeout: float = 120.0,
               log_dir: str | None = None,
               memory_limit_bytes: int | None = None,
               cpus: Sequence[Sequence[int]] | None = None,
               intra_op_threads: int | None = None,
               inter_op_threads: int | None = None,
               allow_exposed: bool = False):
    """Args:
      num_tasks: a task count for `job`, or {job: task count}.
      job: the job name for an int `num_tasks`.
      start_timeout: seconds for every task to listen.
      log_dir: a directory for each task's log (default: discarded).
      memory_limit_bytes: an OS-enforced cap on how much each server may
        grow after start-up (a memory cgroup per task, see
        `tfopt.runtime.caps`); a task over it is killed by the kernel.
        None: uncapped. Raises PermissionError where caps cannot be set.
      cpus: per task, the cores its process is pinned to (e.g. `[[0], [1]]`,
        or `pinned_cpus(n)`): tasks on disjoint cores compute apart from
        each other, unlike logical devices of one process. None: unpinned.
      intra_op_threads, inter_op_threads: each task's thread pools (None:
        TensorFlow's default, one per core the task may use). A pinned task
        with one intra-op thread is one core's worth of device; give it two
        inter-op threads when it exchanges tensors with other tasks (with
        one, a Send waits behind the op running, and its peer idles).
      allow_exposed: where the tasks cannot be confined to the job's network
        namespace (not root, no namespaces), run them on every interface
        anyway, with a warning naming the ports (also
        TFOPT_ALLOW_EXPOSED_SERVERS=1). False: PermissionError there.
        Where they can be confined, they always are.
    """
    if memory_limit_bytes is not None:
      check_positive_int("memory_limit_bytes", memory_limit_bytes)
      reason = caps.unavailable_reason()
      if reason is not None:
        raise PermissionError(f"Argument `memory_limit_bytes` needs memory "
                              f"cgroups: {reason}. Received: "
                              f"memory_limit_bytes={memory_limit_bytes}")
    counts = _task_counts(num_tasks, job)
    total = sum(counts.values())
    self.cpus = _check_cpus(cpus, total)
    for name, value in (("intra_op_threads", intra_op_threads),
                        ("inter_op_threads", inter_op_threads)):
      if value is not None:
        check_positive_int(name, value)
    self.intra_op_threads = intra_op_threads
    self.inter_op_threads = inter_op_threads
    self.memory_limit_bytes = memory_limit_bytes
    self.caps: list[caps.MemoryCap] = []
    self._peaks: list[caps.ProcessPeak] = []
    self.tasks = [(name, i) for name, count in counts.items()
                  for i in range(count)]
    self.namespace = netns.confine("The server tasks of LoopbackServers",
                                   allow_exposed)
    self.ports = (self.namespace.reserve_ports(len(self.tasks))
                  if self.namespace else free_ports(len(self.tasks)))
    if self.namespace is None:
      netns.warn_exposed("The server tasks of LoopbackServers", self.ports)
    spec: dict[str, list[str]] = {name: [] for name in counts}
    for (name, _), port in zip(self.tasks, self.ports):
      # 127.0.0.1, not localhost: a name that may resolve to ::1 first
      # would reach whatever else listens there.
      spec[name].append(f"127.0.0.1:{port}")
    self.spec = spec
    self._procs = []
    self._logs = []
    try:
      self._spawn(log_dir)
      self._wait_listening(start_timeout)
      for (name, i), proc in zip(self.tasks, self._procs):
        if memory_limit_bytes is not None:
          cap = caps.MemoryCap(f"{name}{i}", memory_limit_bytes)
          self.caps.append(cap)
          cap.add(proc.pid)
        self._peaks.append(caps.ProcessPeak(proc.pid))
    except BaseException:
      self.close()
      raise

  def _spawn(self, log_dir: str | None) -> None:
    """One `tfopt.runtime.server` process per task."""
    # glibc's malloc keeps freed large buffers in its heap once its dynamic
    # mmap threshold has grown (it does after the first large free), so a
    # server's memory never shrank back after a step: a fixed threshold
    # returns every tensor-sized buffer to the OS when it is freed, and
    # the process's footprint (what a cap limits) follows its live tensors.
    # A task only runs TensorFlow: no OR-Tools or JAX beside it (_native).
    env = tensorflow_only_env(dict(
        os.environ, TF_CPP_MIN_LOG_LEVEL="2",
        MALLOC_MMAP_THRESHOLD_=str(128 << 10),
        MALLOC_TRIM_THRESHOLD_=str(128 << 10)))
    for k, (name, i) in enumerate(self.tasks):
      log = (open(os.path.join(log_dir, f"{name}{i}.log"), "wb")  # pylint: disable=consider-using-with
             if log_dir else subprocess.DEVNULL)
      self._logs.append(log)
      self._procs.append(subprocess.Popen(  # pylint: disable=consider-using-with
          [sys.executable, "-m", "tfopt.runtime.server",
           f"--cluster={json.dumps(self.spec)}", f"--job={name}",
           f"--task={i}", f"--parent={os.getpid()}"] + self._task_flags(k),
          stdout=log, stderr=subprocess.STDOUT, env=env,
          pass_fds=(self.namespace.fd,) if self.namespace else ()))

  def _wait_listening(self, start_timeout: float) -> None:
    """Until every task accepts connections; a task that exits or is late
    is named."""
    deadline = time.monotonic() + start_timeout
    waiting = list(range(len(self.tasks)))
    while waiting:
      for k in list(waiting):
        if self._procs[k].poll() is not None:
          name, i = self.tasks[k]
          raise RuntimeError(f"Server task {name}:{i} exited with code "
                             f"{self._procs[k].returncode} at start-up "
                             f"(port {self.ports[k]}).")
        if self.listening(k):
          waiting.remove(k)
      if waiting and time.monotonic() > deadline:
        late = [f"{self.tasks[k][0]}:{self.tasks[k][1]}" for k in waiting]
        raise TimeoutError(f"Server tasks {late} did not listen within "
                           f"{start_timeout} s.")
      time.sleep(0.1)

  def _task_flags(self, k: int) -> list[str]:
    flags = ([f"--netns_fd={self.namespace.fd}"] if self.namespace
             else [])
    if self.cpus is not None:
      flags.append("--cpus=" + ",".join(str(c) for c in self.cpus[k]))
    if self.intra_op_threads is not None:
      flags.append(f"--intra_op_threads={self.intra_op_threads}")
    if self.inter_op_threads is not None:
      flags.append(f"--inter_op_threads={self.inter_op_threads}")
    return flags

  def listening(self, k: int) -> bool:
    """Whether task `k` accepts connections (asked inside the namespace:
    outside, the relay accepts before the task listens)."""
    return remote.answers(f"127.0.0.1:{self.ports[k]}", timeout_s=0.5)

  @property
  def confined(self) -> bool:
    """Whether the tasks run in the job's private network namespace."""
    return self.namespace is not None

  def entered(self):
    """A context manager: the calling thread inside the tasks' network
    namespace. Wrap what starts this process's own TensorFlow server for
    the cluster, e.g. `tf.distribute.ParameterServerStrategy(resolver)`
    (its coordinator listens for the tasks' calls back): inside, only the
    tasks reach it. `tfopt.compile` and `tfopt.runtime.remote.connect` do
    this themselves. A no-op where the tasks are not confined. TensorFlow's
    eager context is initialised first, outside: its thread pools, where
    ops run, keep this machine's network."""
    if self.namespace is None:
      return contextlib.nullcontext()
    from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
    context.ensure_initialized()
    return self.namespace.entered()

  @property
  def pinned(self) -> bool:
    """Whether every task has cores no other task uses."""
    if self.cpus is None:
      return False
    seen: set[int] = set()
    for cores in self.cpus:
      if seen & set(cores):
        return False
      seen |= set(cores)
    return True

  @property
  def target(self) -> str:
    """The session target: the first task's gRPC address."""
    return f"grpc://127.0.0.1:{self.ports[0]}"

  @property
  def pids(self) -> list[int]:
    """Each task's process id, in task order (empty once closed). The
    servers exit by themselves when this process dies."""
    return [proc.pid for proc in self._procs]

  @property
  def device_names(self) -> list[str]:
    """Each task's CPU device, in task order."""
    return [f"/job:{name}/task:{i}/device:CPU:0" for name, i in self.tasks]

  def cluster(self, memory_bytes: int | None = None, *,
              comm: CommModel | None = None) -> Cluster:
    """The tasks as a tfopt Cluster (one CPU device each)."""
    return Cluster.uniform(len(self.tasks), memory_bytes, device_type="CPU",
                           comm=comm, names=self.device_names)

  def reset_peaks(self) -> None:
    """Measures each task's peak afresh from now."""
    for peak in self._peaks:
      peak.reset()
    for cap in self.caps:
      cap.reset_peak()

  def peak_bytes(self) -> list[int]:
    """Per task, the most it grew since start-up or `reset_peaks`: the
    cgroup's peak where capped, else VmHWM over the baseline RSS."""
    if self.caps:
      return [cap.peak_bytes for cap in self.caps]
    return [peak.peak_bytes for peak in self._peaks]

  def exited(self) -> dict[str, int]:
    """"job:task" -> exit code of every task that is no longer running
    (-9: killed, e.g. by the kernel at its memory cap)."""
    return {f"{name}:{i}": proc.returncode
            for (name, i), proc in zip(self.tasks, self._procs)
            if proc.poll() is not None}

  def close(self) -> None:
    stop_tasks(self._procs, self._logs)
    self._procs = []
    if self.namespace is not None:
      self.namespace.release_ports(self.ports)
    for cap in self.caps:
      cap.remove()
    self.caps = []

  def __enter__(self) -> "LoopbackServers":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
