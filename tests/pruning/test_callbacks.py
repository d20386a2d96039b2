"""MoEPruner / ExpertDistiller during fit: masks exact after fine-tuning,
gradual schedules, the distillation term and its automatic lambda."""

import keras
import numpy as np
import pytest
from keras import ops

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt import zoo
from tfopt.optimizers import CautiousAdamW
from tfopt.pruning import (ExpertDistiller, MoEPruner, adapter_for,
                           capture_inputs, find_moe_layers, installed_masks,
                           strip_pruning)


def _model(seed=0, optimizer="adam"):
  keras.utils.set_random_seed(seed)
  zm = zoo.moe_lm(vocab_size=40, seq_len=8, num_layers=2, d_model=16,
                  num_heads=2, num_experts=4, expert_dim=16,
                  optimizer=optimizer)
  x, y = zm.batch(32, seed=seed)
  return zm.model, x, y


# 16 calibration sequences of 8 tokens over 4 experts: some expert gets
# fewer than prune_moe's default min_tokens (16) and it warns (a
# TfoptWarning fails a test); these tests check masks, not statistics.
FEW = {"min_tokens": 1}


def _assert_masked(model, masks):
  values = {v.path: v.numpy() for v in model.weights}
  for path, keep in masks.items():
    assert np.all(values[path][~keep] == 0), path
    assert np.count_nonzero(values[path][keep]) == keep.sum(), path


@pytest.mark.parametrize("at_step", [0, 3])
def test_masks_exact_after_fine_tuning(at_step):
  # A decaying, momentum optimizer and a train function that was already
  # traced before pruning (at_step=3): the zeros must stay exact zeros.
  model, x, y = _model(optimizer=CautiousAdamW(1e-2, weight_decay=0.1))
  model.compile(optimizer=model.optimizer, loss=model.loss, jit_compile=True)
  pruner = MoEPruner(x[:16], method="moe_pruner", sparsity=0.5,
                     at_step=at_step, **FEW)
  model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[pruner])
  assert len(pruner.reports) == 1
  masks = installed_masks(model)
  assert len(masks) == 6
  _assert_masked(model, masks)
  for keep in masks.values():
    assert (keep.sum(axis=1) == 8).all()
  # Weights kept did train after pruning (not frozen).
  kept_before = {p: k for p, k in masks.items()}
  values = {v.path: v.numpy().copy() for v in model.weights}
  model.fit(x, y, batch_size=4, epochs=1, verbose=0)
  after = {v.path: v.numpy() for v in model.weights}
  for path, keep in kept_before.items():
    assert not np.array_equal(values[path][keep], after[path][keep])
  _assert_masked(model, masks)
  # strip_pruning lets the zeros train again.
  assert set(strip_pruning(model)) == set(masks)
  assert not installed_masks(model)
  model.fit(x, y, batch_size=4, epochs=1, verbose=0)
  regrown = sum(np.count_nonzero(v.numpy()[~masks[v.path]])
                for v in model.weights if v.path in masks)
  assert regrown > 0


# Pruned after some steps of training some expert gets no calibration
# token (pruned by magnitude, warned), identically in both runs.
@pytest.mark.filterwarnings("ignore:MoE layer .* received")
@pytest.mark.parametrize("at_step,as_one,samples,epochs", [
    (4, 4, 32, 1),  # calls begin at steps 0, 2, 4, 6
    (3, 4, 32, 1),  # the first call beginning at or after step 3: step 4
    # 7 steps an epoch (calls of 2, 2, 2, 1): the second epoch's calls
    # begin at steps 7, 9, 11, 13.
    (8, 9, 28, 2),
])
def test_at_step_counts_steps_with_steps_per_execution(at_step, as_one,
                                                       samples, epochs,
                                                       monkeypatch):
  # Two steps per call prune where one step per call prunes at `as_one`:
  # the same masks and losses. The optimizer's count is read at train
  # begin and at each epoch's begin while the pruning waits, not per call.
  from tfopt import summaries  # pylint: disable=import-outside-toplevel
  reads = []
  real = summaries.training_step
  monkeypatch.setattr(summaries, "training_step",
                      lambda model: reads.append(1) or real(model))
  runs = []
  for per_call, step in ((1, as_one), (2, at_step)):
    model, x, y = _model()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=model.loss,
                  steps_per_execution=per_call)
    pruner = MoEPruner(x[:16], sparsity=0.5, at_step=step, **FEW)
    history = model.fit(x[:samples], y[:samples], batch_size=4,
                        epochs=epochs, shuffle=False, verbose=0,
                        callbacks=[pruner])
    assert len(pruner.reports) == 1
    # Train begin and each epoch begun before the pruning.
    assert len(reads) <= 1 + epochs, len(reads)
    reads.clear()
    runs.append((history.history["loss"], installed_masks(model)))
  (loss_one, masks_one), (loss_two, masks_two) = runs
  np.testing.assert_allclose(loss_two, loss_one, rtol=1e-5)
  # The same weights pruned: calibrated after the same steps.
  assert masks_one and set(masks_two) == set(masks_one)
  for path, keep in masks_one.items():
    np.testing.assert_array_equal(masks_two[path], keep, err_msg=path)


