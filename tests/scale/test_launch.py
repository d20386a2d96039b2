"""The launcher on TensorFlow-free workers (tests/scale/fake_worker.py):
failure detection and classification, restarts and their budget, bad
input, the trajectory stitched from step logs (hand-computed)."""

import json
import os
import socket
import types

import pytest

from tfopt.runtime import netns
from tfopt.scale.launch import (Fault, LaunchError, LaunchResult, free_ports,
                                launch, main, summary)

# Detection within 0.5 s, heartbeat timeouts of 1 s: the serial pass, where
# no other test competes for the cores.
pytestmark = pytest.mark.serial

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                    "fake_worker.py")
FAST = dict(backoff_s=0.05, heartbeat_s=0.1, heartbeat_timeout_s=1.0,
            min_stuck_s=1.0, stuck_factor=5.0, poll_s=0.02)


def _failures(result):
  return [(a["failure"]["kind"], a["failure"]["worker"])
          for a in result.attempts if a["failure"]]


def test_goodput_accounts_for_startup_and_restarts(tmp_path):
  attempts = [
      {"attempt": 0, "started": 100.0, "ended": 130.0, "first_step_s": 10.0,
       "resumed_from": 0, "last_step": 40, "median_step_s": 0.5,
       "failure": {"kind": "killed", "detected_at": 129.0}},
      {"attempt": 1, "started": 132.0, "ended": 162.0, "first_step_s": 8.0,
       "resumed_from": 35, "last_step": 80, "median_step_s": 0.5,
       "failure": None}]
  steps = tmp_path / "steps"
  steps.mkdir()
  (steps / "worker-0.jsonl").write_text("".join(
      json.dumps({"attempt": a, "step": s, "loss": 0.0}) + "\n"
      for a, lo, hi in ((0, 1, 40), (1, 36, 80)) for s in range(lo, hi + 1)))
  g = LaunchResult(True, str(tmp_path), attempts).goodput()
  # 80 steps x 0.5 s productive in 62 s; 18 s startup, 3 s restart, 5 redone
  assert g["productive_s"] == 40.0 and g["wall_s"] == 62.0
  assert g["goodput"] == pytest.approx(40 / 62)
  assert (g["startup_s"], g["restart_s"], g["recomputed_steps"]) == (
      18.0, 3.0, 5)


def test_summary_of_a_restarted_run(tmp_path):
  # Consistent times: attempt 0 starts its steps at 110 and runs 40 of
  # 0.5 s to 130 (killed after step 40, injected there by the worker
  # itself); attempt 1 starts at 132, steps from 140 to 162.5. Wall 62.5 s
  # = 40 s of kept steps + 18 s startup + 2 s restart + 2.5 s for the 5
  # recomputed steps + 0.0 s other.
  attempts = [
      {"attempt": 0, "started": 100.0, "ended": 130.0, "first_step_s": 10.0,
       "resumed_from": None, "last_step": 40, "median_step_s": 0.5,
       "failure": {"kind": "killed", "worker": 1, "detected_at": 130.0},
       "faults": [{"kind": "kill", "worker": 1, "at_step": 40,
                   "asked_step": 40, "by": "worker", "time": 130.0}],
       "network_watch": {"probes": [], "slow": [
           {"address": "10.0.0.2", "from_s": 12.0, "from_step": 12,
            "to_s": None, "to_step": None, "down_bits": 9e6,
            "up_bits": 8e6, "rtt_ms": 20.0}]}},
      {"attempt": 1, "started": 132.0, "ended": 162.5, "first_step_s": 8.0,
       "resumed_from": 35, "last_step": 80, "median_step_s": 0.5,
       "failure": None}]
  (tmp_path / "steps").mkdir()
  (tmp_path / "steps" / "worker-0.jsonl").write_text("".join(
      json.dumps({"attempt": a, "step": s, "loss": 0.0}) + "\n"
      for a, lo, hi in ((0, 1, 40), (1, 36, 80)) for s in range(lo, hi + 1)))
  for w in (1, 0):
    (tmp_path / f"final-worker-{w}.json").write_text(json.dumps(
        {"worker": w, "global_step": 80, "final_loss": 0.25,
         "weights_sha256": "ab" * 32}))
  text = summary(LaunchResult(True, str(tmp_path), attempts)).splitlines()
  assert text == [
      "attempt 0: killed (worker 1), steps 0..40",
      "  injected kill into worker 1 after step 40 (asked: 40; raised by "
      "the worker)",
      "  host 10.0.0.2: NETWORK STRAGGLER from step 12 not measured back "
      "before the attempt ended (its link 9.0 Mbit/s in, 8.0 Mbit/s out "
      "then)",
      "attempt 1: success, steps 35..80",
      "trajectory: 80 steps, lost [], repeated [], recomputed 5",
      "goodput 64 % of 62.5 s wall: training 40.0 s + startup 18.0 s + "
      "restart 2.0 s + recomputed 2.5 s (5 steps) + other 0.0 s",
      "worker 0: step 80, final loss 0.250000, weights sha256 "
      "abababababababab",
      "worker 1: step 80, final loss 0.250000, weights sha256 "
      "abababababababab",
      f"run directory: {tmp_path}"]


