"""Single-path uniform sampling while a `SuperNet` trains (a Keras callback).

Before each training step `PathSampler` draws one op per choice layer,
uniformly among the allowed ops, and makes it the super-network's active
path (a variable assignment: the compiled train step is not retraced). With
`freeze_untaken=True` (default) every variable of the ops not taken in that
step (kernels, BatchNorm scales and moving statistics) is put back after the
step exactly as it was, so untaken paths get no weight decay, no momentum
drift and, in `execution="mask"`, no BatchNorm statistics: Keras' decoupled
weight decay otherwise shrinks every trainable variable, taken or not.
"""

from __future__ import annotations

import collections

import keras
import numpy as np

from tfopt._errors import invalid_argument


class PathSampler(keras.callbacks.Callback):
  """Uniform single-path sampling for `tfopt.nas.SuperNet` training.

  Args:
    allowed: None, or {choice layer name: op names} restricting the ops a
      layer may take (a layer not named keeps all); validated on train begin.
    constraints_file: a `tfopt.nas.steering.Constraints` JSON file, re-read
      at every epoch begin (so an analyst can steer a running search); it
      replaces `allowed`. `versions` records the version seen per epoch.
    seed: seed of the sampler's NumPy generator.
    freeze_untaken: restore untaken ops' variables after every step.

  `counts` counts the sampled architectures.
  """

  def __init__(self, allowed=None, seed: int = 0, freeze_untaken: bool = True,
               constraints_file: str | None = None):
    super().__init__()
    self.allowed = allowed
    self.constraints_file = constraints_file
    self.versions: list = []
    self.rng = np.random.default_rng(seed)
    self.freeze_untaken = bool(freeze_untaken)
    self.counts: collections.Counter = collections.Counter()
    self._saved: list = []

  def _check_model(self):
    from tfopt.nas.supernet import SuperNet  # pylint: disable=import-outside-toplevel
    if not isinstance(self.model, SuperNet):
      raise invalid_argument("model", "a tfopt.nas.SuperNet (PathSampler "
                             "samples its active path)",
                             type(self.model).__name__)

  def on_train_begin(self, logs=None):
    self._check_model()
    self._read_constraints()
    self.model.space.allowed_ops(self.allowed)  # clear errors up front

  def on_epoch_begin(self, epoch, logs=None):
    self._read_constraints()

  def _read_constraints(self) -> None:
    if self.constraints_file is None:
      return
    from tfopt.nas.steering import Constraints  # pylint: disable=import-outside-toplevel
    constraints = Constraints.load(self.constraints_file, self.model.space)
    self.allowed = constraints.allowed_ops(self.model.space)
    self.versions.append(constraints.version)

  def on_train_batch_begin(self, batch, logs=None):
    space = self.model.space
    arch = space.sample(self.rng, self.allowed)
    self.model.set_arch(arch)
    self.counts[arch] += 1
    self._saved = []
    if self.freeze_untaken:
      for op, candidates, layer in zip(arch, self.model.choices, space.layers):
        taken = layer.op_names.index(op)
        for j, block in enumerate(candidates):
          if j != taken:
            self._saved += [(v, v.numpy()) for v in block.weights]

  def on_train_batch_end(self, batch, logs=None):
    for variable, value in self._saved:
      variable.assign(value)
    self._saved = []
