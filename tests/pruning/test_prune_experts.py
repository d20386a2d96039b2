"""prune_experts: removing whole experts gives a smaller model whose
outputs are exactly the dense model's where the removed experts' gates are
zero; saliencies against NumPy; merging; keras-hub Mixtral; bad input."""

import keras
import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt import zoo
from tfopt.pruning import MoE, find_moe_layers, prune_experts

D, E = 8, 6


def _moe_model(dead=(1, 4)):
  """One tfopt MoE layer on tokens whose feature 0 is 1: the router's
  column for a `dead` expert scores that feature -20, the others +2, so
  the dead experts never enter any token's top 2."""
  keras.utils.set_random_seed(0)
  inputs = keras.Input((5, D))
  outputs = MoE(E, 12, top_k=2, name="moe")(inputs)
  model = keras.Model(inputs, outputs)
  router = np.random.default_rng(0).normal(size=(D, E)) * 0.3
  router[0] = [-20.0 if e in dead else 2.0 for e in range(E)]
  model.get_layer("moe").router.assign(router)
  return model


def _tokens(n, seed):
  x = np.random.default_rng(seed).normal(size=(n, 5, D)).astype("float32")
  x[..., 0] = 1.0
  return x


def test_removing_experts_the_router_never_picks_keeps_outputs_exact():
  model = _moe_model()
  calibration, held_out = _tokens(32, 0), _tokens(16, 1)
  for method in ("reap", "frequency"):
    new, report = prune_experts(model, calibration, keep=4, method=method,
                                min_tokens=0)
    assert report.kept == [[0, 2, 3, 5]]
    assert report.tokens[0][[1, 4]].tolist() == [0, 0]
    layer = new.get_layer("moe")
    assert layer.num_experts == 4 and layer.router.shape == (D, 4)
    assert layer.gate_kernel.shape == (4, D, 12)
    np.testing.assert_allclose(new.predict(held_out, verbose=0),
                               model.predict(held_out, verbose=0),
                               rtol=1e-5, atol=1e-6)
    assert report.params_after == report.params_before - 2 * (D + 3 * D * 12)
  # The model passed in is unchanged.
  assert model.get_layer("moe").num_experts == E


def test_reap_saliency_is_gate_times_output_norm_over_routed_tokens():
  model = _moe_model(dead=())
  x = _tokens(8, 2)
  layer = model.get_layer("moe")
  tokens = x.reshape(-1, D)
  gates = np.asarray(layer.routing(tokens)[0])
  out = np.asarray(layer.expert_outputs(tokens))  # (E, T, D)
  norms = np.linalg.norm(out, axis=-1).T
  routed = gates > 0
  want = (gates * norms).sum(0) / np.maximum(routed.sum(0), 1)
  _, report = prune_experts(model, x, keep=3, method="reap", min_tokens=0)
  np.testing.assert_allclose(report.saliency[0], want, rtol=1e-4)
  assert report.kept[0] == sorted(np.argsort(-want)[:3].tolist())
  _, freq = prune_experts(model, x, keep=3, method="frequency", min_tokens=0)
  np.testing.assert_array_equal(freq.saliency[0], routed.sum(0))


def test_merge_folds_a_dropped_expert_into_its_nearest_kept_one():
  model = _moe_model(dead=())
  layer = model.get_layer("moe")
  # Expert 5 is a near copy of expert 2: merging must pick 2 for it.
  for kernel in (layer.gate_kernel, layer.up_kernel, layer.down_kernel):
    value = kernel.numpy()
    value[5] = value[2] * 1.01
    kernel.assign(value)
  x = _tokens(32, 3)
  seed = next(s for s in range(50) if 5 not in prune_experts(
      model, x, keep=5, method="random", seed=s, min_tokens=0)[1].kept[0])
  new, report = prune_experts(model, x, keep=5, method="random", seed=seed,
                              merge=True, min_tokens=0)
  assert report.merged_into[0] == {5: 2}
  n = report.tokens[0]
  assert n[2] > 0 and n[5] > 0
  i = report.kept[0].index(2)
  for name in ("gate_kernel", "up_kernel", "down_kernel"):
    old = getattr(layer, name).numpy()
    want = (old[2] * n[2] + old[5] * n[5]) / (n[2] + n[5])
    np.testing.assert_allclose(getattr(new.get_layer("moe"), name).numpy()[i],
                               want, rtol=1e-5)
  # The router keeps expert 2's column; the other kept experts are copies.
  np.testing.assert_array_equal(new.get_layer("moe").router.numpy(),
                                layer.router.numpy()[:, report.kept[0]])


