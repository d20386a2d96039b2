"""Cautious optimizers against float64 NumPy references and Keras' own."""

import numpy as np
import pytest
import tensorflow as tf

import keras
from tests.optimizers import reference
from tfopt.optimizers import (CautiousAdamW, CautiousLion, CautiousMuon,
                              cautious_mask)

# Dyadic hyperparameters: exact in binary, so float64 agreement is ~1e-15.
LR, WD, B1, B2, EPS = 2.0 ** -4, 2.0 ** -1, 0.5, 0.75, 2.0 ** -10


def _variables(dtype="float64", seed=0):
  rng = np.random.default_rng(seed)
  return [keras.Variable(rng.normal(size=(6, 4)).astype(dtype), name="w"),
          keras.Variable(rng.normal(size=(4,)).astype(dtype), name="bias"),
          keras.Variable(rng.normal(size=(4, 2, 3)).astype(dtype),
                         name="q_kernel")]


def _grads(step, like, dtype="float64"):
  rng = np.random.default_rng(100 + step)
  return [rng.normal(size=v.shape).astype(dtype) for v in like]


def _run(opt, steps=5, dtype="float64"):
  variables = _variables(dtype)
  for s in range(steps):
    opt.apply([tf.constant(g) for g in _grads(s, variables, dtype)],
              variables)
  return [np.asarray(v) for v in variables]


def _run_ref(ref, steps=5, **kw):
  xs = [np.asarray(v) for v in _variables()]
  for s in range(steps):
    result = ref.step(xs, _grads(s, xs), **kw)
    xs = result[0] if isinstance(result, tuple) else result
  return xs


@pytest.mark.parametrize("cautious", [True, False])
def test_adamw_matches_numpy_reference(cautious):
  ours = _run(CautiousAdamW(learning_rate=LR, weight_decay=WD, beta_1=B1,
                            beta_2=B2, epsilon=EPS,
                            cautious_weight_decay=cautious))
  ref = _run_ref(reference.AdamRef(LR, B1, B2, EPS, WD, cautious))
  for a, b in zip(ours, ref):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cautious", [True, False])
def test_lion_matches_numpy_reference(cautious):
  ours = _run(CautiousLion(learning_rate=LR, weight_decay=WD, beta_1=B1,
                           beta_2=B2, cautious_weight_decay=cautious))
  ref = _run_ref(reference.LionRef(LR, B1, B2, WD, cautious))
  for a, b in zip(ours, ref):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scale_mode", ["rms", "keller", "none"])
@pytest.mark.parametrize("cautious", [True, False])
def test_muon_matches_numpy_reference_in_float64(cautious, scale_mode):
  # Keras' own Muon cannot run float64; ours must, with the 3-D kernel
  # orthogonalized as a (4, 6) matrix and the bias on the AdamW fallback.
  opt = CautiousMuon(learning_rate=LR, weight_decay=WD,
                     adam_weight_decay=WD / 2, adam_beta_1=B1,
                     adam_beta_2=B2, epsilon=EPS, momentum=0.75,
                     adam_lr_ratio=0.5, scale_mode=scale_mode,
                     cautious_weight_decay=cautious)
  ours = _run(opt)
  assert [r.matrix_shape for r in opt.routing_table().values()] == [
      (6, 4), None, (4, 6)]
  ref = reference.MuonRef(LR, 0.75, WD, WD / 2, B1, B2, EPS,
                          scale_mode=scale_mode, adam_lr_ratio=0.5,
                          cautious=cautious)
  expected = _run_ref(ref, matrix_shapes=[(6, 4), None, (4, 6)])
  for a, b in zip(ours, expected):
    np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)


KERAS_TWINS = [
    (lambda: CautiousAdamW(weight_decay=0.1, cautious_weight_decay=False),
     lambda: keras.optimizers.AdamW(weight_decay=0.1)),
    (lambda: CautiousAdamW(weight_decay=0.1, amsgrad=True,
                           cautious_weight_decay=False),
     lambda: keras.optimizers.AdamW(weight_decay=0.1, amsgrad=True)),
    (lambda: CautiousLion(weight_decay=0.1, cautious_weight_decay=False),
     lambda: keras.optimizers.Lion(weight_decay=0.1)),
    (lambda: CautiousMuon(cautious_weight_decay=False, routing="keras",
                          weight_decay=0.1, adam_weight_decay=0.05),
     lambda: keras.optimizers.Muon(weight_decay=0.1, adam_weight_decay=0.05)),
]


def _float32_run(make, jit):
  variables = _variables("float32")[:2]  # Keras' Muon: 2-D and 1-D only
  opt = make()
  opt.build(variables)

  def apply(grads):
    opt.apply(grads, variables)

  if jit:
    apply = tf.function(apply, jit_compile=True)
  for s in range(4):
    apply([tf.constant(g) for g in _grads(s, variables, "float32")])
  return opt, [np.asarray(v) for v in variables + list(opt.variables)]


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("pair", KERAS_TWINS,
                         ids=["adamw", "adamw-amsgrad", "lion", "muon"])
