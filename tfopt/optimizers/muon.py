"""CautiousMuon: Muon with cautious weight decay and a routing that fits Keras
models (see `muon_routing`)."""

from __future__ import annotations

import keras
from keras import ops

from tfopt._errors import invalid_argument
from tfopt.optimizers.adamw import adam_step
from tfopt.optimizers.cautious import (CautiousDecayMixin, as_dtype,
                                       check_number, compile_patterns)
from tfopt.optimizers.muon_routing import ROUTINGS, Route, route_variable
from tfopt.optimizers.newton_schulz import (SCALE_MODES, newton_schulz,
                                            scale_factors)


@keras.saving.register_keras_serializable(package="tfopt")
class CautiousMuon(CautiousDecayMixin, keras.optimizers.Muon):
  """Muon (Newton-Schulz orthogonalized momentum) with cautious weight decay.

  Matrices (see `routing_table()`) take the Muon step
  u = scale * NS(g + mu * m) (Nesterov) and are decayed with `weight_decay`;
  the rest take Adam's step at `learning_rate * adam_lr_ratio` and are
  decayed with `adam_weight_decay`. Decay is cautious in both groups:
  x <- x - lr * (u + wd * 1[u * x >= 0] * x).

  With `cautious_weight_decay=False, routing="keras"` this is
  `keras.optimizers.Muon`: same variables, same order, same numbers.

  Args:
    learning_rate, adam_beta_1, adam_beta_2, adam_weight_decay, epsilon,
      weight_decay, exclude_layers, exclude_embeddings, muon_a, muon_b,
      muon_c, adam_lr_ratio, momentum, ns_steps, nesterov, rms_rate and the
      Keras base arguments: as `keras.optimizers.Muon`. `exclude_layers` are
      regexes searched in variable paths.
    routing: "tfopt" (default; 3-D attention kernels reshaped to matrices,
      biases and norms to AdamW) or "keras" (Keras' rule: 2-D <=> Muon).
    scale_mode: "rms" (Moonlight, rms_rate * sqrt(max(rows, cols)), the
      default and Keras' behaviour), "keller" (Keller Jordan's,
      sqrt(max(1, fan_out / fan_in))) or "none".
    muon_conv_kernels: route 4-D conv kernels to Muon as
      (kh * kw * c_in, c_out) matrices (default False: AdamW).
    cautious_weight_decay, decay_exclude_patterns, track_decay_fraction: see
      `CautiousAdamW`.
  """

  def __init__(self, learning_rate=0.001, adam_beta_1=0.9, adam_beta_2=0.999,
               adam_weight_decay=0.004, epsilon=1e-7, weight_decay=0.004,
               exclude_layers=None, exclude_embeddings=True, muon_a=3.4445,
               muon_b=-4.7750, muon_c=2.0315, adam_lr_ratio=1,
               momentum=0.95, ns_steps=5, nesterov=True, rms_rate=0.2,
               routing="tfopt", scale_mode="rms", muon_conv_kernels=False,
               cautious_weight_decay=True, decay_exclude_patterns=None,
               track_decay_fraction=False, name="cautious_muon", **kwargs):
    inf = float("inf")
    check_number("learning_rate", learning_rate, 0, inf, allow_dynamic=True)
    check_number("weight_decay", weight_decay, 0, inf, allow_none=True)
    check_number("adam_weight_decay", adam_weight_decay, 0, inf,
                 allow_none=True)
    check_number("adam_beta_1", adam_beta_1, 0, 1)
    check_number("adam_beta_2", adam_beta_2, 0, 1)
    check_number("epsilon", epsilon, 0, inf)
    check_number("momentum", momentum, 0, 1)
    check_number("adam_lr_ratio", adam_lr_ratio, 0, inf, low_open=True)
    if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or (
        ns_steps < 1):
      raise invalid_argument("ns_steps", "a positive integer", ns_steps)
    if routing not in ROUTINGS:
      raise invalid_argument("routing", f"one of {ROUTINGS}", routing)
    if scale_mode not in SCALE_MODES:
      raise invalid_argument("scale_mode", f"one of {SCALE_MODES}",
                             scale_mode)
    if scale_mode == "rms":
      if rms_rate is None:
        raise invalid_argument(
            "rms_rate", "a number > 0 with scale_mode='rms' (use "
            "scale_mode='none' for no scaling)", rms_rate)
      check_number("rms_rate", rms_rate, 0, inf, low_open=True)
    if not isinstance(muon_conv_kernels, bool):
      raise invalid_argument("muon_conv_kernels", "a bool", muon_conv_kernels)
    exclude_layers, layer_regexes = compile_patterns("exclude_layers",
                                                    exclude_layers)
    super().__init__(
        learning_rate=learning_rate, adam_beta_1=adam_beta_1,
        adam_beta_2=adam_beta_2, adam_weight_decay=adam_weight_decay,
        epsilon=epsilon, weight_decay=weight_decay,
        exclude_layers=list(exclude_layers),
        exclude_embeddings=exclude_embeddings, muon_a=muon_a, muon_b=muon_b,
        muon_c=muon_c, adam_lr_ratio=adam_lr_ratio, momentum=momentum,
        ns_steps=ns_steps, nesterov=nesterov, rms_rate=rms_rate, name=name,
        **kwargs)
    self.routing = routing
    self.scale_mode = scale_mode
    self.muon_conv_kernels = muon_conv_kernels
    self._exclude_layer_regexes = layer_regexes
    self._init_cautious(cautious_weight_decay, decay_exclude_patterns,
                        track_decay_fraction)

  # -- routing ---------------------------------------------------------------

  def _route(self, variable) -> Route:
    return route_variable(
        variable.path, variable.name, variable.shape, routing=self.routing,
        exclude_embeddings=self.exclude_embeddings,
        exclude_layers=self._exclude_layer_regexes,
        muon_conv_kernels=self.muon_conv_kernels)

  def _prepare_build(self, var_list):
    self._routes = [self._route(v) for v in var_list]
    self._route_by_key = {self._var_key(v): r
                          for v, r in zip(var_list, self._routes)}

  def _should_use_adamw(self, variable):
    # Keras' Muon.build asks this to decide which variables get a velocity.
    return self._route_by_key[self._var_key(variable)].optimizer == "adamw"

  def routing_table(self, variables=None) -> dict[str, Route]:
    """Variable path -> `Route`: muon or adamw, the matrix shape, and why.

    Without `variables`, the table the optimizer was built with; with them,
    what it would decide (nothing is built). In variable order;
    `format_routing_table` prints it.
    """
    if variables is not None:
      routes = [self._route(v) for v in variables]
    elif not self.built:
      raise ValueError(
          "`routing_table()` without `variables` needs a built optimizer: "
          "pass `variables=model.trainable_variables` or build it first.")
    else:
      routes = self._routes
    return {r.path: r for r in routes}

  def _weight_decay_for(self, variable):
    if self._should_use_adamw(variable):
      return self.adam_weight_decay
    return self.weight_decay

  # -- update ----------------------------------------------------------------

  def _descent_step(self, gradient, variable, learning_rate, index):
    m = self.momentums[index]
    v = self.adam_velocities[index]
    if v is not None:
      return adam_step(self, gradient, variable,
                       learning_rate * self.adam_lr_ratio, m, v, None,
                       self.adam_beta_1, self.adam_beta_2, self.epsilon)
    dtype = variable.dtype
    gradient = ops.cast(gradient, dtype)
    self.assign_add(m, ops.add(gradient, m * (self.momentum - 1)))
    g = ops.add(gradient, self.momentum * m) if self.nesterov else m
    rows, cols = self._routes[index].matrix_shape
    shape = tuple(variable.shape)
    if shape != (rows, cols):
      g = ops.reshape(g, (rows, cols))
    update = newton_schulz(g, self.ns_steps,
                           (self.muon_a, self.muon_b, self.muon_c))
    if shape != (rows, cols):
      update = ops.reshape(update, shape)
    step = as_dtype(learning_rate, dtype) * update
    for factor in scale_factors(rows, cols, self.scale_mode, self.rms_rate):
      step = step * as_dtype(factor, dtype)
    # The step comes out of a matmul, materialized anyway: mask from it.
    return step, None

  def get_config(self):
    config = super().get_config()
    config.update({"routing": self.routing, "scale_mode": self.scale_mode,
                   "muon_conv_kernels": self.muon_conv_kernels})
    config.update(self._cautious_config())
    return config
