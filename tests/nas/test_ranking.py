"""Ranking with inherited weights: BatchNorm recalibration against a NumPy
oracle, exhaustive and sampled candidates, component fitness, no side
effects on the super-network; kendall_tau against SciPy."""

import keras
import numpy as np
import pytest
from scipy import stats

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.nas.ranking import rank, recalibrate_batchnorm
from tfopt.nas.search import kendall_tau
from tfopt.nas.space import tiny64
from tfopt.nas.supernet import SuperNet


def _data(n, seed):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(n, 8, 8, 1)).astype("float32") + 0.5,
          rng.integers(0, 10, size=n).astype("int32"))


@pytest.fixture(scope="module")
def trained():
  keras.utils.set_random_seed(0)
  net = SuperNet(tiny64(filters=4))
  net.compile(keras.optimizers.Adam(1e-2),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  x, y = _data(64, 0)
  net.fit(x, y, epochs=2, batch_size=16, verbose=0)
  return net


def test_recalibration_is_the_average_of_batch_statistics(trained):
  net = trained
  x_cal, _ = _data(96, 1)
  recalibrate_batchnorm(net, x_cal, batch_size=32)
  conv, bn = net.stem.layers[0], net.stem.layers[1]
  feats = np.asarray(conv(x_cal), np.float64).reshape(3, 32, -1, 4)
  means = feats.mean(axis=(1, 2))
  variances = feats.var(axis=(1, 2))  # biased, as BatchNormalization's
  np.testing.assert_allclose(bn.moving_mean.numpy(), means.mean(0),
                             rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(bn.moving_variance.numpy(), variances.mean(0),
                             rtol=1e-4, atol=1e-6)
  assert bn.momentum == pytest.approx(0.99)  # put back


def test_exhaustive_ranking_and_components(trained):
  net = trained
  x_cal, _ = _data(32, 2)
  x_val, y_val = _data(40, 3)
  allowed = {"layer1": ["skip"], "layer2": ["conv3", "maxpool"]}
  ranking = rank(net, x_cal, x_val, y_val, allowed=allowed, verbose=0)
  assert len(ranking.scores) == 4 * 1 * 2
  assert {a for a, _ in ranking.scores} == set(
      net.space.enumerate(allowed))
  values = [s for _, s in ranking.scores]
  assert values == sorted(values, reverse=True)
  # Each score is, by default, the mean log-probability of the true class
  # on that path after recalibration; with score="accuracy" its accuracy.
  assert ranking.score == "log_likelihood"
  by_accuracy = dict(rank(net, x_cal, x_val, y_val, allowed=allowed,
                          verbose=0, score="accuracy").scores)
  arch, best = ranking.scores[0]
  net.set_arch(arch)
  recalibrate_batchnorm(net, x_cal)
  logits = np.asarray(net(x_val, training=False), np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  assert best == pytest.approx(logp[np.arange(len(y_val)), y_val].mean())
  assert by_accuracy[arch] == pytest.approx(
      (logits.argmax(-1) == y_val).mean())
  mean, count = ranking.components[("layer2", "maxpool")]
  hits = [s for a, s in ranking.scores if a[2] == "maxpool"]
  assert count == 4 and mean == pytest.approx(np.mean(hits))
  assert ("layer1", "conv3") not in ranking.components
  # The super-network is as it was: path and BatchNorm statistics.
  net.set_arch(("skip", "skip", "skip"))
  stats = [v.numpy().copy() for v in net.non_trainable_weights]
  rank(net, x_cal, x_val, y_val, allowed=allowed, verbose=0)
  assert net.arch() == ("skip", "skip", "skip")
  for v, s in zip(net.non_trainable_weights, stats):
    if "active_path" not in v.path:
      np.testing.assert_array_equal(v.numpy(), s)


def test_sampled_ranking_when_space_is_large(trained):
  x, y = _data(16, 4)
  ranking = rank(trained, x, x, y, max_exhaustive=4, samples=5, seed=1,
                 verbose=0)
  assert len(ranking.scores) == len({a for a, _ in ranking.scores}) == 5
  assert len(ranking.top(3)) == 3


def test_rank_errors(trained):
  x, y = _data(8, 5)
  with pytest.raises(ValueError, match="one label per x_val row"):
    rank(trained, x, x, y[:3], verbose=0)
  with pytest.raises(ValueError, match="a tfopt.nas.SuperNet"):
    rank(keras.Sequential([keras.Input((2,))]), x, x, y, verbose=0)


def test_constraints_restrict_what_is_ranked(trained):
  from tfopt.nas.steering import Constraints
  space = trained.space
  x, y = _data(16, 6)
  c = Constraints()
  c.remove_op(space, "layer0", "skip")
  c.lock_layer(space, "layer1", "conv3")
  c.select(space, [("conv3", "conv3", "conv3"), ("skip", "conv3", "skip"),
                   ("maxpool", "conv3", "maxpool")])
  ranking = rank(trained, x, x, y, constraints=c, verbose=0)
  assert {a for a, _ in ranking.scores} == {("conv3", "conv3", "conv3"),
                                            ("maxpool", "conv3", "maxpool")}
  assert ("layer0", "skip") not in ranking.components
  sampled = rank(trained, x, x, y, constraints=c, strategy="random",
                 samples=10, verbose=0)
  assert len(sampled.scores) == 2  # all there is


def test_evolution_finds_the_optimum_of_a_known_landscape():
  # An oracle landscape on 4^6 = 4096 sub-graphs: the score counts conv3
  # ops; the optimum (all conv3) is one sub-graph.
  from tfopt.nas.ranking import _candidates_random, _evolve
  from tfopt.nas.space import ChoiceLayer, SearchSpace
  ops = {"conv3": {"type": "conv", "kernel": 3},
         "conv5": {"type": "conv", "kernel": 5},
         "maxpool": {"type": "maxpool"}, "skip": {"type": "skip"}}
  space = SearchSpace("six", (8, 8, 1), 10, tuple(
      ChoiceLayer(f"l{i}", ops, 4) for i in range(6)))
  score = lambda arch: sum(op == "conv3" for op in arch)  # noqa: E731
  draw = lambda rng: space.sample(rng)  # noqa: E731
  found = 0
  random_best = []
  for seed in range(5):
    rng = np.random.default_rng(seed)
    evaluated = _evolve(space, draw, lambda a: True, 200, rng, score)
    assert len(evaluated) == len(set(evaluated)) == 200
    found += max(map(score, evaluated)) == 6
    random_best.append(max(map(score, _candidates_random(
        draw, 200, np.random.default_rng(seed)))))
  assert found >= 4            # evolution climbs to the optimum
  assert max(random_best) < 6  # 200 random draws of 4096 do not


def test_rank_strategy_errors(trained):
  x, y = _data(8, 7)
  with pytest.raises(ValueError, match="Argument `strategy` must be one of"):
    rank(trained, x, x, y, strategy="bayes", verbose=0)
  with pytest.raises(ValueError, match="Argument `constraints`"):
    rank(trained, x, x, y, constraints={"remove": {}}, verbose=0)


def test_log_likelihood_score_against_numpy(trained):
  from tfopt.nas.ranking import log_likelihood
  x, y = _data(20, 8)
  trained.set_arch(("conv3", "skip", "maxpool"))
  logits = np.asarray(trained(x, training=False), np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  expected = logp[np.arange(20), y].mean()
  assert log_likelihood(trained, x, y, batch_size=7) == pytest.approx(
      expected, rel=1e-5)
  ranking = rank(trained, x, x, y, score="log_likelihood", verbose=0,
                 allowed={"layer0": ["conv3"], "layer1": ["skip"]})
  assert all(s < 0 for _, s in ranking.scores)
  with pytest.raises(ValueError, match="Argument `score` must be one of"):
    rank(trained, x, x, y, score="f1", verbose=0)


def test_in_graph_sampling_ranks_and_exports_the_paths_it_names(
    trained, tmp_path):
  # A super-network that draws its path inside training calls: ranking's
  # BatchNorm recalibration and export call it with training=True, and used
  # to draw random paths there. Oracle: its twin without in-graph sampling,
  # same weights, gives the same scores and the same exported sub-graph.
  from tfopt.nas.export import export_subgraph
  sampling = SuperNet(tiny64(filters=4), in_graph_sampling=True, seed=5)
  sampling.set_weights(trained.get_weights())
  x_cal, _ = _data(64, 6)
  x_val, y_val = _data(40, 7)
  allowed = {"layer1": ["skip", "conv3"], "layer2": ["maxpool"]}
  expected = rank(trained, x_cal, x_val, y_val, allowed=allowed, verbose=0,
                  score="log_likelihood")
  got = rank(sampling, x_cal, x_val, y_val, allowed=allowed, verbose=0,
             score="log_likelihood")
  assert dict(got.scores) == pytest.approx(dict(expected.scores), rel=1e-6)
  arch = ("conv3", "conv3", "maxpool")
  sampling.set_arch(arch)
  recalibrate_batchnorm(sampling, x_cal)
  assert sampling.arch() == arch  # not redrawn
  probe, _ = _data(8, 8)
  outs = []
  for net, name in ((trained, "plain"), (sampling, "sampling")):
    done = export_subgraph(net, arch, str(tmp_path / name), x_cal=x_cal,
                           probe=probe)
    outs.append(np.asarray(keras.saving.load_model(done.keras_path)(
        probe, training=False)))
  np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("a,b,tau", [
    ([1, 2, 3], [10, 20, 30], 1.0),
    ([1, 2, 3], [3, 2, 1], -1.0),
    # 6 pairs, (2, 3) swapped: (5 - 1) / 6.
    ([1, 2, 3, 4], [1, 3, 2, 4], 2 / 3),
    # a ties its first two: 2 of a's 3 pairs untied, all 3 of b's, both
    # untied pairs concordant: 2 / sqrt(2 * 3).
    ([1, 1, 2], [1, 2, 3], 2 / 6 ** 0.5),
    # a ties (0,1) and (2,3); of its 4 other pairs (0,2) (0,3) (1,2) agree
    # with b, (1,3) does not; b has no tie: (3 - 1) / sqrt(4 * 6).
    ([0, 0, 1, 1], [0, 1, 2, 0.5], 2 / 24 ** 0.5),
])
def test_kendall_tau_hand_computed(a, b, tau):
  assert kendall_tau(a, b) == pytest.approx(tau, abs=1e-12)
  assert kendall_tau(b, a) == pytest.approx(tau, abs=1e-12)


def test_kendall_tau_with_ties_equals_scipy():
  rng = np.random.default_rng(0)
  for trial in range(300):
    n = int(rng.integers(2, 25))
    # Few distinct values in half the trials: many ties.
    levels = 4 if trial % 2 else 1000
    a = rng.integers(0, levels, size=n).astype(float)
    b = rng.integers(0, levels, size=n) + 0.5 * a
    expected = stats.kendalltau(a, b, variant="b").statistic
    if np.isnan(expected):  # one side constant: SciPy says undefined
      assert kendall_tau(a, b) == 0.0
    else:
      assert kendall_tau(a, b) == pytest.approx(expected, abs=1e-12)


def test_kendall_tau_bad_shapes_are_named():
  for a, b in (([1, 2], [1, 2, 3]), ([1], [1]), ([[1, 2]], [[1, 2]])):
    with pytest.raises(ValueError, match="Argument `b`"):
      kendall_tau(a, b)