def test_cwd_off_is_keras_bit_for_bit(pair, jit):
  ours_opt, ours = _float32_run(pair[0], jit)
  keras_opt, theirs = _float32_run(pair[1], jit)
  # Same optimizer variables in the same order (checkpoints interchange).
  assert [tuple(v.shape) for v in ours_opt.variables] == [
      tuple(v.shape) for v in keras_opt.variables]
  for a, b in zip(ours, theirs):
    np.testing.assert_array_equal(a, b)


def test_zero_decay_is_keras_adam_bit_for_bit():
  # With nothing to decay the cautious path must be exactly Keras' step.
  _, ours = _float32_run(lambda: CautiousAdamW(weight_decay=0.0), False)
  _, theirs = _float32_run(lambda: keras.optimizers.Adam(), False)
  for a, b in zip(ours, theirs):
    np.testing.assert_array_equal(a, b)


def _one_signed_step(make, x_sign, g_sign):
  x = keras.Variable(np.full((3, 4), 0.5 * x_sign, "float32"))
  opt = make()
  # Rank one and positive: Muon's orthogonalized update keeps the signs too.
  g = tf.constant(np.outer(np.linspace(1, 2, 3), np.linspace(1, 3, 4))
                  .astype("float32") * g_sign)
  for _ in range(3):
    opt.apply([g], [x])
  return np.asarray(x)


@pytest.mark.parametrize("name,ours,plain,no_decay", [
    ("adamw", lambda: CautiousAdamW(weight_decay=0.5),
     lambda: keras.optimizers.AdamW(weight_decay=0.5),
     lambda: keras.optimizers.AdamW(weight_decay=0.0)),
    ("lion", lambda: CautiousLion(weight_decay=0.5),
     lambda: keras.optimizers.Lion(weight_decay=0.5),
     lambda: keras.optimizers.Lion()),
    ("muon", lambda: CautiousMuon(weight_decay=0.5),
     lambda: keras.optimizers.Muon(weight_decay=0.5),
     lambda: keras.optimizers.Muon(weight_decay=0.0)),
])
def test_mask_extremes(name, ours, plain, no_decay):
  del name
  # g > 0 and x > 0: every update agrees with x -> decoupled decay, exactly.
  np.testing.assert_array_equal(_one_signed_step(ours, 1, 1),
                                _one_signed_step(plain, 1, 1))
  # g < 0 and x > 0: every update disagrees -> no decay at all.
  np.testing.assert_array_equal(_one_signed_step(ours, 1, -1),
                                _one_signed_step(no_decay, 1, -1))


def test_ties_decay_and_zero_parameters_stay_put():
  np.testing.assert_array_equal(
      np.asarray(cautious_mask(np.array([0.0, 0.0, 1.0]),
                               np.array([1.0, -1.0, -1.0]))),
      [True, True, False])
  # Lion with a zero gradient and zero momentum: u = 0, a tie, so CWD decays
  # exactly like plain decay; a zero parameter does not move.
  x = keras.Variable(np.array([1.0, -2.0, 0.0]))
  CautiousLion(learning_rate=0.25, weight_decay=0.5).apply(
      [tf.zeros(3, "float64")], [x])
  np.testing.assert_array_equal(np.asarray(x), [1 - 0.125, -2 + 0.25, 0.0])


def test_decay_fraction_is_the_mask_mean():
  opt = CautiousAdamW(learning_rate=LR, weight_decay=WD, beta_1=B1,
                      beta_2=B2, epsilon=EPS, track_decay_fraction=True)
  variables = _variables()
  ref = reference.AdamRef(LR, B1, B2, EPS, WD)
  xs = [np.asarray(v) for v in variables]
  for s in range(3):
    grads = _grads(s, variables)
    opt.apply([tf.constant(g) for g in grads], variables)
    xs, masks = ref.step(xs, grads)
  expected = sum(m.sum() for m in masks) / sum(m.size for m in masks)
  assert 0.0 < expected < 1.0
  assert float(opt.decay_fraction()) == pytest.approx(expected, abs=1e-7)


def test_decay_exclusions_keras_list_and_patterns():
  def bias_after(opt):
    return _run(opt, steps=3)[1]
  no_decay = bias_after(CautiousAdamW(weight_decay=0.0))
  decayed = bias_after(CautiousAdamW(weight_decay=0.5))
  assert not np.allclose(no_decay, decayed)
  by_pattern = CautiousAdamW(weight_decay=0.5,
                             decay_exclude_patterns=[r"^bias$"])
  np.testing.assert_array_equal(bias_after(by_pattern), no_decay)
  by_keras = CautiousAdamW(weight_decay=0.5)
  by_keras.exclude_from_weight_decay(var_names=["bias"])
  np.testing.assert_array_equal(bias_after(by_keras), no_decay)
  # The other variables are still decayed.
  kernel = _run(CautiousAdamW(weight_decay=0.5,
                              decay_exclude_patterns=[r"^bias$"]), 3)[0]
  assert not np.allclose(kernel,
                         _run(CautiousAdamW(weight_decay=0.0), 3)[0])
