"""Where a mixture-of-experts layer keeps its experts: the adapter registry.

Pruning needs, for each MoE layer class, the same five facts: its expert
kernels (as (experts, d_in, d_out) variables, and which input feeds each), how
it routes a token (the gate coefficient of every expert, zero when the token
is not routed there), the experts' hidden activations (the input of the
second-stage kernels), the experts' outputs, and which call argument carries
the block's input. `MoEAdapter` states that contract; `register_adapter`
maps a layer class to an adapter and `find_moe_layers` walks a model.

Adapters ship for tfopt's own `MoE` and for keras-hub's sparse blocks
(registered when their module imports, each on its own, so a keras-hub
without one still registers the others): Mixtral
(`MixtralSparseMoeBlock`), Qwen-MoE (`QwenSparseMoeBlock`), Qwen3-MoE
(`Qwen3SparseMoeBlock`), Qwen3.5-MoE (`Qwen3_5MoeSparseMoeBlock`) and
GPT-OSS (`GptOssSparseMoeBlock`). keras-hub evaluates every expert on every
token and weights the outputs by the routing, so a statistic "over the
tokens routed to an expert" must be masked by the gates: the adapters return
the gates, never the raw expert inputs alone. Qwen's and Qwen3.5's shared
expert is a plain dense MLP outside the routed experts; it is not an expert
kernel here and is never pruned.

A layer of no registered class that holds a router kernel (d_model, E) and
stacked expert kernels (E, d_in, d_out) gets the structural fallback of
`tfopt.pruning.fallback`: a mapping checked against the layer's own output
before it is used, or an error naming the weights it could not map.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
from typing import Any

import keras
from keras import ops

from tfopt._errors import invalid_argument
from tfopt.pruning.moe_layer import MoE, route

INPUT = "input"     # kernel fed by the block's tokens (T, d_model)
HIDDEN = "hidden"   # kernel fed by the experts' hidden activations (E, T, m)


@dataclasses.dataclass(frozen=True)
class ExpertKernel:
  """One stacked expert kernel: `variable` has shape (E, d_in, d_out).

  `stage` is INPUT when every expert multiplies the block's tokens by it and
  HIDDEN when expert e multiplies its own hidden activations by slice e.
  An output neuron is a column `variable[e, :, j]`.
  """
  name: str
  variable: Any
  stage: str


def block_input(args: tuple, kwargs: dict):
  """The block's input tensor among a layer `call`'s arguments: the first
  positional one, else `inputs` / `hidden_states` / `x`."""
  if args:
    return args[0]
  for name in ("inputs", "hidden_states", "x"):
    if name in kwargs:
      return kwargs[name]
  raise invalid_argument("call arguments", "to contain the block input",
                         sorted(kwargs))


class MoEAdapter(abc.ABC):
  """The contract between pruning and one MoE layer class.

  All methods take the layer and flattened tokens (T, d_model) as a backend
  tensor or NumPy array, and return backend tensors computed with the
  layer's current weights exactly as the layer computes them. Subclasses
  implement `kernels`, `gates` and `expert_outputs`, and `expert_hidden`
  when some kernel has stage HIDDEN.
  """

  @abc.abstractmethod
  def kernels(self, layer) -> list[ExpertKernel]:
    """The layer's stacked expert kernels, first stage first."""

  def num_experts(self, layer) -> int:
    return int(layer.num_experts)

  def top_k(self, layer) -> int:
    return int(layer.top_k)

  def router_variables(self, layer) -> list | None:
    """[(variable, axis)]: the router weights indexed by expert along
    `axis` (what `prune_experts` slices with the stacked kernels), or None
    where the adapter does not say (the layer's experts cannot be
    removed)."""
    del layer
    return None

  @abc.abstractmethod
  def gates(self, layer, tokens):
    """Routing weights (T, E): the gate coefficient, zero if not routed."""

  @abc.abstractmethod
  def expert_outputs(self, layer, tokens):
    """Every expert's output on every token, (E, T, d_model)."""

  def expert_hidden(self, layer, tokens):
    """Inputs of the HIDDEN-stage kernels, (E, T, m). Only called for
    adapters that list a HIDDEN kernel."""
    raise TypeError(f"{type(self).__name__} lists no HIDDEN-stage kernel "
                    f"for layer {layer.name!r}, so it has no expert hidden "
                    "activations.")

  def block_input(self, args: tuple, kwargs: dict):
    """The block's input tensor among a `call`'s arguments."""
    return block_input(args, kwargs)

  def combine(self, layer, tokens):
    """The routed-experts part of the block output, (T, d_model)."""
    gates = self.gates(layer, tokens)
    return ops.einsum("te,eth->th", gates, self.expert_outputs(layer, tokens))


