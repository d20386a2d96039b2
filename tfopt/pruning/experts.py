"""Removing (and merging) whole experts: a smaller model, not a sparser one.

`prune_experts(model, data, keep=..., method=...)` scores every expert of
every MoE layer on calibration data and returns a new model with only the
`keep` best experts per layer: the router's columns and the stacked expert
kernels of the dropped experts are gone, and the model's config says
`num_experts=keep`, so an exported SavedModel has fewer parameters and,
since tfopt's `MoE` and keras-hub's blocks evaluate every expert on every
token, less work per token. The model passed in is not changed.

Saliency (higher is kept):
- "reap": router-weighted expert activation (REAP, ICLR 2026): the mean
  over the tokens routed to the expert of gate * ||expert output||, i.e.
  how much the expert actually adds to the layer's output where it is
  used.
- "frequency": how many calibration tokens the router sends to it (the
  baseline of expert-skipping work such as NAEE).
- "random": a seeded random order (the floor).

`merge=True` folds each dropped expert into its nearest kept one (cosine
similarity of their outputs on the calibration tokens) as an average of
their weights weighted by how many calibration tokens each was routed (as
M-SMoE weighs by activation frequency); the kept expert's router column is
unchanged.

Tokens routed by the top-k among the kept experts: where a dropped expert
never received a gate on some tokens, the model's outputs on them are
exactly the dense model's (the softmax's denominator cancels in the top-k
renormalization).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from keras import ops

from tfopt._errors import invalid_argument
from tfopt.pruning.adapters import adapter_for, find_moe_layers

METHODS = ("reap", "frequency", "random")


@dataclasses.dataclass
class ExpertPruneReport:
  """What `prune_experts` did, per MoE layer (in model order)."""
  method: str
  keep: int
  num_experts: int
  layers: list          # layer names
  kept: list            # per layer, the kept expert indices (sorted)
  saliency: list        # per layer, (E,) saliency
  tokens: list          # per layer, (E,) routed calibration tokens
  merged_into: list     # per layer, {dropped: kept} when merge=True
  params_before: int
  params_after: int

  def table(self) -> str:
    lines = [f"{self.method}: {self.keep} of {self.num_experts} experts "
             f"kept per layer; parameters {self.params_before:,} -> "
             f"{self.params_after:,}"]
    for name, kept, tokens in zip(self.layers, self.kept, self.tokens):
      lines.append(f"  {name}: kept {kept} (tokens per expert "
                   f"{np.asarray(tokens).tolist()})")
    return "\n".join(lines)


def _resolve_keep(keep, num_experts: int, top_k: int) -> int:
  if isinstance(keep, float) and not isinstance(keep, bool) and 0 < keep < 1:
    keep = int(round(keep * num_experts))
  if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)) or \
      not top_k <= keep <= num_experts:
    raise invalid_argument(
        "keep", f"an int in [top_k={top_k}, num_experts={num_experts}] (or a "
        "fraction in (0, 1) of the experts that lands there)", keep)
  return int(keep)


def _layer_stats(model, layer, adapter, batches):
  """(tokens (E,), gate-weighted output norm sums (E,), mean outputs (E, d)
  over routed tokens) of one layer on the calibration batches."""
  from tfopt.pruning.hooks import capture_inputs  # pylint: disable=import-outside-toplevel
  with capture_inputs([layer]) as capture:
    for batch in batches:
      model(batch, training=False)
  e = adapter.num_experts(layer)
  tokens = np.zeros(e, dtype=np.int64)
  weighted = np.zeros(e)
  outputs = None
  for x in capture.of(layer):
    x = ops.reshape(ops.convert_to_tensor(x), (-1, ops.shape(x)[-1]))
    gates = np.asarray(ops.convert_to_numpy(adapter.gates(layer, x)),
                       dtype=np.float64)
    out = np.asarray(ops.convert_to_numpy(adapter.expert_outputs(layer, x)),
                     dtype=np.float64)
    routed = gates > 0
    tokens += routed.sum(axis=0)
    norms = np.linalg.norm(out, axis=-1).T  # (T, E)
    weighted += (gates * norms).sum(axis=0)
    flat = out.reshape(e, -1)
    outputs = flat if outputs is None else np.concatenate([outputs, flat], 1)
  return tokens, weighted, outputs


def _saliency(method, tokens, weighted, seed):
  if method == "reap":
    return weighted / np.maximum(tokens, 1)
  if method == "frequency":
    return tokens.astype(np.float64)
  return np.random.default_rng(seed).permutation(len(tokens)).astype(float)


def _nearest_kept(outputs, kept, dropped) -> dict:
  unit = outputs / np.maximum(np.linalg.norm(outputs, axis=1, keepdims=True),
                              1e-12)
  return {int(d): int(kept[int(np.argmax(unit[kept] @ unit[d]))])
          for d in dropped}


def _expert_variables(adapter, layer):
  """[(variable, expert axis)] of one layer: the router's columns and the
  stacked expert kernels."""
  routers = adapter.router_variables(layer)
  if routers is None:
    raise invalid_argument(
        "model", "MoE layers whose adapter names their router variables "
        "(tfopt's MoE and keras-hub's Mixtral, Qwen-MoE and Qwen3-MoE "
        "blocks)", f"layer {layer.name!r} of class {type(layer).__name__}")
  return routers + [(k.variable, 0) for k in adapter.kernels(layer)]


def _shrunk_config(config, num_experts: int, keep: int):
  """The config with every "num_experts": num_experts set to keep."""
  if isinstance(config, dict):
    return {k: (keep if k == "num_experts" and v == num_experts else
                _shrunk_config(v, num_experts, keep))
            for k, v in config.items()}
  if isinstance(config, list):
    return [_shrunk_config(v, num_experts, keep) for v in config]
  return config


def _rebuild(model, num_experts: int, keep: int):
  import keras  # pylint: disable=import-outside-toplevel
  config = _shrunk_config(keras.saving.serialize_keras_object(model),
                          num_experts, keep)
  return keras.saving.deserialize_keras_object(config)


def prune_experts(model, data, keep, method: str = "reap", *,
                  merge: bool = False, batch_size: int = 16,
                  min_tokens: int = 1, seed: int = 0):
  """A copy of `model` with the `keep` most salient experts of every MoE
  layer (see the module doc), and an `ExpertPruneReport`.

  Args:
    model: a Keras model with MoE layers of tfopt's `MoE` or keras-hub's
      Mixtral / Qwen-MoE / Qwen3-MoE blocks (every layer with the same
      number of experts).
    data: calibration inputs, an array shaped like the model's input (or a
      list of batches).
    keep: experts kept per layer: an int in [top_k, num_experts], or a
      fraction in (0, 1) of them.
    method: "reap", "frequency" or "random".
    merge: fold each dropped expert into its nearest kept one.
    min_tokens: each expert must get at least this many calibration tokens
      (else ValueError naming them: the data cannot judge it); 0 accepts
      experts the data never reaches (saliency 0).
    seed: the order for method="random".

  Returns (new model, report). Raises ValueError on bad input, before
  anything is built; `model` is never changed.
  """
  if method not in METHODS:
    raise invalid_argument("method", f"one of {METHODS}", method)
  layers = find_moe_layers(model)
  if not layers:
    raise invalid_argument("model", "a model with MoE layers", model.name)
  adapters = [adapter_for(layer) for layer in layers]
  counts = {a.num_experts(layer) for a, layer in zip(adapters, layers)}
  if len(counts) != 1:
    raise invalid_argument("model", "MoE layers with one expert count",
                           sorted(counts))
  (num_experts,) = counts
  top_k = max(a.top_k(layer) for a, layer in zip(adapters, layers))
  keep = _resolve_keep(keep, num_experts, top_k)
  if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or \
      min_tokens < 0:
    raise invalid_argument("min_tokens", "an int >= 0", min_tokens)
  variables = [_expert_variables(a, layer) for a, layer in
               zip(adapters, layers)]
  from tfopt.pruning.engine import calibration_batches  # pylint: disable=import-outside-toplevel
  batches = calibration_batches(model, data, batch_size)
  report = ExpertPruneReport(method, keep, num_experts, [], [], [], [], [],
                             _count(model), 0)
  plans = []
  for layer, adapter in zip(layers, adapters):
    tokens, weighted, outputs = _layer_stats(model, layer, adapter, batches)
    starved = np.flatnonzero(tokens < min_tokens).tolist()
    if starved:
      raise invalid_argument(
          "data", f"calibration data that routes at least min_tokens="
          f"{min_tokens} tokens to every expert (layer {layer.name!r}: "
          f"experts {starved} got {tokens[starved].tolist()}); more data, "
          "or min_tokens=0 to drop such experts unjudged",
          f"{len(batches)} batches")
    saliency = _saliency(method, tokens, weighted, seed + len(plans))
    kept = np.sort(np.argsort(-saliency, kind="stable")[:keep])
    dropped = np.setdiff1d(np.arange(num_experts), kept)
    merged = _nearest_kept(outputs, kept, dropped) if merge else {}
    plans.append((kept, merged, tokens))
    report.layers.append(layer.name)
    report.kept.append(kept.tolist())
    report.saliency.append(saliency)
    report.tokens.append(tokens)
    report.merged_into.append(merged)
  new = _rebuild(model, num_experts, keep)
  _copy_weights(model, new, variables, plans)
  report.params_after = _count(new)
  return new, report


def _count(model) -> int:
  return int(sum(np.prod(v.shape) for v in model.weights))


def _merged(value, axis, kept, merged, weights):
  """The kept slices, each dropped expert averaged into its target,
  weighted by `weights` (routed tokens)."""
  value = np.moveaxis(np.asarray(value, dtype=np.float64), axis, 0)
  out = value[kept].copy()
  if merged and axis == 0:  # expert kernels, not router columns
    weight = {int(k): float(weights[k]) for k in kept}
    for d, k in merged.items():
      i = int(np.flatnonzero(kept == k)[0])
      w_d = float(weights[d])
      total = weight[k] + w_d
      if total > 0:
        out[i] = (out[i] * weight[k] + value[d] * w_d) / total
        weight[k] = total
  return np.moveaxis(out, 0, axis)


def _copy_weights(old, new, variables, plans) -> None:
  """new's weights from old's, position by position (the same
  architecture), the expert axes sliced (and merged)."""
  if len(old.weights) != len(new.weights):
    raise invalid_argument("model", "a model Keras rebuilds from its config "
                           "with the same weights", old.name)
  where = {}
  for (kept, merged, tokens), pairs in zip(plans, variables):
    for var, axis in pairs:
      where[id(var)] = (axis, kept, merged, tokens)
  for src, dst in zip(old.weights, new.weights):
    value = ops.convert_to_numpy(src)
    if id(src) in where:
      axis, kept, merged, tokens = where[id(src)]
      value = _merged(value, axis, kept, merged, tokens)
    if tuple(value.shape) != tuple(dst.shape):
      raise invalid_argument(
          "model", "MoE layers whose every expert-indexed weight its adapter "
          f"names (weight {src.path} of shape {tuple(src.shape)} has no "
          f"counterpart of shape {tuple(value.shape)}; the rebuilt model has "
          f"{tuple(dst.shape)})", old.name)
    dst.assign(value.astype(dst.dtype))
