"""Single-path uniform sampling while a super-network trains (a Keras
callback): a `SuperNet`, or any model with `space` and `set_arch` (the
weight-entangled `tfopt.nas.moe_lm.MoELMSuperNet`).

Before each training step `PathSampler` draws one op per choice layer,
uniformly among the allowed ops (or, with steering `Constraints`, an
admitted sub-graph with the analyst's preference weights), and makes it the super-network's active
path (a variable assignment: the compiled train step is not retraced). With
`freeze_untaken=True` (default) every variable of the ops not taken in that
step (kernels, BatchNorm scales and moving statistics) is put back after the
step exactly as it was, so untaken paths get no weight decay, no momentum
drift and, in `execution="mask"`, no BatchNorm statistics: Keras' decoupled
weight decay otherwise shrinks every trainable variable, taken or not.
"""

from __future__ import annotations

import collections
import logging

import keras
import numpy as np

from tfopt._errors import invalid_argument


SCHEDULES = ("uniform", "fair")


class PathSampler(keras.callbacks.Callback):
  """Uniform single-path sampling for `tfopt.nas.SuperNet` training.

  Args:
    allowed: None, or {choice layer name: op names} restricting the ops a
      layer may take (a layer not named keeps all); validated on train begin.
    constraints: a `tfopt.nas.Constraints` (remove, lock, prefer, region,
      limits); replaces `allowed`.
    constraints_file: a `Constraints` JSON file, re-read at every epoch
      begin (so an analyst can steer a running search); replaces
      `constraints`. `versions` records the version seen per epoch. A
      live edit that does not parse or validate is not applied: the last
      valid constraints stay, and `steering_errors` (and a warning on the
      "tfopt" logger) says which file, where and what is wrong.
    seed: seed of the sampler's NumPy generator.
    freeze_untaken: restore untaken ops' variables after every step
      (default: yes, unless the model samples in-graph or its sub-networks
      share weights, as `tfopt.nas.moe_lm.MoELMSuperNet`'s do).
    schedule: "uniform" (each step draws every layer's op independently) or
      "fair" (FairNAS-style strict fairness without gradient accumulation:
      each layer walks through random permutations of its allowed ops, so
      over every len(ops) steps each op is trained exactly once; needs
      per-layer constraints only: no prefer, region or limits).

  With a `SuperNet(in_graph_sampling=True)` the path is drawn inside the
  train step: this callback then only sets the model's sampling logits
  from the constraints (at train begin and every epoch) and neither draws,
  counts nor restores (`freeze_untaken=True` is refused).

  `counts` counts the sampled architectures. The draws happen between
  calls of the train function: with `steps_per_execution=N` one drawn
  path trains N steps ("step" above means call), and `counts` counts
  calls; in-graph sampling draws per step.
  """

  def __init__(self, allowed=None, seed: int = 0,
               freeze_untaken: bool | None = None,
               constraints_file: str | None = None, constraints=None,
               schedule: str = "uniform"):
    super().__init__()
    if schedule not in SCHEDULES:
      raise invalid_argument("schedule", f"one of {SCHEDULES}", schedule)
    self.schedule = schedule
    self._queues: list = []
    self.allowed = allowed
    self.constraints = constraints
    self._draw = None
    self.constraints_file = constraints_file
    self.versions: list = []
    # Live edits of constraints_file that could not be applied (why).
    self.steering_errors: list[str] = []
    self.rng = np.random.default_rng(seed)
    self.freeze_untaken = freeze_untaken
    self.counts: collections.Counter = collections.Counter()
    self._saved: list = []

  def _check_model(self):
    if not all(hasattr(self.model, a) for a in ("space", "set_arch")):
      raise invalid_argument("model", "a super-network with `space` and "
                             "`set_arch` (tfopt.nas.SuperNet, "
                             "tfopt.nas.moe_lm.MoELMSuperNet: PathSampler "
                             "samples its active path)",
                             type(self.model).__name__)
    if self.freeze_untaken and not hasattr(self.model, "choices"):
      raise invalid_argument(
          "freeze_untaken", "False or None for a super-network whose "
          "sub-networks share weights (no untaken op has weights of its "
          "own)", self.freeze_untaken)

  def on_train_begin(self, logs=None):
    self._check_model()
    if getattr(self.model, "in_graph_sampling", False) and \
        self.freeze_untaken:
      raise invalid_argument(
          "freeze_untaken", "False or None with in-graph sampling (the path "
          "is drawn inside the step; Python cannot restore what it does not "
          "see)", self.freeze_untaken)
    self._read_constraints()
    self._make_draw()

  def on_epoch_begin(self, epoch, logs=None):
    if self.constraints_file is None:
      return
    # Edited live by the analyst: a bad or half-written file must not end
    # the search. Keep the last valid constraints and say what is wrong.
    kept = (self.constraints, self._draw, self._queues, len(self.versions))
    try:
      self._read_constraints()
      self._make_draw()
    except (ValueError, OSError) as err:
      self.constraints, self._draw, self._queues = kept[:3]
      del self.versions[kept[3]:]
      message = (f"epoch {epoch}: steering file {self.constraints_file} "
                 f"not applied ({err}); the search goes on with the last "
                 f"valid constraints (version "
                 f"{getattr(self.constraints, 'version', None)})")
      self.steering_errors.append(message)
      logging.getLogger("tfopt").warning("%s", message)

  def _make_draw(self) -> None:
    """The architecture sampler for the current constraints (validated
    here, so bad input fails before the first step)."""
    space = self.model.space
    if getattr(self.model, "in_graph_sampling", False):
      constraints = self.constraints
      if constraints is None and self.allowed:
        from tfopt.nas.steering import Constraints  # pylint: disable=import-outside-toplevel
        constraints = Constraints.from_allowed(space, self.allowed)
      self.model.set_sampling(constraints)
      self._draw = None
    elif self.schedule == "fair":
      allowed = self.allowed
      if self.constraints is not None:
        c = self.constraints
        if c.prefer or c.region is not None or c.limits:
          raise invalid_argument(
              "schedule", "'uniform' with prefer, region or limits "
              "constraints (a fair schedule is per layer)", self.schedule)
        allowed = c.allowed_ops(space)
      ops_per_layer = space.allowed_ops(allowed)
      if [sorted(o) for o in ops_per_layer] != [sorted(q[1]) for q in
                                                self._queues]:
        self._queues = [([], ops) for ops in ops_per_layer]

      def draw(rng):
        arch = []
        for queue, ops in self._queues:
          if not queue:
            queue.extend(ops[i] for i in rng.permutation(len(ops)))
          arch.append(queue.pop())
        return tuple(arch)
      self._draw = draw
    elif self.constraints is not None:
      self._draw = self.constraints.sampler(space)
    else:
      space.allowed_ops(self.allowed)
      self._draw = lambda rng: space.sample(rng, self.allowed)

  def _read_constraints(self) -> None:
    if self.constraints_file is None:
      return
    from tfopt.nas.steering import Constraints  # pylint: disable=import-outside-toplevel
    self.constraints = Constraints.load(self.constraints_file,
                                        self.model.space)
    self.versions.append(self.constraints.version)

  def on_train_batch_begin(self, batch, logs=None):
    if self._draw is None:  # drawn in-graph
      return
    space = self.model.space
    arch = self._draw(self.rng)
    self.model.set_arch(arch)
    self.counts[arch] += 1
    self._saved = []
    if self.freeze_untaken is not False and hasattr(self.model, "choices"):
      for op, candidates, layer in zip(arch, self.model.choices, space.layers):
        taken = layer.op_names.index(op)
        for j, block in enumerate(candidates):
          if j != taken:
            self._saved += [(v, v.numpy()) for v in block.weights]

  def on_train_batch_end(self, batch, logs=None):
    for variable, value in self._saved:
      variable.assign(value)
    self._saved = []