class TfoptMoEAdapter(MoEAdapter):
  """tfopt's own `tfopt.pruning.MoE`."""

  def kernels(self, layer):
    return [ExpertKernel("gate", layer.gate_kernel, INPUT),
            ExpertKernel("up", layer.up_kernel, INPUT),
            ExpertKernel("down", layer.down_kernel, HIDDEN)]

  def router_variables(self, layer):
    return [(layer.router, 1)]

  def gates(self, layer, tokens):
    return layer.routing(ops.convert_to_tensor(tokens))[0]

  def expert_hidden(self, layer, tokens):
    return layer.expert_hidden(ops.convert_to_tensor(tokens))

  def expert_outputs(self, layer, tokens):
    return layer.expert_outputs(ops.convert_to_tensor(tokens))


def _hub_gates(router, tokens, top_k: int, normalize: bool):
  """keras-hub's softmax-routed sparse blocks: the bias-free `router` Dense,
  softmax, top-k (renormalized when `normalize`), as their `call` does."""
  tokens = ops.convert_to_tensor(tokens)
  return ops.cast(route(router(tokens), top_k, normalize=normalize)[0],
                  tokens.dtype)


class MixtralAdapter(MoEAdapter):
  """keras-hub's `MixtralSparseMoeBlock` (SwiGLU experts in `expert_bank`)."""

  def kernels(self, layer):
    bank = layer.expert_bank
    return [ExpertKernel("gate", bank._expert_feedforward_gate_dense, INPUT),  # pylint: disable=protected-access
            ExpertKernel("up", bank._expert_feedforward_intermediate_dense,  # pylint: disable=protected-access
                         INPUT),
            ExpertKernel("down", bank._expert_feedforward_output_dense,  # pylint: disable=protected-access
                         HIDDEN)]

  def router_variables(self, layer):
    return [(layer._sparse_feedforward_gate_dense.kernel, 1)]  # pylint: disable=protected-access

  def gates(self, layer, tokens):
    return _hub_gates(layer._sparse_feedforward_gate_dense, tokens,  # pylint: disable=protected-access
                      layer.top_k, normalize=True)

  def expert_hidden(self, layer, tokens):
    # The same arithmetic as MixtralMoeExperts.call, dtype casts included.
    bank = layer.expert_bank
    tokens = ops.convert_to_tensor(tokens)
    gate = ops.einsum("th,ehm->etm", tokens,
                      bank._expert_feedforward_gate_dense)  # pylint: disable=protected-access
    gate = ops.cast(bank.activation(ops.cast(gate, "float32")),
                    bank.compute_dtype)
    up = ops.einsum("th,ehm->etm", tokens,
                    bank._expert_feedforward_intermediate_dense)  # pylint: disable=protected-access
    return up * gate

  def expert_outputs(self, layer, tokens):
    return layer.expert_bank(ops.convert_to_tensor(tokens))


class QwenMoeAdapter(MoEAdapter):
  """keras-hub's `QwenSparseMoeBlock`: gate and up kernels are one
  (E, d_model, 2m) variable; the shared expert is not pruned."""

  def kernels(self, layer):
    bank = layer.expert_bank
    return [ExpertKernel("gate_up", bank._expert_feedforward_gate_dense,  # pylint: disable=protected-access
                         INPUT),
            ExpertKernel("down", bank._expert_feedforward_output_dense,  # pylint: disable=protected-access
                         HIDDEN)]

  def router_variables(self, layer):
    return [(layer._sparse_feedforward_gate_dense.kernel, 1)]  # pylint: disable=protected-access

  def gates(self, layer, tokens):
    return _hub_gates(layer._sparse_feedforward_gate_dense, tokens,  # pylint: disable=protected-access
                      layer.top_k, normalize=layer.norm_top_k_prob)

  def expert_hidden(self, layer, tokens):
    bank = layer.expert_bank
    gate_up = ops.einsum("th,ehm->etm", ops.convert_to_tensor(tokens),
                         bank._expert_feedforward_gate_dense)  # pylint: disable=protected-access
    gate, up = ops.split(gate_up, 2, axis=-1)
    return up * bank.activation(gate)

  def expert_outputs(self, layer, tokens):
    return layer.expert_bank(ops.convert_to_tensor(tokens))


class Qwen3MoeAdapter(QwenMoeAdapter):
  """keras-hub's `Qwen3SparseMoeBlock`: Qwen-MoE's router
  (`_sparse_feedforward_gate_dense`, softmax, top-k renormalized when
  `norm_top_k_prob`) and fused (E, d_model, 2m) gate/up experts (gate the
  first half, `up * silu(gate)`), with no shared expert: the block's output
  is `combine` alone."""


