"""The training loops a search runs: the one-shot super-network (single-path
uniform sampling) and stand-alone training of one sub-graph (the ground
truth a one-shot ranking is judged against, and the retraining of the
chosen sub-graphs). Both count optimizer steps, the compute unit in which
one-shot and exhaustive search are compared.
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np

from tfopt._errors import check_positive_int, invalid_argument
from tfopt.nas.sampler import PathSampler
from tfopt.nas.space import SearchSpace
from tfopt.nas.supernet import SuperNet


@dataclasses.dataclass
class StandaloneResult:
  arch: tuple
  val_accuracy: float
  test_accuracy: float
  steps: int
  params: int
  # Mean log-probability of the true class on the test set: the same
  # test as test_accuracy, but continuous (a few hundred test images move
  # the accuracy in steps of a fraction of a point).
  test_log_likelihood: float | None = None


def make_loss():
  return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_optimizer(lr: float, total_steps: int):
  # Cosine decay to 0 over the run: the same recipe for the super-network
  # and every stand-alone sub-graph.
  return keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(
      lr, decay_steps=max(1, total_steps)))


def _steps(n: int, batch_size: int) -> int:
  return math.ceil(n / batch_size)


def _accuracy(model, x, y) -> float:
  return _test_scores(model, x, y)[0]


def _test_scores(model, x, y) -> tuple[float, float]:
  """(accuracy, mean log-probability of the true class) of `model`'s
  logits on (x, y)."""
  logits = np.asarray(model.predict(x, batch_size=512, verbose=0),
                      np.float64)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
  y = np.asarray(y).astype(int)
  return (float((logits.argmax(-1) == y).mean()),
          float(log_probs[np.arange(len(y)), y].mean()))


def train_standalone(space: SearchSpace, arch, split, epochs: int = 20,
                     batch_size: int = 32, lr: float = 3e-3, seed: int = 0
                     ) -> StandaloneResult:
  """Trains sub-graph `arch` from scratch on `split.x_train` (a
  `tfopt.nas.data.Split`) and scores it on validation and test."""
  check_positive_int("epochs", epochs)
  check_positive_int("batch_size", batch_size)
  arch = space.check_arch(arch)
  keras.utils.set_random_seed(seed)
  model = SuperNet(space).subnet(arch)  # fresh weights
  steps = epochs * _steps(len(split.x_train), batch_size)
  model.compile(make_optimizer(lr, steps), make_loss())
  model.fit(split.x_train, split.y_train, batch_size=batch_size,
            epochs=epochs, verbose=0, shuffle=True)
  test_accuracy, test_ll = _test_scores(model, split.x_test, split.y_test)
  return StandaloneResult(arch, _accuracy(model, split.x_val, split.y_val),
                          test_accuracy, steps, int(model.count_params()),
                          test_ll)


def train_supernet(space: SearchSpace, split, steps: int,
                   batch_size: int = 32, lr: float = 3e-3, seed: int = 0,
                   execution: str = "switch", constraints=None,
                   constraints_file: str | None = None, callbacks=(),
                   verbose: int = 0, schedule: str = "uniform"):
  """Trains a `SuperNet` of `space` for `steps` optimizer steps (whole
  epochs, rounded up), one uniformly sampled path per step. Returns
  (net, history, sampler)."""
  check_positive_int("steps", steps)
  check_positive_int("batch_size", batch_size)
  if not isinstance(space, SearchSpace):
    raise invalid_argument("space", "a tfopt.nas.SearchSpace", space)
  keras.utils.set_random_seed(seed)
  net = SuperNet(space, execution=execution)
  per_epoch = _steps(len(split.x_train), batch_size)
  epochs = math.ceil(steps / per_epoch)
  net.compile(make_optimizer(lr, epochs * per_epoch), make_loss(),
              metrics=["accuracy"])
  sampler = PathSampler(seed=seed, constraints=constraints,
                        constraints_file=constraints_file, schedule=schedule)
  history = net.fit(split.x_train, split.y_train, batch_size=batch_size,
                    epochs=epochs, verbose=verbose, shuffle=True,
                    callbacks=[sampler] + list(callbacks))
  return net, history, sampler


def kendall_tau(a, b) -> float:
  """Kendall's tau-b between two score vectors (ties in either count as
  neither concordant nor discordant; tau-b's tie correction)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
    raise invalid_argument("b", f"a vector as long as a ({a.shape})", b.shape)
  da = np.sign(a[:, None] - a[None, :])
  db = np.sign(b[:, None] - b[None, :])
  upper = np.triu_indices(len(a), 1)
  da, db = da[upper], db[upper]
  denominator = math.sqrt(np.count_nonzero(da) * np.count_nonzero(db))
  return float((da * db).sum() / denominator) if denominator else 0.0
