"""One-shot MoE pruning: the calibration engine behind `prune_moe` and the
`MoEPruner` callback.

Layer by layer, in the order the model calls them: run the model on the
calibration data with a hook on that one MoE layer (the earlier layers are
already pruned, so the layer sees what it will see after pruning), take its
inputs and routing, and prune its expert kernels. Within a layer the
first-stage kernels (fed by the block input) are pruned first, then the
experts' hidden activations are recomputed with them, and the second-stage
kernels (fed by those) are pruned on the recomputed inputs, as SparseGPT
and Wanda prune a block sequentially. Only expert kernels are written: the
router, attention and everything else stay bit for bit as they were.
"""

from __future__ import annotations

import dataclasses
import re
import time
import warnings

import numpy as np
from keras import ops

from tfopt._errors import TfoptWarning, check_positive_int, invalid_argument
from tfopt.pruning import methods as methods_lib
from tfopt.pruning.adapters import (HIDDEN, INPUT, DenseAdapter, adapter_for,
                                    find_moe_layers)
from tfopt.pruning.hooks import capture_inputs
from tfopt.pruning.masks import install_masks
from tfopt.pruning.patterns import (Pattern, check_divides, resolve_pattern,
                                    select_mask)


@dataclasses.dataclass
class KernelReport:
  layer: str
  kernel: str
  path: str
  shape: tuple
  sparsity: float
  tokens_min: int
  tokens_max: int


@dataclasses.dataclass
class PruneReport:
  """What `prune_moe` did: method, pattern, per-kernel rows, the keep-masks
  keyed by variable path, the seconds it took and the warnings raised."""
  method: str
  pattern: Pattern
  kernels: list[KernelReport]
  masks: dict[str, np.ndarray]
  seconds: float
  warnings: list[str]

  @property
  def sparsity(self) -> float:
    """Fraction of the pruned kernels' weights that are now zero-masked."""
    total = sum(m.size for m in self.masks.values())
    return 1.0 - sum(int(m.sum()) for m in self.masks.values()) / max(total, 1)

  def table(self) -> str:
    head = (f"{'layer':18s} {'kernel':8s} {'shape':>14s} {'sparsity':>8s} "
            f"{'tokens/expert':>15s}")
    lines = [f"{self.method} {self.pattern} in {self.seconds:.2f} s", head]
    for k in self.kernels:
      shape = "x".join(map(str, k.shape))
      tokens = ("-" if self.method == "magnitude"  # uses no data
                else f"{k.tokens_min}-{k.tokens_max}")
      lines.append(f"{k.layer:18s} {k.kernel:8s} {shape:>14s} "
                   f"{k.sparsity:8.2%} {tokens:>15s}")
    return "\n".join(lines)


def calibration_batches(model, data, batch_size: int) -> list:
  """Calibration batches shaped like the model's input: arrays, or dicts of
  arrays for models with named inputs (keras-hub backbones)."""
  if isinstance(data, dict):
    arrays = {k: np.asarray(v) for k, v in data.items()}
    lengths = {len(v) for v in arrays.values() if v.ndim}
    if len(lengths) != 1 or 0 in lengths:
      raise invalid_argument("data", "a dict of non-empty arrays with one "
                             "common length", {k: v.shape
                                               for k, v in arrays.items()})
    n = lengths.pop()
    return [{k: v[i:i + batch_size] for k, v in arrays.items()}
            for i in range(0, n, batch_size)]
  if isinstance(data, (list, tuple)) and data and not np.isscalar(data[0]):
    batches = [b if isinstance(b, dict) else np.asarray(b) for b in data]
  else:
    array = np.asarray(data)
    if array.ndim == 0 or len(array) == 0:
      raise invalid_argument("data", "a non-empty array of model inputs "
                             "(or a list of such batches)",
                             getattr(array, "shape", data))
    batches = [array[i:i + batch_size]
               for i in range(0, len(array), batch_size)]
  inputs = getattr(model, "inputs", None)
  if inputs and len(inputs) == 1:
    expected = tuple(inputs[0].shape)
    for b in batches:
      ok = (not isinstance(b, dict) and b.ndim == len(expected) and all(
          e is None or e == s for e, s in zip(expected[1:], b.shape[1:])))
      if not ok:
        raise invalid_argument(
            "data", f"batches of shape {expected} (the model's input)",
            getattr(b, "shape", type(b).__name__))
  return batches


