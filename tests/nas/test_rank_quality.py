"""Judging a one-shot ranking (tfopt.nas.rank_quality): tau against the
mean of repeated stand-alone trainings and against one, the repeatability,
by SciPy and by hand; the truth table's repeats are `train_standalone`'s
own recipe at the documented seeds; the compared methods' super-networks
run the asked steps and rank every sub-graph."""

import numpy as np
import pytest
from scipy import stats

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.nas.data import digits
from tfopt.nas.rank_quality import (REPEAT_SEED_STRIDE, judge, rank_methods,
                                    repeatability, sample_archs, truth_table)
from tfopt.nas.search import train_standalone
from tfopt.nas.space import ChoiceLayer, SearchSpace, tiny64


def _rows(tests):
  return [{"arch": [f"op{i}"], "test": list(t)} for i, t in enumerate(tests)]


def test_judge_against_the_mean_one_training_and_the_repeatability():
  # Two trainings of 5 sub-graphs; the mean orders them 0 < 1 < 2 < 3 < 4.
  tests = [(0.50, 0.60), (0.70, 0.62), (0.66, 0.80), (0.80, 0.78),
           (0.90, 0.88)]
  rows = _rows(tests)
  oneshot = {("op0",): 0.1, ("op1",): 0.3, ("op2",): 0.2, ("op3",): 0.4,
             ("op4",): 0.5}
  got = judge(oneshot, rows)
  # By hand: against the mean, one of 10 pairs (op1, op2) is discordant.
  assert got["tau"] == pytest.approx(0.8)
  first = [t[0] for t in tests]
  second = [t[1] for t in tests]
  scores = [oneshot[(f"op{i}",)] for i in range(5)]
  assert got["tau_single"] == pytest.approx(
      stats.kendalltau(scores, first).statistic)
  assert repeatability(rows) == pytest.approx(
      stats.kendalltau(first, second).statistic)
  # One repeat: no repeatability; a perfect ranking: tau 1.
  single = [{"arch": r["arch"], "test": r["test"][:1]} for r in rows]
  perfect = {("op0",): 0, ("op1",): 2, ("op2",): 1, ("op3",): 3,
             ("op4",): 4}
  assert judge(perfect, single) == {"tau": 1.0, "tau_single": 1.0}
  assert repeatability(single) is None


def test_judge_by_the_test_log_likelihood():
  # The same by-hand ranking, judged by the log-likelihood truth: accuracy
  # ties broken by it (op1 and op2 tie on accuracy, not on likelihood).
  rows = [{"arch": [f"op{i}"], "test": [a, a], "test_ll": [ll, ll + 0.01]}
          for i, (a, ll) in enumerate([(0.5, -0.9), (0.7, -0.5),
                                       (0.7, -0.6), (0.9, -0.2)])]
  oneshot = {("op0",): 0.0, ("op1",): 2.0, ("op2",): 1.0, ("op3",): 3.0}
  assert judge(oneshot, rows, truth="test_ll") == {"tau": 1.0,
                                                   "tau_single": 1.0}
  # On accuracy the tie op1 = op2 costs tau-b: 5 concordant pairs of 6
  # with one tie in the truth.
  assert judge(oneshot, rows)["tau"] == pytest.approx(
      stats.kendalltau([0, 2, 1, 3], [0.5, 0.7, 0.7, 0.9]).statistic)
  assert repeatability(rows, truth="test_ll") == 1.0
  with pytest.raises(ValueError, match=r"Argument `truth` must be one of "
                     r"\('test', 'test_ll'\). Received: truth='val'"):
    judge(oneshot, rows, truth="val")


def test_judge_names_an_unscored_architecture():
  with pytest.raises(ValueError, match=r"Argument `scores` must be a score "
                     r"for every row's architecture \(missing \[\['op1'\]"):
    judge({("op0",): 1.0}, _rows([(0.5,), (0.6,)]))


