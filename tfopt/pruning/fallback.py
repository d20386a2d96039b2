"""The structural fallback: pruning an MoE layer no adapter was written for.

A layer of no registered class is taken for an MoE block when its weights
(its own and its sublayers') hold a router kernel (d_model, E) and stacked
expert kernels (E, d_model, m), and no sublayer does (the innermost such
layer is the block; a layer that contains a registered MoE layer, and
Keras' own layer classes, never are). Its weights are then mapped:

- the router: the one 2-D weight (d_model, E) whose E is the experts axis of
  kernels fed by d_model, plus an optional router bias (E,);
- the expert kernels: every 3-D weight (E, d_in, d_out). By shapes, INPUT
  when d_in == d_model (fed by the tokens) and HIDDEN when d_out == d_model
  and d_in == m; when m == d_model the shapes cannot tell and the last one
  listed is the HIDDEN kernel (layers create gate and up before down);
- the experts: `act(x W1) W2` (one INPUT kernel (E, d_model, m)), or a GLU
  `act(x Wg) * (x Wu) W2`, from two INPUT kernels (either the gate) or one
  fused (E, d_model, 2m) kernel (halves or interleaved columns, either the
  gate); act is SiLU, GELU (erf or tanh) or ReLU;
- the routing: softmax of the router logits, top-k (k the layer's `top_k`,
  `num_experts_per_tok` or similar attribute, else each k up to 8), the k
  probabilities renormalized or not.

Nothing is guessed silently. The first combination whose `combine` equals
the layer's own call on random tokens (largest difference within 1e-4 of
the output's largest magnitude; 3e-2 in 16-bit dtypes) is used, once per
layer (the check is cached for the layer's lifetime; pruning changes
values, not the structure). A layer with weights outside the map (expert
biases, a shared expert, a norm, attention), or whose output no
combination reproduces, is refused by a Keras-style ValueError naming the
layer and the weights (paths and shapes): register an adapter for it.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable

import numpy as np
from keras import ops

from tfopt._errors import invalid_argument
from tfopt.pruning.adapters import (HIDDEN, INPUT, ExpertKernel, MoEAdapter,
                                    registered_adapter)
from tfopt.pruning.moe_layer import route

_ACTIVATIONS: dict[str, Callable] = {
    "silu": ops.silu,
    "gelu": lambda x: ops.gelu(x, approximate=False),
    "gelu_tanh": lambda x: ops.gelu(x, approximate=True),
    "relu": ops.relu,
}
# Attributes a layer may state its k in; without one each k <= 8 is tried.
_TOP_K_NAMES = ("top_k", "num_experts_per_tok", "num_experts_per_token",
                "experts_per_token", "num_selected_experts")
_MAX_GUESSED_K = 8
_PROBE_TOKENS = 64
_LISTED = 12  # weights named in an error before "... n more"


@dataclasses.dataclass(frozen=True)
class Layout:
  """Which weight is which: `inputs` the INPUT-stage kernels (E, d, w) in
  the layer's order, `down` the HIDDEN-stage kernel (E, m, d)."""
  router: Any
  router_bias: Any
  inputs: tuple
  down: Any

  @property
  def num_experts(self) -> int:
    return int(self.router.shape[1])

  @property
  def d_model(self) -> int:
    return int(self.router.shape[0])

  @property
  def width(self) -> int:
    return int(self.down.shape[1])


@dataclasses.dataclass(frozen=True)
class Experts:
  """An expert function: `hidden` maps the INPUT kernels' projections
  [(E, T, w), ...] to the HIDDEN kernel's input (E, T, m)."""
  name: str
  hidden: Callable


@dataclasses.dataclass(frozen=True)
class Routing:
  top_k: int
  normalize: bool


class StructuralAdapter(MoEAdapter):
  """The fallback's adapter for one layer: a verified `Layout`, expert
  function and routing. Computes from the mapped variables directly."""

  def __init__(self, layout: Layout, experts: Experts, routing: Routing):
    self.layout = layout
    self.experts = experts
    self.routing = routing

  def describe(self) -> str:
    r = self.routing
    return (f"router {self.layout.router.path}, softmax top-{r.top_k}"
            f"{' renormalized' if r.normalize else ''}; experts "
            f"{self.experts.name}")

  def kernels(self, layer):
    return ([ExpertKernel(k.name, k, INPUT) for k in self.layout.inputs]
            + [ExpertKernel(self.layout.down.name, self.layout.down, HIDDEN)])

  def num_experts(self, layer) -> int:
    return self.layout.num_experts

  def top_k(self, layer) -> int:
    return self.routing.top_k

  def gates(self, layer, tokens):
    tokens = ops.convert_to_tensor(tokens)
    logits = ops.matmul(tokens, ops.cast(self.layout.router, tokens.dtype))
    if self.layout.router_bias is not None:
      logits = logits + ops.cast(self.layout.router_bias, tokens.dtype)
    gates = route(logits, self.routing.top_k, self.routing.normalize)[0]
    return ops.cast(gates, tokens.dtype)

  def expert_hidden(self, layer, tokens):
    tokens = ops.convert_to_tensor(tokens)
    return self.experts.hidden([
        ops.einsum("th,ehm->etm", tokens, ops.cast(k, tokens.dtype))
        for k in self.layout.inputs])

  def expert_outputs(self, layer, tokens):
    hidden = self.expert_hidden(layer, tokens)
    return ops.einsum("etm,emh->eth", hidden,
                      ops.cast(self.layout.down, hidden.dtype))


