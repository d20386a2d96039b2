"""tfopt in TensorBoard: with a `keras.callbacks.TensorBoard` in a fit, the
hook and tfopt's callbacks write under `<log_dir>/tfopt`, tags `tfopt/...`.

Every check reads the event files back and compares with an oracle the
writer did not compute: the hook's own report, the PNG the Gantt drawer
makes, the values the callbacks put in Keras' logs, zeros counted with
NumPy in the weights after fit, the NAS run's own PNG, the chief's verdict
file, the worker's FitResult. Another test guards the one assumption on
Keras (its CallbackList is on the stack while a fit runs its callbacks
and train function)."""

import glob
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfopt
from tfopt import summaries


def _events(log_dir) -> dict:
  """{tag: [(step, value, plugin)]} of every event file in `log_dir/tfopt`
  (value: a float for scalars, str for text, the tensor's list of bytes
  for images)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  run = os.path.join(str(log_dir), "tfopt")
  found: dict = {}
  for name in sorted(os.listdir(run)):
    for event in tf.compat.v1.train.summary_iterator(os.path.join(run, name)):
      for v in event.summary.value:
        array = tf.make_ndarray(v.tensor)
        plugin = v.metadata.plugin_data.plugin_name
        value = (float(array) if plugin == "scalars" else
                 array.item().decode() if plugin == "text" else list(array))
        found.setdefault(v.tag, []).append((event.step, value, plugin))
  return found


def _values(events, tag) -> list:
  return [value for _, value, _ in events[tag]]


def _mlp(seed=0):
  keras.utils.set_random_seed(seed)
  inp = keras.Input((6,))
  h = keras.layers.Dense(8, activation="relu", name="hidden")(inp)
  return keras.Model(inp, keras.layers.Dense(2, name="head")(h))


def _data(n=32, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(n, 6)).astype("float32"),
          rng.normal(size=(n, 2)).astype("float32"))


class _Logged(keras.callbacks.Callback):
  """What the callbacks before it put into the batch logs."""

  def __init__(self, key):
    super().__init__()
    self.key = key
    self.values: list = []

  def on_train_batch_end(self, batch, logs=None):
    if logs and self.key in logs:
      self.values.append(float(logs[self.key]))


def test_the_fits_callback_list_is_found_from_callbacks_and_train_function(
    tmp_path):
  """The guard on Keras: while `fit` runs a callback's `on_train_begin` or
  the model's train function, the fit's CallbackList is on the stack.
  If a Keras release breaks this, tfopt writes nothing to TensorBoard."""
  model = _mlp()
  model.compile("sgd", "mse")
  x, y = _data()
  board = keras.callbacks.TensorBoard(log_dir=str(tmp_path))
  seen: dict = {}

  class Probe(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
      seen["callback"] = summaries.fit_callbacks(self.model, self)
      seen["other member"] = summaries.fit_callbacks(self.model,
                                                     keras.callbacks.History())
      seen["board"] = summaries.fit_tensorboard(self.model, self)

  probe = Probe()
  model.make_train_function()
  keras_step = model.train_function

  def train_function(iterator):
    seen.setdefault("train function", summaries.fit_callbacks(model))
    return keras_step(iterator)

  model.train_function = train_function  # fit keeps a function already set
  model.fit(x, y, batch_size=16, epochs=1, verbose=0,
            callbacks=[probe, board])
  assert isinstance(seen["callback"], keras.callbacks.CallbackList)
  assert any(c is probe for c in seen["callback"].callbacks)
  assert seen["train function"] is seen["callback"]
  assert seen["other member"] is None
  assert seen["board"] is board
  assert summaries.fit_callbacks(model) is None  # no fit running


def test_hook_report_as_text_and_gantt_as_image(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfopt.simulate.gantt import draw_gantt  # pylint: disable=g-import-not-at-top
  model = tfopt.compile(_mlp(), optimizer="adam", loss="mse",
                        placement="m-etf", devices=["/device:CPU:0"],
                        verbose=False)
  x, y = _data()
  model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[
      keras.callbacks.TensorBoard(log_dir=str(tmp_path))])
  (report,) = model.train_function.reports.values()
  events = _events(tmp_path)
  [(step, text, plugin)] = events["tfopt/compile/report"]
  assert (step, plugin) == (0, "text")
  assert text == f"```\n{report.table()}\n```"
  assert "placement m-etf: predicted" in text
  [(step, image, plugin)] = events["tfopt/compile/gantt"]
  assert (step, plugin) == (0, "images")
  width, height, png = image
  # The oracle: the same chart drawn here from the report's plan, as the
  # hook draws it (its device names and title); the pixels must agree.
  draw_gantt(report.plan.schedule, str(tmp_path / "oracle.png"),
             device_names=["/device:CPU:0"],
             title=f"placed step ({report.placer}): predicted "
                   f"{report.predicted_us / 1e3:.2f} ms")
  oracle = tf.io.decode_png((tmp_path / "oracle.png").read_bytes())
  decoded = tf.io.decode_png(png)
  assert decoded.shape == oracle.shape
  assert (int(width), int(height)) == (oracle.shape[1], oracle.shape[0])
  assert np.array_equal(decoded.numpy(), oracle.numpy())
  # Not a blank canvas: the bars are there.
  assert len(np.unique(decoded.numpy().reshape(-1, decoded.shape[-1]),
                       axis=0)) > 4


def test_mfu_per_step_per_epoch_and_goodput_are_the_callbacks_own(tmp_path):
  from tfopt.scale.mfu import MFUMonitor  # pylint: disable=g-import-not-at-top
  model = _mlp()
  model.compile("adam", "mse")
  x, y = _data(64)
  monitor = MFUMonitor((x[:16], y[:16]), peak_flops=1e12, log_every=1)
  logged = _Logged("mfu")
  history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[
      monitor, logged, keras.callbacks.TensorBoard(log_dir=str(tmp_path))])
  events = _events(tmp_path)
  # The first batch of each epoch is not timed: steps 2-4 and 6-8.
  assert [s for s, _, _ in events["tfopt/mfu/step"]] == [2, 3, 4, 6, 7, 8]
  np.testing.assert_allclose(_values(events, "tfopt/mfu/step"),
                             logged.values, rtol=1e-6)
  assert [s for s, _, _ in events["tfopt/mfu/epoch"]] == [0, 1]
  np.testing.assert_allclose(_values(events, "tfopt/mfu/epoch"),
                             history.history["mfu"], rtol=1e-6)
  [(step, goodput, _)] = events["tfopt/goodput"]
  assert step == 8
  assert goodput == pytest.approx(monitor.summary()["goodput"], rel=1e-6)
  assert 0 < goodput < 1


def test_pruning_sparsity_per_layer_is_the_zeros_in_its_kernels(tmp_path):
  from tfopt import zoo  # pylint: disable=g-import-not-at-top
  from tfopt.pruning import MoEPruner, find_moe_layers, installed_masks  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(0)
  zm = zoo.moe_lm(vocab_size=40, seq_len=8, num_layers=2, d_model=16,
                  num_heads=2, num_experts=4, expert_dim=16)
  x, y = zm.batch(32, seed=0)
  pruner = MoEPruner(x[:16], method="wanda", sparsity=0.5, at_step=2,
                     min_tokens=1)
  zm.model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[
      pruner, keras.callbacks.TensorBoard(log_dir=str(tmp_path))])
  events = _events(tmp_path)
  masked = installed_masks(zm.model)
  layers = find_moe_layers(zm.model)
  assert len(layers) == 2
  for layer in layers:
    kernels = [v.numpy() for v in layer.weights if v.path in masked]
    assert kernels
    zeros = sum(np.count_nonzero(k == 0) for k in kernels)
    [(step, value, _)] = events[f"tfopt/pruning/sparsity/{layer.name}"]
    assert step == 2  # pruned before the third step
    assert value == pytest.approx(zeros / sum(k.size for k in kernels))
    assert 0.45 < value < 0.55
  assert _values(events, "tfopt/pruning/sparsity") == pytest.approx(
      [pruner.reports[0].sparsity])


def test_cwd_decay_fraction_per_step_and_epoch(tmp_path):
  from tfopt.optimizers import CautiousAdamW, DecayFractionLogger  # pylint: disable=g-import-not-at-top
  model = _mlp()
  model.compile(CautiousAdamW(1e-2, weight_decay=0.1,
                              track_decay_fraction=True), "mse")
  x, y = _data(64)
  logged = _Logged("cwd_decay_fraction")
  # TensorBoard first: tfopt's scalars do not depend on the order.
  history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[
      keras.callbacks.TensorBoard(log_dir=str(tmp_path)),
      DecayFractionLogger(every_n_batches=2), logged])
  events = _events(tmp_path)
  step_events = sorted(events["tfopt/cwd/decay_fraction/step"])
  assert [s for s, _, _ in step_events] == [2, 4, 6, 8]
  assert [v for _, v, _ in step_events] == pytest.approx(logged.values)
  assert _values(events, "tfopt/cwd/decay_fraction/epoch") == pytest.approx(
      history.history["cwd_decay_fraction"])
  assert all(0 < v <= 1 for v in logged.values)


def test_nas_scatterplot_is_the_runs_png(tmp_path):
  from tfopt.nas.callbacks import NASReport  # pylint: disable=g-import-not-at-top
  from tfopt.nas.space import tiny64  # pylint: disable=g-import-not-at-top
  from tfopt.nas.supernet import SuperNet  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(0)
  net = SuperNet(tiny64(filters=4))
  net.compile("adam", keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  rng = np.random.default_rng(0)
  x = rng.normal(size=(32, 8, 8, 1)).astype("float32")
  y = rng.integers(0, 10, size=32).astype("int32")
  report = NASReport(str(tmp_path / "run"))
  net.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[
      report, keras.callbacks.TensorBoard(log_dir=str(tmp_path / "tb"))])
  [(step, image, plugin)] = _events(tmp_path / "tb")["tfopt/nas/search_space"]
  assert (step, plugin) == (2, "images")
  png = (tmp_path / "run" / "search_space.png").read_bytes()
  assert image == [str(w).encode() for w in summaries.png_size(png)] + [png]


def test_straggler_scalars_under_tfopt_and_in_their_own_dir(tmp_path):
  """The chief in a real fit, worker 1's records written beforehand, 50 ms
  late at every step: the fit's TensorBoard gets the chief's verdicts
  (reports.jsonl) tagged tfopt/stragglers/..., tensorboard_dir keeps its
  own tags."""
  from tfopt.scale.stragglers import StragglerMonitor  # pylint: disable=g-import-not-at-top
  phases = tmp_path / "phases"
  phases.mkdir()
  with open(phases / "worker-1.jsonl", "w", encoding="utf-8") as f:
    for step in range(8):
      f.write(json.dumps({"attempt": 0, "step": step, "gap": 0.05,
                          "in_step": 0.001, "begin": 1000.0 + step}) + "\n")
  monitor = StragglerMonitor(str(phases), 0, 2, exchange_every=4,
                             time_compute=False,
                             tensorboard_dir=str(tmp_path / "own"))
  model = _mlp()
  model.compile("sgd", "mse")
  x, y = _data(64)
  model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[
      monitor, keras.callbacks.TensorBoard(log_dir=str(tmp_path / "tb"))])
  verdicts = [json.loads(line) for line in
              (phases / "reports.jsonl").read_text().splitlines()]
  assert [v["step"] for v in verdicts] == [3, 7]
  assert all(v["stragglers"] == [1] for v in verdicts)
  events = _events(tmp_path / "tb")
  for w in (0, 1):
    for name in ("late_ms", "flagged"):
      got = events[f"tfopt/stragglers/{name}/worker_{w}"]
      assert [s for s, _, _ in got] == [3, 7]
      assert [v for _, v, _ in got] == pytest.approx(
          [v[name][w] for v in verdicts], rel=1e-6)
  own = _events_in(tmp_path / "own")
  assert own["stragglers/late_ms/worker_1"] == pytest.approx(
      [v["late_ms"][1] for v in verdicts], rel=1e-6)


def _events_in(directory) -> dict:
  """{tag: [values]} of the scalars in `directory`'s own event files."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  found: dict = {}
  for name in sorted(os.listdir(directory)):
    for event in tf.compat.v1.train.summary_iterator(
        os.path.join(str(directory), name)):
      for v in event.summary.value:
        found.setdefault(v.tag, []).append(float(tf.make_ndarray(v.tensor)))
  return found


