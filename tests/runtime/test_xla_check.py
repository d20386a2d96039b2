"""The XLA step's first-batch check (`tfopt.runtime.xla`): the rule that
tells float noise amplified by an optimizer from a step that computes
something else, on hand-made numbers; and the gradients a captured step
hands its optimizer, which the check compares."""

import numpy as np
import pytest

import keras

from tfopt.graph.capture import capture_train_step
from tfopt.runtime.xla import GRADIENT_NOISE, judge_by_gradients

PAIRS = (("g_w", "w"), ("g_b", "b"))


def _adam_first_step(w, g, lr=1e-3):
  # Adam's first update is lr * sign(g) (bias-corrected m / sqrt(v)).
  return w - lr * np.sign(g)


def test_a_sign_flip_of_a_noise_gradient_is_accepted_and_counted():
  w = np.ones(4, np.float32)
  g_ref = np.array([0.5, -2.0, 3e-9, 1.0], np.float32)
  g_xla = np.array([0.5, -2.0, -4e-9, 1.0], np.float32)  # noise flips sign
  b = np.zeros(2, np.float32)
  moved = judge_by_gradients(
      {"w": _adam_first_step(w, g_ref), "b": b},
      {"w": _adam_first_step(w, g_xla), "b": b},
      {"g_w": g_ref, "g_b": b}, {"g_w": g_xla, "g_b": b}, PAIRS,
      rtol=1e-4, atol=1e-5)
  assert moved == 1


def test_a_difference_where_the_gradient_is_not_noise_is_refused():
  w = np.ones(3, np.float32)
  g = np.array([0.5, -2.0, 1.0], np.float32)
  wrong = _adam_first_step(w, g)
  wrong[1] += 2e-3  # a real weight moved the other way
  with pytest.raises(ValueError, match="variable 'w' differently where its "
                     "gradient is not noise"):
    judge_by_gradients({"w": _adam_first_step(w, g)}, {"w": wrong},
                       {"g_w": g}, {"g_w": g}, PAIRS, rtol=1e-4, atol=1e-5)


def test_gradients_must_agree_to_their_noise():
  g = np.array([100.0, 1.0], np.float32)
  # Within GRADIENT_NOISE of the largest magnitude: the same gradient.
  close = g + [0.0, 0.5 * GRADIENT_NOISE * 100]
  assert judge_by_gradients({}, {}, {"g_w": g}, {"g_w": close}, PAIRS,
                            rtol=1e-4, atol=1e-5) == 0
  far = g * [1.0, 1.1]  # 0.1 off: ten times the noise of a 100 tensor
  with pytest.raises(ValueError, match="computes gradient 'g_w' "
                     "differently: max \\|diff\\| 0.1"):
    judge_by_gradients({}, {}, {"g_w": g}, {"g_w": far}, PAIRS, rtol=1e-4,
                       atol=1e-5)


def test_a_variable_without_a_known_gradient_must_agree():
  with pytest.raises(ValueError, match="updates variable 'slot' "
                     "differently: max \\|diff\\| 0.1"):
    judge_by_gradients({"slot": np.zeros(2)}, {"slot": np.array([0, 0.1])},
                       {}, {}, PAIRS, rtol=1e-4, atol=1e-5)


def test_the_captured_step_names_each_trainable_variables_gradient():
  keras.utils.set_random_seed(0)
  inputs = keras.Input((2,), dtype="int32")
  emb = keras.layers.Embedding(10, 3, name="emb")(inputs)
  out = keras.layers.Dense(2, name="out")(keras.layers.Flatten()(emb))
  model = keras.Model(inputs, out)
  model.compile(optimizer="adam", loss="mse")
  x = np.zeros((4, 2), np.int32)
  y = np.zeros((4, 2), np.float32)
  step = capture_train_step(model, x=x, y=y)
  assert sorted(v for _, v in step.gradients) == sorted(
      v.path for v in model.trainable_variables)
  nodes = {n.name for n in step.graph_def.node}
  assert all(g.partition(":")[0] in nodes for g, _ in step.gradients)
  # The optimizer is the user's again (nothing left patched on it).
  assert "apply" not in vars(model.optimizer)