_VERIFIED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def structural_adapter(layer) -> StructuralAdapter | None:
  """The verified fallback adapter of an unregistered MoE-looking `layer`,
  None for any other layer; raises (see the module docstring) when the
  layer looks like an MoE block the fallback cannot map."""
  cached = _VERIFIED.get(layer)
  if cached is not None:
    return cached
  if not is_candidate(layer):
    return None
  adapter = _verified(layer, _layout(layer))
  _VERIFIED[layer] = adapter
  return adapter


def _weights(layer) -> list:
  """`layer.weights` (its sublayers' included), each variable once."""
  seen, out = set(), []
  for w in layer.weights:
    if id(w) not in seen:
      seen.add(id(w))
      out.append(w)
  return out


def _shape(w) -> tuple:
  return tuple(int(s) for s in w.shape)


def _routers(weights) -> list:
  """2-D weights (d, E) with some 3-D weight (E, d, m), E >= 2."""
  fed = {_shape(w)[:2] for w in weights if len(w.shape) == 3}
  return [w for w in weights if len(w.shape) == 2 and _shape(w)[1] >= 2
          and (_shape(w)[1], _shape(w)[0]) in fed]


def _builtin(layer) -> bool:
  # Keras' own layers (EinsumDense, MultiHeadAttention...) are never an MoE
  # block, though their 2-D biases and 3-D kernels may look like one.
  return type(layer).__module__.startswith("keras.")


def _looks_like_moe(layer) -> bool:
  return not _builtin(layer) and bool(_routers(_weights(layer)))


def is_candidate(layer) -> bool:
  """True for the innermost unregistered layer holding a router kernel and
  stacked expert kernels fed by it (see the module docstring)."""
  if registered_adapter(layer) is not None or not _looks_like_moe(layer):
    return False
  for sub in layer._flatten_layers(include_self=False, recursive=True):  # pylint: disable=protected-access
    if registered_adapter(sub) is not None or _looks_like_moe(sub):
      return False  # that sublayer (or one inside it) is the block
  return True


def _cannot_map(layer, weights, why: str) -> ValueError:
  listed = [f"{w.path} {_shape(w)}" for w in weights]
  if len(listed) > _LISTED:
    listed = listed[:_LISTED] + [f"... {len(listed) - _LISTED} more"]
  return invalid_argument(
      "layer", "an MoE layer tfopt can map (its class registered with "
      "tfopt.pruning.register_adapter, or a layer the structural fallback "
      "reproduces: a router kernel (d_model, E), stacked expert kernels "
      "(E, d_in, d_out), softmax top-k routing, MLP or GLU experts). Layer "
      f"{layer.name!r} ({type(layer).__name__}) has no registered adapter "
      f"and the fallback could not map it: {why}: " + ", ".join(listed),
      f"{layer.name} ({type(layer).__name__})")


def _layout(layer) -> Layout:
  """The router, router bias and expert kernels of `layer`, by shapes;
  raises naming the weights that do not fit."""
  weights = _weights(layer)
  routers = _routers(weights)
  if len(routers) != 1:
    raise _cannot_map(layer, routers, "it has several router-like kernels "
                      "(d_model, E), so which one routes is ambiguous")
  router = routers[0]
  d, e = _shape(router)
  experts = [w for w in weights if len(w.shape) == 3 and _shape(w)[0] == e]
  biases = [w for w in weights if _shape(w) == (e,)]
  bias = biases[0] if len(biases) == 1 else None
  mapped = {id(router), id(bias)} | {id(w) for w in experts}
  unmapped = [w for w in weights if id(w) not in mapped]
  if unmapped:
    raise _cannot_map(layer, unmapped, "these weights are outside its map "
                      "(a router, an optional router bias (E,) and expert "
                      "kernels (E, d_in, d_out) only)")
  inputs, down = _stages(layer, experts, d)
  return Layout(router, bias, tuple(inputs), down)


def _stages(layer, experts, d: int):
  """(INPUT kernels, HIDDEN kernel) by shapes; raises if they do not chain
  as d_model -> m (or 2m for a fused GLU) -> d_model."""
  hidden = [w for w in experts if _shape(w)[2] == d and _shape(w)[1] != d]
  if not hidden:  # m == d_model: the last square kernel is the down one
    hidden = [w for w in experts if _shape(w)[1:] == (d, d)][-1:]
  inputs = [w for w in experts if _shape(w)[1] == d
            and all(w is not h for h in hidden)]
  ok = len(hidden) == 1 and len(inputs) + 1 == len(experts)
  if ok:
    m = _shape(hidden[0])[1]
    widths = [_shape(w)[2] for w in inputs]
    ok = widths in ([m], [2 * m], [m, m])
  if not ok:
    raise _cannot_map(layer, experts, "its expert kernels do not chain as "
                      "(E, d_model, m) [one or two, or one (E, d_model, 2m)]"
                      " then (E, m, d_model)")
  return inputs, hidden[0]


