"""tfopt.compile: Keras' fit trains with the rewritten (fused, placed) step
and gives the loss trajectory plain Keras gives."""

import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

import tfopt
from tfopt import zoo


def _mlp():
  keras.utils.set_random_seed(0)
  return zoo.mlp(hidden=(32, 32), input_dim=16)


def _loss():
  return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_fit_with_the_hook_matches_plain_keras(tmp_path, capsys):
  plain = _mlp()
  x, y = plain.batch(64)
  expected = plain.model.fit(x, y, batch_size=16, epochs=3, shuffle=False,
                             verbose=0).history["loss"]
  model = tfopt.compile(_mlp().model, optimizer="adam", loss=_loss(),
                        metrics=["accuracy"])
  history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False,
                      verbose=0).history
  np.testing.assert_allclose(history["loss"], expected, rtol=1e-6)
  assert set(history) == {"loss", "accuracy"}
  (report,) = model.train_function.reports.values()
  assert "_FusedMatMul +3" in report.pipeline_table
  assert "tfopt.compile: step for inputs" in capsys.readouterr().out
  # The same weights as plain Keras after training, so predict agrees.
  np.testing.assert_allclose(model.predict(x, verbose=0),
                             plain.model.predict(x, verbose=0), atol=1e-5)
  assert np.isfinite(model.evaluate(x, y, verbose=0)[0])
  path = tmp_path / "m.keras"
  model.save(path)
  loaded = keras.saving.load_model(path, compile=False)
  np.testing.assert_allclose(loaded.predict(x, verbose=0),
                             model.predict(x, verbose=0), atol=1e-6)
  # A second batch size builds (and reports) a second step.
  model.fit(x[:48], y[:48], batch_size=24, epochs=1, verbose=0)
  assert len(model.train_function.reports) == 2
  # Keras' own compile removes the hook.
  model.compile(optimizer="adam", loss=_loss())
  assert model.train_function is None


_ZOO = {
    "small_cnn": {"image_size": 16},
    "transformer_lm": {"vocab_size": 100, "seq_len": 16, "num_layers": 1,
                       "d_model": 32, "num_heads": 2, "d_ff": 64},
    "gnmt": {"vocab_size": 100, "seq_len": 4, "units": 16,
             "encoder_layers": 1, "decoder_layers": 1},
    "moe_lm": {"vocab_size": 64, "seq_len": 16, "num_layers": 1,
               "d_model": 32, "num_heads": 2, "num_experts": 4,
               "expert_dim": 32},
}


@pytest.mark.parametrize("name", sorted(_ZOO))
def test_hook_on_zoo_models_matches_plain_keras(name):
  def build():
    keras.utils.set_random_seed(0)
    return zoo.build(name, **_ZOO[name])
  plain = build()
  x, y = plain.batch(32)
  expected = plain.model.fit(x, y, batch_size=8, epochs=2, shuffle=False,
                             verbose=0).history["loss"]
  fresh = build()
  model = tfopt.compile(fresh.model, optimizer="adam", loss=fresh.model.loss,
                        verbose=False)
  history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False,
                      verbose=0).history["loss"]
  np.testing.assert_allclose(history, expected, rtol=1e-5)
  (report,) = model.train_function.reports.values()
  assert "nodes fewer" in report.pipeline_table  # fold changed the step


# The subprocess scripts' shared part: the MLP and plain Keras' losses.
_PLAIN_MLP = """def build():
  keras.utils.set_random_seed(0)
  return zoo.mlp(hidden=(32, 32), input_dim=16)
loss = lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True)
m = build(); x, y = m.batch(64)
plain = m.model.fit(x, y, batch_size=16, epochs=2, shuffle=False,
                    verbose=0).history["loss"]
"""

_PLACED = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, numpy as np, tfopt
from tfopt import zoo
""" + _PLAIN_MLP + """model = tfopt.compile(build().model, optimizer="adam", loss=loss(),
                      placement="m-etf",
                      devices=["/device:CPU:0", "/device:CPU:1"],
                      memory_per_device=1 << 30, verbose=False,
                      jit_compile=True)
placed = model.fit(x, y, batch_size=16, epochs=2, shuffle=False,
                   verbose=0).history["loss"]
(report,) = model.train_function.reports.values()
print(json.dumps({"plain": plain, "placed": placed,
                  "devices": list(report.devices_used),
                  "verified": report.ops_verified, "placer": report.placer,
                  "xla": report.xla}))