def _ordered(model, batch, layers) -> list:
  """MoE layers in the order the model first calls them on `batch`."""
  with capture_inputs(layers) as capture:
    model(batch, training=False)
  missing = [l.name for l in layers if not capture.of(l)]
  if missing:
    warnings.warn(f"MoE layers {missing} are not called by the model's "
                  "forward pass; they are not pruned.", TfoptWarning, stacklevel=3)
  return capture.order


def prune_moe(model, data, method: str = "moe_pruner", sparsity=None,
              pattern=None, *, batch_size: int = 16,
              wanda_tokens: str = "routed", blocksize: int = 128,
              percdamp: float = 0.01, min_tokens: int = 16,
              prior_tokens: float = 128.0, refit: bool | None = None,
              previous_masks: dict | None = None, install: bool = False,
              also_prune=None, verbose: int = 1) -> PruneReport:
  """Prunes every recognised MoE layer's expert kernels in place.

  Args:
    model: a Keras 3 model with MoE layers (see `tfopt.pruning.adapters`).
    data: calibration inputs: an array (N, ...) shaped like the model's
      input, or a list of such batches.
    method: "moe_pruner", "wanda", "magnitude", "sparsegpt" or
      "router_obs" (SparseGPT's OBS update with the router-gate-weighted
      Hessian, see `tfopt.pruning.methods`).
    sparsity: fraction in [0, 1) removed from each comparison group
      (each output neuron; each expert matrix for magnitude); default 0.5.
      With an N:M pattern it may only repeat the pattern's (1 - N/M).
    pattern: None / "unstructured", or "N:M" (e.g. "2:4": N of every M
      consecutive inputs kept in every output neuron).
    wanda_tokens: "routed" (the tokens routed to the expert) or "all".
    blocksize, percdamp: SparseGPT's column block and Hessian dampening
      (also router_obs').
    min_tokens: warn when an expert gets fewer calibration tokens; an
      expert with none is pruned by magnitude (router_obs: by the layer's
      pooled Hessian), with a warning.
    prior_tokens: router_obs: pseudo-tokens of the layer's pooled
      per-token Hessian added to each expert's (a number >= 0).
    refit: sparsegpt and router_obs: once the mask is chosen, solve each
      output neuron's kept weights exactly for the least output error
      (`tfopt.pruning.methods.masked_refit`); None: router_obs does,
      sparsegpt (as its paper) does not.
    previous_masks: {path: keep} already applied (gradual pruning): those
      weights stay pruned. Not supported with sparsegpt or router_obs.
    also_prune: only expert kernels are pruned unless asked: a regex (or a
      list) matched against layer names selects `keras.layers.Dense` layers
      pruned too, each as one expert that every token reaches with gate 1
      (so MoE-Pruner there equals Wanda over all tokens).
    install: also install the masks (zeros kept through training).
    verbose: 1 shows a progress bar over the layers.

  Returns a `PruneReport`; `report.masks` maps variable paths to keep-masks.
  """
  import keras  # pylint: disable=import-outside-toplevel
  opts = _Options(method, resolve_pattern(sparsity, pattern), wanda_tokens,
                  blocksize, percdamp, min_tokens, previous_masks or {},
                  prior_tokens, refit)
  _check_arguments(opts, batch_size)
  layers = find_moe_layers(model)
  adapters = {id(layer): adapter_for(layer) for layer in layers}
  for layer in _dense_layers(model, also_prune):
    layers.append(layer)
    adapters[id(layer)] = DenseAdapter()
  batches = calibration_batches(model, data, batch_size)
  for layer in layers:
    for k in adapters[id(layer)].kernels(layer):
      check_divides(opts.pattern, int(k.variable.shape[-2]),
                    f"{layer.name}/{k.name}")
  start = time.perf_counter()
  layers = _ordered(model, batches[0], layers)
  report = PruneReport(method, opts.pattern, [], {}, 0.0, [])
  bar = keras.utils.Progbar(len(layers), verbose=verbose,
                            unit_name="layer") if verbose else None
  for li, layer in enumerate(layers):
    _prune_layer(model, layer, adapters[id(layer)], batches, opts, report)
    if bar is not None:
      bar.update(li + 1)
  report.seconds = time.perf_counter() - start
  if install:
    install_masks(model, report.masks)
  return report