def _glu(act, gate: int) -> Callable:
  return lambda p: act(p[gate]) * p[1 - gate]


def _fused_glu(act, interleaved: bool, gate: int) -> Callable:
  def hidden(p):
    x = p[0]
    if interleaved:
      parts = (x[..., 0::2], x[..., 1::2])
    else:
      parts = ops.split(x, 2, axis=-1)
    return act(parts[gate]) * parts[1 - gate]
  return hidden


def _mlp(act) -> Callable:
  return lambda p: act(p[0])


def _expert_forms(layout: Layout) -> list[Experts]:
  """Every expert function the layout's shapes allow, likeliest first."""
  names = [k.name for k in layout.inputs]
  fused = len(names) == 1 and int(layout.inputs[0].shape[2]) != layout.width
  forms = []
  for act_name, act in _ACTIVATIONS.items():
    if len(names) == 2:
      forms += [Experts(f"{act_name}(x {names[g]}) * (x {names[1 - g]})",
                        _glu(act, g)) for g in (0, 1)]
    elif fused:
      forms += [Experts(f"{act_name}(gate) * up, {names[0]} split "
                        f"{'interleaved' if i else 'in halves'}, gate "
                        f"{'second' if g else 'first'}",
                        _fused_glu(act, i, g))
                for i in (False, True) for g in (0, 1)]
    else:
      forms.append(Experts(f"{act_name}(x {names[0]})", _mlp(act)))
  return forms


def _routings(layer, num_experts: int) -> list[Routing]:
  ks = None
  for name in _TOP_K_NAMES:
    k = getattr(layer, name, None)
    if isinstance(k, int) and not isinstance(k, bool) and (
        1 <= k <= num_experts):
      ks = [k]
      break
  if ks is None:
    ks = range(1, min(num_experts, _MAX_GUESSED_K) + 1)
  return [Routing(k, normalize) for k in ks for normalize in (True, False)]


def _layer_output(layer, tokens) -> np.ndarray:
  """The layer's own output on `tokens` (T, d), called as (1, T, d) or
  (T, d), its first element if it returns several; raises if neither works."""
  t, d = (int(s) for s in ops.shape(tokens))
  errors = []
  for shape in ((1, t, d), (t, d)):
    try:
      out = layer(ops.reshape(tokens, shape))
      if isinstance(out, (tuple, list)) and out:
        out = out[0]
      out = np.asarray(ops.convert_to_numpy(out), dtype=np.float64)
    except Exception as err:  # pylint: disable=broad-except
      # Any layer, any failure: the refusal below says what happened.
      errors.append(f"{shape}: {type(err).__name__}: {str(err)[:120]}")
      continue
    if out.size == t * d:
      return out.reshape(t, d)
    errors.append(f"{shape}: an output of shape {out.shape}")
  raise _cannot_map(layer, _weights(layer), "its call on tokens alone, to "
                    "check the mapping, failed (" + "; ".join(errors) + ")")


def _verified(layer, layout: Layout) -> StructuralAdapter:
  """The first expert function and routing whose `combine` equals the
  layer's own output on random tokens; raises if none does."""
  dtype = str(layer.compute_dtype)
  rng = np.random.default_rng(0)  # its own generator: Keras' seed untouched
  tokens = ops.cast(rng.standard_normal((_PROBE_TOKENS, layout.d_model)),
                    dtype)
  expected = _layer_output(layer, tokens)
  scale = float(np.max(np.abs(expected))) if expected.size else 0.0
  tol = (1e-4 if dtype in ("float32", "float64") else 3e-2) * max(scale,
                                                                   1e-30)
  best = np.inf
  for experts in _expert_forms(layout):
    outputs = None
    for routing in _routings(layer, layout.num_experts):
      adapter = StructuralAdapter(layout, experts, routing)
      if outputs is None:  # the experts do not depend on the routing
        outputs = adapter.expert_outputs(layer, tokens)
      got = ops.einsum("te,eth->th", adapter.gates(layer, tokens), outputs)
      diff = float(np.max(np.abs(ops.convert_to_numpy(got) - expected)))
      if diff <= tol:
        return adapter
      best = min(best, diff) if np.isfinite(diff) else best
  raise _cannot_map(
      layer, _weights(layer), "no expert function (MLP or GLU; SiLU, GELU, "
      "ReLU) with softmax top-k routing reproduces its output on random "
      f"tokens (the closest differs by up to {best:.3g}, on outputs up to "
      f"{scale:.3g})")
