"""Ranking sub-graphs of a trained `SuperNet` with inherited weights.

Each candidate architecture is scored by validation accuracy with the shared
weights, after **recalibrating BatchNorm** on calibration data: the moving
statistics the super-network accumulated mix every path that was sampled,
so without recalibration the ranking is garbage. Recalibration resets the
moving mean/variance of every BatchNorm on the path and replaces them by the
plain average over the calibration batches of the batch statistics (the
cumulative-average momentum 1 - 1/(k+1) at batch k).

The candidates are every allowed architecture when there are at most
`max_exhaustive`, else `samples` uniform draws (distinct). Component
fitness: for each (layer, op), the mean score of the ranked sub-graphs
containing it and how many there were.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
from keras import ops

from tfopt._errors import check_positive_int, invalid_argument


@dataclasses.dataclass
class Ranking:
  """Scores of the ranked sub-graphs, best first, and component fitness
  {(layer, op): (mean score, count)}."""
  scores: list  # [(arch, accuracy)]
  components: dict

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


def recalibrate_batchnorm(net, x_cal, batch_size: int = 64) -> None:
  """Re-estimates the moving statistics of the active path's BatchNorm
  layers on `x_cal` (their weights are untouched)."""
  norms = _batch_norms(path_blocks(net, net.arch()))
  saved = [bn.momentum for bn in norms]
  try:
    for bn in norms:
      bn.moving_mean.assign(ops.zeros_like(bn.moving_mean))
      bn.moving_variance.assign(ops.ones_like(bn.moving_variance))
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


def rank(net, x_cal, x_val, y_val, allowed=None, max_exhaustive: int = 256,
         samples: int = 100, seed: int = 0, recalibrate: bool = True,
         verbose: int = 1) -> Ranking:
  """Scores sub-graphs of `net` (a trained `SuperNet`); see the module doc.

  The active path and every BatchNorm's moving statistics are restored
  afterwards: ranking leaves the super-network as it was.
  """
  from tfopt.nas.supernet import SuperNet  # pylint: disable=import-outside-toplevel
  if not isinstance(net, SuperNet):
    raise invalid_argument("net", "a tfopt.nas.SuperNet", type(net).__name__)
  check_positive_int("max_exhaustive", max_exhaustive)
  check_positive_int("samples", samples)
  x_val, y_val = np.asarray(x_val), np.asarray(y_val)
  if len(x_val) != len(y_val) or not len(x_val):
    raise invalid_argument("y_val", f"one label per x_val row ({len(x_val)})",
                           y_val.shape)
  space = net.space
  allowed_ops = space.allowed_ops(allowed)
  total = int(np.prod([len(o) for o in allowed_ops]))
  if total <= max_exhaustive:
    candidates = list(space.enumerate(allowed))
  else:
    rng = np.random.default_rng(seed)
    seen: dict = {}
    while len(seen) < min(samples, total):
      seen.setdefault(space.sample(rng, allowed), None)
    candidates = list(seen)
  original = net.arch()
  bar = keras.utils.Progbar(len(candidates), unit_name="sub-graph",
                            verbose=verbose) if verbose else None
  norms = _batch_norms([net.stem] + [b for c in net.choices for b in c])
  saved = [(bn.moving_mean.numpy(), bn.moving_variance.numpy())
           for bn in norms]
  scores = []
  try:
    for i, arch in enumerate(candidates):
      net.set_arch(arch)
      if recalibrate:
        recalibrate_batchnorm(net, x_cal)
      scores.append((arch, accuracy(net, x_val, y_val)))
      if bar is not None:
        bar.update(i + 1)
  finally:
    net.set_arch(original)
    for bn, (mean, var) in zip(norms, saved):  # the super-network as it was
      bn.moving_mean.assign(mean)
      bn.moving_variance.assign(var)
  scores.sort(key=lambda item: (-item[1], space.index(item[0])))
  components = {}
  for i, layer in enumerate(space.layers):
    for op in allowed_ops[i]:
      hits = [s for arch, s in scores if arch[i] == op]
      components[(layer.name, op)] = (float(np.mean(hits)) if hits
                                      else float("nan"), len(hits))
  return Ranking(scores, components)