@dataclasses.dataclass(frozen=True)
class _Options:
  """`prune_moe`'s choices, as every step of it needs them."""
  method: str
  pattern: Pattern
  wanda_tokens: str
  blocksize: int
  percdamp: float
  min_tokens: int
  previous_masks: dict
  prior_tokens: float = 128.0
  refit: bool | None = None

  @property
  def uses_data(self) -> bool:
    return self.method != "magnitude"  # magnitude needs no forward pass


def _check_arguments(opts: _Options, batch_size: int) -> None:
  if opts.method not in methods_lib.METHODS:
    raise invalid_argument("method", f"one of {methods_lib.METHODS}",
                           opts.method)
  check_positive_int("batch_size", batch_size)
  check_positive_int("blocksize", opts.blocksize)
  obs = opts.method in methods_lib.OBS_METHODS
  if (obs and opts.pattern.structured
      and opts.blocksize % opts.pattern.m):
    raise invalid_argument("blocksize", f"a multiple of M={opts.pattern.m}",
                           opts.blocksize)
  if opts.wanda_tokens not in ("routed", "all"):
    raise invalid_argument("wanda_tokens", '"routed" or "all"',
                           opts.wanda_tokens)
  if opts.previous_masks and obs:
    raise invalid_argument("previous_masks", f"None with method="
                           f"{opts.method!r} (its weight updates cannot keep "
                           "an earlier mask)", "{...}")
  prior = opts.prior_tokens
  if isinstance(prior, bool) or not isinstance(prior, (int, float)) or \
      not prior >= 0 or prior == float("inf"):
    raise invalid_argument("prior_tokens", "a finite number >= 0", prior)
  if opts.refit is not None and not isinstance(opts.refit, bool):
    raise invalid_argument("refit", "True, False or None", opts.refit)
  if opts.refit and not obs:
    raise invalid_argument("refit", f"None or False with method="
                           f"{opts.method!r} (it refits the kept weights of "
                           f"the OBS methods {methods_lib.OBS_METHODS})",
                           opts.refit)


def _prune_layer(model, layer, adapter, batches, opts: _Options,
                 report: PruneReport) -> None:
  """Prunes one layer's kernels, first stage then second, adding their
  rows, masks and warnings to `report`."""
  inputs: list = []
  if opts.uses_data:
    with capture_inputs([layer]) as capture:
      for batch in batches:
        model(batch, training=False)
    inputs = capture.of(layer)
  gates = [ops.convert_to_numpy(adapter.gates(layer, x)) for x in inputs]
  for stage in (INPUT, HIDDEN):
    stage_kernels = [k for k in adapter.kernels(layer) if k.stage == stage]
    if not stage_kernels:
      continue
    stats = _stage_stats(layer, adapter, stage, stage_kernels, inputs, gates,
                         opts)
    starved = [int(e) for e in np.flatnonzero(stats.tokens == 0)]
    if opts.uses_data and stage == INPUT:
      _warn_starved(layer, stats, starved, opts, report)
    for k in stage_kernels:
      _prune_kernel(layer, k, stats, starved if opts.uses_data else (),
                    opts, report)


def _stage_stats(layer, adapter, stage, stage_kernels, inputs, gates,
                 opts: _Options):
  """The calibration statistics of one stage's inputs, per expert."""
  d_in = int(stage_kernels[0].variable.shape[-2])
  stats = methods_lib.Stats.zeros(adapter.num_experts(layer), d_in,
                                  hessian=opts.method == "sparsegpt",
                                  gated_hessian=opts.method == "router_obs")
  for x, g in zip(inputs, gates):
    # HIDDEN inputs are recomputed with the just-pruned INPUT kernels.
    stats.add(x if stage == INPUT else
              ops.convert_to_numpy(adapter.expert_hidden(layer, x)), g)
  return stats