def test_worker_restart_is_the_resumed_from_step(tmp_path):
  from tfopt.scale.worker import WorkerEnv, fit  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x, y = _data(64)

  def dataset_fn(epoch):
    del epoch
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)

  def run(epochs, attempt):
    model = _mlp()
    model.compile("sgd", "mse")
    return fit(model, dataset_fn, epochs=epochs, steps_per_epoch=4,
               checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=3,
               env=WorkerEnv(attempt=attempt), callbacks=[
                   keras.callbacks.TensorBoard(log_dir=str(tmp_path / "tb"))])

  first = run(1, attempt=0)
  second = run(2, attempt=1)
  assert (first.global_step, second.resumed_from) == (4, 4)
  events = _events(tmp_path / "tb")
  assert [(s, v) for s, v, _ in events["tfopt/restart/resumed_from_step"]] \
      == [(0, 0.0), (4, 4.0)]
  assert _values(events, "tfopt/restart/attempt") == [0.0, 1.0]
  assert _values(events, "tfopt/restart") == [
      "attempt 0: started at step 0",
      "attempt 1: resumed from step 4 (0 batches into its epoch)"]


def test_all_at_once_and_nothing_without_tensorboard(tmp_path):
  """tfopt.compile's placed step, MFU and CWD in one fit, with Keras'
  TensorBoard gating its own batch summaries (update_freq=2): every tfopt
  tag is there, TensorBoard's own reader files each under its plugin. The
  same fit without a TensorBoard opens no writer and writes nothing."""
  from tfopt.optimizers import CautiousAdamW, DecayFractionLogger  # pylint: disable=g-import-not-at-top
  from tfopt.scale.mfu import MFUMonitor  # pylint: disable=g-import-not-at-top

  def fit(callbacks):
    model = tfopt.compile(_mlp(), optimizer=CautiousAdamW(
        1e-2, weight_decay=0.1, track_decay_fraction=True), loss="mse",
        placement="m-etf", devices=["/device:CPU:0"], verbose=False)
    x, y = _data(64)
    monitor = MFUMonitor((x[:16], y[:16]), peak_flops=1e12, log_every=1)
    logged = _Logged("mfu")
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[
        monitor, DecayFractionLogger(every_n_batches=1), logged, *callbacks])
    return model, logged

  board = keras.callbacks.TensorBoard(log_dir=str(tmp_path / "tb"),
                                      update_freq=2)
  model, logged = fit([board])
  events = _events(tmp_path / "tb")
  assert {"tfopt/compile/report", "tfopt/compile/gantt", "tfopt/mfu/step",
          "tfopt/mfu/epoch", "tfopt/goodput", "tfopt/cwd/decay_fraction/step",
          "tfopt/cwd/decay_fraction/epoch"} == set(events)
  (report,) = model.train_function.reports.values()
  assert _values(events, "tfopt/compile/report") == [
      f"```\n{report.table()}\n```"]
  # Odd steps too: Keras' record_if(step % 2 == 0) is not tfopt's.
  assert [s for s, _, _ in events["tfopt/mfu/step"]] == [2, 3, 4, 6, 7, 8]
  assert _values(events, "tfopt/mfu/step") == pytest.approx(logged.values)
  assert len(events["tfopt/cwd/decay_fraction/step"]) == 8
  # Keras' own run is untouched by tfopt's.
  assert "tfopt" not in os.listdir(tmp_path / "tb" / "train")

  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # pylint: disable=g-import-not-at-top
  reader = EventAccumulator(str(tmp_path / "tb" / "tfopt"))
  reader.Reload()
  assert set(reader.PluginTagToContent("images")) == {"tfopt/compile/gantt"}
  assert set(reader.PluginTagToContent("text")) == {"tfopt/compile/report"}
  assert "tfopt/mfu/epoch" in reader.PluginTagToContent("scalars")

  writers = dict(summaries._WRITERS)  # pylint: disable=protected-access
  before = sorted(p.name for p in tmp_path.iterdir())
  fit([keras.callbacks.History()])
  assert summaries._WRITERS == writers  # pylint: disable=protected-access
  assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_summaries_refuse_what_they_cannot_write(tmp_path):
  writer = summaries.for_directory(str(tmp_path))
  with pytest.raises(ValueError, match="Argument `png` must be the bytes of "
                     "a PNG image"):
    writer.write_image("x", b"GIF89a not a png at all....", 0)
  with pytest.raises(ValueError, match="Argument `step` must be an integer"):
    writer.write_scalar("x", 1.0, 0.5)
  with pytest.raises(ValueError, match="Argument `logdir` must be"):
    summaries.for_directory("")
  writer.write_scalar("x", 2.5, 3)
  writer.flush()
  assert _events_in(tmp_path) == {"x": [2.5]}