def test_clean_run_and_record(tmp_path):
  result = launch([FAKE, "ok", "10"], workers=2, run_dir=tmp_path, **FAST)
  assert result.ok and len(result.attempts) == 1
  g = result.goodput()  # the fake worker logs no steps: nothing productive
  assert g["goodput"] == 0 and 0 < g["startup_s"] < g["wall_s"]
  record = json.loads((tmp_path / "launch.json").read_text())
  assert record["ok"] and record["attempts"][0]["last_step"] == 10
  assert len(set(record["attempts"][0]["ports"])) == 2


@pytest.mark.parametrize("kind,expected", [("kill", "killed"),
                                           ("stop", "stopped")])
def test_signal_faults_are_detected_named_and_restarted(tmp_path, kind,
                                                        expected):
  result = launch([FAKE, "ok", "40"], workers=2, run_dir=tmp_path,
                  faults=[f"{kind}:1:5"], **FAST)
  assert result.ok
  assert _failures(result) == [(expected, 1)]
  fault = result.attempts[0]["faults"][0]
  # Raised by the worker itself right after the step asked for (the
  # launcher's own signal, from the heartbeats, landed steps later).
  assert fault["worker"] == 1 and fault["at_step"] == 5
  assert fault["by"] == "worker" and fault["asked_step"] == 5
  detected = result.attempts[0]["failure"]["detected_at"] - fault["time"]
  # A kill is seen at the next poll; a stop when the beat is stale.
  assert detected < (0.5 if kind == "kill" else 2.5)
  assert result.attempts[1]["outcome"] == "success"


def test_alive_but_stuck_worker_is_named(tmp_path):
  result = launch([FAKE, "stall", "20"], workers=2, run_dir=tmp_path,
                  **FAST)
  assert result.ok
  (kind, worker), = _failures(result)
  assert kind == "stuck"
  # Both fake workers stall at step 5 in the host phase; the report lists
  # both with their phases.
  assert worker in (0, 1)
  assert "phase host" in result.attempts[0]["failure"]["detail"]


def test_slow_validation_and_checkpoint_are_not_taken_for_a_hang(tmp_path):
  # After step 10 both workers validate for 3 s, then checkpoint for 3 s:
  # each phase 3x the 1 s stuck threshold without a step. The heartbeats
  # name the phases, judged by their own budgets: never restarted.
  result = launch([FAKE, "slow_epoch_end", "20"], workers=2,
                  run_dir=tmp_path, **FAST)
  assert result.ok and len(result.attempts) == 1, _failures(result)
  # The same job under the step-time rule alone (budgets shorter than the
  # work) is restarted: the budgets are what saved it.
  tight = launch([FAKE, "slow_epoch_end", "20"], workers=2,
                 run_dir=tmp_path / "tight",
                 phase_budget_s={"validation": 1.0, "checkpoint": 1.0},
                 **FAST)
  assert tight.ok and _failures(tight)[0][0] == "stuck"
  assert "phase validation" in tight.attempts[0]["failure"]["detail"]


