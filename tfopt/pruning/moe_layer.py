"""tfopt's own mixture-of-experts layer for Keras 3 (any backend, XLA-ready).

`MoE` is a Mixtral-style sparse feed-forward block: a bias-free linear router,
softmax, top-k experts with their probabilities renormalized, and SwiGLU
experts `down(silu(x @ gate) * (x @ up))` held as three batched kernels of
shape (experts, d_in, d_out). Every expert is evaluated on every token as
batched einsums and combined with the (mostly zero) routing weights: no
gather/scatter and no data-dependent shapes, so the layer compiles under XLA
and runs on every Keras backend. That costs num_experts / top_k times the
FLOPs of a dispatching implementation, which is fine at the sizes tfopt
trains on CPU; it is also why statistics over "tokens routed to an expert"
must be masked by the routing (see `tfopt.pruning.adapters`).

During training the layer adds Switch Transformer's load-balancing loss,
`coef * E * sum_e f_e * P_e` (f_e: fraction of routing slots that chose
expert e, P_e: mean router probability of e), with `add_loss`.
"""

from __future__ import annotations

import keras
from keras import ops

from tfopt._errors import check_non_negative, check_positive_int, invalid_argument


def route(logits, top_k: int, normalize: bool = True):
  """Routing weights (tokens, experts) from router logits (tokens, experts).

  Softmax, keep the top-k probabilities per token (renormalized to sum to 1
  when `normalize`), zero elsewhere. Also returns the softmax probabilities.
  """
  probs = ops.softmax(logits, axis=-1)
  top_p, top_i = ops.top_k(probs, k=top_k)
  if normalize:
    top_p = top_p / ops.sum(top_p, axis=-1, keepdims=True)
  one_hot = ops.cast(ops.one_hot(top_i, ops.shape(logits)[-1]), top_p.dtype)
  return ops.sum(one_hot * top_p[..., None], axis=1), probs


def load_balancing_loss(gates, probs, top_k: int):
  """Switch Transformer's auxiliary loss: E * sum_e f_e * P_e (1.0 balanced)."""
  num_experts = ops.shape(probs)[-1]
  chosen = ops.cast(gates > 0, probs.dtype)
  fraction = ops.mean(chosen, axis=0) / top_k
  return ops.cast(num_experts, probs.dtype) * ops.sum(
      fraction * ops.mean(probs, axis=0))


@keras.saving.register_keras_serializable(package="tfopt")
class MoE(keras.layers.Layer):
  """Top-k mixture of SwiGLU experts; input and output (..., d_model).

  Args:
    num_experts: number of experts E (>= 2).
    expert_dim: hidden width of each expert's SwiGLU.
    top_k: experts per token (1 <= top_k <= num_experts).
    load_balance_coef: weight of the load-balancing loss added in training.
    kernel_initializer: initializer of the expert kernels.
    router_initializer: initializer of the router kernel.

  Weights: `router` (d_model, E), `gate_kernel` and `up_kernel`
  (E, d_model, expert_dim), `down_kernel` (E, expert_dim, d_model).
  """

  def __init__(self, num_experts: int, expert_dim: int, top_k: int = 2,
               load_balance_coef: float = 0.01,
               kernel_initializer="glorot_uniform",
               router_initializer="glorot_uniform", **kwargs):
    super().__init__(**kwargs)
    check_positive_int("num_experts", num_experts)
    if num_experts < 2:
      raise invalid_argument("num_experts", "at least 2", num_experts)
    self.num_experts = num_experts
    self.expert_dim = check_positive_int("expert_dim", expert_dim)
    check_positive_int("top_k", top_k)
    if top_k > num_experts:
      raise invalid_argument(
          "top_k", f"at most num_experts={num_experts}", top_k)
    self.top_k = top_k
    self.load_balance_coef = check_non_negative("load_balance_coef",
                                                load_balance_coef)
    self.kernel_initializer = keras.initializers.get(kernel_initializer)
    self.router_initializer = keras.initializers.get(router_initializer)

  def build(self, input_shape):
    d_model = input_shape[-1]
    if d_model is None:
      raise invalid_argument("input_shape", "known in its last dimension",
                             input_shape)
    self.d_model = int(d_model)
    e, h, m = self.num_experts, self.d_model, self.expert_dim
    self.router = self.add_weight(name="router", shape=(h, e),
                                  initializer=self.router_initializer)
    self.gate_kernel = self.add_weight(name="gate_kernel", shape=(e, h, m),
                                       initializer=self.kernel_initializer)
    self.up_kernel = self.add_weight(name="up_kernel", shape=(e, h, m),
                                     initializer=self.kernel_initializer)
    self.down_kernel = self.add_weight(name="down_kernel", shape=(e, m, h),
                                       initializer=self.kernel_initializer)

  def routing(self, tokens):
    """(gates (T, E), probs (T, E)) for flattened tokens (T, d_model)."""
    logits = ops.matmul(tokens, ops.cast(self.router, tokens.dtype))
    return route(logits, self.top_k)

  def expert_hidden(self, tokens):
    """SwiGLU hidden activations (E, T, expert_dim): the down kernel's input."""
    gate = ops.einsum("th,ehm->etm", tokens,
                      ops.cast(self.gate_kernel, tokens.dtype))
    up = ops.einsum("th,ehm->etm", tokens,
                    ops.cast(self.up_kernel, tokens.dtype))
    return ops.silu(gate) * up

  def expert_outputs(self, tokens):
    """Every expert's output on every token, (E, T, d_model)."""
    return ops.einsum("etm,emh->eth", self.expert_hidden(tokens),
                      ops.cast(self.down_kernel, tokens.dtype))

  def call(self, inputs, training=None):
    shape = ops.shape(inputs)
    tokens = ops.reshape(inputs, (-1, self.d_model))
    gates, probs = self.routing(tokens)
    out = ops.einsum("te,eth->th", gates, self.expert_outputs(tokens))
    if training and self.load_balance_coef > 0:
      self.add_loss(self.load_balance_coef *
                    load_balancing_loss(gates, probs, self.top_k))
    return ops.reshape(out, shape)

  def compute_output_shape(self, input_shape):
    return input_shape

  def get_config(self):
    config = super().get_config()
    config.update({
        "num_experts": self.num_experts, "expert_dim": self.expert_dim,
        "top_k": self.top_k, "load_balance_coef": self.load_balance_coef,
        "kernel_initializer": keras.initializers.serialize(
            self.kernel_initializer),
        "router_initializer": keras.initializers.serialize(
            self.router_initializer)})
    return config
