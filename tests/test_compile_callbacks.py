"""tfopt.compile with the callbacks a user combines it with: MoE pruning
(masks installed mid-fit), expert-wise distillation and MFU monitoring.
Each pair trains as the same callbacks do on plain Keras (loss trajectory,
masks), and the hook is still the step after the callbacks changed it."""

import keras
import numpy as np
import pytest

import tfopt
from tfopt import zoo
from tfopt.pruning import ExpertDistiller, MoEPruner, installed_masks
from tfopt.scale.mfu import MFUMonitor

# A tiny calibration set leaves some expert without tokens (pruned by
# magnitude, with a warning), identically on both twins.
pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:MoE layer .* received")]

FIT = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)


def _moe(seed=0):
  keras.utils.set_random_seed(seed)
  zm = zoo.moe_lm(vocab_size=40, seq_len=8, num_layers=2, d_model=16,
                  num_heads=2, num_experts=4, expert_dim=16)
  x, y = zm.batch(32, seed=seed)
  return zm.model, x, y


def _twins(seed=0):
  """The same model twice: plain Keras, and through tfopt.compile."""
  plain, x, y = _moe(seed)
  plain.compile(optimizer=keras.optimizers.Adam(1e-2), loss=plain.loss)
  hooked, _, _ = _moe(seed)
  tfopt.compile(hooked, optimizer=keras.optimizers.Adam(1e-2),
                loss=hooked.loss, verbose=False)
  return plain, hooked, x, y


def _is_hook(model):
  return type(model.train_function).__name__ == "_OptimizedTrainFunction"


def test_pruning_mid_fit_keeps_the_hook_and_its_losses():
  plain, hooked, x, y = _twins()
  # at_step=3: the hook's step is captured and running when the masks come.
  callbacks = [lambda: MoEPruner(x[:32], sparsity=0.5, at_step=3,
                                 min_tokens=1)]
  expected = plain.fit(x, y, callbacks=[c() for c in callbacks],
                       **FIT).history["loss"]
  losses = hooked.fit(x, y, callbacks=[c() for c in callbacks],
                      **FIT).history["loss"]
  np.testing.assert_allclose(losses, expected, rtol=1e-5)
  assert _is_hook(hooked)
  # The masks hold on the hooked model's weights, as on the plain one's.
  masks = installed_masks(hooked)
  assert masks and set(masks) == set(installed_masks(plain))
  weights = {v.path: v.numpy() for v in hooked.weights}
  for path, keep in masks.items():
    assert np.all(weights[path][~keep] == 0), path


@pytest.mark.parametrize("method", ["moe_pruner", "router_obs"])
def test_distillation_with_the_hook_matches_plain_keras(method):
  teacher, x, y = _moe(seed=1)
  teacher.compile(optimizer="adam", loss=teacher.loss)
  plain, hooked, _, _ = _twins()
  for model in (plain, hooked):
    model.set_weights(teacher.get_weights())
  expected = plain.fit(x, y, callbacks=[
      MoEPruner(x[:32], method=method, sparsity=0.5, min_tokens=1),
      ExpertDistiller(teacher, lambda_=0.5)], **FIT).history["loss"]
  losses = hooked.fit(x, y, callbacks=[
      MoEPruner(x[:32], method=method, sparsity=0.5, min_tokens=1),
      ExpertDistiller(teacher, lambda_=0.5)], **FIT).history["loss"]
  np.testing.assert_allclose(losses, expected, rtol=1e-5)
  assert _is_hook(hooked)


