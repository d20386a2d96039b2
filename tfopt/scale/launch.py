"""Launcher: start N workers on loopback, watch them, restart on failure.

    python -m tfopt.scale.launch --workers=2 [--max_restarts=3] \\
        [--run_dir=DIR] [--inject=kill:1:20] -- train.py --flag=value

or `launch(["train.py", ...], workers=2)` from Python. Per attempt it picks
free loopback ports, writes each worker's `TF_CONFIG` (and the `TFOPT_*`
variables `tfopt.scale.worker.WorkerEnv` reads), starts the workers in
their own process groups with their output in
`<run_dir>/logs/attempt-<k>/worker-<i>.log`, then watches:
- exit codes (a worker killed or crashed: the survivors of a dead peer
  fail within a second, so the first failure seen is the culprit),
- heartbeats (`tfopt.scale.heartbeat`): a beat that stops (SIGSTOP shows as
  process state T) or steps that stop advancing (alive but stuck, with the
  report naming the worker outside the collective).
On any failure it stops every worker at once (SIGCONT, then SIGKILL to the
process group), classifies the failure (killed, stopped, heartbeat lost,
stuck, OOM, port in use, a server task of a placed step lost, crashed,
preempted) from exit codes, process
state and the log tails, and relaunches after an exponential backoff; the
workers resume from the newest checkpoint. A restart budget bounds the
loop; a script that fails before any step without a signal (an import
error, a bad flag, an unwritable checkpoint directory) is not restarted,
since it would fail again: the error shows its log tail. Later attempts get
a collective timeout derived from the step times observed so far.

The launcher never deletes anything; `<run_dir>/launch.json` records every
attempt (ports, start, first step, failure, detection and teardown times,
injected faults), and `result.trajectory()` stitches the per-step logs into
the steps that made the final model (lost and repeated steps counted).
SIGTERM to the launcher is passed on as a preemption: the workers agree on
a step, checkpoint and exit, and the launcher exits with 75.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import inspect
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

from tfopt._errors import invalid_argument
from tfopt._io import atomic_write_text
from tfopt._net import free_ports
from tfopt.runtime import netns
from tfopt.scale import heartbeat as hb
from tfopt.scale import host_report
from tfopt.scale import network
from tfopt.scale import protocol as wk

FAULTS = wk.FAULTS
RECORD = "launch.json"
# The link watch during an attempt (_Attempt._watch_links): each probe's
# sending time each way at most (the launcher's loop waits for it), and
# the failures in a row after which the watch stops for the attempt.
WATCH_PROBE_S = 0.25
WATCH_FAILURES_TO_STOP = 3
# A host that does not answer from the fabric in this many probes in a row
# (each 0.2 s, one per heartbeat interval) is cut off: one lost SYN on a
# busy shaped link is not a partition.
SILENT_PROBES = 2
# The failures a cut-off host explains (renamed "partition" or "host
# lost"); start-up crashes, OOM, ports in use and the like stay as seen.
NETWORK_EXPLAINS = ("stuck", "heartbeat lost", "crashed", "killed",
                    "task lost")

_OOM = re.compile(r"ResourceExhaustedError|MemoryError|[Oo]ut of memory|OOM")
_PORT = re.compile(r"[Aa]ddress already in use|Failed to add port|"
                   r"could not bind|bind\(\) failed")


class LaunchError(RuntimeError):
  """The job could not be completed (budget spent, or a failure that a
  restart cannot fix); `result` has every attempt."""

  def __init__(self, message: str, result: "LaunchResult"):
    super().__init__(message)
    self.result = result


@dataclasses.dataclass(frozen=True)
class Fault:
  """Inject `kind` (kill = SIGKILL, stop = SIGSTOP, term = SIGTERM) into
  `worker` once its heartbeat reports `step` in `attempt`; on LocalHosts
  also partition (the worker's host's link down for `partition_s`) and
  kill_host (every worker of that host killed, its link down as long)."""
  kind: str
  worker: int
  step: int
  attempt: int = 0

  @classmethod
  def parse(cls, text: str) -> "Fault":
    """'kind:worker:step[:attempt]'."""
    parts = text.split(":")
    try:
      if len(parts) not in (3, 4) or parts[0] not in FAULTS:
        raise ValueError
      return cls(parts[0], *(int(p) for p in parts[1:]))
    except ValueError:
      raise invalid_argument(
          "inject", f"'kind:worker:step[:attempt]' with kind one of "
          f"{sorted(FAULTS)}", text) from None


@dataclasses.dataclass
class LaunchResult:
  ok: bool
  run_dir: str
  attempts: list
  preempted: bool = False

  def trajectory(self, worker: int = 0) -> dict:
    """Stitches `<run_dir>/steps/worker-<i>.jsonl` into the steps that made
    the final state: attempt k contributes its steps after its resume point
    up to the next attempt's resume point. Returns the per-step losses of
    that trajectory, the steps missing from it (`lost`), the steps it has
    twice (`repeated`) and the logged steps computed and thrown away
    (`recomputed`; workers flush the log at every checkpoint, so a kill -9
    loses the unflushed steps since the last one from this count)."""
    path = os.path.join(self.run_dir, "steps", f"worker-{worker}.jsonl")
    by_attempt: dict = {}
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        for line in f:
          try:
            rec = json.loads(line)
          except ValueError:
            continue  # a line cut by a kill
          by_attempt.setdefault(rec["attempt"], []).append(rec)
    resumes = {a["attempt"]: a.get("resumed_from") for a in self.attempts}
    order = sorted(by_attempt)
    kept, recomputed = [], 0
    for i, attempt in enumerate(order):
      lo = resumes.get(attempt) or 0
      hi = (resumes.get(order[i + 1]) if i + 1 < len(order) else None)
      for rec in by_attempt[attempt]:
        if rec["step"] > lo and (hi is None or rec["step"] <= hi):
          kept.append(rec)
        elif hi is not None and rec["step"] > hi:
          recomputed += 1
    steps = [r["step"] for r in kept]
    last = max(steps, default=0)
    seen = set(steps)
    return {"steps": last, "loss": {r["step"]: r["loss"] for r in kept},
            "lost": sorted(set(range(1, last + 1)) - seen),
            "repeated": sorted(s for s, n in collections.Counter(
                steps).items() if n > 1),
            "recomputed": recomputed}

  def per_host(self) -> list[dict]:
    """The last attempt's report per host (workers, pooled MFU,
    stragglers, link; `tfopt.scale.host_report.host_report`); empty on
    one host."""
    if not self.attempts:
      return []
    return host_report.host_report(self.attempts[-1],
                                   host_report.read_finals(self.run_dir))

  def goodput(self) -> dict:
    """Productive training time over the job's wall time, with the badput
    split: startup (launch to first step, every attempt), restart (from a
    failure's detection to the next launch: teardown and backoff), and the
    steps recomputed after restarts. Productive time is the final
    trajectory's steps at the median step time the heartbeats reported."""
    if not self.attempts:
      raise ValueError("goodput() needs at least one attempt")
    trajectory = self.trajectory()
    medians = [a["median_step_s"] for a in self.attempts
               if a.get("median_step_s")]
    step_s = sorted(medians)[len(medians) // 2] if medians else 0.0
    wall = self.attempts[-1]["ended"] - self.attempts[0]["started"]
    startup = sum(a["first_step_s"] or (a["ended"] - a["started"])
                  for a in self.attempts)
    restart = sum(nxt["started"] - (cur["failure"] or {}).get(
        "detected_at", cur["ended"])
                  for cur, nxt in zip(self.attempts, self.attempts[1:]))
    recomputed = sum(max(0, cur["last_step"] - (nxt["resumed_from"] or 0))
                     for cur, nxt in zip(self.attempts, self.attempts[1:]))
    productive = trajectory["steps"] * step_s
    return {"goodput": productive / wall if wall > 0 else None,
            "wall_s": wall, "productive_s": productive, "startup_s": startup,
            "restart_s": restart, "recomputed_steps": recomputed,
            "recomputed_s": recomputed * step_s, "step_s": step_s}


def _check_ports_free(ports, host: str = "127.0.0.1") -> None:
  for port in ports:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
      try:
        s.bind((host, port))
      except OSError:
        raise invalid_argument("ports", "free loopback ports (port "
                               f"{port} is in use)", list(ports)) from None


def _proc_state(pid: int) -> str | None:
  """The process state letter from /proc (R, S, D, T = stopped, Z)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
      return f.read().rsplit(")", 1)[1].split()[0]
  except (OSError, IndexError):
    return None


def _tail(path: str, limit: int = 4000) -> str:
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - limit))
      return f.read().decode("utf-8", "replace")
  except OSError:
    return ""


class _Attempt:
  """One launch of all workers."""

  def __init__(self, launcher, index: int):
    self.launcher = launcher
    self.index = index
    self.procs: list = []
    self.logs: list = []
    self.record = {"attempt": index, "ports": None, "started": None,
                   "first_step_s": None, "resumed_from": None,
                   "outcome": None, "failure": None, "faults": [],
                   "last_step": -1, "median_step_s": None}
    self.watch = None
    # Hosts that did not answer from the fabric in SILENT_PROBES probes in
    # a row (host -> since when), and the probes in a row so far.
    self.unanswered: dict[int, float] = {}
    self.silent: dict[int, int] = {}
    self.probed_at = float("-inf")
    self.killed: set[int] = set()  # workers a kill_host fault killed
    # On 2 or more hosts: the hosts' RTT and the step time, watched for a
    # link slow during the attempt (tfopt.scale.network.NetworkWatch);
    # when last sampled; per worker the (end time, step, pauses summed) of
    # the step its beat last showed; the watch's failures in a row and in
    # all, and the last one.
    self.network_watch = None
    self.rtt_at = float("-inf")
    self.step_end_at: dict[int, tuple] = {}
    self.watch_failures = 0
    self.watch_errors = {"count": 0, "last": None}

  def start(self, ports) -> None:
    cfg = self.launcher
    log_dir = os.path.join(cfg.run_dir, "logs", f"attempt-{self.index}")
    os.makedirs(log_dir, exist_ok=True)
    cluster = {"worker": [f"{cfg.address_of(w)}:{p}"
                          for w, p in enumerate(ports)]}
    self.record["ports"] = list(ports)
    self.record["addresses"] = [cfg.address_of(w) for w in range(len(ports))]
    self.record["started"] = time.time()
    if cfg.hosts is not None and cfg.hosts.num_hosts >= 2 and \
        cfg.link_probe_s is not None:
      self.network_watch = network.NetworkWatch(
          cfg.hosts.addresses, start=self.record["started"])
      self.record["network_watch"] = self.network_watch.record()
    self.watch = hb.ProgressWatch(
        os.path.join(cfg.run_dir, "heartbeats"), cfg.workers,
        timeout_s=cfg.heartbeat_timeout_s, stuck_factor=cfg.stuck_factor,
        min_stuck_s=cfg.min_stuck_s, attempt=self.index,
        phase_budget_s=cfg.phase_budget_s)
    for w in range(cfg.workers):
      env = dict(os.environ)
      env.update(cfg.env)
      env.update({
          "TF_CONFIG": json.dumps({"cluster": cluster,
                                   "task": {"type": "worker", "index": w}}),
          wk.ENV_RUN_DIR: cfg.run_dir, wk.ENV_WORKER: str(w),
          wk.ENV_WORKERS: str(cfg.workers), wk.ENV_ATTEMPT: str(self.index),
          wk.ENV_HEARTBEAT: str(cfg.heartbeat_s), "PYTHONUNBUFFERED": "1"})
      if cfg.collective_timeout_s:
        env[wk.ENV_TIMEOUT] = f"{cfg.collective_timeout_s:.1f}"
      mine = [f"{f.kind}:{f.step}" for f in cfg.faults
              if f.worker == w and f.attempt == self.index]
      if mine:  # the worker raises them at the exact step
        env[wk.ENV_FAULT] = ",".join(mine)
      log = os.path.join(log_dir, f"worker-{w}.log")
      self.logs.append(log)
      fd = cfg.namespace_fd(w)
      with open(log, "ab") as out:
        self.procs.append(subprocess.Popen(  # pylint: disable=consider-using-with
            cfg.worker_command(w), env=env, stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, pass_fds=() if fd is None else (fd,)))

  def _inject(self) -> None:
    """Records the faults workers raised on themselves at their step
    (ENV_FAULT); a worker that passed the step without doing so does not
    speak the protocol, and gets the signal from here, a step or more
    late (`by` says which, `at_step` where it landed)."""
    cfg = self.launcher
    for fault in cfg.faults:
      if fault.attempt != self.index or fault in cfg.injected:
        continue
      report = wk.fault_report_path(cfg.run_dir, self.index, fault.worker,
                                    fault.step)
      if os.path.exists(report):
        with open(report, encoding="utf-8") as f:
          landed = json.load(f)
        if fault.kind in wk.HOST_FAULTS:
          landed["host"] = self._cut_off(fault)
          atomic_write_text(report + ".ack", "{}", overwrite=True)
      else:
        beat = self.watch.beats.get(fault.worker)
        if FAULTS[fault.kind] is None or not (
            beat and beat["step"] > fault.step and
            self.procs[fault.worker].poll() is None):
          continue  # only the worker can kill its server tasks
        os.kill(self.procs[fault.worker].pid, FAULTS[fault.kind])
        landed = {"kind": fault.kind, "worker": fault.worker,
                  "at_step": beat["step"], "time": time.time(),
                  "by": "launcher"}
      cfg.injected.add(fault)
      self.record["faults"].append(dict(landed, asked_step=fault.step))
      # The worker reached that step (its heartbeat may not have said so
      # before it died): the steps past the checkpoint are recomputed.
      self.record["last_step"] = max(self.record["last_step"],
                                     landed["at_step"])

  def _cut_off(self, fault) -> str:
    """Delivers a host fault: the host's link down (until `partition_s`
    from now), and for kill_host its workers killed. Returns the host's
    address."""
    cfg = self.launcher
    host = cfg.host_of(fault.worker)
    cfg.hosts.set_link(host, False)
    cfg.down_until[host] = time.time() + cfg.partition_s
    if fault.kind == "kill_host":
      for w in range(cfg.workers):
        if cfg.host_of(w) == host and self.procs[w].poll() is None:
          self.killed.add(w)
          try:
            os.killpg(self.procs[w].pid, signal.SIGKILL)
          except ProcessLookupError:
            pass
    return cfg.hosts.addresses[host]

  def run(self) -> dict | None:
    """Watches until all exit 0 (None) or a failure (returns it)."""
    cfg = self.launcher
    preempt_since = finishing_since = None
    while True:
      now = time.time()
      cfg.restore_links(now)
      self._probe_hosts(now)
      self._watch_links(now)
      codes = [p.poll() for p in self.procs]
      running = [w for w, c in enumerate(codes) if c is None]
      assessment = self.watch.poll(now, running)
      self._note_progress(now)
      self._inject()
      if cfg.terminate_requested and not cfg.forwarded:
        self._forward_preemption()
      if all(c == 0 for c in codes):
        return None
      bad = [c for c in codes if c not in (None, 0, wk.PREEMPTED_EXIT)]
      if bad:
        return self._exit_failure(codes, now)
      if wk.PREEMPTED_EXIT in codes:
        preempt_since = preempt_since or now
        if not running:
          reason = self._control_reason()
          named = re.search(r"SIGTERM on worker (\d+)", reason)
          return {"kind": "preempted",
                  "worker": int(named.group(1)) if named else None,
                  "detail": f"{reason}: all workers checkpointed and exited "
                            f"with {wk.PREEMPTED_EXIT}", "detected_at": now}
        if now - preempt_since > cfg.startup_timeout_s:
          return self._failure("stuck", running[0], now,
                               "did not follow the preemption")
      if assessment.kind == "lost":
        w = assessment.worker
        state = _proc_state(self.procs[w].pid)
        kind = "stopped" if state == "T" else "heartbeat lost"
        return self._failure(kind, w, now, "; ".join(assessment.report))
      if assessment.kind == "stuck":
        return self._failure(
            "stuck", assessment.worker, now,
            f"no step for {assessment.stalled_s:.1f}s: " +
            "; ".join(assessment.report))
      if assessment.kind == "starting" and \
          now - self.record["started"] > cfg.startup_timeout_s:
        return self._failure("startup timeout", None, now,
                             "; ".join(assessment.report))
      finishing_since = (finishing_since or now) \
          if assessment.kind == "finishing" else None
      if finishing_since and now - finishing_since > cfg.startup_timeout_s:
        return self._failure("shutdown hang", running[0], now,
                             "; ".join(assessment.report))
      time.sleep(cfg.poll_s)

  def _note_progress(self, now: float) -> None:
    beats = [b for b in self.watch.beats.values() if b]
    if not beats:
      return
    self.record["resumed_from"] = beats[0].get("resumed_from")
    top = max(b["step"] for b in beats)
    if top > (self.record["resumed_from"] or 0) and \
        self.record["first_step_s"] is None:
      self.record["first_step_s"] = now - self.record["started"]
    self.record["last_step"] = max(self.record["last_step"], top)
    medians = [b["median_step_s"] for b in beats if b.get("median_step_s")]
    if medians:
      self.record["median_step_s"] = max(medians)

  def _control_reason(self) -> str:
    try:
      with open(os.path.join(self.launcher.run_dir, wk.CONTROL),
                encoding="utf-8") as f:
        control = json.load(f)
    except (OSError, ValueError):
      return "preempted"
    if control.get("attempt") != self.index:
      return "preempted"
    return str(control.get("reason", "preempted"))

  def _forward_preemption(self) -> None:
    cfg = self.launcher
    cfg.forwarded = True
    text = json.dumps({"attempt": self.index,
                       "stop_at_step": self.watch.max_step() + 2,
                       "reason": "SIGTERM to the launcher"})
    atomic_write_text(os.path.join(cfg.run_dir, wk.CONTROL), text,
                      overwrite=True)

  def _exit_failure(self, codes, now) -> dict:
    failed = [w for w, c in enumerate(codes)
              if c is not None and c not in (0, wk.PREEMPTED_EXIT)]
    # Several at once: a signal death is the cause, an error exit the effect.
    w = min(failed, key=lambda i: (codes[i] >= 0, i))
    code = codes[w]
    log = _tail(self.logs[w])
    if code < 0:
      sig = signal.Signals(-code).name
      kind = "oom" if _OOM.search(log) and code == -signal.SIGKILL else \
          "killed"
      return self._failure(kind, w, now, f"exited by {sig}")
    if code == wk.TASK_LOST_EXIT:
      lost = [line for line in log.splitlines() if "server task" in line]
      return self._failure("task lost", w, now,
                           lost[-1].strip() if lost else f"exit code {code}")
    if _PORT.search(log):
      kind = "port in use"
    elif _OOM.search(log):
      kind = "oom"
    elif self.record["first_step_s"] is None and \
        self.record["last_step"] <= (self.record["resumed_from"] or 0):
      kind = "startup crash"
    else:
      kind = "crashed"
    return self._failure(kind, w, now, f"exit code {code}")

  def _failure(self, kind, worker, now, detail) -> dict:
    cut = (self._unreachable_host() if kind in NETWORK_EXPLAINS else None)
    if cut is not None:
      # A host nobody reaches: its workers killed by a signal is the
      # host lost; anything else (a collective stalled or failed, its
      # workers alive or exiting on the error) is a partition.
      host, ports = cut
      on_host = [w for w in range(self.launcher.workers)
                 if self.launcher.host_of(w) == host]
      # Killed: by a signal, or by the launcher's kill_host (a process
      # not reaped yet reads None).
      codes = [self.procs[w].poll() for w in on_host]
      lost = all(w in self.killed or (c is not None and c < 0)
                 for w, c in zip(on_host, codes))
      kind = "host lost" if lost else "partition"
      worker = on_host[0] if worker is None or worker not in on_host \
          else worker
      address = self.launcher.hosts.addresses[host]
      detail = (f"host {host} ({address}) did not answer on ports "
                f"{ports} from the fabric" +
                (", its workers killed" if lost else "") + f"; {detail}")
    beat = self.watch.beats.get(worker) if worker is not None else None
    return {"kind": kind, "worker": worker, "detail": detail,
            "detected_at": now, "last_beat": beat}

  def _probe_hosts(self, now: float) -> None:
    """Every heartbeat interval, asks each host from the fabric; records
    when one first did not answer in this attempt (a partition may heal
    before the stalled collective is detected)."""
    cfg = self.launcher
    if cfg.hosts is None or cfg.hosts.num_hosts < 2 or \
        now - self.probed_at < cfg.heartbeat_s:
      return
    self.probed_at = now
    for host in range(cfg.hosts.num_hosts):
      if host in self.unanswered:
        continue
      self.silent[host] = (self.silent.get(host, 0) + 1
                           if self._host_silent(host) else 0)
      if self.silent[host] >= SILENT_PROBES:
        self.unanswered[host] = now

  def _watch_links(self, now: float) -> None:
    """Every RTT_EVERY_S on 2 or more hosts whose links are up: each
    host's TCP round-trip time and the step time into the attempt's
    NetworkWatch, and every link probed right then when it asks (for at
    most WATCH_PROBE_S each way of sending; the loop waits for the probe,
    whose time is recorded). Hosts whose link is down for a fault are left
    out, and nothing is sampled with fewer than two hosts up (the step
    time's reference dropped: it would span the cut) or once the launcher
    was told to stop. A diagnosis never fails the job: errors are counted
    beside what the watch found (the last one kept), and after
    WATCH_FAILURES_TO_STOP in a row the watch stops for the attempt."""
    cfg, watch = self.launcher, self.network_watch
    if watch is None or now - self.rtt_at < network.RTT_EVERY_S or \
        cfg.terminate_requested:
      return
    self.rtt_at = now
    down = set(cfg.down_until)
    if cfg.hosts.num_hosts - len(down) < 2:
      self.step_end_at.clear()
      return
    try:
      rtts = [None if h in down else cfg.hosts.tcp_rtt_ms(h)
              for h in range(cfg.hosts.num_hosts)]
      if watch.sample(now, self.record["last_step"], rtts, self._step_s()):
        began = time.time()
        links = network.probe_links(
            cfg.hosts, min(cfg.link_probe_s, WATCH_PROBE_S), skip=down)
        # What the probe found holds at its end (a throttle may have
        # begun while it ran): that time, and the step the beats say now.
        ended = time.time()
        watch.probed(ended, self._step_now(), rtts, links,
                     took_s=ended - began)
      self.watch_failures = 0
    except Exception as err:  # pylint: disable=broad-except
      self.watch_failures += 1
      self.watch_errors = {"count": self.watch_errors["count"] + 1,
                           "last": repr(err)}
      if self.watch_failures >= WATCH_FAILURES_TO_STOP:
        self.network_watch = None
    self.record["network_watch"] = dict(watch.record(),
                                        errors=self.watch_errors)

  def _step_now(self) -> int:
    """The highest step the workers' beats of this attempt show now (read
    afresh), or the last one recorded."""
    steps = [self.record["last_step"]]
    for w in range(self.launcher.workers):
      beat = hb.read(self.watch.directory, w)
      if beat and beat.get("attempt") == self.index:
        steps.append(beat["step"])
    return max(steps)

  def _step_s(self) -> float | None:
    """Seconds per step, from the heartbeats' step end times less the
    pauses between them (checkpoints, validation: `paused_s` in the
    beats): per worker over the steps it ended since its reference, the
    slowest worker's; where no worker ended one since the last sample,
    the step in progress of a worker inside its step for longer than
    RTT_EVERY_S (its time so far: a stalled link is judged); None
    otherwise, and while any worker's beat shows a pause (checkpoint,
    validation, epoch_end, done: their traffic -- a save, the job's last
    exchanges -- raises the RTTs of a healthy network; the references are
    kept, the pause is subtracted later)."""
    rates, running = [], []
    pausing = any(beat and beat["phase"] not in hb.TRAINING_PHASES
                  for beat in self.watch.beats.values())
    for w, beat in self.watch.beats.items():
      ended = beat and beat.get("step_end_time")
      if not ended:
        self.step_end_at.pop(w, None)
        continue
      paused = beat.get("step_end_paused_s", 0.0)
      then = self.step_end_at.get(w)
      if then is None or beat["step"] > then[1]:
        self.step_end_at[w] = (ended, beat["step"], paused)
      if then and beat["step"] > then[1]:
        spent = (ended - then[0]) - (paused - then[2])
        if spent > 0:
          rates.append(spent / (beat["step"] - then[1]))
      elif then and beat["phase"] == "step":
        so_far = (beat["time"] - ended) - (beat.get("paused_s", paused) -
                                           paused)
        if so_far > network.RTT_EVERY_S:
          running.append(so_far)
    if pausing:
      return None
    if rates:
      return max(rates)
    return max(running) if running else None

  def _host_silent(self, host: int) -> bool:
    cfg, ports = self.launcher, self.record["ports"] or []
    mine = [ports[w] for w in range(cfg.workers) if cfg.host_of(w) == host]
    return not any(cfg.hosts.reachable(host, p, timeout_s=0.2) for p in mine)

  def _unreachable_host(self):
    """(host, its workers' ports) of the first host that did not answer
    from the fabric in this attempt (probed again now), or None (also
    without hosts)."""
    cfg = self.launcher
    if cfg.hosts is None or cfg.hosts.num_hosts < 2:
      return None
    for _ in range(SILENT_PROBES):  # asked again now, as many times
      self.probed_at = float("-inf")
      self._probe_hosts(time.time())
    if not self.unanswered:
      return None
    host = min(self.unanswered, key=self.unanswered.get)
    ports = self.record["ports"] or []
    return host, [ports[w] for w in range(cfg.workers)
                  if cfg.host_of(w) == host]

  def teardown(self) -> float:
    start = time.time()
    for p in self.procs:
      if p.poll() is None:
        for sig in (signal.SIGCONT, signal.SIGKILL):
          try:
            os.killpg(p.pid, sig)
          except (ProcessLookupError, PermissionError):
            pass  # the group exited between poll() and the signal
    for p in self.procs:
      p.wait()
    return time.time() - start


class Launcher:
  """See the module doc and `launch` for the arguments."""

  def __init__(self, command, workers, run_dir=None, max_restarts=3,
               backoff_s=1.0, backoff_max_s=30.0, heartbeat_s=0.5,
               heartbeat_timeout_s=5.0, stuck_factor=10.0, min_stuck_s=10.0,
               startup_timeout_s=300.0, collective_timeout_factor=20.0,
               min_collective_timeout_s=30.0, faults=(), ports=None,
               env=None, poll_s=0.05, phase_budget_s=None,
               allow_exposed=False, confine=True, hosts=None,
               partition_s=10.0, link_probe_s=0.25):
    if isinstance(workers, bool) or not isinstance(workers, int) or \
        workers < 1:
      raise invalid_argument("workers", "a positive integer", workers)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) \
        or max_restarts < 0:
      raise invalid_argument("max_restarts", "an integer >= 0",
                             max_restarts)
    if not command or isinstance(command, str):
      raise invalid_argument("command", "a non-empty list of arguments "
                             "(script.py and its flags)", command)
    command = [os.fspath(c) for c in command]
    if command[0].endswith(".py"):
      if not os.path.isfile(command[0]):
        raise invalid_argument("command", "a script that exists",
                               command[0], FileNotFoundError)
      command = [sys.executable, *command]
    for name, value in (("backoff_s", backoff_s),
                        ("heartbeat_s", heartbeat_s),
                        ("heartbeat_timeout_s", heartbeat_timeout_s),
                        ("min_stuck_s", min_stuck_s),
                        ("startup_timeout_s", startup_timeout_s),
                        ("partition_s", partition_s)):
      if isinstance(value, bool) or not isinstance(value, (int, float)) \
          or not value > 0:
        raise invalid_argument(name, "a positive number of seconds", value)
    if heartbeat_timeout_s <= 2 * heartbeat_s:
      raise invalid_argument("heartbeat_timeout_s", "more than twice "
                             f"heartbeat_s ({heartbeat_s})",
                             heartbeat_timeout_s)
    if link_probe_s is not None and (
        isinstance(link_probe_s, bool) or
        not isinstance(link_probe_s, (int, float)) or
        not 0 < link_probe_s <= 10):
      raise invalid_argument("link_probe_s", "seconds in (0, 10] or None "
                             "(no link probes)", link_probe_s)
    faults = [Fault.parse(f) if isinstance(f, str) else f for f in faults]
    for fault in faults:
      if not 0 <= fault.worker < workers:
        raise invalid_argument("faults", f"faults on workers 0..{workers - 1}",
                               fault)
      if fault.kind in wk.HOST_FAULTS and (hosts is None or
                                           hosts.num_hosts < 2):
        raise invalid_argument("faults", f"{fault.kind} only on 2 or more "
                               f"hosts (`hosts`: a LocalHosts)", fault)
    # On `hosts` (tfopt.scale.hosts.LocalHosts) worker w runs in host
    # w // (workers / hosts)'s network namespace, at that host's address.
    self.hosts = hosts
    if hosts is not None and not (hasattr(hosts, "host_fd") and
                                  hasattr(hosts, "num_hosts")):
      raise invalid_argument("hosts", "a tfopt.scale.hosts.LocalHosts or "
                             "None", hosts)
    if hosts is not None and workers % hosts.num_hosts:
      raise invalid_argument(
          "workers", f"a multiple of the hosts' count ({hosts.num_hosts}) "
          f"when `hosts` is given", workers)
    # The workers' TensorFlow servers listen on every interface of the
    # network namespace they run in: this process's private one, or their
    # host's. confine=False: the workers need this machine's network (a
    # dataset read from another host); they then listen on every interface.
    self.confine = bool(confine) or hosts is not None
    self.namespace = (netns.confine("The launcher's workers", allow_exposed)
                      if confine and hosts is None else None)
    if ports is not None and hosts is not None:
      raise invalid_argument("ports", "None when `hosts` is given (each "
                             "worker's port is picked inside its host)",
                             ports)
    if ports is not None:
      ports = [int(p) for p in ports]
      if len(ports) != workers or len(set(ports)) != workers:
        raise invalid_argument("ports", f"{workers} distinct ports", ports)
      self._inside(_check_ports_free, ports)
    if run_dir is None:
      run_dir = tempfile.mkdtemp(prefix="tfopt-launch-")
    run_dir = os.path.abspath(os.fspath(run_dir))
    try:
      os.makedirs(run_dir, exist_ok=True)
    except OSError as err:
      raise invalid_argument("run_dir", f"a directory that can be created "
                             f"({err.strerror})", run_dir) from None
    if not os.access(run_dir, os.W_OK):
      raise invalid_argument("run_dir", "a writable directory", run_dir,
                             PermissionError)
    self.command = command
    self.workers = workers
    self.run_dir = run_dir
    self.max_restarts = max_restarts
    self.backoff_s = float(backoff_s)
    self.backoff_max_s = float(backoff_max_s)
    self.heartbeat_s = float(heartbeat_s)
    self.heartbeat_timeout_s = float(heartbeat_timeout_s)
    self.stuck_factor = float(stuck_factor)
    self.min_stuck_s = float(min_stuck_s)
    self.startup_timeout_s = float(startup_timeout_s)
    self.collective_timeout_factor = float(collective_timeout_factor)
    self.min_collective_timeout_s = float(min_collective_timeout_s)
    self.collective_timeout_s = None
    self.faults = faults
    self.injected: set = set()
    self.partition_s = float(partition_s)
    self.link_probe_s = link_probe_s
    self.down_until: dict[int, float] = {}  # host -> when its link is back
    # Checked here (bad input before anything starts), used by each watch.
    self.phase_budget_s = hb.phase_budgets(phase_budget_s)
    self.ports = ports
    self.env = {str(k): str(v) for k, v in (env or {}).items()}
    self.poll_s = float(poll_s)
    self.terminate_requested = False
    self.forwarded = False
    self.attempts: list = []
    self._first_attempt = self._previous_attempts()

  def _inside(self, fn, *args):
    """fn(*args) in the workers' network namespace."""
    return self.namespace.run_inside(fn, *args) if self.namespace \
        else fn(*args)

  def restore_links(self, now: float, wait: bool = False) -> None:
    """Brings back the links of hosts whose fault is over (with `wait`,
    first waits for every one: a new attempt starts with all hosts)."""
    for host, until in sorted(self.down_until.items()):
      while wait and until > now and not self.terminate_requested:
        time.sleep(min(0.1, until - now))
        now = time.time()
      if until <= now:
        self.hosts.set_link(host, True)
        del self.down_until[host]

  def host_of(self, worker: int) -> int | None:
    """The host worker `worker` runs on (None without `hosts`)."""
    if self.hosts is None:
      return None
    return worker // (self.workers // self.hosts.num_hosts)

  def address_of(self, worker: int) -> str:
    """Where the other workers reach worker `worker`."""
    host = self.host_of(worker)
    return "127.0.0.1" if host is None else self.hosts.addresses[host]

  def namespace_fd(self, worker: int) -> int | None:
    """The network namespace worker `worker` runs in, as an fd of this
    process (None: this process's)."""
    if self.hosts is not None:
      return self.hosts.host_fd(self.host_of(worker))
    return self.namespace.fd if self.namespace else None

  def _free_ports(self) -> list[int]:
    """A free port per worker, inside the namespace it will run in."""
    if self.hosts is None:
      return self._inside(free_ports, self.workers)
    per_host = self.workers // self.hosts.num_hosts
    return [port for h in range(self.hosts.num_hosts)
            for port in self.hosts.free_ports(h, per_host)]

  def worker_command(self, worker: int = 0) -> list[str]:
    """The command worker `worker` runs: `command` inside its network
    namespace."""
    fd = self.namespace_fd(worker)
    if fd is None:
      return list(self.command)
    return [sys.executable, "-m", "tfopt.runtime.netns",
            f"--enter_fd={fd}", f"--parent={os.getpid()}",
            "--", *self.command]

  def _previous_attempts(self) -> int:
    """A relaunch into the same run directory continues its numbering."""
    path = os.path.join(self.run_dir, RECORD)
    try:
      with open(path, encoding="utf-8") as f:
        return len(json.load(f)["attempts"])
    except (OSError, ValueError, KeyError):
      return 0

  def _save(self, ok: bool) -> None:
    record = {"format": "tfopt.scale.launch/1", "command": self.command,
              "workers": self.workers, "ok": ok, "attempts": self.attempts}
    path = os.path.join(self.run_dir, RECORD)
    previous = []
    if self._first_attempt:
      try:
        with open(path, encoding="utf-8") as f:
          previous = json.load(f)["attempts"][:self._first_attempt]
      except (OSError, ValueError, KeyError):
        previous = []
    record["attempts"] = previous + self.attempts
    atomic_write_text(path, json.dumps(record, indent=1), overwrite=True)

  def run(self) -> LaunchResult:
    previous = signal.getsignal(signal.SIGTERM)
    in_main = _in_main_thread()
    if in_main:
      signal.signal(signal.SIGTERM, self._on_sigterm)
    try:
      return self._run()
    finally:
      if in_main:
        signal.signal(signal.SIGTERM, previous)
      for host in list(self.down_until):  # the hosts are the caller's
        # No wait here: a host slow to answer must neither hide the
        # exception on its way out nor leave the other links down.
        self.hosts.set_link(host, True, wait=False)
      self.down_until.clear()

  def _probe_links(self, rec: dict) -> None:
    """On 2 or more hosts, after the attempt (its workers gone, nothing
    else on the links): each host's link rate, and the hosts far slower
    than the others, named network stragglers (`tfopt.scale.network`)."""
    if self.hosts is None or self.hosts.num_hosts < 2 or \
        self.link_probe_s is None or self.terminate_requested:
      return
    try:
      links = network.probe_links(self.hosts, self.link_probe_s,
                                  skip=set(self.down_until))
      slow = network.network_stragglers(
          [network.slowest_rate(link) for link in links])
    except Exception as err:  # pylint: disable=broad-except
      rec["links_error"] = repr(err)  # a diagnosis never fails the job
      return
    rec["links"] = links
    rec["network_stragglers"] = [links[h]["address"] for h in slow]

  def _on_sigterm(self, signum, frame):  # pylint: disable=unused-argument
    self.terminate_requested = True

  def _run(self) -> LaunchResult:
    restarts = 0
    stalled = 0  # consecutive attempts without progress (for the backoff)
    index = self._first_attempt
    while True:
      self.restore_links(time.time(), wait=True)
      attempt = _Attempt(self, index)
      ports = self.ports if (self.ports and not self.attempts) else \
          self._free_ports()
      if self.namespace is None and self.hosts is None and not self.attempts:
        netns.warn_exposed("The launcher's workers", ports,
                           None if self.confine else "confine=False")
      attempt.start(ports)
      self.attempts.append(attempt.record)
      try:
        failure = attempt.run()
      finally:
        teardown = attempt.teardown()
      rec = attempt.record
      rec["ended"] = time.time()
      rec["teardown_s"] = teardown if failure else 0.0
      self._probe_links(rec)
      rec["failure"] = failure
      rec["outcome"] = ("success" if failure is None else
                        "preempted" if failure["kind"] == "preempted" else
                        "failure")
      if failure:
        failure["log_tail"] = (_tail(attempt.logs[failure["worker"]], 1500)
                               if failure["worker"] is not None else "")
      if rec["median_step_s"]:
        self.collective_timeout_s = max(
            self.min_collective_timeout_s,
            self.collective_timeout_factor * rec["median_step_s"])
      self._save(ok=failure is None)
      result = LaunchResult(failure is None, self.run_dir,
                            list(self.attempts))
      if failure is None:
        return result
      if self.terminate_requested:
        result.preempted = True
        return result
      if failure["kind"] == "startup crash":
        raise LaunchError(
            f"Worker {failure['worker']} failed before its first step "
            f"({failure['detail']}); not restarting, it would fail again. "
            f"Log {attempt.logs[failure['worker']]} ends with:\n"
            f"{failure['log_tail']}", result)
      if restarts >= self.max_restarts:
        raise LaunchError(
            f"Restart budget spent (max_restarts={self.max_restarts}); the "
            f"last failure: {failure['kind']} on worker {failure['worker']} "
            f"({failure['detail']}). Attempts are recorded in "
            f"{os.path.join(self.run_dir, RECORD)}.", result)
      progressed = rec["last_step"] > (rec["resumed_from"] or 0)
      stalled = 0 if progressed else stalled + 1
      time.sleep(min(self.backoff_max_s, self.backoff_s * 2 ** stalled))
      restarts += 1
      index += 1


# The launcher's keyword defaults, for the command lines built on it.
DEFAULTS = {name: p.default for name, p in inspect.signature(
    Launcher.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}
# The knobs both command lines (this module's and experiments/launch.py)
# expose as flags of the same names.
CLI_KNOBS = ("max_restarts", "backoff_s", "heartbeat_timeout_s",
             "stuck_factor", "min_stuck_s", "startup_timeout_s")


def _in_main_thread() -> bool:
  import threading  # pylint: disable=import-outside-toplevel
  return threading.current_thread() is threading.main_thread()


def launch(command, workers: int, **kwargs) -> LaunchResult:
  """Runs `command` (["script.py", flags...] or any argv) on `workers`
  loopback workers with restarts; raises LaunchError when it cannot finish.

  Keyword arguments (defaults): run_dir (a new temporary directory),
  max_restarts (3), backoff_s (1.0, doubled per attempt without progress,
  capped at backoff_max_s 30), heartbeat_s (0.5), heartbeat_timeout_s
  (5.0), stuck_factor (10 median step times) and min_stuck_s (10),
  phase_budget_s ({phase: seconds} for work the heartbeats name, where
  the step-time rule does not apply: first_step 600 (a process's first
  step traces and compiles), validation 600, checkpoint 300, restore 300,
  epoch_end 300), startup_timeout_s (300), collective_timeout_factor (20 median step times,
  at least min_collective_timeout_s 30) for later attempts, faults
  (Fault or 'kind:worker:step[:attempt]' strings), ports (fixed ports for
  the first attempt), env (extra environment variables), allow_exposed
  (False: the workers run in this process's private network namespace,
  and where none can be made, PermissionError; True: there, they run on
  every interface with a warning), confine (True; False runs the workers
  in this machine's network, with a warning: for scripts that must reach
  other hosts), hosts (a `tfopt.scale.hosts.LocalHosts`: worker w runs on
  host w // (workers / hosts), in its namespace, at its address; the host
  faults partition and kill_host apply there, named "partition" and "host
  lost" when detected: a host that does not answer from the fabric, its
  workers alive or exiting on the error, or all killed), partition_s (10:
  how long a host fault keeps the host's link down; the next attempt
  starts once every link is back), link_probe_s (0.25: on 2 or more hosts,
  after each attempt, each host's link is measured this long each way and
  a host far slower than the others is named a network straggler,
  `tfopt.scale.network`; during the attempt the hosts' TCP round-trip
  times and the step time are watched, and the links probed (at most
  0.25 s each way) once when training starts, when they rise and when
  they fall again: a slow host is named with the steps it was slow in,
  `NetworkWatch`; None: no probes)."""
  return Launcher(command, workers, **kwargs).run()


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if "--" in argv:
    cut = argv.index("--")
    own, command = argv[:cut], argv[cut + 1:]
  else:
    own, command = argv, []
  parser = argparse.ArgumentParser(
      prog="python -m tfopt.scale.launch",
      description="Run a training script on N loopback workers with "
                  "heartbeats and restarts: ... -- script.py [args]")
  parser.add_argument("--workers", type=int, required=True)
  parser.add_argument("--run_dir", default=None)
  for name in CLI_KNOBS:
    parser.add_argument(f"--{name}", type=type(DEFAULTS[name]),
                        default=DEFAULTS[name])
  parser.add_argument("--ports", default=None,
                      help="comma-separated ports for the first attempt")
  parser.add_argument("--allow_exposed_servers", action="store_true",
                      help="run the workers on every interface where they "
                           "cannot be confined (not root), with a warning")
  parser.add_argument("--inject", action="append", default=[],
                      help="kind:worker:step[:attempt], kind in kill, stop, "
                           "term; on --hosts also partition, kill_host "
                           "(testing the restart path)")
  parser.add_argument("--hosts", type=int, default=0,
                      help="run the workers on this many hosts made on this "
                           "machine (network namespaces, root; 0: loopback)")
  parser.add_argument("--link_rate", default="1gbit",
                      help="with --hosts: each host's link rate, or a "
                           "comma-separated rate per host")
  args = parser.parse_args(own)
  if not command:
    parser.error("give the training command after --, e.g. "
                 "-- train.py --epochs=3")
  return run_and_report(
      command, args.workers, run_dir=args.run_dir, faults=args.inject,
      ports=(args.ports.split(",") if args.ports else None),
      allow_exposed=args.allow_exposed_servers, num_hosts=args.hosts,
      link_rate=args.link_rate,
      **{name: getattr(args, name) for name in CLI_KNOBS})


def run_and_report(command, workers: int, num_hosts: int = 0,
                   link_rate="1gbit", **kwargs) -> int:
  """`launch` for a command line: prints `summary` (or the error on
  stderr) and returns the exit status: 0 done, 1 the launcher gave up, 2
  bad input, `PREEMPTED_EXIT` (75) preempted. `num_hosts` > 0: the workers
  run on that many `LocalHosts` (network namespaces on this machine, links
  shaped at `link_rate`: one rate, or a comma-separated rate per host),
  made for the run and removed after it."""
  try:
    if not num_hosts:
      result = launch(command, workers, **kwargs)
    else:
      from tfopt.scale.hosts import LocalHosts  # pylint: disable=import-outside-toplevel
      rates = (link_rate.split(",") if isinstance(link_rate, str) and
               "," in link_rate else link_rate)
      with LocalHosts(num_hosts, 0, link_rate=rates) as hosts:
        result = launch(command, workers, hosts=hosts, **kwargs)
  except (ValueError, FileNotFoundError, PermissionError) as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  except LaunchError as err:
    print(f"error: {err}", file=sys.stderr)
    return 1
  print(summary(result))
  return wk.PREEMPTED_EXIT if result.preempted else 0


def goodput_line(good: dict) -> str:
  """The goodput as a percentage of the wall time, and where the wall time
  went, in parts that add up to it ("other": checkpoints, evaluation, host
  work and steps slower than the median).

  >>> print(goodput_line({"goodput": 0.5, "wall_s": 10.0, "productive_s":
  ...   5.0, "startup_s": 3.0, "restart_s": 1.0, "recomputed_steps": 4,
  ...   "recomputed_s": 0.4}))
  goodput 50 % of 10.0 s wall: training 5.0 s + startup 3.0 s + restart 1.0 s + recomputed 0.4 s (4 steps) + other 0.6 s
  """
  other = good["wall_s"] - (good["productive_s"] + good["startup_s"] +
                            good["restart_s"] + good["recomputed_s"])
  return (f"goodput {100 * good['goodput']:.0f} % of {good['wall_s']:.1f} s "
          f"wall: training {good['productive_s']:.1f} s + startup "
          f"{good['startup_s']:.1f} s + restart {good['restart_s']:.1f} s + "
          f"recomputed {good['recomputed_s']:.1f} s "
          f"({good['recomputed_steps']} steps) + other {other:.1f} s")


def summary(result: LaunchResult) -> str:
  """Every attempt (failure kind and worker, steps; for those before the
  last, the hosts its link watch found slow), the stitched trajectory, the goodput, per host of the last attempt its workers' MFU,
  stragglers and link (`tfopt.scale.host_report`), the job's MFU, each
  worker's `final-worker-<i>.json` when the job writes one
  (experiments/scale_train.py does: final loss, weights SHA-256, MFU), and
  the run directory."""
  lines = []
  for rec in result.attempts:
    failure = rec["failure"]
    what = (f"{failure['kind']} (worker {failure['worker']}"
            f"{_on_host(rec, failure['worker'])})" if failure
            else "success")
    lines.append(f"attempt {rec['attempt']}: {what}, steps "
                 f"{rec['resumed_from'] or 0}..{rec['last_step']}")
    for fault in rec.get("faults", ()):
      lines.append(f"  injected {fault['kind']} into worker "
                   f"{fault['worker']} after step {fault['at_step']} "
                   f"(asked: {fault.get('asked_step', fault['at_step'])}; "
                   f"raised by the {fault.get('by', 'launcher')})")
    if rec is not result.attempts[-1]:  # the last one's go on its hosts
      lines.extend(f"  {line}" for line in host_report.slow_lines(rec))
  if result.attempts:
    trajectory = result.trajectory()
    lines.append(f"trajectory: {trajectory['steps']} steps, lost "
                 f"{trajectory['lost']}, repeated {trajectory['repeated']}, "
                 f"recomputed {trajectory['recomputed']}")
    good = result.goodput()
    if good["goodput"] is not None:
      lines.append(goodput_line(good))
  last = result.attempts[-1] if result.attempts else {}
  finals = host_report.read_finals(result.run_dir)
  lines.extend(host_report.host_lines(last, finals))
  for w, final in finals.items():
    lines.append(f"worker {w}{_on_host(last, w)}: step "
                 f"{final.get('global_step')}, final loss "
                 f"{final.get('final_loss', float('nan')):.6f}, weights "
                 f"sha256 {str(final.get('weights_sha256', ''))[:16]}")
  lines.append(f"run directory: {result.run_dir}")
  return "\n".join(lines)


def _on_host(record: dict, worker) -> str:
  """" on host ADDRESS" for a worker of an attempt on several hosts."""
  addresses = record.get("addresses") or []
  if len(set(addresses)) < 2 or not isinstance(worker, int) or not (
      0 <= worker < len(addresses)):
    return ""
  return f" on host {addresses[worker]}"


if __name__ == "__main__":
  sys.exit(main())