class Qwen35MoeAdapter(MoEAdapter):
  """keras-hub's `Qwen3_5MoeSparseMoeBlock`.

  Routing: the bias-free `_router_gate` Dense, softmax, top-k, always
  renormalized. Experts: one (E, d_model, 2m) gate/up kernel (gate the first
  half) whose SiLU runs in float32, then `expert_feedforward_output_dense`.
  The block adds a shared expert scaled by `sigmoid(_shared_expert_gate)`;
  it is not a routed expert, not in `combine` and not pruned.
  """

  def kernels(self, layer):
    bank = layer.expert_bank
    return [ExpertKernel("gate_up", bank._expert_feedforward_gate_dense,  # pylint: disable=protected-access
                         INPUT),
            ExpertKernel("down", bank._expert_feedforward_output_dense,  # pylint: disable=protected-access
                         HIDDEN)]

  def gates(self, layer, tokens):
    return _hub_gates(layer._router_gate, tokens, layer.top_k,  # pylint: disable=protected-access
                      normalize=True)

  def expert_hidden(self, layer, tokens):
    # The same arithmetic as Qwen3_5MoeExperts.call, dtype casts included.
    tokens = ops.convert_to_tensor(tokens)
    gate_up = ops.einsum("th,ehm->etm", tokens,
                         layer.expert_bank._expert_feedforward_gate_dense)  # pylint: disable=protected-access
    gate, up = ops.split(gate_up, 2, axis=-1)
    gate = ops.cast(ops.silu(ops.cast(gate, "float32")), tokens.dtype)
    return up * gate

  def expert_outputs(self, layer, tokens):
    return layer.expert_bank(ops.convert_to_tensor(tokens))


class GptOssAdapter(MoEAdapter):
  """keras-hub's `GptOssSparseMoeBlock`.

  Routing (`layer.router`'s own call): a router Dense *with* a bias, the
  top-k logits, softmax over those k only (the same gates as softmax, top-k,
  renormalize). Experts: `gate_up_proj` (E, d_model, 2m), even columns the
  gate and odd ones the up projection, plus `gate_up_proj_bias`; the gate
  clamped to <= limit, the up projection to [-limit, limit]; hidden
  `(up + 1) * gate * sigmoid(alpha * gate)`; then `down_proj` (E, m, d_model)
  plus `down_proj_bias`.

  Biases are not pruned: `gate_up_proj_bias`, `down_proj_bias` and the
  router's bias stay dense and unchanged. Every criterion ranks a weight by
  the statistics of the input it multiplies, and a bias multiplies none; in
  SparseGPT's reconstruction error ||XW + b - (XW' + b)|| it cancels. So
  every output neuron keeps adding its bias however many of its weights are
  pruned, and the down kernel is calibrated on the hidden activations after
  bias and clamp, as `expert_hidden` returns them.
  """

  def kernels(self, layer):
    return [ExpertKernel("gate_up", layer.experts.gate_up_proj, INPUT),
            ExpertKernel("down", layer.experts.down_proj, HIDDEN)]

  def gates(self, layer, tokens):
    tokens = ops.convert_to_tensor(tokens)
    return ops.cast(layer.router(tokens), tokens.dtype)

  def expert_hidden(self, layer, tokens):
    # The same arithmetic as GptOssExperts.call up to its down projection.
    experts = layer.experts
    gate_up = ops.einsum("th,ehm->etm", ops.convert_to_tensor(tokens),
                         experts.gate_up_proj)
    gate_up = gate_up + experts.gate_up_proj_bias[:, None, :]
    gate = ops.clip(gate_up[..., ::2], -1e9, experts.limit)
    up = ops.clip(gate_up[..., 1::2], -experts.limit, experts.limit)
    return (up + 1) * (gate * ops.sigmoid(gate * experts.alpha))

  def expert_outputs(self, layer, tokens):
    return layer.experts(ops.convert_to_tensor(tokens))


class DenseAdapter(MoEAdapter):
  """A `keras.layers.Dense` pruned on request (`prune_moe(also_prune=...)`):
  one "expert" that every token reaches with gate 1, so MoE-Pruner ranks its
  weights exactly as Wanda over all tokens. Not in the registry: a Dense
  layer is never taken for an MoE layer."""

  def kernels(self, layer):
    return [ExpertKernel("kernel", layer.kernel, INPUT)]

  def num_experts(self, layer) -> int:
    return 1

  def top_k(self, layer) -> int:
    return 1

  def gates(self, layer, tokens):
    tokens = ops.convert_to_tensor(tokens)
    return ops.ones((ops.shape(tokens)[0], 1), dtype=tokens.dtype)

  def expert_outputs(self, layer, tokens):
    return layer(ops.convert_to_tensor(tokens))[None]