def test_a_slow_first_step_is_not_taken_for_a_hang(tmp_path):
  # The first step (tracing, compiling, tfopt.compile's capture) takes 3x
  # the 1 s stuck threshold: judged by the first step's budget, not
  # restarted; under a budget shorter than it, it is stuck.
  result = launch([FAKE, "slow_first_step", "10"], workers=2,
                  run_dir=tmp_path, **FAST)
  assert result.ok and len(result.attempts) == 1, _failures(result)
  with pytest.raises(LaunchError, match="stuck") as err:
    launch([FAKE, "slow_first_step", "10"], workers=2,
           run_dir=tmp_path / "tight", max_restarts=1,
           phase_budget_s={"first_step": 1.0}, **FAST)
  tight = err.value.result
  assert [kind for kind, _ in _failures(tight)] == ["stuck", "stuck"]
  assert "phase first_step" in tight.attempts[0]["failure"]["detail"]


def test_a_validation_past_its_budget_is_stuck(tmp_path):
  result = launch([FAKE, "hung_validation", "20"], workers=2,
                  run_dir=tmp_path, phase_budget_s={"validation": 2.0},
                  **FAST)
  assert result.ok
  (kind, _), = _failures(result)
  assert kind == "stuck"
  assert "phase validation" in result.attempts[0]["failure"]["detail"]
  with pytest.raises(ValueError, match="phase_budget_s\\['validation'\\]"):
    launch([FAKE, "ok"], workers=1, phase_budget_s={"validation": 0})


def test_import_error_is_not_restarted(tmp_path):
  with pytest.raises(LaunchError, match="(?s)before its first step.*not "
                     "restarting.*not_a_module") as err:
    launch([FAKE, "import_error"], workers=2, run_dir=tmp_path, **FAST)
  assert len(err.value.result.attempts) == 1


def test_restart_budget_and_classification(tmp_path):
  with pytest.raises(LaunchError, match=r"Restart budget spent "
                     r"\(max_restarts=2\).*crashed") as err:
    launch([FAKE, "exit3"], workers=2, run_dir=tmp_path, max_restarts=2,
           **FAST)
  assert len(err.value.result.attempts) == 3
  result = None
  with pytest.raises(LaunchError) as err:
    launch([FAKE, "port"], workers=2, run_dir=tmp_path / "p",
           max_restarts=1, **FAST)
  result = err.value.result
  assert [f[0] for f in _failures(result)] == ["port in use"] * 2
  # every attempt got fresh ports
  assert result.attempts[0]["ports"] != result.attempts[1]["ports"]
  with pytest.raises(LaunchError, match="oom on worker") as err:
    launch([FAKE, "oom"], workers=1, run_dir=tmp_path / "o",
           max_restarts=0, **FAST)


def test_a_lost_server_task_is_named_and_restarted(tmp_path):
  result = launch([FAKE, "task_lost", "12"], workers=1, run_dir=tmp_path,
                  **FAST)
  assert result.ok
  assert _failures(result) == [("task lost", 0)]
  failure = result.attempts[0]["failure"]
  assert "server task worker:2 killed by signal 9" in failure["detail"]
  assert result.attempts[1]["last_step"] == 12


def test_sigterm_is_a_preemption_that_restarts(tmp_path):
  result = launch([FAKE, "ok", "40"], workers=2, run_dir=tmp_path,
                  faults=["term:0:5"], **FAST)
  assert result.ok
  assert _failures(result) == [("preempted", None)]


