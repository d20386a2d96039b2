"""No port that a tfopt job opens on this machine can be reached from
another network namespace (what another machine on the network is to this
one), while the job trains with plain Keras' losses; nothing is left
behind when the job is killed; the exposed path warns and is reachable.

The oracle for "reachable" is a second namespace joined by a veth pair
(tests/_netprobe.py): a socket bound to the wildcard address here, as
TensorFlow's servers bind, answers it (checked in every test, and shown
with a real exposed TensorFlow server in the opt-in test), so a refused
connection means the port is confined, not that the probe is blind.
Ports are read from /proc: every listening socket of every process of the
job, in whatever namespace it lives.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tests import _netprobe as probe
from tfopt.runtime import netns

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
SCALE_TRAIN = os.path.join(ROOT, "experiments", "scale_train.py")
REASON = probe.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))


def _start_job(mode: str):
  proc = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-m", "tests._confined_job_script", mode], cwd=ROOT,
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)
  for line in proc.stdout:
    if line.startswith("READY "):
      return proc, json.loads(line[6:])
  proc.wait()
  raise AssertionError(f"the job ended early: {proc.stderr.read()[-3000:]}")


def _assert_probe_sees_wildcard_sockets(knock: probe.ProbeNamespace):
  with socket.socket() as exposed:
    exposed.bind(("0.0.0.0", 0))
    exposed.listen()
    assert knock.reachable(exposed.getsockname()[1])


@pytest.mark.parametrize("mode", ["placed", "ps"])
def test_no_port_of_a_job_is_reachable_from_another_namespace(mode):
  proc, out = _start_job(mode)
  try:
    pids = [out["pid"], *probe.descendants(out["pid"])]
    ports = probe.listening_ports(pids)
    assert out["confined"] and out["relay"] in pids
    # Every task listens on its port, the relay on each outside, and this
    # process's own TensorFlow server (tasks call back to it) on one more.
    for task, port in zip(out["tasks"], out["ports"]):
      assert port in ports[task]
    assert set(out["ports"]) <= ports[out["relay"]]
    assert ports[out["pid"]], "the client's TensorFlow server"
    with probe.ProbeNamespace() as knock:
      _assert_probe_sees_wildcard_sockets(knock)
      reached = {(pid, port) for pid, open_ in ports.items()
                 for port in open_ if knock.reachable(port)}
    assert reached == set()
    # On this machine, the relay serves the job's own process alone: a
    # task answers gRPC from inside its namespace, not through the relay
    # for another process (this one).
    port = out["ports"][0]
    assert probe.grpc_answers(port, namespace_of=out["tasks"][0])
    assert not probe.grpc_answers(port)
  finally:
    proc.stdin.write("\n")
    proc.stdin.flush()
    proc.wait(timeout=60)
  if mode == "placed":
    np.testing.assert_allclose(out["tfopt"], out["plain"], rtol=1e-5)
    assert all("/job:worker/" in d for d in out["devices"])
  else:
    assert len(out["tfopt"]) == 16 and out["tfopt"][-1] < out["tfopt"][0]
    assert all("/job:ps/" in d for d in out["devices"])


def test_a_killed_job_leaves_no_process_and_no_namespace():
  proc, out = _start_job("placed")
  namespace = out["namespace"]
  assert namespace != probe.namespace_id(os.getpid())
  assert set(probe.processes_in(namespace)) == set(out["tasks"])
  assert {out["pid"], out["relay"]} <= set(probe.holders(namespace))
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  left = [out["relay"], *out["tasks"]]
  deadline = time.monotonic() + 20
  while time.monotonic() < deadline:
    left = [p for p in left if probe.namespace_id(p) is not None]
    if not left and not probe.holders(namespace):
      break
    time.sleep(0.2)
  assert left == [] and probe.holders(namespace) == []


def _cannot_confine(monkeypatch):
  def refuse():
    raise OSError("making one needs CAP_SYS_ADMIN (root); simulated")
  monkeypatch.setattr(netns, "job_namespace", refuse)
  monkeypatch.delenv(netns.ALLOW_EXPOSED_ENV, raising=False)


def test_where_confinement_is_impossible_it_is_refused_or_warned(
    monkeypatch):
  from tfopt.runtime import LoopbackServers
  from tfopt.scale.launch import Launcher
  _cannot_confine(monkeypatch)
  for start in (lambda: LoopbackServers(1),
                lambda: Launcher([SCALE_TRAIN], workers=2)):
    with pytest.raises(PermissionError) as err:
      start()
    assert "CAP_SYS_ADMIN" in str(err.value)
    assert "allow_exposed=True" in str(err.value)
    assert netns.ALLOW_EXPOSED_ENV in str(err.value)
  with pytest.warns(RuntimeWarning) as seen:
    servers = LoopbackServers(1, allow_exposed=True)
  with servers, probe.ProbeNamespace() as knock:
    (warning,) = [w for w in seen if "unconfined" in str(w.message)]
    assert str(servers.ports) in str(warning.message)
    assert not servers.confined
    # The opt-in is what it says: a TensorFlow server anyone reaches.
    assert knock.reachable(servers.ports[0])
  monkeypatch.setenv(netns.ALLOW_EXPOSED_ENV, "1")
  with pytest.warns(RuntimeWarning, match="unconfined"):
    LoopbackServers(1).close()


def _steps(run_dir, worker):
  path = os.path.join(run_dir, "steps", f"worker-{worker}.jsonl")
  try:
    with open(path, encoding="utf-8") as f:
      return [json.loads(line) for line in f]
  except OSError:
    return []


@pytest.mark.slow
@pytest.mark.serial
def test_the_launchers_workers_are_not_reachable_and_train_as_one_process(
    tmp_path):
  from tfopt.scale.launch import launch
  flags = ["--dropout=0", "--epochs=2", "--steps_per_epoch=20",
           "--delay_ms=0:150"]
  result = {}

  def run():
    result["launch"] = launch([SCALE_TRAIN, *flags], workers=2,
                              run_dir=tmp_path / "run", max_restarts=0,
                              startup_timeout_s=240.0)
  runner = threading.Thread(target=run)
  runner.start()
  reached, ports = None, {}
  try:
    deadline = time.monotonic() + 240
    while len(_steps(tmp_path / "run", 0)) < 3 and runner.is_alive():
      assert time.monotonic() < deadline, "no worker reached step 3"
      time.sleep(0.2)
    workers = [p for p in probe.descendants(os.getpid())
               if SCALE_TRAIN in open(f"/proc/{p}/cmdline").read()]
    ports = probe.listening_ports(workers)
    with probe.ProbeNamespace() as knock:
      _assert_probe_sees_wildcard_sockets(knock)
      reached = {(pid, port) for pid, open_ in ports.items()
                 for port in open_ if knock.reachable(port)}
  finally:
    runner.join(timeout=600)
  assert len(ports) == 2 and all(ports.values()), ports
  assert reached == set()
  assert result["launch"].ok
  single = tmp_path / "single"
  subprocess.run([sys.executable, SCALE_TRAIN, *flags[:3],
                  f"--run_dir={single}"], check=True, capture_output=True,
                 cwd=ROOT, timeout=300)
  np.testing.assert_allclose(
      [r["mean"] for r in _steps(tmp_path / "run", 0)],
      [r["mean"] for r in _steps(single, 0)], rtol=0, atol=1e-6)