@pytest.mark.filterwarnings("ignore:MoE layer .* received")
def test_at_step_after_an_epoch_whose_last_call_ran_past_steps_per_epoch():
  # Over repeating data with steps_per_epoch=7 and two steps per call,
  # Keras runs 8 steps in the first epoch (its last call runs 2): the
  # second epoch begins at step 8, where at_step=8 prunes, as one step per
  # call does over 8 steps an epoch. Counting 7 steps for the first epoch
  # would prune 2 steps later.
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  runs = []
  for per_call, steps_per_epoch in ((1, 8), (2, 7)):
    model, x, y = _model()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=model.loss,
                  steps_per_execution=per_call)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat()
    pruner = MoEPruner(x[:16], sparsity=0.5, at_step=8, **FEW)
    model.fit(data, steps_per_epoch=steps_per_epoch, epochs=2, verbose=0,
              callbacks=[pruner])
    assert int(model.optimizer.iterations) == 16
    assert len(pruner.reports) == 1
    runs.append(installed_masks(model))
  masks_one, masks_two = runs
  assert masks_one and set(masks_two) == set(masks_one)
  for path, keep in masks_one.items():
    np.testing.assert_array_equal(masks_two[path], keep, err_msg=path)


def test_gradual_schedule_nested_masks():
  model, x, y = _model()
  pruner = MoEPruner(x[:16], method="wanda", sparsity=0.75, **FEW,
                     gradual=(0, 6, 3))
  model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[pruner])
  assert len(pruner.reports) == 3
  sizes = [r.sparsity for r in pruner.reports]
  # Cubic schedule s (1 - (1 - i/3)^3): 0.528, 0.722, 0.75 -> floor(s * 16)/16.
  assert sizes == pytest.approx([8 / 16, 11 / 16, 12 / 16])
  for early, late in zip(pruner.reports, pruner.reports[1:]):
    for path in early.masks:
      assert not np.any(late.masks[path] & ~early.masks[path])
  _assert_masked(model, installed_masks(model))


def test_pruner_argument_errors():
  with pytest.raises(ValueError, match="Argument `gradual` must be None "
                     "with an N:M pattern"):
    MoEPruner(np.zeros((2, 8)), pattern="2:4", gradual=(0, 5, 2))
  with pytest.raises(ValueError, match="Argument `gradual` must be"):
    MoEPruner(np.zeros((2, 8)), sparsity=0.5, gradual=(5, 1, 2))
  with pytest.raises(ValueError, match="Argument `at_step` must be"):
    MoEPruner(np.zeros((2, 8)), at_step=-1)


def _expert_term(student, teacher, x):
  """The distillation term by hand: per layer, per expert, the mean over
  routed tokens of the mean squared output difference."""
  total = 0.0
  s_layers, t_layers = find_moe_layers(student), find_moe_layers(teacher)
  with capture_inputs(s_layers) as capture:
    student(x, training=False)
  for s, t in zip(s_layers, t_layers):
    tokens = capture.of(s)[0]
    a = adapter_for(s)
    routed = np.asarray(a.gates(s, tokens)) > 0
    so = np.asarray(a.expert_outputs(s, tokens), np.float64)
    to = np.asarray(a.expert_outputs(t, tokens), np.float64)
    for e in range(routed.shape[1]):
      r = routed[:, e]
      if r.any():
        total += ((so[e][r] - to[e][r]) ** 2).mean()
  return total