"""


@pytest.mark.slow
def test_placed_fit_on_two_logical_devices_matches_plain_keras():
  # Logical devices must exist before TensorFlow starts: a fresh process.
  done = subprocess.run([sys.executable, "-c", _PLACED], capture_output=True,
                        text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  # jit_compile=True: XLA where TensorFlow compiles the placed step (per
  # device; here it did, in many small clusters), else said and run
  # without (TF 2.21 has refused some multi-device plans: "Multiple CPU
  # devices").
  assert result["xla"].startswith(("XLA: ", "XLA not used")), result["xla"]
  compiled = result["xla"].startswith("XLA: ")
  np.testing.assert_allclose(result["placed"], result["plain"],
                             rtol=1e-4 if compiled else 1e-6)
  assert result["devices"] == ["/device:CPU:0", "/device:CPU:1"]
  assert result["verified"] > 200 and result["placer"].startswith("m-etf")


_XLA = """
import json, os, sys
import tfopt  # first: with keras first, TF_CPP_VMODULE was not honoured
import keras, numpy as np
from tfopt import zoo
""" + _PLAIN_MLP + """model = tfopt.compile(build().model, optimizer="adam", loss=loss(),
                      jit_compile=True, verbose=False)
print("FIT BEGINS", file=sys.stderr, flush=True)
xla = model.fit(x, y, batch_size=16, epochs=2, shuffle=False,
                verbose=0).history["loss"]
(report,) = model.train_function.reports.values()
print(json.dumps({"plain": plain, "xla": xla, "report": report.table()}))
"""


@pytest.mark.slow
def test_jit_compile_with_the_hook_compiles_per_device_and_matches_keras():
  # XLA's compilation log (device_compiler) shows what ran inside fit.
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0",
             TF_CPP_VMODULE="device_compiler=1,xla_compile_util=1")
  done = subprocess.run([sys.executable, "-c", _XLA], capture_output=True,
                        text=True, timeout=600, check=False, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  np.testing.assert_allclose(result["xla"], result["plain"], rtol=1e-4)
  report = result["report"]
  assert "_FusedMatMul" not in report  # fusion is left to XLA
  assert re.search(r"XLA: \d+ ops in \d+ clusters", report), report
  assert "checked on the first batch" in report
  clusters = int(re.search(r"in (\d+) clusters", report).group(1))
  during_fit = done.stderr.split("FIT BEGINS")[1]
  # The Session check compiles each cluster once; the tf.function that fit
  # runs compiles its own (its nodes carry the import's name scope).
  assert during_fit.count("Compilation of XLA executable") > clusters, \
      during_fit[-2000:]


class _Untraceable(keras.Model):
  """Converts a tensor to a Python int in call: fine eagerly, not traced."""

  def __init__(self):
    super().__init__()
    self.dense = keras.layers.Dense(3)

  def call(self, x):
    return self.dense(x) * float(int(keras.ops.sum(x) > 0))


def test_bad_input_gets_clear_errors():
  model = _mlp().model
  with pytest.raises(ValueError, match="Argument `jit_compile` must be True, "
                     "False, None or 'auto'. Received: jit_compile='yes'"):
    tfopt.compile(model, optimizer="adam", loss=_loss(), jit_compile="yes")
  with pytest.raises(ValueError, match="Argument `devices`.*non-empty"):
    tfopt.compile(model, optimizer="adam", loss=_loss(), placement="auto")
  with pytest.raises(ValueError, match="set_logical_device_configuration"):
    tfopt.compile(model, optimizer="adam", loss=_loss(), placement="auto",
                  devices=["/device:CPU:0", "/device:CPU:7"])
  with pytest.raises(ValueError, match="Argument `placement`"):
    tfopt.compile(model, optimizer="adam", loss=_loss(), placement="m-fast",
                  devices=["/device:CPU:0"])
  with pytest.raises(ValueError, match="given only with `placement`"):
    tfopt.compile(model, optimizer="adam", loss=_loss(),
                  devices=["/device:CPU:0"])
  with pytest.raises(ValueError, match="memory_per_device"):
    tfopt.compile(model, optimizer="adam", loss=_loss(), placement="auto",
                  devices=["/device:CPU:0"], memory_per_device=-1)
  with pytest.raises(ValueError, match="Argument `model`"):
    tfopt.compile("model", optimizer="adam", loss=_loss())
  # XLA alone is Keras' own: allowed, no hook.
  plain = tfopt.compile(model, optimizer="adam", loss=_loss(),
                        jit_compile=True, fusion=False)
  assert plain.train_function is None and plain.jit_compile
  sub = _Untraceable()
  x = np.ones((8, 4), "float32")
  sub(x)
  tfopt.compile(sub, optimizer="sgd", loss="mse", verbose=False)
  with pytest.raises(RuntimeError, match="could not capture.*functional"):
    sub.fit(x, np.zeros((8, 3), "float32"), batch_size=8, verbose=0)
  # The failed trace left no Keras name scope open behind it.
  fresh = _mlp().model
  assert fresh.trainable_variables[0].path == "dense_0/kernel"


class _CountBatches(keras.callbacks.Callback):
  """The batch indices and logs Keras' fit hands to callbacks."""

  def __init__(self):
    super().__init__()
    self.ends = []

  def on_train_batch_end(self, batch, logs=None):
    self.ends.append((batch, round(float(logs["loss"]), 6)))