def test_sample_archs_is_uniform_distinct_and_checked():
  space = tiny64()
  picked = sample_archs(space, 16, seed=3)
  indices = [space.index(a) for a in picked]
  assert len(set(picked)) == 16 and indices == sorted(indices)
  assert picked == sample_archs(space, 16, seed=3)
  assert picked != sample_archs(space, 16, seed=4)
  # Uniform: over many draws every sub-graph is picked about 16/64 of
  # the time.
  hits = np.zeros(space.size)
  for seed in range(400):
    for a in sample_archs(space, 16, seed=seed):
      hits[space.index(a)] += 1
  assert np.all(np.abs(hits / 400 - 0.25) < 0.1)
  with pytest.raises(ValueError, match=r"Argument `count` must be at most "
                     r"the space's 64 sub-graphs.*Received: count=65"):
    sample_archs(space, 65)


def _small_space():
  ops = {"conv3": {"type": "conv", "kernel": 3}, "skip": {"type": "skip"}}
  return SearchSpace("four", (8, 8, 1), 10, tuple(
      ChoiceLayer(f"l{i}", ops, 4) for i in range(2)),
      stem={"type": "conv", "kernel": 3, "filters": 4})


def test_truth_table_repeats_are_the_stand_alone_recipe_at_their_seeds():
  space = _small_space()
  split = digits(0, train=200, val=100)
  archs = [("conv3", "skip"), ("skip", "skip")]
  rows = truth_table(space, archs, split, epochs=1, seed=5, repeats=2,
                     verbose=0)
  assert [tuple(r["arch"]) for r in rows] == archs
  for row, arch in zip(rows, archs):
    for r in range(2):
      direct = train_standalone(space, arch, split, epochs=1,
                                seed=5 + REPEAT_SEED_STRIDE * r)
      assert row["test"][r] == pytest.approx(direct.test_accuracy,
                                              abs=1.5 / len(split.y_test))
      assert row["test_ll"][r] == pytest.approx(direct.test_log_likelihood,
                                                rel=0.05)
      assert row["val"][r] == pytest.approx(direct.val_accuracy,
                                             abs=1.5 / len(split.y_val))
    assert row["steps"] == direct.steps and row["params"] == direct.params
  with pytest.raises(ValueError, match="Argument `archs` must be at least 2 "
                     "distinct architectures"):
    truth_table(space, [archs[0], archs[0]], split, epochs=1, verbose=0)


def test_rank_methods_train_the_asked_steps_and_rank_every_sub_graph():
  space = _small_space()
  split = digits(1, train=64, val=100)
  methods = rank_methods(space, split, steps=2, multiples=(1, 3))
  assert set(methods) == {"accuracy@1x", "log_likelihood@1x",
                          "accuracy@3x", "log_likelihood@3x"}
  for name, m in methods.items():
    assert set(m["scores"]) == set(space.enumerate())
    # Whole epochs of 64 / 32 = 2 steps: 2 and 6 steps.
    assert m["steps"] == (2 if name.endswith("1x") else 6)
    assert m["search_s"] == pytest.approx(m["train_s"] + m["rank_s"])
    values = np.array(list(m["scores"].values()))
    if name.startswith("accuracy"):
      assert np.all((values >= 0) & (values <= 1))
      assert np.allclose(values * 100, np.round(values * 100))
    else:
      assert np.all(values < 0)  # mean log-probabilities


def test_rank_methods_check_their_arguments_before_training():
  space = _small_space()
  split = digits(1, train=64, val=100)
  with pytest.raises(ValueError, match=r"Argument `scores` must be names "
                     r"from \('accuracy', 'log_likelihood'\).*perplexity"):
    rank_methods(space, split, steps=2, scores=("perplexity",))
  with pytest.raises(ValueError, match=r"Argument `multiples` must be "
                     r"distinct positive integers"):
    rank_methods(space, split, steps=2, multiples=(1, 1))
  with pytest.raises(ValueError, match=r"Argument `multiples\[i\]`"):
    rank_methods(space, split, steps=2, multiples=(0,))


def test_the_test_log_likelihood_is_minus_keras_cross_entropy():
  import keras  # pylint: disable=import-outside-toplevel
  from tfopt.nas.search import _test_scores  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  x = rng.normal(size=(40, 5)).astype("float32")
  y = rng.integers(0, 3, size=40)
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
  accuracy, ll = _test_scores(model, x, y)
  logits = np.asarray(model(x))
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  assert ll == pytest.approx(-float(loss(y, logits)), rel=1e-5)
  assert accuracy == pytest.approx(float((logits.argmax(1) == y).mean()))
