"""Keras callbacks over the pruning engine: `MoEPruner` and `ExpertDistiller`.

Both are thin shells: `MoEPruner` calls `prune_moe` at the right step and
installs the masks (kept exact through fine-tuning by a constraint, see
`masks.py`); `ExpertDistiller` adds MoE-Pruner's expert-wise distillation
term to the training loss.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
from keras import ops

from tfopt import _fit_steps as fit_steps
from tfopt import summaries
from tfopt._errors import TfoptWarning, check_non_negative, invalid_argument
from tfopt.pruning.adapters import adapter_for, find_moe_layers
from tfopt.pruning.engine import prune_moe
from tfopt.pruning.masks import install_masks, installed_masks
from tfopt.pruning.patterns import resolve_pattern


class MoEPruner(keras.callbacks.Callback):
  """Prunes the model's experts during `fit`, then keeps the masks exact.

  Args:
    data: calibration inputs (see `prune_moe`).
    method, sparsity, pattern: as in `prune_moe`.
    at_step: the training step of this `fit` (the steps its optimizer
      applied since train begin) before which pruning happens (0: at
      train begin). With `steps_per_execution=N` Keras runs N steps per
      call and the callback acts between calls: before the first call
      that begins at or after the step. Stages of `gradual` that fall
      due within one call are pruned one after the other before it.
    gradual: None, or (begin_step, end_step, stages): unstructured sparsity
      rises along Zhu & Gupta's cubic schedule s_t = s (1 - (1 - t)^3) over
      `stages` prunings between the two steps, each re-calibrated on the
      current weights and containing the previous mask.
    **prune_kwargs: passed to `prune_moe` (batch_size, wanda_tokens, ...).

  After each pruning `self.reports` gains the `PruneReport`; with a
  `keras.callbacks.TensorBoard` in the same fit (`tfopt.summaries`), the
  scalars `tfopt/pruning/sparsity/<layer>` (the fraction of zeros in the
  layer's pruned kernels) and `tfopt/pruning/sparsity` (the report's) are
  written at the training step of the pruning.
  """

  def __init__(self, data, method: str = "moe_pruner", sparsity=None,
               pattern=None, at_step: int = 0, gradual=None, **prune_kwargs):
    super().__init__()
    self.data = data
    self.method = method
    self.pattern = resolve_pattern(sparsity, pattern)
    if isinstance(at_step, bool) or not isinstance(at_step, int) or at_step < 0:
      raise invalid_argument("at_step", "an integer >= 0", at_step)
    self.schedule = self._schedule(at_step, gradual)
    self.prune_kwargs = dict(prune_kwargs)
    self.prune_kwargs.setdefault("verbose", 0)
    self.reports: list = []
    self._step, self._first, self._epoch_first = 0, 0, None
    self._summaries = None  # the fit's TensorBoard, if it has one

  def _schedule(self, at_step, gradual) -> list[tuple[int, float]]:
    if gradual is None:
      return [(at_step, self.pattern.ratio)]
    if self.pattern.structured:
      raise invalid_argument("gradual", "None with an N:M pattern", gradual)
    ok = (isinstance(gradual, (tuple, list)) and len(gradual) == 3
          and all(isinstance(v, int) and not isinstance(v, bool)
                  for v in gradual)
          and 0 <= gradual[0] < gradual[1] and gradual[2] >= 1)
    if not ok:
      raise invalid_argument(
          "gradual", "(begin_step, end_step, stages) integers with "
          "0 <= begin_step < end_step and stages >= 1", gradual)
    begin, end, stages = gradual
    final = self.pattern.sparsity
    return [(begin + round(i * (end - begin) / stages),
             final * (1 - (1 - i / stages) ** 3)) for i in range(1, stages + 1)]

  def _prune(self, sparsity: float) -> None:
    structured = self.pattern.structured
    report = prune_moe(
        self.model, self.data, method=self.method,
        sparsity=None if structured else sparsity,
        pattern=str(self.pattern) if structured else None,
        previous_masks=installed_masks(self.model) or None,
        **self.prune_kwargs)
    install_masks(self.model, report.masks)
    self.reports.append(report)
    if self._summaries is not None:
      self._write_sparsity(report)

  def _write_sparsity(self, report) -> None:
    """Per layer, the zeros of its pruned kernels as they now are (masks
    installed), over their size; and the report's overall sparsity."""
    values = {v.path: v for v in self.model.weights}
    counts: dict = {}
    for kernel in report.kernels:
      weights = ops.convert_to_numpy(values[kernel.path])
      zeros, size = counts.get(kernel.layer, (0, 0))
      counts[kernel.layer] = (zeros + int(np.count_nonzero(weights == 0)),
                              size + weights.size)
    step = summaries.training_step(self.model)
    for layer, (zeros, size) in counts.items():
      self._summaries.write_scalar(f"pruning/sparsity/{layer}",
                                   zeros / max(size, 1), step)
    self._summaries.write_scalar("pruning/sparsity", report.sparsity, step)
    self._summaries.flush()

  def on_train_begin(self, logs=None):
    self._step, self._epoch_first = 0, None
    self._first = summaries.training_step(self.model)
    self._summaries = summaries.for_fit(self.model, self)
    self._maybe_prune()

  def on_epoch_begin(self, epoch, logs=None):
    if self.schedule:  # one device read per epoch while a pruning waits
      # The optimizer's count at the epoch's start: exact also where the
      # previous epoch's last call ran fewer or more steps than the batch
      # hooks' indices say (tfopt._fit_steps).
      self._epoch_first = summaries.training_step(self.model) - self._first

  def on_train_batch_begin(self, batch, logs=None):
    if not self.schedule:
      return
    if self._epoch_first is None:
      # Driven without epochs (a CallbackList outside fit): read the count
      # at every call.
      self._step = summaries.training_step(self.model) - self._first
    else:
      # Within an epoch a call begins at step `batch`: every earlier call
      # of the epoch ran its full steps_per_execution.
      self._step = self._epoch_first + batch
    self._maybe_prune()

  def _maybe_prune(self) -> None:
    while self.schedule and self.schedule[0][0] <= self._step:
      _, sparsity = self.schedule.pop(0)
      self._prune(sparsity)


