"""Ranking sub-graphs of a trained `SuperNet` with inherited weights.

Each candidate architecture is scored on validation data (by default the
mean log-probability of the true class; or accuracy) with the shared
weights, after **recalibrating BatchNorm** on calibration data: the moving
statistics the super-network accumulated mix every path that was sampled,
so without recalibration the ranking is garbage. Recalibration resets the
moving mean/variance of every BatchNorm on the path and replaces them by the
plain average over the calibration batches of the batch statistics (the
cumulative-average momentum 1 - 1/(k+1) at batch k).

The candidates are every admitted architecture when there are at most
`max_exhaustive`, else `samples` sub-graphs chosen by regularized evolution
(Real et al.: tournament selection, one-layer mutation, aging) or uniform
draws. Component
fitness: for each (layer, op), the mean score of the ranked sub-graphs
containing it and how many there were.
"""

from __future__ import annotations

import contextlib
import dataclasses

import keras
import numpy as np
from keras import ops

from tfopt._errors import check_positive_int, invalid_argument


# `rank`'s score by default (see its doc for why).
DEFAULT_SCORE = "log_likelihood"


@dataclasses.dataclass
class Ranking:
  """Scores of the ranked sub-graphs, best first, and component fitness
  {(layer, op): (mean score, count)}."""
  scores: list  # [(arch, score)]: `score` names which
  components: dict
  strategy: str = "exhaustive"
  score: str = DEFAULT_SCORE

  def top(self, k: int = 1) -> list:
    return [arch for arch, _ in self.scores[:k]]


def _batch_norms(blocks) -> list:
  found = []
  for block in blocks:
    for layer in block._flatten_layers(include_self=True, recursive=True):  # pylint: disable=protected-access
      if isinstance(layer, keras.layers.BatchNormalization):
        found.append(layer)
  return found


def path_blocks(net, arch) -> list:
  """The stem and the op blocks an architecture runs through."""
  arch = net.space.check_arch(arch)
  return [net.stem] + [candidates[layer.op_names.index(op)] for op, candidates,
                       layer in zip(arch, net.choices, net.space.layers)]


@contextlib.contextmanager
def preserved_state(net, blocks=None):
  """Restores the active path and the moving statistics of the BatchNorm
  layers in `blocks` (default: every block of `net`) on exit."""
  if blocks is None:
    blocks = [net.stem] + [b for c in net.choices for b in c]
  norms = _batch_norms(blocks)
  saved = [(bn.moving_mean.numpy(), bn.moving_variance.numpy())
           for bn in norms]
  original = net.arch()
  try:
    yield
  finally:
    net.set_arch(original)
    for bn, (mean, var) in zip(norms, saved):
      bn.moving_mean.assign(mean)
      bn.moving_variance.assign(var)


def recalibrate_batchnorm(net, x_cal, batch_size: int = 64) -> None:
  """Re-estimates the moving statistics of the active path's BatchNorm
  layers on `x_cal` (their weights are untouched); a network that samples
  its path in the graph runs the active one throughout."""
  norms = _batch_norms(path_blocks(net, net.arch()))
  saved = [bn.momentum for bn in norms]
  fixed = getattr(net, "fixed_path", contextlib.nullcontext)
  try:
    for bn in norms:
      bn.moving_mean.assign(ops.zeros_like(bn.moving_mean))
      bn.moving_variance.assign(ops.ones_like(bn.moving_variance))
    with fixed():
      for k, start in enumerate(range(0, len(x_cal), batch_size)):
        for bn in norms:  # new = m * old + (1 - m) * batch: a running mean
          bn.momentum = 1.0 - 1.0 / (k + 1)
        net(x_cal[start:start + batch_size], training=True)
  finally:
    for bn, momentum in zip(norms, saved):
      bn.momentum = momentum


def accuracy(net, x, y, batch_size: int = 256) -> float:
  """Top-1 accuracy of the active path (inference mode)."""
  correct = 0
  for start in range(0, len(x), batch_size):
    logits = ops.convert_to_numpy(net(x[start:start + batch_size],
                                      training=False))
    correct += int((logits.argmax(-1) == y[start:start + batch_size]).sum())
  return correct / len(x)


def log_likelihood(net, x, y, batch_size: int = 256) -> float:
  """Mean log-probability of the true class under the active path
  (inference mode): a proper scoring rule, less grainy than accuracy on a
  few hundred validation images."""
  total = 0.0
  for start in range(0, len(x), batch_size):
    logits = ops.convert_to_numpy(net(x[start:start + batch_size],
                                      training=False)).astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    total += float(logp[np.arange(len(logp)),
                        y[start:start + batch_size]].sum())
  return total / len(x)


STRATEGIES = ("auto", "exhaustive", "random", "evolution")
SCORES = {"accuracy": accuracy, "log_likelihood": log_likelihood}


def _candidates_random(draw, samples, rng):
  seen: dict = {}
  for _ in range(50 * samples):  # distinct draws; a small region runs dry
    if len(seen) >= samples:
      break
    seen.setdefault(draw(rng), None)
  return list(seen)


