"""Two-stage checkpoints: exact round trip of weights, optimizer state,
position and RNG; two generations; a corrupt newest falls back; a kill
during persist leaves the previous generation; clear errors."""

import json
import pathlib
import signal
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.scale.checkpoint import TwoStageCheckpointer

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _model(seed=0, width=16):
  keras.utils.set_random_seed(seed)
  model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(width),
                            keras.layers.Dense(2)])
  model.compile(keras.optimizers.Adam(1e-2), "mse")
  return model


def _train(model, steps=3, seed=1):
  rng = np.random.default_rng(seed)
  for _ in range(steps):
    model.train_on_batch(rng.normal(size=(4, 8)).astype("float32"),
                         rng.normal(size=(4, 2)).astype("float32"))


def _state(model):
  return [v.numpy().copy() for v in model.weights] + [
      v.numpy().copy() for v in model.optimizer.variables]


def test_round_trip_while_training_goes_on(tmp_path):
  model = _model()
  _train(model)
  ckpt = TwoStageCheckpointer(str(tmp_path / "ck"), model)
  np.random.seed(5)
  saved = _state(model)
  ckpt.save(step=3, epoch=1, step_in_epoch=2)
  expected_draw = np.random.random()
  expected_keras = float(keras.random.uniform(()))  # global seed generator
  _train(model, seed=2)            # training continues during the persist
  ckpt.wait()
  assert any(not np.array_equal(a, b) for a, b in zip(_state(model), saved))
  fresh = _model(seed=9)
  restored = TwoStageCheckpointer(str(tmp_path / "ck"), fresh).restore()
  assert (restored.step, restored.epoch, restored.step_in_epoch) == (3, 1, 2)
  for a, b in zip(_state(fresh), saved):
    np.testing.assert_array_equal(a, b)
  assert np.random.random() == expected_draw  # the RNGs where they were
  assert float(keras.random.uniform(())) == expected_keras
  assert ckpt.blocking_seconds and ckpt.blocking_seconds[0] < 5


def test_generations_and_corrupt_newest(tmp_path):
  model = _model()
  ckpt = TwoStageCheckpointer(str(tmp_path), model)
  states = {}
  for step in (1, 2, 3):
    _train(model, steps=1, seed=step)
    states[step] = _state(model)
    ckpt.save(step=step, blocking=True)
  assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == [
      "ckpt-2.npz", "ckpt-3.npz"]
  assert json.loads((tmp_path / "checkpoints.json").read_text())[
      "generations"] == ["ckpt-2.npz", "ckpt-3.npz"]
  newest = tmp_path / "ckpt-3.npz"
  newest.write_bytes(newest.read_bytes()[:-100])   # truncated
  fresh = _model(seed=4)
  restored = TwoStageCheckpointer(str(tmp_path), fresh).restore()
  assert restored.step == 2 and restored.skipped == [str(newest)]
  for a, b in zip(_state(fresh), states[2]):
    np.testing.assert_array_equal(a, b)
  # A file of someone else's in the directory is never deleted.
  mine = tmp_path / "notes.txt"
  mine.write_text("keep me")
  ckpt.save(step=4, blocking=True)
  ckpt.save(step=5, blocking=True)
  assert mine.read_text() == "keep me"


def test_kill_during_persist_leaves_previous_generation(tmp_path):
  script = textwrap.dedent(f"""
      import sys, time
      sys.path.insert(0, {str(ROOT)!r})
      import tfopt, keras, numpy as np
      from tfopt.scale import checkpoint as ck
      keras.utils.set_random_seed(0)
      m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
      m.compile(keras.optimizers.Adam(1e-2), "mse")
      m.train_on_batch(np.ones((4, 8), "float32"), np.ones((4, 2), "float32"))
      c = ck.TwoStageCheckpointer({str(tmp_path)!r}, m)
      c.save(step=1, blocking=True)
      np.save({str(tmp_path / "gen1.npy")!r}, m.weights[0].numpy())
      m.train_on_batch(np.ones((4, 8), "float32"), np.zeros((4, 2), "float32"))
      real = ck.np.savez
      def slow(f, **kw):
        f.write(b"partial")
        f.flush()
        print("WRITING", flush=True)
        time.sleep(60)
      ck.np.savez = slow
      c.save(step=2)
      time.sleep(60)
      """)
  proc = subprocess.Popen([sys.executable, "-c", script],
                          stdout=subprocess.PIPE, text=True)
  try:
    for line in proc.stdout:
      if "WRITING" in line:
        break
    proc.send_signal(signal.SIGKILL)
  finally:
    proc.wait(timeout=60)
  assert not (tmp_path / "ckpt-2.npz").exists()
  fresh = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
  fresh.compile(keras.optimizers.Adam(1e-2), "mse")
  restored = TwoStageCheckpointer(str(tmp_path), fresh).restore()
  assert restored.step == 1 and restored.skipped == []
  np.testing.assert_array_equal(fresh.weights[0].numpy(),
                                np.load(tmp_path / "gen1.npy"))


def test_errors_and_non_chief(tmp_path):
  model = _model()
  _train(model, steps=1)
  with pytest.raises(ValueError, match="Argument `keep` must be an integer "
                     ">= 2"):
    TwoStageCheckpointer(str(tmp_path), model, keep=1)
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(PermissionError, match="Argument `directory`"):
    TwoStageCheckpointer(str(blocker / "sub"), model)
  worker = TwoStageCheckpointer(str(tmp_path / "shared"), model,
                                is_chief=False)
  worker.save(step=1, blocking=True)
  assert not (tmp_path / "shared").exists()
  TwoStageCheckpointer(str(tmp_path / "c"), model).save(step=1,
                                                        blocking=True)
  other = _model(width=4)  # a different model
  _train(other, steps=1)
  with pytest.raises(ValueError, match="a checkpoint of this model"):
    TwoStageCheckpointer(str(tmp_path / "c"), other).restore()
  assert TwoStageCheckpointer(str(tmp_path / "none"), model).restore() is None


def test_snapshot_is_not_touched_by_later_training(tmp_path):
  # The snapshot holds the variables' buffers without copying them; an
  # optimizer update must not write into it (TensorFlow copies on write).
  model = _model()
  _train(model)
  ckpt = TwoStageCheckpointer(str(tmp_path), model)
  snap = ckpt.snapshot(step=7)
  before = {k: v.copy() for k, v in snap["arrays"].items()}
  _train(model, seed=3)
  for key, value in snap["arrays"].items():
    np.testing.assert_array_equal(value, before[key])
  ckpt.persist(snap)
  fresh = _model(seed=2)
  assert TwoStageCheckpointer(str(tmp_path), fresh).restore().step == 7
  np.testing.assert_array_equal(fresh.weights[0].numpy(),
                                before["model/000000"])
