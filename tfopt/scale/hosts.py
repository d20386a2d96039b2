"""LocalHosts: several hosts on one machine, each its own network stack.

    with LocalHosts(2, 2, link_rate="100mbit") as hosts:
      hosts.spec            # {"worker": ["10.201.0.1:2222", ...]}
      hosts.device_names    # "/job:worker/task:k/device:CPU:0", task order
      hosts.tf_config(3)    # TF_CONFIG of task 3 (JSON)
      hosts.run_client([sys.executable, "train.py"])  # on the fabric

Each host is a Linux network namespace joined to a bridge (in a namespace
of its own, the fabric) by a veth pair; both ends of a host's link are
shaped with a token bucket (`tc qdisc ... tbf`) at `link_rate`, so a
tensor between two hosts crosses two shaped links and the bridge, while
tasks of one host talk over its loopback at memory speed. This kernel has
no `netem`: latency cannot be injected, only rate; the latency between
hosts is the kernel's (tens of microseconds). Each host's TensorFlow server
tasks (`tfopt.runtime.server`) run inside its namespace, pinned to cores
and under memory cgroups where asked (as `LoopbackServers` does). The
client -- this process's work for the cluster, or a script run by
`run_client` -- sits in a namespace of its own on the fabric with an
unshaped link (`client_address`).

Addresses exist only inside the namespaces this object made (10.201.0.0/24
by default: host h is .h+1, the client .254); nothing is added to this
machine's own network, and no packet leaves the fabric.

Nothing outlives the object, also when this process is killed: the
namespaces are anonymous (no name under /var/run/netns), held by a holder
process each that the kernel kills when this process dies
(PR_SET_PDEATHSIG) and by this process's file descriptors; the tasks exit
when their parent is gone; links and the bridge vanish with their
namespaces. `close()` (or leaving the `with` block, also by an exception
or Ctrl-C) kills the tasks and holders at once.

Needs Linux, root (CAP_SYS_ADMIN and CAP_NET_ADMIN), `ip`, `tc` and
`nsenter`; `unavailable_reason()` names what is missing and the
constructor raises PermissionError with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

from tfopt._errors import check_positive_int, invalid_argument
from tfopt._native import tensorflow_only_env
from tfopt.cluster import Cluster
from tfopt.cost.comm import CommModel, Link
from tfopt.runtime import caps, netns
from tfopt.runtime.processes import _check_cpus, stop_tasks
from tfopt.scale import network

# The latency `comm()` charges between hosts: the kernel's bridge and veth
# hops (no netem here), a gRPC round trip's order of magnitude.
INTER_HOST_LATENCY_US = 200.0
# Each host's tasks listen on BASE_PORT, BASE_PORT + 1, ... inside its own
# namespace (a fresh port space: nothing else listens there).
BASE_PORT = 2222
# Nothing listens here: a connection is refused, which shows a host is up.
_UNUSED_PORT = 1
# A link probe's sockets give up after this long without progress.
_PROBE_TIMEOUT_S = 30.0
# A holder process: leaves for a network namespace of its own, asks the
# kernel to kill it when its parent dies, says "ready" and sleeps.
_HOLDER = (
    "import ctypes, os, signal, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.prctl(1, 9, 0, 0, 0)\n"  # PR_SET_PDEATHSIG, SIGKILL
    "if os.getppid() != int(sys.argv[1]): sys.exit(1)\n"
    "if libc.unshare(0x40000000) != 0: sys.exit(2)\n"  # CLONE_NEWNET
    "print('ready', flush=True)\n"
    "signal.pause()\n")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)\s*$", re.I)
_SCALE = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_TOOLS = ("ip", "tc", "nsenter")


def unavailable_reason() -> str | None:
  """Why LocalHosts cannot be made here, or None."""
  reason = netns.unavailable_reason()
  if reason is not None:
    return reason
  missing = [t for t in _TOOLS if shutil.which(t) is None]
  if missing:
    return (f"the commands {missing} are not installed (iproute2 and "
            f"util-linux)")
  return None


def link_rate_bits(link_rate) -> float | None:
  """A rate such as "1gbit", "100mbit" or bits per second as a number, in
  bits per second; None for an unshaped link."""
  if link_rate is None:
    return None
  if isinstance(link_rate, (int, float)) and not isinstance(link_rate, bool):
    if link_rate > 0:
      return float(link_rate)
  elif isinstance(link_rate, str):
    found = _RATE.match(link_rate)
    if found and float(found.group(1)) > 0:
      return float(found.group(1)) * _SCALE[found.group(2).lower()]
  raise invalid_argument("link_rate", "a rate such as '1gbit', '100mbit' or "
                         "'500kbit', bits per second > 0, or None (unshaped)",
                         link_rate)


def _rates_per_host(link_rate, num_hosts: int) -> list[float | None]:
  """`link_rate` (one rate, or one per host) as bits per second per host."""
  if isinstance(link_rate, (str, int, float)) or link_rate is None:
    return [link_rate_bits(link_rate)] * num_hosts
  rates = list(link_rate)
  if len(rates) != num_hosts or any(rate is None for rate in rates):
    raise invalid_argument("link_rate", f"one rate, or a rate for each of "
                           f"the {num_hosts} hosts (none of them None)",
                           link_rate)
  return [link_rate_bits(rate) for rate in rates]


def _stream_rate(sender, receiver, seconds: float) -> float:
  """Bits per second `receiver` takes in while `sender` sends for
  `seconds`, then closes its side: counted from the first byte received to
  the last, so the sender's buffer filling at memory speed does not count
  (kept small, so that draining it after `seconds` takes little longer)."""
  import socket  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 128 << 10)
  # Small chunks: a socket's timeout bounds a whole sendall, and a chunk
  # must cross a slow link well within it.
  chunk, got = b"\0" * (16 << 10), {}

  def drain():
    try:
      total, first, last, skip = 0, None, None, 0
      while data := receiver.recv(1 << 20):
        now = time.perf_counter()
        if first is None:
          first, skip = now, len(data)
        total, last = total + len(data), now
      if first is None or last == first:
        raise OSError("too few bytes arrived to time the link")
      got["bits"] = 8 * (total - skip) / (last - first)
    except OSError as err:  # a timeout included
      got["error"] = err

  thread = threading.Thread(target=drain, name="tfopt-link-probe",
                            daemon=True)
  thread.start()
  try:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline and thread.is_alive():
      sender.sendall(chunk)
    sender.shutdown(socket.SHUT_WR)  # the receiver sees the end
  finally:
    thread.join(_PROBE_TIMEOUT_S)
  if "bits" not in got:
    raise OSError(f"the link probe failed: {got.get('error', 'no answer')}")
  return got["bits"]


class _Namespace:
  """One anonymous network namespace, held by a holder process (for `ip`
  and `nsenter`, which name a namespace by a pid) and an fd here (for
  tasks, which enter it through `pass_fds`)."""

  def __init__(self, label: str, start_timeout: float = 30.0):
    self.label = label
    self.holder = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-c", _HOLDER, str(os.getpid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env={"PATH": os.environ.get("PATH", "")})
    deadline = time.monotonic() + start_timeout
    line = b""
    while not line and time.monotonic() < deadline:
      line = self.holder.stdout.readline()
      if self.holder.poll() is not None:
        break
    if line.strip() != b"ready":
      self.close()
      raise OSError(f"The network namespace of {label} could not be made "
                    f"(its holder exited with {self.holder.returncode}).")
    self.fd = os.open(f"/proc/{self.holder.pid}/ns/net", os.O_RDONLY)

  @property
  def pid(self) -> int:
    return self.holder.pid

  @property
  def identity(self) -> str:
    """The namespace as /proc shows it ("net:[inode]")."""
    return os.readlink(f"/proc/self/fd/{self.fd}")

  def run(self, *command: str) -> str:
    """`command` inside the namespace; its stdout (an error names the
    command and its stderr)."""
    done = subprocess.run(
        ["nsenter", f"--net=/proc/{self.pid}/ns/net", *command],
        capture_output=True, text=True, check=False)
    if done.returncode != 0:
      raise OSError(f"{' '.join(command)} in {self.label}'s network "
                    f"namespace failed: {done.stderr.strip()}")
    return done.stdout

  def close(self) -> None:
    if self.holder.poll() is None:
      self.holder.kill()
    self.holder.wait()
    if self.holder.stdout is not None:
      self.holder.stdout.close()
    if getattr(self, "fd", -1) >= 0:
      os.close(self.fd)
      self.fd = -1


class LocalHosts:
  """`num_hosts` hosts of `tasks_per_host` TensorFlow server tasks each,
  joined by shaped links (see the module doc); a context manager."""

  def __init__(self, num_hosts: int, tasks_per_host: int, *,
               link_rate="1gbit", cpus: Sequence[Sequence[int]] | None = None,
               memory_limit_bytes: int | None = None, job: str = "worker",
               subnet: str = "10.201.0", start_timeout: float = 120.0,
               log_dir: str | None = None):
    """Args:
      num_hosts: hosts (>= 1).
      tasks_per_host: server tasks on each host (>= 0); task k runs on host
        k // tasks_per_host. 0: the hosts' network alone, for processes
        started on it (the launcher's workers: `launch(..., hosts=)`).
      link_rate: each host's link rate, both directions ("1gbit",
        "100mbit", bits per second), or None for unshaped links; or one
        rate per host (a host with a slower link than the others).
      cpus: per task, the cores its process is pinned to (None: unpinned).
      memory_limit_bytes: an OS cap per task (a memory cgroup), or None.
      job: the tasks' job name.
      subnet: the first three octets of the fabric's /24.
      start_timeout: seconds for every task to listen.
      log_dir: a directory for each task's log (default: discarded).
    """
    check_positive_int("num_hosts", num_hosts)
    if isinstance(tasks_per_host, bool) or not isinstance(
        tasks_per_host, int) or tasks_per_host < 0:
      raise invalid_argument("tasks_per_host", "an integer >= 0",
                             tasks_per_host)
    if num_hosts > 250:
      raise invalid_argument("num_hosts", "at most 250 (one /24)", num_hosts)
    self.rates_bits = _rates_per_host(link_rate, num_hosts)
    if not isinstance(subnet, str) or not re.fullmatch(
        r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})", subnet) or any(
            int(o) > 255 for o in subnet.split(".")):
      raise invalid_argument("subnet", "three octets such as '10.201.0'",
                             subnet)
    if memory_limit_bytes is not None and not tasks_per_host:
      raise invalid_argument("memory_limit_bytes", "None when "
                             "tasks_per_host=0 (there are no tasks to cap)",
                             memory_limit_bytes)
    if memory_limit_bytes is not None:
      check_positive_int("memory_limit_bytes", memory_limit_bytes)
      reason = caps.unavailable_reason()
      if reason is not None:
        raise PermissionError(f"Argument `memory_limit_bytes` needs memory "
                              f"cgroups: {reason}. Received: "
                              f"memory_limit_bytes={memory_limit_bytes}")
    reason = unavailable_reason()
    if reason is not None:
      raise PermissionError(f"LocalHosts needs network namespaces, veth "
                            f"links and traffic shaping: {reason}.")
    self.num_hosts, self.tasks_per_host, self.job = (num_hosts,
                                                     tasks_per_host, job)
    self.cpus = _check_cpus(cpus, num_hosts * tasks_per_host)
    self.memory_limit_bytes = memory_limit_bytes
    self.addresses = [f"{subnet}.{h + 1}" for h in range(num_hosts)]
    self.client_address = f"{subnet}.254"
    self.spec = {job: [f"{self.addresses[k // tasks_per_host]}:"
                       f"{BASE_PORT + k % tasks_per_host}"
                       for k in range(num_hosts * tasks_per_host)]}
    self._fabric: _Namespace | None = None
    self._hosts: list[_Namespace] = []
    self._client: _Namespace | None = None
    self._procs: list[subprocess.Popen] = []
    self._logs: list = []
    self.caps: list[caps.MemoryCap] = []
    try:
      self._make_network()
      # A new port joins the bridge once the kernel sees its carrier (up to
      # a second later, under load longer): wait until every host answers.
      self._wait_reachable(range(num_hosts), start_timeout)
      self._spawn(log_dir)
      self._wait_listening(start_timeout)
    except BaseException:
      self.close()
      raise

  # ------------------------------------------------------------ the network

  def _make_network(self) -> None:
    """The fabric's bridge; per host a namespace, a veth pair (eth0 inside,
    hN on the bridge), its address and the shaping; the client's link."""
    self._fabric = _Namespace("the fabric")
    self._fabric.run("ip", "link", "add", "name", "br0", "type", "bridge")
    self._fabric.run("ip", "link", "set", "br0", "up")
    for h, address in enumerate(self.addresses):
      host = _Namespace(f"host {h}")
      self._hosts.append(host)
      self._attach(host, f"h{h}", address)
      self._shape(h, self.rates_bits[h])
    self._client = _Namespace("the client")
    self._attach(self._client, "client", self.client_address)

  def _attach(self, ns: _Namespace, port: str, address: str) -> None:
    fabric = self._fabric
    fabric.run("ip", "link", "add", "name", port, "type", "veth", "peer",
               "name", "eth0", "netns", str(ns.pid))
    fabric.run("ip", "link", "set", port, "master", "br0")
    fabric.run("ip", "link", "set", port, "up")
    ns.run("ip", "link", "set", "lo", "up")
    ns.run("ip", "addr", "add", f"{address}/24", "dev", "eth0")
    ns.run("ip", "link", "set", "eth0", "up")

  def _shape(self, host: int, bits: float | None) -> None:
    """Host `host`'s link at `bits` per second, both directions: the
    host's egress on eth0, its ingress as the fabric end's egress (None:
    unshaped). A bucket of 1 ms at the rate (at least a few packets): a
    real link sends no faster than its rate, and a larger bucket lets a
    step's tensors of tens of kB through at memory speed after each pause.
    At most 50 ms of queue."""
    ends = ((self._hosts[host], "eth0"), (self._fabric, f"h{host}"))
    for where, dev in ends:
      if bits is None:
        if "tbf" in where.run("tc", "qdisc", "show", "dev", dev):
          where.run("tc", "qdisc", "del", "dev", dev, "root")
        continue
      where.run("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                f"{int(bits)}bit", "burst", str(max(4_000, int(bits / 8e3))),
                "latency", "50ms")
    self.rates_bits[host] = bits

  def set_link_rate(self, host: int, link_rate) -> None:
    """Shapes host `host`'s link at `link_rate` ("10mbit", bits per second,
    or None: unshaped) from now on: a throttled link (a degraded NIC, a
    congested switch port)."""
    self.host_fd(host)  # checks `host`
    self._shape(host, link_rate_bits(link_rate))

  def measure_link(self, host: int, seconds: float = 0.25) -> dict:
    """Host `host`'s link as TCP sees it from the client's place (whose own
    link is unshaped): bits per second received in `seconds` of sending
    each way, {"down_bits": to the host, "up_bits": from it}. Nothing but
    this crosses the link meanwhile, or it shares the link."""
    import socket  # pylint: disable=g-import-not-at-top
    self.host_fd(host)  # checks `host`
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
        or not 0 < seconds <= 10:
      raise invalid_argument("seconds", "a number of seconds in (0, 10]",
                             seconds)
    with netns.entered(self._hosts[host].fd):
      listener = socket.create_server((self.addresses[host], 0))
    try:
      listener.settimeout(_PROBE_TIMEOUT_S)
      port = listener.getsockname()[1]
      with netns.entered(self._client.fd):
        outside = socket.create_connection((self.addresses[host], port),
                                           timeout=_PROBE_TIMEOUT_S)
      inside, _ = listener.accept()
    finally:
      listener.close()
    with outside, inside:
      for end in (outside, inside):
        end.settimeout(_PROBE_TIMEOUT_S)
      return {"down_bits": _stream_rate(outside, inside, seconds),
              "up_bits": _stream_rate(inside, outside, seconds)}

  def tcp_rtt_ms(self, host: int) -> float | None:
    """The longest round trip (ms) of host `host`'s established TCP
    connections to other hosts now, as `ss -tin state established` shows
    them (`tfopt.scale.network.ss_rtts_ms`), or None without such a
    connection.
    Bytes queueing at a link slower than the traffic raise it
    (`tfopt.scale.network.NetworkWatch`). OSError where `ss` (iproute2) is
    missing or fails."""
    self.host_fd(host)  # checks `host`
    if shutil.which("ss") is None:
      raise OSError("the command ss is not installed (iproute2)")
    rtts = network.ss_rtts_ms(
        self._hosts[host].run("ss", "-tin", "state", "established"))
    return max(rtts) if rtts else None

  # -------------------------------------------------------------- the tasks

  def _spawn(self, log_dir: str | None) -> None:
    env = tensorflow_only_env(dict(
        os.environ, TF_CPP_MIN_LOG_LEVEL="2",
        MALLOC_MMAP_THRESHOLD_=str(128 << 10),
        MALLOC_TRIM_THRESHOLD_=str(128 << 10)))
    for k in range(len(self.spec[self.job])):
      host = self._hosts[k // self.tasks_per_host]
      log = (open(os.path.join(log_dir, f"{self.job}{k}.log"), "wb")  # pylint: disable=consider-using-with
             if log_dir else subprocess.DEVNULL)
      self._logs.append(log)
      flags = [f"--netns_fd={host.fd}"]
      if self.cpus is not None:
        flags.append("--cpus=" + ",".join(str(c) for c in self.cpus[k]))
      self._procs.append(subprocess.Popen(  # pylint: disable=consider-using-with
          [sys.executable, "-m", "tfopt.runtime.server",
           f"--cluster={json.dumps(self.spec)}", f"--job={self.job}",
           f"--task={k}", f"--parent={os.getpid()}", *flags],
          stdout=log, stderr=subprocess.STDOUT, env=env,
          pass_fds=(host.fd,)))
      if self.memory_limit_bytes is not None:
        cap = caps.MemoryCap(f"host{k // self.tasks_per_host}-{self.job}{k}",
                             self.memory_limit_bytes)
        self.caps.append(cap)
        cap.add(self._procs[-1].pid)

  def _wait_listening(self, start_timeout: float) -> None:
    deadline = time.monotonic() + start_timeout
    waiting = list(range(len(self._procs)))
    while waiting:
      for k in list(waiting):
        if self._procs[k].poll() is not None:
          raise RuntimeError(
              f"Server task {self.job}:{k} on host {self.host_of(k)} exited "
              f"with code {self._procs[k].returncode} at start-up.")
        if self.answers(k):
          waiting.remove(k)
      if waiting and time.monotonic() > deadline:
        raise TimeoutError(f"Server tasks {waiting} did not listen within "
                           f"{start_timeout} s.")
      time.sleep(0.1)

  def answers(self, task: int) -> bool:
    """Whether task `task` accepts connections, asked from the client's
    place on the fabric."""
    host, _, port = self.spec[self.job][task].rpartition(":")
    probe = ("import socket, sys\n"
             "try:\n"
             f"  socket.create_connection(({host!r}, {port}), timeout=0.5)\n"
             "except OSError:\n"
             "  sys.exit(1)\n")
    done = subprocess.run(
        ["nsenter", f"--net=/proc/{self._client.pid}/ns/net",
         sys.executable, "-c", probe], capture_output=True, check=False)
    return done.returncode == 0

  # ----------------------------------------------------------------- access

  def host_fd(self, host: int) -> int:
    """Host `host`'s network namespace as an fd of this process (for
    `pass_fds` and `tfopt.runtime.netns`'s `--enter_fd`)."""
    if isinstance(host, bool) or not isinstance(host, int) or not (
        0 <= host < self.num_hosts):
      raise invalid_argument("host", f"a host index in [0, {self.num_hosts})",
                             host)
    return self._hosts[host].fd

  def free_ports(self, host: int, count: int) -> list[int]:
    """`count` ports free at host `host`'s address, asked inside it."""
    from tfopt._net import free_ports  # pylint: disable=g-import-not-at-top
    with netns.entered(self.host_fd(host)):
      return free_ports(count, host=self.addresses[host])

  def set_link(self, host: int, up: bool, timeout_s: float = 30.0,
               wait: bool = True) -> None:
    """Takes host `host`'s link to the fabric down (a partition: nothing
    reaches it or leaves it) or brings it back up; up with `wait` returns
    once the host answers again (TimeoutError after `timeout_s`)."""
    self.host_fd(host)  # checks `host`
    self._fabric.run("ip", "link", "set", f"h{host}",
                     "up" if up else "down")
    if up and wait:
      self._wait_reachable([host], timeout_s)

  def _wait_reachable(self, hosts, timeout_s: float) -> None:
    """Waits until each of `hosts` answers from the client's place (a
    refusal at an unused port is an answer)."""
    deadline = time.monotonic() + timeout_s
    for host in hosts:
      while not self.reachable(host, _UNUSED_PORT):
        if time.monotonic() > deadline:
          raise TimeoutError(f"Host {host} ({self.addresses[host]}) did not "
                             f"answer within {timeout_s} s of its link "
                             f"coming up.")
        time.sleep(0.05)

  def reachable(self, host: int, port: int, timeout_s: float = 0.5) -> bool:
    """Whether host `host` answers a connection to `port` from the client's
    place on the fabric: accepting it, or refusing it (up, nothing
    listening there); False where nothing comes back (its link down)."""
    import socket  # pylint: disable=g-import-not-at-top
    self.host_fd(host)  # checks `host`
    address = self.addresses[host]
    with netns.entered(self._client.fd):
      try:
        with socket.create_connection((address, port), timeout=timeout_s):
          return True
      except ConnectionRefusedError:
        return True
      except OSError:
        return False

  def host_of(self, task: int) -> int:
    """The host task `task` runs on."""
    self._check_tasks("host_of")
    return task // self.tasks_per_host

  def _check_tasks(self, what: str) -> None:
    if not self.tasks_per_host:
      raise ValueError(f"LocalHosts(tasks_per_host=0) has no server tasks: "
                       f"`{what}` needs some.")

  @property
  def device_names(self) -> list[str]:
    """Each task's CPU device, in task order."""
    return [f"/job:{self.job}/task:{k}/device:CPU:0"
            for k in range(len(self.spec[self.job]))]

  @property
  def target(self) -> str:
    """The session target of task 0 (reachable from the client's place)."""
    self._check_tasks("target")
    return f"grpc://{self.spec[self.job][0]}"

  def tf_config(self, task: int) -> str:
    """TF_CONFIG for task `task` (as a cluster manager writes it)."""
    if isinstance(task, bool) or not isinstance(task, int) or not (
        0 <= task < len(self.spec[self.job])):
      raise invalid_argument("task", f"a task index in [0, "
                             f"{len(self.spec[self.job])})", task)
    return json.dumps({"cluster": self.spec,
                       "task": {"type": self.job, "index": task}})

  def comm(self, intra: Link | None = None,
           latency_us: float = INTER_HOST_LATENCY_US) -> CommModel:
    """The two levels as a CommModel: between tasks of one host `intra`
    (default: the default Link, a fast local hand-over), between hosts a
    link of `link_rate` (its bytes over the rate, plus `latency_us`);
    unshaped links are `intra` everywhere."""
    intra = intra if intra is not None else Link()
    if all(bits is None for bits in self.rates_bits):
      return CommModel(intra)
    hosts = [self.host_of(k) for k in range(len(self.spec[self.job]))]

    def between(a: int, b: int) -> Link:
      # A transfer between two hosts crosses both links: the slower
      # shaped one sets its rate (an unshaped link sets none).
      rates = [r for r in (self.rates_bits[a], self.rates_bits[b])
               if r is not None]
      return Link(latency_us, min(rates) / 8 / 1e9) if rates else intra
    return CommModel(intra, pairs={
        (a, b): between(hosts[a], hosts[b])
        for a in range(len(hosts)) for b in range(len(hosts))
        if hosts[a] != hosts[b]}, hosts=tuple(hosts))

  def cluster(self, memory_bytes: int | None = None, *,
              comm: CommModel | None = None) -> Cluster:
    """The tasks as a tfopt Cluster (one CPU device each), by default with
    the two-level `comm()`."""
    self._check_tasks("cluster")
    return Cluster.uniform(len(self.device_names), memory_bytes,
                           device_type="CPU",
                           comm=comm if comm is not None else self.comm(),
                           names=self.device_names)

  @property
  def pids(self) -> list[int]:
    """The tasks' process ids, in task order (empty once closed)."""
    return [p.pid for p in self._procs]

  @property
  def namespaces(self) -> list[str]:
    """Every namespace this object made, as /proc shows them (hosts, then
    the fabric and the client)."""
    made = self._hosts + [n for n in (self._fabric, self._client) if n]
    return [n.identity for n in made if n.fd >= 0]

  @property
  def holder_pids(self) -> list[int]:
    """The processes holding the namespaces (killed with this process)."""
    made = self._hosts + [n for n in (self._fabric, self._client) if n]
    return [n.pid for n in made]

  def client_command(self, command: Sequence[str]) -> list[str]:
    """`command` prefixed to run in the client's place on the fabric."""
    return ["nsenter", f"--net=/proc/{self._client.pid}/ns/net",
            *command]

  def run_client(self, command: Sequence[str], **kwargs
                 ) -> subprocess.CompletedProcess:
    """subprocess.run(command) in the client's place on the fabric."""
    return subprocess.run(self.client_command(command), check=False,
                          **kwargs)

  def entered(self):
    """A context manager: the calling thread in the client's place on the
    fabric (threads it starts meanwhile stay there). TensorFlow's eager
    context is initialised first, outside."""
    from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
    context.ensure_initialized()
    return netns.entered(self._client.fd)

  def exited(self) -> dict[str, int]:
    """"job:task" -> exit code of every task no longer running."""
    return {f"{self.job}:{k}": p.returncode
            for k, p in enumerate(self._procs) if p.poll() is not None}

  def close(self) -> None:
    """Kills the tasks and the holders: the namespaces, links and bridge
    go with them. Safe to call twice."""
    stop_tasks(self._procs, self._logs)
    self._procs, self._logs = [], []
    for cap in self.caps:
      cap.remove()
    self.caps = []
    for ns in self._hosts + [n for n in (self._client, self._fabric) if n]:
      ns.close()

  def __enter__(self) -> "LocalHosts":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


__all__ = ["LocalHosts", "link_rate_bits", "unavailable_reason"]