def _evolve(space, draw, admits, samples, rng, score, population=16,
            tournament=4):
  """Regularized (aging) evolution: a random population, then `samples`
  minus its size children, each the winner of a random tournament with one
  layer mutated to another allowed op; the oldest member dies. Returns the
  evaluated architectures; `score(arch)` caches."""
  allowed = space.allowed_ops()
  evaluated = {}
  alive = []
  for arch in _candidates_random(draw, min(population, samples), rng):
    evaluated[arch] = score(arch)
    alive.append(arch)
  stale = 0
  while len(evaluated) < samples and stale < 20 * samples:
    pool = [alive[i] for i in rng.choice(len(alive),
                                         min(tournament, len(alive)),
                                         replace=False)]
    parent = max(pool, key=lambda a: evaluated[a])
    layer = int(rng.integers(len(parent)))
    options = [op for op in allowed[layer] if op != parent[layer]]
    child = list(parent)
    child[layer] = options[int(rng.integers(len(options)))] if options \
        else parent[layer]
    child = tuple(child)
    if child in evaluated or not admits(child):
      stale += 1
      continue
    evaluated[child] = score(child)
    alive.append(child)
    if len(alive) > population:
      alive.pop(0)
  return list(evaluated)


def rank(net, x_cal, x_val, y_val, allowed=None, max_exhaustive: int = 256,
         samples: int = 100, seed: int = 0, recalibrate: bool = True,
         verbose: int = 1, constraints=None, strategy: str = "auto",
         score: str = DEFAULT_SCORE) -> Ranking:
  """Scores sub-graphs of `net` (a trained `SuperNet`); see the module doc.

  `constraints` (a `tfopt.nas.Constraints`) replaces `allowed`: removed
  ops, locks, region and limits are never ranked. `strategy`: "exhaustive"
  (every admitted sub-graph), "random" (`samples` distinct draws),
  "evolution" (regularized evolution evaluating `samples` sub-graphs) or
  "auto" (exhaustive up to `max_exhaustive` admitted sub-graphs, else
  evolution). `score`: "log_likelihood" (mean log-probability of the
  true class; the default: it ranked closer to stand-alone training than
  accuracy on every seed of `python -m benchmarks.nas`, on tiny64 and on
  the held-out space of `--part=ranking`) or "accuracy" (top-1 on the
  validation data). The active path and every BatchNorm's moving
  statistics are restored afterwards: ranking leaves the super-network as
  it was.
  """
  from tfopt.nas.supernet import SuperNet  # pylint: disable=import-outside-toplevel
  from tfopt.nas.steering import Constraints  # pylint: disable=import-outside-toplevel
  if not isinstance(net, SuperNet):
    raise invalid_argument("net", "a tfopt.nas.SuperNet", type(net).__name__)
  check_positive_int("max_exhaustive", max_exhaustive)
  check_positive_int("samples", samples)
  if strategy not in STRATEGIES:
    raise invalid_argument("strategy", f"one of {STRATEGIES}", strategy)
  if score not in SCORES:
    raise invalid_argument("score", f"one of {tuple(SCORES)}", score)
  metric = SCORES[score]
  x_val, y_val = np.asarray(x_val), np.asarray(y_val)
  if len(x_val) != len(y_val) or not len(x_val):
    raise invalid_argument("y_val", f"one label per x_val row ({len(x_val)})",
                           y_val.shape)
  space = net.space
  if constraints is None:
    constraints = Constraints.from_allowed(space, allowed)
  elif not isinstance(constraints, Constraints):
    raise invalid_argument("constraints", "a tfopt.nas.Constraints",
                           type(constraints).__name__)
  draw = constraints.sampler(space)  # validates
  admitted = constraints.admitted(space)
  admits = lambda arch: constraints.admits(space, arch)  # noqa: E731
  if strategy == "auto":
    strategy = "exhaustive" if admitted is not None and \
        len(admitted) <= max_exhaustive else "evolution"
  if strategy == "exhaustive" and admitted is None:
    raise invalid_argument("strategy", "'random' or 'evolution' for a space "
                           "this large", strategy)
  rng = np.random.default_rng(seed)
  budget = len(admitted) if strategy == "exhaustive" else samples
  if admitted is not None:
    budget = min(budget, len(admitted))
  bar = keras.utils.Progbar(budget, unit_name="sub-graph",
                            verbose=verbose) if verbose else None
  cache: dict = {}

  def evaluate(arch):
    if arch not in cache:
      net.set_arch(arch)
      if recalibrate:
        recalibrate_batchnorm(net, x_cal)
      cache[arch] = metric(net, x_val, y_val)
      if bar is not None:
        bar.update(min(len(cache), budget))
    return cache[arch]

  with preserved_state(net):  # the super-network as it was
    if strategy == "exhaustive":
      candidates = admitted
    elif strategy == "random":
      candidates = _candidates_random(draw, budget, rng)
    else:
      candidates = _evolve(space, draw, admits, budget, rng, evaluate)
    scores = [(arch, evaluate(arch)) for arch in candidates]
  scores.sort(key=lambda item: (-item[1], space.index(item[0])))
  allowed_ops = space.allowed_ops(constraints.allowed_ops(space))
  components = {}
  for i, layer in enumerate(space.layers):
    for op in allowed_ops[i]:
      hits = [s for arch, s in scores if arch[i] == op]
      components[(layer.name, op)] = (float(np.mean(hits)) if hits
                                      else float("nan"), len(hits))
  return Ranking(scores, components, strategy, score)