def test_bad_input(tmp_path):
  with pytest.raises(ValueError, match="Argument `workers` must be a "
                     "positive integer. Received: workers=0"):
    launch([FAKE, "ok"], workers=0)
  with pytest.raises(FileNotFoundError, match="Argument `command`"):
    launch([str(tmp_path / "missing.py")], workers=1)
  with pytest.raises(ValueError, match="Argument `inject`"):
    Fault.parse("explode:1:2")
  with pytest.raises(ValueError, match="Argument `faults`"):
    launch([FAKE, "ok"], workers=2, faults=["kill:5:1"])
  # On LocalHosts: as many workers on each host; ports picked inside them.
  two_hosts = types.SimpleNamespace(num_hosts=2, host_fd=lambda host: -1)
  with pytest.raises(ValueError, match=r"Argument `workers` must be a "
                     r"multiple of the hosts' count \(2\)"):
    launch([FAKE, "ok"], workers=3, hosts=two_hosts)
  with pytest.raises(ValueError, match="Argument `ports` must be None when "
                     "`hosts`"):
    launch([FAKE, "ok"], workers=2, hosts=two_hosts, ports=[1, 2])
  with pytest.raises(ValueError, match="Argument `hosts` must be a "
                     "tfopt.scale.hosts.LocalHosts or None"):
    launch([FAKE, "ok"], workers=2, hosts=3)
  with pytest.raises(ValueError, match=r"Argument `link_probe_s` must be "
                     r"seconds in \(0, 10\] or None"):
    launch([FAKE, "ok"], workers=2, hosts=two_hosts, link_probe_s=0)
  one_host = types.SimpleNamespace(num_hosts=1, host_fd=lambda host: -1)
  for hosts, fault in ((None, "partition:1:5"), (one_host, "kill_host:1:5")):
    with pytest.raises(ValueError, match="only on 2 or more hosts"):
      launch([FAKE, "ok"], workers=2, hosts=hosts, faults=[fault])
  # The workers listen inside the job's network namespace: a port is in
  # use where something there holds it.
  def bound():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s
  with netns.job_namespace().run_inside(bound) as busy:
    port = busy.getsockname()[1]
    with pytest.raises(ValueError, match=f"port {port} is in use"):
      launch([FAKE, "ok"], workers=2, ports=[port, free_ports(1)[0]])
  locked = tmp_path / "locked"
  locked.mkdir()
  locked.chmod(0o500)
  try:
    if not os.access(locked, os.W_OK):  # root may write anyway
      with pytest.raises(PermissionError, match="Argument `run_dir`"):
        launch([FAKE, "ok"], workers=1, run_dir=locked)
  finally:
    locked.chmod(0o700)
  assert main(["--workers=0", "--", FAKE, "ok"]) == 2


def test_trajectory_is_stitched_from_resume_points(tmp_path):
  steps = tmp_path / "steps"
  steps.mkdir()
  lines = ([{"attempt": 0, "step": s, "loss": float(s)} for s in range(1, 13)]
           + [{"attempt": 1, "step": s, "loss": 100.0 + s}
              for s in range(11, 21)])
  (steps / "worker-0.jsonl").write_text(
      "\n".join(json.dumps(x) for x in lines) + "\n{\"attem")
  attempts = [{"attempt": 0, "resumed_from": 0},
              {"attempt": 1, "resumed_from": 10}]
  t = LaunchResult(True, str(tmp_path), attempts).trajectory()
  # attempt 0 gives 1..10, its 11 and 12 were thrown away; attempt 1 11..20
  assert t["steps"] == 20 and t["lost"] == [] and t["repeated"] == []
  assert t["recomputed"] == 2
  assert t["loss"][10] == 10.0 and t["loss"][11] == 111.0
  # a resume point past what was logged leaves a hole
  attempts[1]["resumed_from"] = 12
  (steps / "worker-0.jsonl").write_text("\n".join(
      json.dumps(x) for x in lines if x["attempt"] == 0 or x["step"] > 14))
  t = LaunchResult(True, str(tmp_path), attempts).trajectory()
  assert t["lost"] == [13, 14]