def _expert_mse(adapter, layer, t_adapter, t_layer, tokens):
  """Sum over experts of the mean squared difference between the student's
  and the teacher's expert outputs over the tokens routed to the expert."""
  routed = ops.cast(ops.stop_gradient(adapter.gates(layer, tokens)) > 0,
                    tokens.dtype)  # (T, E)
  student = adapter.expert_outputs(layer, tokens)  # (E, T, H)
  teacher = ops.stop_gradient(t_adapter.expert_outputs(t_layer, tokens))
  sq = ops.mean(ops.square(student - ops.cast(teacher, student.dtype)),
                axis=-1)  # (E, T)
  per_expert = (ops.sum(sq * ops.transpose(routed), axis=1)
                / ops.maximum(ops.sum(routed, axis=0), 1.0))
  return ops.sum(per_expert)


class ExpertDistiller(keras.callbacks.Callback):
  """MoE-Pruner's expert-wise knowledge distillation during `fit`.

  The loss becomes `loss + lambda * sum_layers sum_experts MSE(E_s, E_t)`:
  for every MoE layer of the student and each expert, the mean squared
  difference between the student expert's output and the teacher's (the
  same expert of the unpruned `teacher` model's matching layer) on the
  student's tokens routed to that expert. Layers are matched in order. The
  term's gradient reaches the expert kernels only (the tokens and the
  routing are constants in it).

  `lambda_="auto"` runs the first batch without the term and then sets
  lambda = loss / distillation term, so both start at the same scale; when
  the term is zero (nothing pruned yet, 0 % sparsity) lambda is 0 and a
  warning says so. A number sets lambda directly. Installed at train begin
  (the train function is rebuilt), removed at train end or by `remove()`.
  """

  def __init__(self, teacher, lambda_="auto"):
    super().__init__()
    if lambda_ != "auto":
      check_non_negative("lambda_", lambda_)
    self.teacher = teacher
    self.lambda_setting = lambda_
    self.lam = keras.Variable(0.0 if lambda_ == "auto" else float(lambda_),
                              trainable=False, name="distill_lambda")
    self.term = keras.Variable(0.0, trainable=False, name="distill_term")
    self.lambda_value: float | None = None
    self._layers: list = []

  def _pairs(self):
    students = find_moe_layers(self.model)
    teachers = find_moe_layers(self.teacher)
    if len(students) != len(teachers):
      raise invalid_argument(
          "teacher", f"a model with as many MoE layers as the student "
          f"({len(students)})", f"{self.teacher.name} with {len(teachers)}")
    for s, t in zip(students, teachers):
      shapes = [tuple(k.variable.shape) for k in adapter_for(s).kernels(s)]
      t_shapes = [tuple(k.variable.shape) for k in adapter_for(t).kernels(t)]
      if shapes != t_shapes:
        raise invalid_argument(
            "teacher", f"MoE layers shaped like the student's ({s.name}: "
            f"{shapes})", f"{t.name}: {t_shapes}")
    return list(zip(students, teachers))

  def on_train_begin(self, logs=None):
    self.remove()
    for layer, t_layer in self._pairs():
      adapter, t_adapter = adapter_for(layer), adapter_for(t_layer)
      original = layer.call

      def call(*args, _layer=layer, _t=t_layer, _a=adapter, _ta=t_adapter,
               _original=original, **kwargs):
        out = _original(*args, **kwargs)
        if kwargs.get("training"):
          x = _a.block_input(args, kwargs)
          # The term trains the experts only: through the tokens it would
          # also pull the layers below toward inputs on which any two
          # experts agree (e.g. smaller activations), against the task.
          tokens = ops.stop_gradient(ops.reshape(x, (-1, ops.shape(x)[-1])))
          term = _expert_mse(_a, _layer, _ta, _t, tokens)
          self.term.assign_add(ops.cast(ops.stop_gradient(term), "float32"))
          _layer.add_loss(ops.cast(self.lam, term.dtype) * term)
        return out

      object.__setattr__(layer, "call", call)
      self._layers.append(layer)
    self.model.make_train_function(force=True)

  def on_train_batch_begin(self, batch, logs=None):
    self.term.assign(0.0)

  def on_train_batch_end(self, batch, logs=None):
    if self.lambda_setting != "auto" or self.lambda_value is not None:
      return
    # The term adds up over the call's steps (steps_per_execution), the
    # logged loss is their mean.
    term = float(ops.convert_to_numpy(self.term)) / fit_steps.count(
        self, batch)
    loss = float(np.asarray((logs or {}).get("loss", 0.0)))
    if term > 1e-12:
      self.lambda_value = loss / term
    else:
      self.lambda_value = 0.0
      warnings.warn("ExpertDistiller: the student's experts equal the "
                    "teacher's on the first batch (0 % sparsity?); "
                    "lambda is set to 0.", TfoptWarning, stacklevel=2)
    self.lam.assign(self.lambda_value)

  def on_train_end(self, logs=None):
    self.remove()

  def remove(self) -> None:
    """Takes the distillation term out of the layers (idempotent)."""
    for layer in self._layers:
      if "call" in vars(layer):
        object.__delattr__(layer, "call")
    self._layers = []
    if self.model is not None and getattr(self.model, "train_function",
                                          None) is not None:
      self.model.make_train_function(force=True)