def _warn_starved(layer, stats, starved, opts: _Options,
                  report: PruneReport) -> None:
  """Warns about experts with no or too few calibration tokens."""
  min_tokens = opts.min_tokens
  instead = ("the layer's pooled router-weighted Hessian"
             if opts.method == "router_obs" else "magnitude")
  few = [int(e) for e in np.flatnonzero(
      (stats.tokens > 0) & (stats.tokens < min_tokens))]
  messages = []
  if starved:
    messages.append(f"MoE layer '{layer.name}': experts {starved} received "
                    f"no calibration token; they are pruned by {instead}.")
  if few:
    messages.append(f"MoE layer '{layer.name}': experts {few} received "
                    f"fewer than min_tokens={min_tokens} calibration tokens "
                    f"({stats.tokens[few].tolist()}); their statistics are "
                    "noisy.")
  for msg in messages:
    report.warnings.append(msg)
    # stacklevel: the user's call of prune_moe (or the callback's hook).
    warnings.warn(msg, TfoptWarning, stacklevel=4)


def _prune_kernel(layer, k, stats, starved, opts: _Options,
                  report: PruneReport) -> None:
  """Prunes one kernel in place; its row and mask go into `report`."""
  var = k.variable
  old = ops.convert_to_numpy(var)
  prev = opts.previous_masks.get(var.path)
  flat = old.ndim == 2  # a Dense kernel: one expert
  if flat:
    old = old[None]
    prev = None if prev is None else np.asarray(prev)[None]
  new, keep = _prune(opts, old, stats, starved, prev)
  if flat:
    old, new, keep = old[0], new[0], keep[0]
  var.assign(new.astype(old.dtype))
  report.masks[var.path] = keep
  tokens = stats.tokens if opts.uses_data else np.zeros(1, int)
  report.kernels.append(KernelReport(layer.name, k.name, var.path, old.shape,
                                     1.0 - keep.mean(), int(tokens.min()),
                                     int(tokens.max())))


def _dense_layers(model, also_prune) -> list:
  """The Dense layers whose names match `also_prune` (regex or list)."""
  if also_prune is None:
    return []
  import keras  # pylint: disable=import-outside-toplevel
  patterns = [also_prune] if isinstance(also_prune, str) else also_prune
  try:
    compiled = [re.compile(p) for p in patterns]
  except (TypeError, re.error) as err:
    raise invalid_argument("also_prune", "a regex or a list of regexes over "
                           f"layer names ({err})", also_prune) from None
  chosen = []
  for layer in model._flatten_layers(include_self=False, recursive=True):  # pylint: disable=protected-access
    if not any(c.search(layer.name) for c in compiled):
      continue
    if adapter_for(layer) is not None:
      continue  # an MoE layer: pruned anyway
    if not isinstance(layer, keras.layers.Dense):
      raise invalid_argument(
          "also_prune", "regexes matching only keras.layers.Dense layers "
          f"(or MoE layers); it matches {layer.name!r}, a "
          f"{type(layer).__name__}", also_prune)
    chosen.append(layer)
  if not chosen:
    raise invalid_argument("also_prune", "regexes matching at least one "
                           "Dense layer of the model", also_prune)
  return chosen


def _prune(opts: _Options, old, stats, starved, prev):
  method, pat, wanda_tokens = opts.method, opts.pattern, opts.wanda_tokens
  if prev is None:
    return methods_lib.prune_kernel(
        method, old, stats, pat, wanda_tokens=wanda_tokens,
        blocksize=opts.blocksize, percdamp=opts.percdamp,
        fallback_experts=starved, prior_tokens=opts.prior_tokens,
        refit=opts.refit)
  # Gradual pruning: weights pruned before score below everything else, so
  # the new mask contains the old one (the counts are exact and larger).
  s = (np.abs(old) if method == "magnitude" else
       methods_lib.scores(method, old, stats, wanda_tokens))
  for e in starved:
    s[e] = np.abs(old[e])
  s = np.where(np.asarray(prev, dtype=bool), s, -np.inf)
  keep = select_mask(s, pat, methods_lib.comparison_group(method))
  return np.where(keep, old, 0.0), keep
