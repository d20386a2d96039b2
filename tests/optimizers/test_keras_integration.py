"""The Cautious optimizers inside Keras: fit, XLA, sparse gradients,
schedules, accumulation, mixed precision, save/load, lookup, bad input."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras
from tests.optimizers import reference
from tfopt.optimizers import (CautiousAdamW, CautiousLion, CautiousMuon,
                              DecayFractionLogger, format_routing_table)

MAKERS = {
    "adamw": lambda **kw: CautiousAdamW(learning_rate=0.01, weight_decay=0.3,
                                        **kw),
    "lion": lambda **kw: CautiousLion(learning_rate=0.003, weight_decay=1.0,
                                      **kw),
    "muon": lambda **kw: CautiousMuon(learning_rate=0.01, weight_decay=0.3,
                                      **kw),
}


def _data(n=64, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 8)).astype("float32")
  y = (x @ rng.normal(size=(8, 3))).astype("float32")
  return x, y


def _model(seed=0):
  keras.utils.set_random_seed(seed)
  return keras.Sequential([
      keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
      keras.layers.LayerNormalization(), keras.layers.Dense(3)])


def _weights(model):
  return [np.asarray(w) for w in model.weights]


def _assert_close(a, b, **tol):
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, **tol)


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_eager_equals_xla_function_equals_fit_jit(name):
  x, y = _data()
  results = []
  for mode in ("eager", "function_xla", "fit_xla"):
    model = _model()
    opt = MAKERS[name]()
    if mode == "fit_xla":
      model.compile(optimizer=opt, loss="mse", jit_compile=True)
      model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    else:
      opt.build(model.trainable_variables)

      def train(xb, yb, model=model, opt=opt):
        with tf.GradientTape() as tape:
          loss = keras.losses.mean_squared_error(yb, model(xb))
          loss = tf.reduce_mean(loss)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)

      if mode == "function_xla":
        train = tf.function(train, jit_compile=True)
      for i in range(0, 64, 16):
        train(x[i:i + 16], y[i:i + 16])
    results.append(_weights(model))
  # XLA may fuse differently (FMA); Lion's sign is robust away from zero.
  _assert_close(results[0], results[1], rtol=1e-5, atol=1e-6)
  _assert_close(results[0], results[2], rtol=1e-5, atol=1e-6)
  # And something did happen.
  assert not np.allclose(results[0][0], _weights(_model())[0])


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_sparse_embedding_gradients_equal_dense(name):
  ids = tf.constant([[1, 2, 1], [7, 2, 0]])
  results = []
  for densify in (False, True):
    keras.utils.set_random_seed(1)
    layer = keras.layers.Embedding(10, 4)
    layer.build((None, 3))
    # exclude_embeddings=False: Muon treats the table as a matrix here.
    opt = (MAKERS[name](exclude_embeddings=False) if name == "muon"
           else MAKERS[name]())
    for _ in range(3):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(layer(ids) - 0.5))
      grad = tape.gradient(loss, layer.trainable_variables)[0]
      assert isinstance(grad, tf.IndexedSlices)
      if densify:
        grad = tf.convert_to_tensor(grad)
      opt.apply([grad], layer.trainable_variables)
    results.append(np.asarray(layer.embeddings))
  np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-7)


def test_learning_rate_schedule_matches_reference():
  lr0, wd, b1, b2, eps = 2.0 ** -3, 0.5, 0.5, 0.75, 2.0 ** -10
  schedule = keras.optimizers.schedules.ExponentialDecay(
      lr0, decay_steps=1, decay_rate=0.5)
  opt = CautiousAdamW(learning_rate=schedule, weight_decay=wd, beta_1=b1,
                      beta_2=b2, epsilon=eps)
  rng = np.random.default_rng(3)
  x0 = rng.normal(size=(5, 3))
  var = keras.Variable(x0)
  ref = reference.AdamRef(lr0, b1, b2, eps, wd)
  xs = [x0]
  for step in range(4):
    g = rng.normal(size=(5, 3))
    opt.apply([tf.constant(g)], [var])
    xs, _ = ref.step(xs, [g], lr=lr0 * 0.5 ** step)
  np.testing.assert_allclose(np.asarray(var), xs[0], rtol=1e-12, atol=1e-12)


def test_gradient_accumulation_is_one_step_on_the_mean():
  rng = np.random.default_rng(4)
  x0 = rng.normal(size=(4, 4)).astype("float32")
  g1, g2 = (rng.normal(size=(4, 4)).astype("float32") for _ in range(2))
  acc_var = keras.Variable(x0)
  acc_opt = CautiousLion(learning_rate=0.1, weight_decay=0.5,
                         gradient_accumulation_steps=2)
  acc_opt.apply([tf.constant(g1)], [acc_var])
  np.testing.assert_array_equal(np.asarray(acc_var), x0)  # accumulating
  acc_opt.apply([tf.constant(g2)], [acc_var])
  one = keras.Variable(x0)
  CautiousLion(learning_rate=0.1, weight_decay=0.5).apply(
      [tf.constant((g1 + g2) / 2)], [one])
  np.testing.assert_allclose(np.asarray(acc_var), np.asarray(one), rtol=1e-6)
  assert not np.allclose(np.asarray(acc_var), x0)


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_save_load_then_continue_equals_uninterrupted(name, tmp_path):
  x, y = _data()
  straight = _model()
  straight.compile(optimizer=MAKERS[name](), loss="mse")
  straight.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)

  first = _model()
  first.compile(optimizer=MAKERS[name](), loss="mse")
  first.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
  path = tmp_path / "model.keras"
  first.save(path)
  # Registered on import: no custom_objects needed.
  resumed = keras.saving.load_model(path)
  assert type(resumed.optimizer) is type(first.optimizer)
  assert resumed.optimizer.get_config() == first.optimizer.get_config()
  resumed.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
  _assert_close(_weights(resumed), _weights(straight), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_config_round_trip_and_string_lookup(name):
  opt = MAKERS[name](decay_exclude_patterns=["bias$"],
                     cautious_weight_decay=False)
  clone = type(opt).from_config(opt.get_config())
  assert clone.get_config() == opt.get_config()
  assert clone.decay_exclude_patterns == ("bias$",)
  assert type(keras.optimizers.get(f"cautious_{name}")) is type(opt)
  assert type(keras.optimizers.get(type(opt).__name__)) is type(opt)


def test_compile_with_string_name_trains():
  x, y = _data()
  model = _model()
  model.compile(optimizer="cautious_adamw", loss="mse")
  assert isinstance(model.optimizer, CautiousAdamW)
  history = model.fit(x, y, epochs=3, verbose=0)
  assert history.history["loss"][-1] < history.history["loss"][0]


def _fit_weights(make, loss_scale=None):
  """Weights after 8 steps of `fit`; with `loss_scale`, under the
  mixed_float16 policy and a LossScaleOptimizer starting at that scale."""
  x, y = _data()
  if loss_scale is not None:
    keras.mixed_precision.set_dtype_policy("mixed_float16")
  try:
    model = _model()
    opt = make()
    if loss_scale is not None:
      opt = keras.optimizers.LossScaleOptimizer(opt, initial_scale=loss_scale)
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    # A skipped (overflowing) step would leave the run a step behind.
    assert int(model.optimizer.iterations) == 8
    return _weights(model)
  finally:
    keras.mixed_precision.set_dtype_policy("float32")


def test_mixed_precision_loss_scaling():
  # lr and wd large enough that the decay moves each tensor by 2.5-5 %
  # (relative norm) in 8 steps, well above the float16 forward's noise
  # (at most 0.7 %). 2**10: the default 2**15 overflows at the first step
  # on this model, and a skipped step would dwarf the decay.
  kw = {"learning_rate": 0.01, "weight_decay": 1.0}
  scale = 2.0 ** 10
  plain = _fit_weights(
      lambda: CautiousAdamW(cautious_weight_decay=False, **kw), scale)
  assert all(w.dtype == np.float32 for w in plain)  # float32 masters
  for a, b in zip(plain, _fit_weights(
      lambda: keras.optimizers.AdamW(**kw), scale)):
    np.testing.assert_array_equal(a, b)
  # CWD under loss scaling against the same CWD in float32 without it.
  mixed = _fit_weights(lambda: CautiousAdamW(**kw), scale)
  full = _fit_weights(lambda: CautiousAdamW(**kw))
  for a, b in zip(mixed, full):
    assert np.linalg.norm(a - b) < 0.015 * np.linalg.norm(b)

  # The update itself against the NumPy reference: gradients arrive
  # multiplied by the scale, and an overflowing step is skipped (the
  # variable and Adam's step count untouched, the scale halved).
  opt = keras.optimizers.LossScaleOptimizer(CautiousAdamW(**kw),
                                            initial_scale=scale)
  rng = np.random.default_rng(5)
  x0 = rng.normal(size=(6, 4)).astype("float32")
  var = keras.Variable(x0)
  opt.build([var])
  ref = reference.AdamRef(0.01, 0.9, 0.999, 1e-7, 1.0)
  xs = [x0.astype(np.float64)]
  for step in range(5):
    if step == 2:
      before = np.asarray(var)
      opt.apply([tf.fill((6, 4), np.inf)], [var])
      np.testing.assert_array_equal(np.asarray(var), before)
      assert float(opt.dynamic_scale) == scale / 2
      continue
    g = rng.normal(size=(6, 4)).astype("float16").astype("float32")
    opt.apply([tf.constant(g * float(opt.dynamic_scale))], [var])
    xs, _ = ref.step(xs, [g.astype(np.float64)])
  np.testing.assert_allclose(np.asarray(var), xs[0], rtol=1e-5, atol=1e-6)


def test_decay_fraction_logger_in_fit():
  x, y = _data()
  model = _model()
  opt = CautiousAdamW(learning_rate=0.01, weight_decay=0.3,
                      track_decay_fraction=True)
  model.compile(optimizer=opt, loss="mse")
  history = model.fit(x, y, epochs=2, verbose=0,
                      callbacks=[DecayFractionLogger()])
  fractions = history.history["cwd_decay_fraction"]
  assert len(fractions) == 2 and all(0.0 < f < 1.0 for f in fractions)
  assert fractions[-1] == pytest.approx(float(opt.decay_fraction()))


def test_muon_routing_table_on_a_mixed_model():
  inputs = keras.Input((6,), dtype="int32")
  h = keras.layers.Embedding(50, 16, name="embed")(inputs)
  h = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8, name="mha")(h, h)
  h = keras.layers.LayerNormalization(name="norm")(h)
  h = keras.layers.Reshape((6, 16, 1))(h)
  h = keras.layers.Conv2D(4, 3, name="conv")(h)
  h = keras.layers.Flatten()(h)
  outputs = keras.layers.Dense(5, name="head")(h)
  model = keras.Model(inputs, outputs)
  opt = CautiousMuon(exclude_layers=["head"])
  opt.build(model.trainable_variables)
  table = {path: (r.optimizer, r.matrix_shape)
           for path, r in opt.routing_table().items()}
  assert table == {
      "embed/embeddings": ("adamw", None),
      "mha/query/kernel": ("muon", (16, 16)),
      "mha/query/bias": ("adamw", None),
      "mha/key/kernel": ("muon", (16, 16)),
      "mha/key/bias": ("adamw", None),
      "mha/value/kernel": ("muon", (16, 16)),
      "mha/value/bias": ("adamw", None),
      "mha/attention_output/kernel": ("muon", (16, 16)),
      "mha/attention_output/bias": ("adamw", None),
      "norm/gamma": ("adamw", None),
      "norm/beta": ("adamw", None),
      "conv/kernel": ("adamw", None),
      "conv/bias": ("adamw", None),
      "head/kernel": ("adamw", None),
      "head/bias": ("adamw", None),
  }
  # Keras' rule routes the other way round on attention.
  keras_rule = {path: r.optimizer for path, r in CautiousMuon(
      routing="keras").routing_table(model.trainable_variables).items()}
  assert keras_rule["mha/query/kernel"] == "adamw"
  assert keras_rule["mha/query/bias"] == "muon"
  conv = CautiousMuon(muon_conv_kernels=True).routing_table(
      [v for v in model.trainable_variables if v.path == "conv/kernel"])
  assert conv["conv/kernel"].matrix_shape == (9, 4)
  assert "mha/query/kernel" in format_routing_table(opt.routing_table())
  # Only Muon-routed variables lack an Adam velocity.
  velocities = [v is not None for v in opt.adam_velocities]
  assert velocities == [t == "adamw" for t, _ in table.values()]
  x = np.random.default_rng(0).integers(0, 50, size=(8, 6))
  model.compile(optimizer=opt, loss="mse", jit_compile=True)
  model.fit(x, np.zeros((8, 5), "float32"), verbose=0)
  assert all(np.isfinite(np.asarray(w)).all() for w in model.weights)


@pytest.mark.parametrize("make,message", [
    (lambda: CautiousAdamW(beta_1=1.5),
     "Argument `beta_1` must be a number in the range [0, 1). "
     "Received: beta_1=1.5"),
    (lambda: CautiousAdamW(weight_decay=-0.1),
     "Argument `weight_decay` must be a number in the range [0, inf). "
     "Received: weight_decay=-0.1"),
    (lambda: CautiousLion(learning_rate=-1.0),
     "Argument `learning_rate` must be a number in the range [0, inf). "
     "Received: learning_rate=-1.0"),
    (lambda: CautiousLion(beta_1=0.0),
     "Argument `beta_1` must be a number in the range (0, 1]. "
     "Received: beta_1=0.0"),
    (lambda: CautiousMuon(scale_mode="spectral"),
     "Argument `scale_mode` must be one of ('rms', 'keller', 'none'). "
     "Received: scale_mode='spectral'"),
    (lambda: CautiousMuon(routing="auto"),
     "Argument `routing` must be one of ('tfopt', 'keras'). "
     "Received: routing='auto'"),
    (lambda: CautiousMuon(ns_steps=0),
     "Argument `ns_steps` must be a positive integer. Received: ns_steps=0"),
    (lambda: CautiousAdamW(decay_exclude_patterns=["bias("]),
     "Argument `decay_exclude_patterns` must be a list of valid regular "
     "expressions ('bias(': missing ), unterminated subpattern at position "
     "4). Received: decay_exclude_patterns=['bias(']"),
    (lambda: CautiousMuon(exclude_layers=["head", "[a-"]),
     "Argument `exclude_layers` must be a list of valid regular expressions "
     "('[a-': unterminated character set at position 0). "
     "Received: exclude_layers=['head', '[a-']"),
    (lambda: CautiousMuon(exclude_layers="head"),
     "Argument `exclude_layers` must be a list of regular-expression "
     "strings. Received: exclude_layers='head'"),
    (lambda: CautiousAdamW(cautious_weight_decay="yes"),
     "Argument `cautious_weight_decay` must be a bool. "
     "Received: cautious_weight_decay='yes'"),
])
def test_bad_input_is_named(make, message):
  with pytest.raises(ValueError) as info:
    make()
  assert str(info.value) == message


def test_diagnostics_need_tracking_and_a_build():
  with pytest.raises(ValueError, match="track_decay_fraction=True"):
    CautiousAdamW().decay_fraction()
  with pytest.raises(ValueError, match="built optimizer"):
    CautiousAdamW(track_decay_fraction=True).decay_fraction()
  with pytest.raises(ValueError, match="built optimizer"):
    CautiousMuon().routing_table()
  with pytest.raises(ValueError, match=r"Received: every_n_batches=0"):
    DecayFractionLogger(every_n_batches=0)


def test_decay_fraction_every_n_steps_with_steps_per_execution():
  # every_n_batches=3 counts steps: with 4 steps per call the values go
  # into the logs of the calls completing steps 3, 6 and 9 of a 10-step
  # epoch (calls of 4, 4 and 2 steps, passed the end indices 3, 7 and 11),
  # each the fraction of its call's last step (indices 3, 7, 9): what one
  # step per call logs at those steps.
  x, y = _data(40)
  runs = []
  for per_call, every in ((1, 1), (4, 3)):
    model = _model()
    model.compile(CautiousAdamW(1e-2, weight_decay=0.1,
                                track_decay_fraction=True), "mse",
                  steps_per_execution=per_call)
    seen = []
    reader = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs, seen=seen: seen.append(
            (batch, logs.get("cwd_decay_fraction"))))
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[DecayFractionLogger(every_n_batches=every),
                         reader])
    runs.append({b: f for b, f in seen if f is not None})
  every_step, every_third = runs
  assert sorted(every_step) == list(range(10))
  assert sorted(every_third) == [3, 7, 11]
  for batch, fraction in every_third.items():
    assert fraction == pytest.approx(every_step[min(batch, 9)], rel=1e-5)
  assert len(set(every_step.values())) > 1  # the steps tell apart


def _run_script(module, **env):
  """Runs `python -m module` from the repo root; returns its JSON output."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
  proc = subprocess.run(
      [sys.executable, "-m", module], cwd=root, capture_output=True,
      text=True, timeout=600,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_mirrored_strategy_on_two_cpus_equals_one_device():
  result = _run_script("tests.optimizers._mirrored_script")
  for name in ("adamw", "lion", "muon"):
    assert result[name]["replicas"] == 2
    assert result[name]["max_diff"] < 1e-5, (name, result[name])
  assert 0.0 < result["adamw"]["decay_fraction"] < 1.0


@pytest.mark.slow
def test_on_keras_jax_backend_against_numpy():
  # The script also hides TensorFlow and OR-Tools: a JAX-only machine must
  # be able to import and run the optimizers.
  # jax is a test extra: missing, this check fails rather than vanishing.
  assert importlib.util.find_spec("jax") is not None, (
      "jax is not installed: `pip install -e '.[test]'` brings it")
  result = _run_script("tests.optimizers._jax_script", KERAS_BACKEND="jax",
                       JAX_PLATFORMS="cpu")
  for name in ("adamw", "lion", "muon"):
    assert result[name] < 1e-12, (name, result[name])
  assert result["fit"] == [True, True, True]