_WEIGHTS = np.random.default_rng(1).uniform(0.1, 2.0, 64).astype("float32")


@pytest.mark.parametrize("fit_kwargs,compile_kwargs", [
    (dict(sample_weight=_WEIGHTS), {}),
    (dict(class_weight={0: 0.3, 1: 2.0, 7: 0.5}), {}),
    ({}, dict(steps_per_execution=3)),
    (dict(sample_weight=_WEIGHTS), dict(steps_per_execution=4)),
], ids=["sample_weight", "class_weight", "steps_per_execution",
        "both"])
def test_fit_contract_matches_plain_keras(fit_kwargs, compile_kwargs):
  # Per-example weights, class weights (Keras turns them into per-example
  # weights) and several batches per call: the same losses, metrics and
  # callback calls as plain Keras. 64 examples in batches of 8: with
  # steps_per_execution=3 the last call of an epoch runs 2 batches.
  x, y = _mlp().batch(64)
  runs = []
  for hooked in (False, True):
    model = _mlp().model
    kwargs = dict(optimizer="adam", loss=_loss(), metrics=["accuracy"],
                  weighted_metrics=["accuracy"], **compile_kwargs)
    if hooked:
      tfopt.compile(model, verbose=False, **kwargs)
    else:
      model.compile(**kwargs)
    counter = _CountBatches()
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False,
                        verbose=0, callbacks=[counter], **fit_kwargs).history
    runs.append((history, counter.ends))
  (plain, plain_ends), (got, got_ends) = runs
  assert set(got) == set(plain)
  for key in plain:
    np.testing.assert_allclose(got[key], plain[key], rtol=1e-6, err_msg=key)
  assert got_ends == plain_ends


def test_per_timestep_sample_weights_match_plain_keras():
  # A sequence model weighted per timestep (a padding mask), as keras-hub's
  # language-model preprocessors feed it.
  def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), dtype="int32")
    h = keras.layers.Embedding(20, 8)(inputs)
    return keras.Model(inputs, keras.layers.Dense(20)(h))

  rng = np.random.default_rng(0)
  x = rng.integers(0, 20, (16, 6)).astype("int32")
  y = rng.integers(0, 20, (16, 6)).astype("int32")
  weights = (np.arange(6)[None] < rng.integers(2, 7, (16, 1))).astype(
      "float32")
  losses = []
  for hooked in (False, True):
    model = build()
    kwargs = dict(optimizer="adam", loss=_loss(),
                  weighted_metrics=["sparse_categorical_accuracy"])
    if hooked:
      tfopt.compile(model, verbose=False, **kwargs)
    else:
      model.compile(**kwargs)
    losses.append(model.fit(x, y, sample_weight=weights, batch_size=8,
                            epochs=2, shuffle=False, verbose=0).history)
  for key in losses[0]:
    np.testing.assert_allclose(losses[1][key], losses[0][key], rtol=1e-6)
  (report,) = model.train_function.reports.values()
  assert ("sample_weight", (8, 6), "float32") in report.signature


def test_an_unbuilt_sequential_is_built_on_the_first_batch_as_keras_does():
  def unbuilt():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(3)])

  rng = np.random.default_rng(0)
  x = rng.standard_normal((64, 8)).astype("float32")
  y = (x[:, 0] > 0).astype("int32")
  plain = unbuilt()
  plain.compile(optimizer="adam", loss=_loss())
  expected = plain.fit(x, y, batch_size=16, epochs=2, shuffle=False,
                       verbose=0).history["loss"]
  model = unbuilt()
  assert not model.built
  tfopt.compile(model, optimizer="adam", loss=_loss(), verbose=False)
  got = model.fit(x, y, batch_size=16, epochs=2, shuffle=False,
                  verbose=0).history["loss"]
  assert model.built and model.train_function.reports
  np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_a_cap_below_one_input_tensor_is_refused_at_compile():
  def model(batch_size=None):
    inp = keras.Input((64, 64, 3), batch_size=batch_size, name="image")
    x = keras.layers.GlobalAveragePooling2D()(inp)
    return keras.Model(inp, keras.layers.Dense(2)(x))

  # 16 x 64 x 64 x 3 float32 = 786,432 bytes in one tensor, on one device.
  with pytest.raises(ValueError, match=r"memory_per_device.*image \(16, 64, "
                     r"64, 3\): 786,432 bytes.*Received: "
                     r"memory_per_device=500000"):
    tfopt.compile(model(16), optimizer="adam", loss="mse", placement="m-etf",
                  devices=["/device:CPU:0"], memory_per_device=500_000)
  # Batch size unknown: one example (49,152 bytes) is what must fit.
  with pytest.raises(ValueError, match=r"image \(None, 64, 64, 3\): 49,152"):
    tfopt.compile(model(), optimizer="adam", loss="mse", placement="m-etf",
                  devices=["/device:CPU:0"], memory_per_device=40_000)
  compiled = tfopt.compile(model(), optimizer="adam", loss="mse",
                           placement="m-etf", devices=["/device:CPU:0"],
                           memory_per_device=500_000)
  assert compiled.train_function is not None