def test_writers_beyond_the_bound_are_closed_and_reopened(tmp_path):
  """A sweep over many log_dirs keeps at most _MAX_WRITERS files open; a
  directory written again after its writer closed loses nothing."""
  dirs = [tmp_path / f"run{i}" for i in range(summaries._MAX_WRITERS + 2)]
  first = summaries.for_directory(dirs[0])
  first.write_scalar("x", 1.0, 0)
  for d in dirs[1:]:
    summaries.for_directory(d).write_scalar("x", 2.0, 0)
  assert len(summaries._WRITERS) <= summaries._MAX_WRITERS
  assert os.path.realpath(dirs[0]) not in summaries._WRITERS
  first.write_scalar("x", 3.0, 1)  # reopened: a second events file
  first.flush()
  values = sorted(
      float(tf.make_ndarray(v.tensor))
      for path in glob.glob(str(dirs[0] / "events.*"))
      for e in tf.compat.v1.train.summary_iterator(path)
      for v in e.summary.value)
  assert values == [1.0, 3.0]


def test_only_the_chief_writes_for_a_multi_worker_fit(monkeypatch, tmp_path):
  class Extended:
    should_checkpoint = False  # a worker other than the chief

  class Model:
    distribute_strategy = type("S", (), {"extended": Extended()})()

  board = keras.callbacks.TensorBoard(log_dir=str(tmp_path))
  monkeypatch.setattr(summaries, "fit_tensorboard", lambda m, c=None: board)
  assert summaries.for_fit(Model()) is None
  Extended.should_checkpoint = True
  assert summaries.for_fit(Model()) is not None
