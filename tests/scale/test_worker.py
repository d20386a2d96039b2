"""The resumable fit in one process: an interrupted run resumed from its
checkpoint ends bit for bit where an uninterrupted one does (input position,
optimizer, dropout RNG), and SIGTERM stops at the agreed step and saves."""

import json
import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfopt.scale import worker
from tfopt.scale.protocol import CONTROL

X = np.random.RandomState(0).randn(96, 6).astype("float32")
Y = np.tanh(X[:, :1] - X[:, 1:2])


def dataset_fn(epoch):
  return tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(
      96, seed=epoch).batch(8)


def _model():
  keras.utils.set_random_seed(1)
  model = keras.Sequential([keras.Input((6,)),
                            keras.layers.Dense(16, activation="relu"),
                            keras.layers.Dropout(0.3, seed=2),
                            keras.layers.Dense(1)])
  model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
  return model


class _Crash(keras.callbacks.Callback):
  def __init__(self, at):
    super().__init__()
    self.at, self.n = at, 0

  def on_train_batch_end(self, batch, logs=None):
    self.n += 1
    if self.n == self.at:
      raise RuntimeError("simulated crash")


def _fit(run_dir, callbacks=(), **kwargs):
  env = worker.WorkerEnv(run_dir=str(run_dir))
  return worker.fit(_model(), dataset_fn, epochs=3, steps_per_epoch=12,
                    checkpoint_every=4, callbacks=callbacks, env=env,
                    **kwargs)


def _weights(run_dir):
  model = _model()
  env = worker.WorkerEnv(run_dir=str(run_dir))
  worker.fit(model, dataset_fn, epochs=3, steps_per_epoch=12, env=env)
  return model.get_weights()


def test_resume_mid_epoch_is_bit_exact(tmp_path):
  reference = _weights(tmp_path / "clean")
  with pytest.raises(RuntimeError, match="simulated crash"):
    _fit(tmp_path / "crash", [_Crash(18)])  # step 18: epoch 1, batch 6
  result = _fit(tmp_path / "crash")
  assert result.resumed_from == 16  # the last checkpoint, mid-epoch 1
  model = _model()
  worker.fit(model, dataset_fn, epochs=3, steps_per_epoch=12,
             env=worker.WorkerEnv(run_dir=str(tmp_path / "crash")))
  for a, b in zip(model.get_weights(), reference):
    np.testing.assert_array_equal(a, b)
  # the step log: 1..18 from the crashed attempt, then 17..36
  steps = [json.loads(line)["step"] for line in
           (tmp_path / "crash" / "steps" / "worker-0.jsonl").open()]
  assert steps[:18] == list(range(1, 19))
  assert steps[18:38] == list(range(17, 37))


def test_sigterm_stops_at_the_agreed_step_and_saves(tmp_path):
  class Term(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      if batch == 4 and not hasattr(self, "sent"):
        self.sent = True
        os.kill(os.getpid(), signal.SIGTERM)

  result = _fit(tmp_path, [Term()], exit_on_preemption=False)
  # sent after step 5's check, seen after step 6: stop at 6 + margin 2
  assert result.preempted and result.global_step == 8
  control = json.loads((tmp_path / CONTROL).read_text())
  assert control["stop_at_step"] == 8
  assert "ckpt-8.npz" in os.listdir(tmp_path / "checkpoints")
  assert signal.getsignal(signal.SIGTERM) is not None
  # run again in the same directory (a standalone rerun, attempt 0 again):
  # it resumes at 8 and is not stopped by the old control file
  resumed = _fit(tmp_path, exit_on_preemption=False)
  assert (resumed.resumed_from, resumed.global_step, resumed.preempted) == (
      8, 36, False)
  with pytest.raises(SystemExit) as exit_info:
    worker.fit(_model(), dataset_fn, epochs=1, steps_per_epoch=12,
               env=worker.WorkerEnv(run_dir=str(tmp_path / "b")),
               callbacks=[Term()])
  assert exit_info.value.code == worker.PREEMPTED_EXIT


def test_bad_input(tmp_path):
  model = _model()
  with pytest.raises(ValueError, match="Argument `dataset_fn`"):
    worker.fit(model, dataset_fn(0), epochs=1, steps_per_epoch=2)
  with pytest.raises(ValueError, match="Argument `steps_per_epoch`"):
    worker.fit(model, dataset_fn, epochs=1, steps_per_epoch=0)
  model.compile(optimizer="adam", loss="mse", steps_per_execution=4)
  with pytest.raises(ValueError, match="steps_per_execution=1"):
    worker.fit(model, dataset_fn, epochs=1, steps_per_epoch=2)
  other = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3),
                            keras.layers.Dense(1)])
  other.compile(optimizer="adam", loss="mse")
  _fit(tmp_path)
  with pytest.raises(ValueError, match="Argument `checkpoint` must be a "
                     "checkpoint of this model"):
    worker.fit(other, dataset_fn, epochs=1, steps_per_epoch=2,
               env=worker.WorkerEnv(run_dir=str(tmp_path)))