def test_reference_lm_shrinks_and_trains_through_tfopt_compile():
  keras.utils.set_random_seed(0)
  zm = zoo.moe_lm(vocab_size=40, seq_len=8, num_layers=2, d_model=16,
                  num_heads=2, num_experts=8, expert_dim=16)
  x, y = zm.batch(64, seed=0)
  new, report = prune_experts(zm.model, x, keep=0.5, min_tokens=0)
  twin, _ = prune_experts(zm.model, x, keep=0.5, min_tokens=0)
  assert report.keep == 4 and len(report.kept) == 2
  assert [layer.num_experts for layer in find_moe_layers(new)] == [4, 4]
  fit = dict(batch_size=16, epochs=3, shuffle=False, verbose=0)
  new.compile(optimizer=keras.optimizers.Adam(1e-2), loss=zm.model.loss)
  before = new.evaluate(x, y, verbose=0)
  plain = new.fit(x, y, **fit).history["loss"]
  tfopt.compile(twin, optimizer=keras.optimizers.Adam(1e-2),
                loss=zm.model.loss, verbose=False)
  hooked = twin.fit(x, y, **fit).history["loss"]
  np.testing.assert_allclose(hooked, plain, rtol=1e-5)
  assert plain[-1] < before


def test_keras_hub_mixtral_loses_experts():
  keras_hub = pytest.importorskip("keras_hub")
  from keras_hub.src.models.mixtral.mixtral_backbone import MixtralBackbone  # pylint: disable=import-outside-toplevel
  del keras_hub
  keras.utils.set_random_seed(0)
  backbone = MixtralBackbone(vocabulary_size=50, num_layers=2,
                             num_query_heads=2, num_key_value_heads=1,
                             hidden_dim=32, intermediate_dim=32,
                             num_experts=4, top_k=2)
  rng = np.random.default_rng(0)
  data = {"token_ids": rng.integers(1, 50, size=(12, 8)).astype("int32"),
          "padding_mask": np.ones((12, 8), dtype="int32")}
  new, report = prune_experts(backbone, data, keep=3, min_tokens=0)
  layers = find_moe_layers(new)
  assert [layer.num_experts for layer in layers] == [3, 3]
  assert report.params_after < report.params_before
  # Each kept expert's weights are the dense model's expert, unchanged.
  old = find_moe_layers(backbone)[0].expert_bank
  kept = report.kept[0]
  np.testing.assert_array_equal(
      layers[0].expert_bank._expert_feedforward_gate_dense.numpy(),  # pylint: disable=protected-access
      old._expert_feedforward_gate_dense.numpy()[kept])  # pylint: disable=protected-access
  out = new.predict(data, verbose=0)
  assert np.isfinite(out).all() and out.shape == (12, 8, 32)


def test_bad_input_names_the_argument():
  model = _moe_model()
  x = _tokens(8, 0)
  weights = [w.copy() for w in model.get_weights()]
  with pytest.raises(ValueError, match=r"Argument `keep` must be an int in "
                     r"\[top_k=2, num_experts=6\].*Received: keep=7"):
    prune_experts(model, x, keep=7)
  with pytest.raises(ValueError, match=r"Received: keep=1"):
    prune_experts(model, x, keep=1)
  with pytest.raises(ValueError, match="Argument `method` must be one of"):
    prune_experts(model, x, keep=4, method="largest")
  # Experts 1 and 4 never get a token: the data cannot judge them.
  with pytest.raises(ValueError, match=r"Argument `data` must be .*experts "
                     r"\[1, 4\] got \[0, 0\]"):
    prune_experts(model, x, keep=4)
  for before, after in zip(weights, model.get_weights()):
    np.testing.assert_array_equal(before, after)
