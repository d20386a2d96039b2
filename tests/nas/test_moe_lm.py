"""One-shot NAS over a keras-hub Qwen3-MoE LM (`tfopt.nas.moe_lm`): each
sub-network of the entangled super-network against the standalone
keras-hub model of its config (keras-hub's own forward pass and parameter
count are the oracles), sampling under constraints, and the perplexity
ranking on hand-computed cases."""

import keras
import numpy as np
import pytest

from tfopt.nas import Constraints, PathSampler
from tfopt.nas import moe_lm

pytest.importorskip("keras_hub")

VOCAB, SEQ = 64, 12
ARCHS = [("L1", "E2", "k1", "m16"), ("L2", "E4", "k2", "m32"),
         ("L2", "E2", "k2", "m16"), ("L1", "E4", "k1", "m32")]


@pytest.fixture(scope="module")
def space():
  return moe_lm.moe_lm_space(VOCAB, sequence_length=SEQ)


@pytest.fixture(scope="module")
def net(space):
  return moe_lm.MoELMSuperNet(space)


def _tokens(n, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, VOCAB, (n, SEQ + 1)).astype("int32")
  mask = np.ones((n, SEQ), "int32")
  mask[0, SEQ // 2:] = 0  # one padded example
  x = {"token_ids": ids[:, :-1] * mask, "padding_mask": mask}
  return x, ids[:, 1:] * mask, mask.astype("float32")


def test_the_space_is_a_search_space_of_values(space):
  assert space.size == 16
  assert [l.name for l in space.layers] == list(moe_lm.CHOICES)
  assert space.describe(ARCHS[0]) == (
      "layers=L1 > experts=E2 > top_k=k1 > expert_width=m16")
  assert moe_lm.arch_values(space, ARCHS[1]) == {
      "layers": 2, "experts": 4, "top_k": 2, "expert_width": 32}


@pytest.mark.parametrize("arch", ARCHS)
def test_a_sub_network_is_the_standalone_keras_hub_model(space, net, arch):
  x, _, _ = _tokens(3)
  net.set_arch(arch)
  child = net.subnet(arch)
  assert child.count_params() == space.param_count(arch)
  np.testing.assert_allclose(net.predict(x, verbose=0),
                             child.predict(x, verbose=0), atol=1e-6)


def test_sampled_training_moves_only_the_sampled_slices(space):
  # With the top of each choice removed, the super-network's extra expert,
  # extra hidden units and second layer get no gradient: Adam without
  # weight decay leaves them exactly as they were.
  net = moe_lm.MoELMSuperNet(space, seed=1)
  constraints = Constraints()
  for layer, op in (("layers", "L2"), ("experts", "E4"),
                    ("expert_width", "m32")):
    constraints.remove_op(space, layer, op)
  net.compile(optimizer=keras.optimizers.Adam(1e-2),
              loss=keras.losses.SparseCategoricalCrossentropy(
                  from_logits=True))
  decoders = net.lm.backbone.transformer_layers
  bank = decoders[0].mlp.expert_bank
  before = {
      "layer 2": [w.numpy() for w in decoders[1].weights],
      "experts 3-4": bank._expert_feedforward_output_dense.numpy()[2:],
      "units 17-32": bank._expert_feedforward_output_dense.numpy()[:2, 16:],
  }
  x, y, w = _tokens(16)
  sampler = PathSampler(constraints=constraints, seed=0)
  net.fit(x, y, sample_weight=w, batch_size=4, epochs=1, verbose=0,
          callbacks=[sampler])
  assert sum(sampler.counts.values()) == 4
  assert all(constraints.admits(space, a) for a in sampler.counts)
  after = {
      "layer 2": [w.numpy() for w in decoders[1].weights],
      "experts 3-4": bank._expert_feedforward_output_dense.numpy()[2:],
      "units 17-32": bank._expert_feedforward_output_dense.numpy()[:2, 16:],
  }
  for key in ("experts 3-4", "units 17-32"):
    np.testing.assert_array_equal(after[key], before[key], err_msg=key)
  for a, b in zip(after["layer 2"], before["layer 2"]):
    np.testing.assert_array_equal(a, b)
  # ... while the sampled slice did train.
  moved = bank._expert_feedforward_output_dense.numpy()[:2, :16]
  assert not np.allclose(moved, keras.ops.convert_to_numpy(
      moe_lm.MoELMSuperNet(space, seed=1).lm.backbone.transformer_layers[0]
      .mlp.expert_bank._expert_feedforward_output_dense)[:2, :16])


def test_perplexity_of_uniform_logits_is_the_vocabulary_size():
  class Uniform(keras.Model):
    def call(self, x):
      return keras.ops.zeros(x["token_ids"].shape + (VOCAB,))

  x, y, w = _tokens(4)
  assert moe_lm.token_perplexity(Uniform(), x, y, w) == pytest.approx(VOCAB)


def test_perplexity_counts_only_weighted_tokens():
  # Logits that put all mass on token 1: perplexity 1 where the target is
  # 1, huge elsewhere; only the weighted positions count.
  class OnOne(keras.Model):
    def call(self, x):
      return 50.0 * keras.ops.one_hot(keras.ops.ones_like(x["token_ids"]),
                                      VOCAB)

  x, _, _ = _tokens(2)
  y = np.full((2, SEQ), 1, "int32")
  y[:, -1] = 5
  w = np.ones((2, SEQ), "float32")
  w[:, -1] = 0.0
  assert moe_lm.token_perplexity(OnOne(), x, y, w) == pytest.approx(1.0)
  with pytest.raises(ValueError, match="sample_weight"):
    moe_lm.token_perplexity(OnOne(), x, y, np.zeros_like(w))


def test_ranking_covers_the_space_and_marks_exclusions(space, net):
  x, y, w = _tokens(8, seed=3)
  constraints = Constraints()
  constraints.remove_op(space, "top_k", "k1")
  ranking = moe_lm.rank_lm(net, x, y, w, constraints=constraints)
  assert len(ranking.perplexity) == space.size
  values = [p for _, p in ranking.perplexity]
  assert values == sorted(values)
  assert sorted(ranking.excluded) == sorted(
      a for a in space.enumerate() if a[2] == "k1")
  assert ranking.top()[0][2] == "k2"
  # Each score is the sub-network's own perplexity.
  arch, score = ranking.perplexity[-1]
  assert moe_lm.token_perplexity(net.subnet(arch), x, y, w) == \
      pytest.approx(score, rel=1e-5)
  assert ranking.params[arch] == space.param_count(arch)


def test_bad_spaces_are_refused():
  with pytest.raises(ValueError, match="Argument `top_k` must be values at "
                     "most the fewest experts"):
    moe_lm.moe_lm_space(VOCAB, experts=(2, 4), top_k=(1, 4))
  with pytest.raises(ValueError, match="Argument `layers` must be a "
                     "non-empty tuple"):
    moe_lm.moe_lm_space(VOCAB, layers=())
  with pytest.raises(ValueError, match="Argument `space`"):
    moe_lm.MoELMSuperNet("not a space")