def test_strategies_other_than_mirrored_are_refused_saying_why():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
    model = _mlp().model
  before = [v.numpy().copy() for v in model.weights]
  with pytest.raises(ValueError, match=r"(?s)Argument `model` must be built "
                     r"outside a tf.distribute strategy scope, or in a "
                     r"MirroredStrategy's.*plain `model.compile` under the "
                     r"strategy.*Received: model='<strategy "
                     r"OneDeviceStrategy>'"):
    tfopt.compile(model, optimizer="adam", loss=_loss())
  assert all(np.array_equal(b, v.numpy())
             for b, v in zip(before, model.weights))


def test_a_mirrored_model_trains_as_plain_keras_and_refuses_placement():
  # One replica in this process (2 replicas over logical CPUs: the
  # compatibility matrix's `mirrored` cells, in a process of their own).
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  x, y = _mlp().batch(32)
  weights = np.linspace(0.5, 1.5, 32).astype("float32")
  runs = []
  for hooked in (False, True):
    with strategy.scope():
      model = _mlp().model
      kwargs = dict(optimizer="adam", loss=_loss(), metrics=["accuracy"])
      if hooked:
        tfopt.compile(model, verbose=False, **kwargs)
      else:
        model.compile(**kwargs)
    runs.append(model.fit(x, y, sample_weight=weights, batch_size=8,
                          epochs=2, shuffle=False, verbose=0).history)
  for key in runs[0]:
    np.testing.assert_allclose(runs[1][key], runs[0][key], rtol=1e-6)
  (report,) = model.train_function.reports.values()
  assert report.replicas == 1 and report.ops_verified > 0
  with strategy.scope():
    placed = _mlp().model
  with pytest.raises(ValueError, match=r"Argument `placement` must be None "
                     r"for a model built in a \(MultiWorker\)MirroredStrategy "
                     r"scope"):
    tfopt.compile(placed, optimizer="adam", loss=_loss(), placement="auto",
                  devices=["/device:CPU:0"])
  # A train_step set on the instance (as a test harness wraps one) would be
  # bypassed by the cut at apply_gradients: refused, not ignored.
  placed.train_step = lambda data: keras.Model.train_step(placed, data)
  with pytest.raises(ValueError, match="its own train_step"):
    tfopt.compile(placed, optimizer="adam", loss=_loss())


def test_xla_with_dropout_compiles_and_draws_plain_keras_masks():
  # XLA's random generators are not TensorFlow kernels' (Keras' own
  # jit_compile=True gives this model another dropout mask): the hook
  # leaves random-number ops unmarked, so its XLA step compiles and
  # matches plain Keras without XLA.
  def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    h = keras.layers.Dense(32, activation="relu")(inputs)
    h = keras.layers.Dropout(0.3)(h)
    return keras.Model(inputs, keras.layers.Dense(3)(h))

  rng = np.random.default_rng(0)
  x = rng.standard_normal((32, 16)).astype("float32")
  y = rng.integers(0, 3, 32)
  plain = build()
  plain.compile(optimizer="adam", loss=_loss(), jit_compile=False)
  expected = plain.fit(x, y, batch_size=8, epochs=2, shuffle=False,
                       verbose=0).history["loss"]
  model = tfopt.compile(build(), optimizer="adam", loss=_loss(),
                        jit_compile=True, verbose=False)
  got = model.fit(x, y, batch_size=8, epochs=2, shuffle=False,
                  verbose=0).history["loss"]
  np.testing.assert_allclose(got, expected, rtol=1e-4)
  (report,) = model.train_function.reports.values()
  assert report.xla.startswith("XLA: ") and (
      "StatelessRandomUniformV2 x1" in report.xla), report.xla
