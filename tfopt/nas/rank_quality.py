"""How far a one-shot ranking holds up: Kendall tau against stand-alone
training on sub-graphs it was not tuned on, beside the ground truth's own
noise.

One stand-alone training is itself a noisy measurement of a sub-graph: on a
few hundred test images, two trainings of the same sub-graph from different
initializations differ by about as much as close sub-graphs do. So the
truth here is each sub-graph trained `repeats` times (initialization and
shuffling seeds `seed + 1000 * r`; repeat 0 is `train_standalone`'s own
recipe), scored by its mean test accuracy (`truth="test"`) or by its
mean test log-likelihood (`truth="test_ll"`: the mean log-probability of
the true class on the same test images, continuous where the accuracy of a
few hundred images moves in steps), and the **repeatability** is the tau
between two repeats: how well one stand-alone training ranks another. A one-shot ranking is judged against the mean and against repeat
0 alone (the footing of the repeatability: not a ceiling, a ranking can
agree with one training better than a second training does).

- `sample_archs(space, count, seed)`: `count` distinct sub-graphs drawn
  uniformly (the held-out set), in enumeration order.
- `truth_table(space, archs, split, ...)`: rows {arch, test, test_ll,
  val, steps, params} with one entry per repeat in each of `test`,
  `test_ll` and `val`.
- `judge(scores, rows, truth)`: tau against the mean and against repeat 0.
- `repeatability(rows, truth)`: repeat 0 against repeat 1 (a property of
  the truth, the same for every ranking judged against it).
"""

from __future__ import annotations

import time

import keras
import numpy as np

from tfopt._errors import check_positive_int, invalid_argument
from tfopt.nas.ranking import SCORES, rank
from tfopt.nas.search import kendall_tau, train_standalone, train_supernet
from tfopt.nas.space import SearchSpace

REPEAT_SEED_STRIDE = 1000
TRUTHS = ("test", "test_ll")  # test accuracy, test log-likelihood


def sample_archs(space: SearchSpace, count: int, seed: int = 0) -> list:
  """`count` distinct architectures of `space` drawn uniformly with `seed`,
  in the space's enumeration order."""
  check_positive_int("count", count)
  if count > space.size:
    raise invalid_argument("count", f"at most the space's {space.size} "
                           "sub-graphs", count)
  rng = np.random.default_rng(seed)
  picked = sorted(rng.choice(space.size, size=count, replace=False))
  return [space.arch_at(int(i)) for i in picked]


def truth_table(space: SearchSpace, archs, split, epochs: int = 15,
                seed: int = 0, repeats: int = 2, verbose: int = 1) -> list:
  """Each of `archs` trained stand-alone `repeats` times on `split` (see
  the module doc): rows {arch, test: [..], val: [..], steps, params}."""
  check_positive_int("repeats", repeats)
  archs = [space.check_arch(a) for a in archs]
  if len(set(archs)) != len(archs) or len(archs) < 2:
    raise invalid_argument("archs", "at least 2 distinct architectures",
                           archs)
  bar = keras.utils.Progbar(len(archs) * repeats, unit_name="training",
                            verbose=verbose) if verbose else None
  rows = []
  for arch in archs:
    runs = []
    for r in range(repeats):
      runs.append(train_standalone(space, arch, split, epochs=epochs,
                                   seed=seed + REPEAT_SEED_STRIDE * r))
      if bar is not None:
        bar.add(1)
    rows.append({"arch": list(arch),
                 "test": [x.test_accuracy for x in runs],
                 "test_ll": [x.test_log_likelihood for x in runs],
                 "val": [x.val_accuracy for x in runs],
                 "steps": runs[0].steps, "params": runs[0].params})
  return rows


def judge(scores, rows, truth: str = "test") -> dict:
  """Kendall tau-b of one-shot `scores` ({arch: score}, higher is better;
  every row's arch must be scored) against `rows` of `truth_table` by
  their `truth` (one of TRUTHS): {"tau": vs the mean over repeats,
  "tau_single": vs repeat 0}."""
  tests = _truth(rows, truth)
  scores = {tuple(a): s for a, s in dict(scores).items()}
  missing = [r["arch"] for r in rows if tuple(r["arch"]) not in scores]
  if missing:
    raise invalid_argument("scores", "a score for every row's "
                           f"architecture (missing {missing[:3]})",
                           f"{len(scores)} scores")
  oneshot = [scores[tuple(r["arch"])] for r in rows]
  return {"tau": kendall_tau(oneshot, tests.mean(axis=1)),
          "tau_single": kendall_tau(oneshot, tests[:, 0])}


def repeatability(rows, truth: str = "test") -> float | None:
  """Kendall tau-b of repeat 0 against repeat 1 of `truth_table` rows by
  their `truth`: how well one stand-alone training ranks another (None
  with one repeat)."""
  tests = _truth(rows, truth)
  return kendall_tau(tests[:, 0], tests[:, 1]) if tests.shape[1] > 1 \
      else None


def _truth(rows, truth: str) -> np.ndarray:
  """[archs, repeats] of `truth` (checked) from truth_table rows."""
  if truth not in TRUTHS:
    raise invalid_argument("truth", f"one of {TRUTHS}", truth)
  return np.array([r[truth] for r in rows], np.float64)


def rank_methods(space: SearchSpace, split, steps: int, seed: int = 0,
                 multiples=(1, 2), scores=("accuracy", "log_likelihood"),
                 calibration: int = 500, max_exhaustive: int = 256) -> dict:
  """The one-shot methods compared by the NAS benchmark: for each multiple
  m, a super-network trained for m * `steps` steps (uniform single path),
  ranked under each of `scores` (`tfopt.nas.rank`: every sub-graph up to
  `max_exhaustive` of them, else those evolution visits). Returns
  {f"{score}@{m}x": {"scores": {arch: score}, "steps", "train_s",
  "rank_s", "search_s"}}; search_s = train_s + rank_s (wall seconds)."""
  check_positive_int("steps", steps)
  multiples, scores = tuple(multiples), tuple(scores)
  for m in multiples:
    check_positive_int("multiples[i]", m)
  if not multiples or len(set(multiples)) != len(multiples):
    raise invalid_argument("multiples", "distinct positive integers",
                           multiples)
  if not scores or any(s not in SCORES for s in scores):
    raise invalid_argument("scores", f"names from {tuple(SCORES)}", scores)
  x_cal = split.x_train[:calibration]
  methods = {}
  for m in multiples:
    began = time.perf_counter()
    net, _, sampler = train_supernet(space, split, m * steps, seed=seed)
    train_s = time.perf_counter() - began
    for score in scores:
      began = time.perf_counter()
      ranking = rank(net, x_cal, split.x_val, split.y_val, verbose=0,
                     max_exhaustive=max_exhaustive, score=score)
      rank_s = time.perf_counter() - began
      methods[f"{score}@{m}x"] = {
          "scores": {tuple(a): s for a, s in ranking.scores},
          "steps": sum(sampler.counts.values()), "train_s": train_s,
          "rank_s": rank_s, "search_s": train_s + rank_s}
  return methods