def test_distiller_term_and_auto_lambda():
  teacher, x, y = _model()
  student, _, _ = _model()
  student.set_weights(teacher.get_weights())
  pruner = MoEPruner(x[:16], sparsity=0.5, **FEW)
  pruner.set_model(student)
  pruner.on_train_begin()
  expected = _expert_term(student, teacher, x[:4])
  assert expected > 0
  distiller = ExpertDistiller(teacher)
  first_loss = []
  record = keras.callbacks.LambdaCallback(
      on_train_batch_end=lambda b, logs: first_loss.append(
          float(logs["loss"])))
  student.fit(x[:4], y[:4], batch_size=4, epochs=1, verbose=0, shuffle=False,
              callbacks=[record, distiller])
  # First batch: lambda 0, the term measured, then lambda = loss / term (the
  # logged loss: cross-entropy plus the load-balancing loss).
  term = float(ops.convert_to_numpy(distiller.term))
  assert term == pytest.approx(expected, rel=1e-4)
  assert distiller.lambda_value == pytest.approx(first_loss[0] / term,
                                                 rel=1e-6)
  assert float(ops.convert_to_numpy(distiller.lam)) == pytest.approx(
      distiller.lambda_value, rel=1e-6)
  assert not any("call" in vars(l) for l in find_moe_layers(student))


def test_auto_lambda_scale_with_steps_per_execution():
  # Two steps per call: the term adds up over both, the logged loss is
  # their mean; lambda stays at the scale one step per call gives. Both
  # steps see the same batch and the second step's weights differ only by
  # one tiny Adam step, so the two steps' terms and losses nearly agree.
  lambdas = []
  for per_call in (1, 2):
    teacher, x, y = _model()
    student, _, _ = _model()
    student.set_weights(teacher.get_weights())
    student.compile(optimizer=keras.optimizers.Adam(1e-6),
                    loss=student.loss, steps_per_execution=per_call)
    pruner = MoEPruner(x[:16], sparsity=0.5, **FEW)
    distiller = ExpertDistiller(teacher)
    twice = np.concatenate([x[:4], x[:4]]), np.concatenate([y[:4], y[:4]])
    student.fit(*twice, batch_size=4, epochs=1, verbose=0, shuffle=False,
                callbacks=[pruner, distiller])
    lambdas.append(distiller.lambda_value)
  assert lambdas[1] == pytest.approx(lambdas[0], rel=0.01)


def test_distiller_lambda_guarded_at_zero_sparsity():
  teacher, x, y = _model()
  student, _, _ = _model()
  student.set_weights(teacher.get_weights())
  distiller = ExpertDistiller(teacher)
  with pytest.warns(UserWarning, match="lambda is set to 0"):
    student.fit(x[:4], y[:4], batch_size=4, epochs=1, verbose=0,
                callbacks=[distiller])
  assert distiller.lambda_value == 0.0
  assert np.isfinite(student.evaluate(x[:4], y[:4], verbose=0))


def test_distillation_pulls_experts_toward_teacher():
  # With a fixed lambda the term must shrink faster than without it.
  def run(lam):
    teacher, x, y = _model()
    student, _, _ = _model()
    student.set_weights(teacher.get_weights())
    pruner = MoEPruner(x[:16], sparsity=0.5, **FEW)
    callbacks = [pruner] + ([ExpertDistiller(teacher, lambda_=lam)]
                            if lam else [])
    student.compile(keras.optimizers.Adam(3e-3), student.loss)
    student.fit(x, y, batch_size=8, epochs=6, verbose=0,
                callbacks=callbacks)
    return _expert_term(student, teacher, x[:8])

  assert run(100.0) < 0.7 * run(0.0)


def test_distiller_teacher_mismatch():
  student, x, y = _model()
  other = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
  with pytest.raises(ValueError, match="recognised MoE layer"):
    student.fit(x[:4], y[:4], verbose=0,
                callbacks=[ExpertDistiller(other)])
  with pytest.raises(ValueError, match="Argument `lambda_`"):
    ExpertDistiller(student, lambda_=-1.0)