_REGISTRY: dict[type, MoEAdapter] = {}


def register_adapter(layer_class: type, adapter: MoEAdapter) -> None:
  """Makes layers of `layer_class` (and subclasses) prunable."""
  if not (isinstance(layer_class, type)
          and issubclass(layer_class, keras.layers.Layer)):
    raise invalid_argument("layer_class", "a keras.layers.Layer subclass",
                           layer_class)
  if not isinstance(adapter, MoEAdapter):
    raise invalid_argument("adapter", "a tfopt.pruning.MoEAdapter", adapter)
  _REGISTRY[layer_class] = adapter


# keras-hub's sparse blocks: (module, class, adapter). Looked up one by one:
# a keras-hub release without one of them (older, or a renamed module)
# still registers the others.
_HUB_BLOCKS = (
    ("keras_hub.src.models.mixtral.mixtral_decoder", "MixtralSparseMoeBlock",
     MixtralAdapter),
    ("keras_hub.src.models.qwen_moe.qwen_moe_decoder", "QwenSparseMoeBlock",
     QwenMoeAdapter),
    ("keras_hub.src.models.qwen3_moe.qwen3_moe_decoder",
     "Qwen3SparseMoeBlock", Qwen3MoeAdapter),
    ("keras_hub.src.models.qwen3_5_moe.qwen3_5_moe_decoder",
     "Qwen3_5MoeSparseMoeBlock", Qwen35MoeAdapter),
    ("keras_hub.src.models.gpt_oss.gpt_oss_decoder", "GptOssSparseMoeBlock",
     GptOssAdapter),
)


def _register_keras_hub(blocks=_HUB_BLOCKS) -> list[str]:
  """Registers the keras-hub blocks that import; returns their names."""
  registered = []
  for module, name, adapter in blocks:
    try:  # Optional: keras-hub is a test extra, not a requirement.
      layer_class = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
      continue
    register_adapter(layer_class, adapter())
    registered.append(name)
  return registered


register_adapter(MoE, TfoptMoEAdapter())
_hub_checked = False


def registered_adapter(layer) -> MoEAdapter | None:
  """The adapter registered for `layer`'s class (the most derived
  registration), or None. Never the structural fallback."""
  global _hub_checked  # pylint: disable=global-statement
  if not _hub_checked:
    _hub_checked = True
    _register_keras_hub()
  for cls in type(layer).__mro__:
    if cls in _REGISTRY:
      return _REGISTRY[cls]
  return None


def adapter_for(layer) -> MoEAdapter | None:
  """The adapter of `layer`: its class's registered one, else, for an
  unregistered layer holding a router kernel and stacked expert kernels,
  the structural fallback's (checked against the layer's own output once,
  see `tfopt.pruning.fallback`), else None.

  Raises a ValueError naming the layer and its weights when the layer looks
  like an MoE block but the fallback cannot map it.
  """
  adapter = registered_adapter(layer)
  if adapter is not None:
    return adapter
  from tfopt.pruning import fallback  # pylint: disable=import-outside-toplevel
  return fallback.structural_adapter(layer)


def find_moe_layers(model) -> list:
  """The recognised MoE layers of `model`, outermost-first, each once.

  Raises a clear error when there is none (naming the layer types seen), and
  when a layer looks like an MoE block (router kernel and stacked expert
  kernels) that neither an adapter nor the structural fallback can map
  (naming that layer's weights, paths and shapes).
  """
  if not isinstance(model, keras.layers.Layer):
    raise invalid_argument("model", "a keras.Model or keras.layers.Layer",
                           model)
  found = [layer for layer in model._flatten_layers(include_self=True,  # pylint: disable=protected-access
                                                    recursive=True)
           if adapter_for(layer) is not None]
  if not found:
    kinds = sorted({type(layer).__name__ for layer in
                    model._flatten_layers(include_self=True, recursive=True)})  # pylint: disable=protected-access
    raise invalid_argument(
        "model", "a model with a recognised MoE layer (tfopt.pruning.MoE; "
        "keras-hub's Mixtral, Qwen-MoE, Qwen3-MoE, Qwen3.5-MoE or GPT-OSS "
        "sparse block; a class registered with "
        "tfopt.pruning.register_adapter; or a layer with a router kernel "
        "(d_model, E) and stacked expert kernels (E, d_in, d_out), which "
        f"the structural fallback maps); its layers are {kinds}",
        getattr(model, "name", model))
  return found