def test_env_from_environ():
  env = worker.WorkerEnv.from_environ({
      "TFOPT_WORKER": "1", "TFOPT_NUM_WORKERS": "2", "TFOPT_ATTEMPT": "3",
      "TFOPT_RUN_DIR": "/r", "TFOPT_COLLECTIVE_TIMEOUT_S": "30"})
  assert (env.worker, env.workers, env.attempt, env.run_dir,
          env.collective_timeout_s, env.is_chief) == (1, 2, 3, "/r", 30.0,
                                                       False)
  assert worker.WorkerEnv.from_environ({}).is_chief


class _Report(keras.callbacks.Callback):
  """Records when its end-of-run report would be written."""

  def __init__(self, run_dir):
    super().__init__()
    self.run_dir = run_dir
    self.final_segment = True
    self.segment_ends, self.finished = [], []

  def on_train_end(self, logs=None):
    self.segment_ends.append(self.final_segment)

  def finish_run(self):
    from tfopt.scale import heartbeat
    self.finished.append(heartbeat.read(str(self.run_dir / "heartbeats"), 0))


def test_end_of_run_report_once_after_the_last_segment(tmp_path):
  report = _Report(tmp_path)
  _fit(tmp_path, [report])
  # One model.fit per epoch: three on_train_end calls, none the last word.
  assert report.segment_ends == [False, False, False]
  (beat,) = report.finished
  # Written after the heartbeat said "done": a watcher sees "finishing",
  # not a stuck step, however long the drawing takes.
  assert beat is not None and beat["phase"] == "done"
  assert report.final_segment


def test_a_stop_step_that_cannot_be_shared_is_logged(tmp_path, caplog):
  # The control file's directory is gone: the worker still stops at its
  # step, and says that its peers were not told (it used to pass silently).
  env = worker.WorkerEnv(worker=1, workers=2, run_dir=str(tmp_path / "gone"))
  preemption = worker._Preemption(env)  # pylint: disable=protected-access
  preemption.signalled = True
  with caplog.at_level("WARNING", logger="tfopt"):
    assert not preemption.check(5)
  assert preemption.stop_at == 7
  assert preemption.check(7)
  assert any("could not tell its peers to stop at step 7" in r.getMessage()
             for r in caplog.records)


def test_validation_runs_each_epoch_and_beats_its_phase(tmp_path):
  # worker.fit evaluates validation_data at each epoch's end, as Keras does,
  # and the heartbeat says "validation" meanwhile (the launcher gives that
  # phase its own budget).
  from tfopt.scale import heartbeat
  phases = []

  class ReadBeat(keras.callbacks.Callback):
    def on_test_batch_end(self, batch, logs=None):
      if batch == 0:
        import time
        time.sleep(0.3)  # a few beats of 0.05 s
        phases.append(heartbeat.read(str(tmp_path / "heartbeats"), 0)
                      ["phase"])

  env = worker.WorkerEnv(run_dir=str(tmp_path), heartbeat_s=0.05)
  val = tf.data.Dataset.from_tensor_slices((X[:32], Y[:32])).batch(8)
  result = worker.fit(_model(), dataset_fn, epochs=2, steps_per_epoch=6,
                      env=env, callbacks=[ReadBeat()], validation_data=val,
                      validation_steps=2)
  assert phases == ["validation", "validation"]
  assert len(result.history["val_loss"]) == 2
  with pytest.raises(ValueError, match="Argument `validation_steps`"):
    worker.fit(_model(), dataset_fn, epochs=1, steps_per_epoch=2, env=env,
               validation_data=val, validation_steps=0)
