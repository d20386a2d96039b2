"""What the launcher and its workers agree on: environment variable names,
the control file, the preemption exit code and injected faults. No
TensorFlow here: the launcher imports only this."""

import json
import os
import signal
import time

PREEMPTED_EXIT = 75  # EX_TEMPFAIL, "try again": the launcher restarts
# A worker whose TensorFlow server tasks (a placed step's devices) lost
# one exits with this: its state there is gone; the launcher restarts it
# from the last checkpoint (`tfopt.scale.worker.fit(servers=...)`).
TASK_LOST_EXIT = 76
CONTROL = "control.json"  # {"attempt", "stop_at_step", "reason"}

ENV_RUN_DIR = "TFOPT_RUN_DIR"
ENV_WORKER = "TFOPT_WORKER"
ENV_WORKERS = "TFOPT_NUM_WORKERS"
ENV_ATTEMPT = "TFOPT_ATTEMPT"
ENV_TIMEOUT = "TFOPT_COLLECTIVE_TIMEOUT_S"
ENV_HEARTBEAT = "TFOPT_HEARTBEAT_S"
# "kind:step[,kind:step...]": faults this worker raises itself, each right
# after that step (the launcher's --inject, delivered at the exact step).
ENV_FAULT = "TFOPT_FAULT"

# Signals a worker raises on itself; "kill_task" kills the last of the
# worker's server tasks instead (a worker started with servers). The host
# faults are the launcher's to deliver on LocalHosts (`launch(hosts=)`):
# "partition" takes the worker's host's link down, "kill_host" kills every
# worker of its host and takes its link down; the worker only says it
# reached the step and waits for the launcher's acknowledgement.
FAULTS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP,
          "term": signal.SIGTERM, "kill_task": None, "partition": None,
          "kill_host": None}
HOST_FAULTS = ("partition", "kill_host")
# How long a worker waits at its step for the launcher to deliver a host
# fault.
HOST_FAULT_WAIT_S = 60.0


def fault_report_path(run_dir: str, attempt: int, worker: int,
                      step: int) -> str:
  """Where a worker records a fault it raised on itself."""
  return os.path.join(run_dir, "faults",
                      f"attempt-{attempt}-worker-{worker}-step-{step}.json")


def raise_fault_if_asked(step: int, environ=None, kill_task=None) -> None:
  """Called by a worker after each step: if the launcher asked for a fault
  at `step` (ENV_FAULT), records where it landed and signals this process
  (kill and stop take effect at once; term starts a preemption), or for
  "kill_task" calls `kill_task()`, which kills one of the worker's server
  tasks and returns which (a worker without servers ignores it)."""
  env = os.environ if environ is None else environ
  text = env.get(ENV_FAULT)
  if not text:
    return
  for item in text.split(","):
    kind, at = item.split(":")
    if int(at) != step:
      continue
    if kind == "kill_task" and kill_task is None:
      continue
    run_dir = env[ENV_RUN_DIR]
    path = fault_report_path(run_dir, int(env[ENV_ATTEMPT]),
                             int(env[ENV_WORKER]), step)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    report = {"kind": kind, "worker": int(env[ENV_WORKER]),
              "at_step": step, "time": time.time(), "by": "worker"}
    if kind == "kill_task":
      report["target"] = kill_task()
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      json.dump(report, f)
    os.replace(path + ".tmp", path)  # the launcher reads it whole or not
    if FAULTS[kind] is not None:
      os.kill(os.getpid(), FAULTS[kind])
    elif kind in HOST_FAULTS:
      _wait_for(path + ".ack", HOST_FAULT_WAIT_S)


def _wait_for(path: str, timeout_s: float) -> None:
  """Until `path` exists (the launcher delivered the fault; a killed
  worker never returns) or `timeout_s` passed."""
  deadline = time.monotonic() + timeout_s
  while not os.path.exists(path) and time.monotonic() < deadline:
    time.sleep(0.05)