def test_mfu_monitor_with_the_hook():
  plain, hooked, x, y = _twins()
  reference = MFUMonitor((x[:8], y[:8]), peak_flops=1e12)
  expected = plain.fit(x, y, callbacks=[reference], **FIT).history["loss"]
  monitor = MFUMonitor((x[:8], y[:8]), peak_flops=1e12)
  history = hooked.fit(x, y, callbacks=[monitor], **FIT).history
  np.testing.assert_allclose(history["loss"], expected, rtol=1e-5)
  assert _is_hook(hooked)
  # The same step's FLOPs; each epoch's first step is no sample: 2 x 3.
  assert monitor.flops_per_step == reference.flops_per_step > 0
  assert len(monitor.step_times) == 6
  assert all(0 < e["mfu"] < 1 for e in monitor.epochs)


@pytest.mark.usefixtures("mfu_ticking_clock")
def test_mfu_monitor_with_the_hook_and_steps_per_execution():
  # 4 batches an epoch, 2 per call: one clean call of 2 steps per epoch,
  # its time counted as 2 steps, as on plain Keras. The monitor's clock
  # ticks a second per read: a call (one read) is 1 s, a step 1/2 s.
  runs = []
  for hooked in (False, True):
    model, x, y = _moe()
    kwargs = dict(optimizer=keras.optimizers.Adam(1e-2), loss=model.loss,
                  steps_per_execution=2)
    if hooked:
      tfopt.compile(model, verbose=False, **kwargs)
    else:
      model.compile(**kwargs)
    monitor = MFUMonitor((x[:8], y[:8]), peak_flops=1e12)
    losses = model.fit(x, y, callbacks=[monitor], **FIT).history["loss"]
    runs.append((losses, monitor))
  (expected, reference), (losses, monitor) = runs
  np.testing.assert_allclose(losses, expected, rtol=1e-5)
  assert _is_hook(model)
  assert monitor.step_counts == reference.step_counts == [2, 2]
  assert monitor.step_times == reference.step_times == [0.5, 0.5]
  assert monitor.flops_per_step == reference.flops_per_step > 0
  assert all(0 < e["mfu"] < 1 for e in monitor.epochs)


def test_a_plain_compile_afterwards_is_plain_keras_again():
  _, hooked, x, y = _twins()
  hooked.fit(x, y, **FIT)
  hooked.compile(optimizer="adam", loss=hooked.loss)
  hooked.fit(x, y, **FIT)
  assert not _is_hook(hooked)


def test_nas_search_with_the_hook_matches_plain_keras():
  # A mask-execution super-network (every op runs, the path weights it)
  # with PathSampler: the same paths drawn and the same losses as plain
  # Keras; a switch network (functional Case ops) likewise.
  from tfopt.nas.sampler import PathSampler
  from tfopt.nas.space import tiny64
  from tfopt.nas.supernet import SuperNet
  rng = np.random.default_rng(0)
  x = rng.normal(size=(32, 8, 8, 1)).astype("float32")
  y = rng.integers(0, 10, 32).astype("int32")
  runs = []
  for hooked in (False, True):
    keras.utils.set_random_seed(0)
    net = SuperNet(tiny64(filters=4), execution="mask")
    kwargs = dict(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    if hooked:
      tfopt.compile(net, verbose=False, **kwargs)
    else:
      net.compile(**kwargs)
    sampler = PathSampler(seed=0)
    losses = net.fit(x, y, callbacks=[sampler], **FIT).history["loss"]
    runs.append((losses, dict(sampler.counts)))
  np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-5)
  assert runs[1][1] == runs[0][1]
  assert _is_hook(net)
  # execution="switch" runs one path per batch through functional control
  # flow (Case/If ops): the hook keeps them whole, with plain Keras' losses.
  switched = []
  for hooked in (False, True):
    keras.utils.set_random_seed(0)
    switch = SuperNet(tiny64(filters=4), execution="switch")
    kwargs = dict(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    if hooked:
      tfopt.compile(switch, verbose=False, **kwargs)
    else:
      switch.compile(**kwargs)
    switched.append(switch.fit(x, y, callbacks=[PathSampler(seed=0)],
                               **FIT).history["loss"])
  np.testing.assert_allclose(switched[1], switched[0], rtol=1e-5)
  assert _is_hook(switch)
