"""Heartbeats: the writer's file, and the watch's verdicts on hand-made
beats (lost, stuck with the culprit outside the collective, starting)."""

import json
import time

import pytest

from tfopt.scale import heartbeat as hb


def _beat(directory, worker, step, phase, age, phase_age, median=0.05,
          attempt=0):
  now = time.time()
  (directory / f"worker-{worker}.json").write_text(json.dumps({
      "format": hb.FORMAT, "worker": worker, "attempt": attempt, "pid": 1,
      "time": now - age, "seq": 1, "step": step, "resumed_from": 0,
      "phase": phase, "phase_since": now - phase_age,
      "median_step_s": median}))


@pytest.mark.serial
def test_writer_beats_from_a_thread(tmp_path):
  writer = hb.HeartbeatWriter(tmp_path, 3, interval_s=0.05, attempt=2)
  writer.start()
  for step in range(1, 4):
    writer.begin_step()
    time.sleep(0.01)
    writer.end_step(step)
  first = hb.read(tmp_path, 3)["seq"]
  time.sleep(0.2)  # the main thread does nothing: the thread still beats
  beat = hb.read(tmp_path, 3)
  writer.stop()
  assert beat["seq"] > first and beat["step"] == 3
  assert beat["phase"] == "host" and beat["attempt"] == 2
  assert 0.005 < beat["median_step_s"] < 0.1
  assert hb.read(tmp_path, 4) is None
  with pytest.raises(ValueError, match="Argument `interval_s`"):
    hb.HeartbeatWriter(tmp_path, 0, interval_s=0)


def test_watch_verdicts(tmp_path):
  watch = hb.ProgressWatch(tmp_path, 2, timeout_s=2.0, stuck_factor=10,
                           min_stuck_s=1.0)
  assert watch.poll().kind == "starting"
  _beat(tmp_path, 0, 7, "step", 0.1, 0.1)
  _beat(tmp_path, 1, 7, "host", 0.1, 0.1)
  assert watch.poll().kind == "ok"
  # nobody advances: stuck after max(1 s, 10 x 0.05 s); worker 1 is the one
  # outside the step (the others wait inside the collective)
  verdict = watch.poll(now=time.time() + 1.5)
  assert (verdict.kind, verdict.worker) == ("stuck", 1)
  assert "worker 1: step 7, phase host" in verdict.report[1]
  # a slower job waits longer: 10 x 0.5 s
  _beat(tmp_path, 0, 7, "step", 0.1, 0.1, median=0.5)
  assert watch.poll(now=time.time() + 1.5).kind == "ok"
  # worker 0's beat is stale: lost, unless its process already exited
  _beat(tmp_path, 0, 8, "step", 3.0, 3.0)
  verdict = watch.poll()
  assert (verdict.kind, verdict.worker) == ("lost", 0)
  assert watch.poll(running=[1]).kind == "ok"
  # training returned on both ("done", beats stopped): finishing, neither
  # lost nor stuck however long the processes take to exit
  _beat(tmp_path, 0, 9, "done", 3.0, 3.0)
  _beat(tmp_path, 1, 9, "done", 30.0, 30.0)
  assert watch.poll(now=time.time() + 60).kind == "finishing"
  # beats of another attempt do not count
  other = hb.ProgressWatch(tmp_path, 2, attempt=1)
  assert other.poll().kind == "starting"


def test_culprit_is_the_lowest_step_when_all_wait_inside(tmp_path):
  watch = hb.ProgressWatch(tmp_path, 3, min_stuck_s=1.0)
  _beat(tmp_path, 0, 9, "step", 0.1, 2.0)
  _beat(tmp_path, 1, 8, "step", 0.1, 2.0)
  _beat(tmp_path, 2, 9, "step", 0.1, 2.0)
  watch.poll()
  verdict = watch.poll(now=time.time() + 2)
  assert (verdict.kind, verdict.worker) == ("stuck", 1)


def test_the_writer_sums_its_pauses_for_the_step_times(tmp_path,
                                                       monkeypatch):
  """Hand-timed phases: a checkpoint and a validation are pauses, summed
  into paused_s (the current one included) and, as of each step's end,
  into step_end_paused_s; steps and host time are not."""
  clock = [100.0]
  monkeypatch.setattr(hb.time, "time", lambda: clock[0])
  writer = hb.HeartbeatWriter(str(tmp_path), 0)  # "startup" from 100
  for phase, at in (("first_step", 103.0), ("end", 104.0), ("step", 104.5),
                    ("end", 105.0), ("checkpoint", 105.1), ("host", 107.1),
                    ("step", 107.2), ("end", 107.5), ("validation", 108.0),
                    ("epoch_end", 109.0)):
    clock[0] = at
    if phase == "end":
      writer.end_step(writer.step + 1)
    elif phase in ("first_step", "step"):
      writer.begin_step()
    else:
      writer.set_phase(phase)
  clock[0] = 109.5
  state = writer.state()
  # 3 s of startup + 2 s of checkpoint by the third step's end; then 1 s
  # of validation and 0.5 s of epoch_end so far.
  assert (state["step"], state["step_end_time"]) == (2, 107.5)
  assert state["step_end_paused_s"] == pytest.approx(5.0)
  assert state["paused_s"] == pytest.approx(6.5)
  assert state["phase"] == "epoch_end"
