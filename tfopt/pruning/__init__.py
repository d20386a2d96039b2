"""MoE pruning for Keras 3: MoE-Pruner, with Wanda, magnitude and SparseGPT
baselines, router-weighted OBS, expert removal, expert-wise distillation,
and sparse export.

- `MoE`: tfopt's mixture-of-experts layer (top-k router, batched SwiGLU
  experts, load-balancing loss, XLA-ready).
- `prune_moe(model, data, method=..., sparsity=... | pattern="2:4")`: one-shot
  pruning on calibration data, layer by layer.
- `prune_experts(model, data, keep=..., method="reap")`: a smaller model
  with the most salient experts of every layer (optionally merging the
  others into them).
- `MoEPruner`, `ExpertDistiller`: Keras callbacks on the same engine;
  `strip_pruning(model)` removes the masks' constraints.
- `export_sparse` / `load_sparse` / `apply_sparse`: kept values plus a packed
  bitmask or N:M indices, with a manifest; `export_saved_model` for serving.
- Adapters (`register_adapter`) say where a layer class keeps its experts:
  shipped for `MoE` and keras-hub's Mixtral, Qwen-MoE, Qwen3-MoE,
  Qwen3.5-MoE and GPT-OSS blocks; any other layer with a router kernel and
  stacked expert kernels gets the structural fallback (`fallback.py`),
  checked against the layer's own output first, or an error naming the
  weights it could not map.
"""

from tfopt.pruning.adapters import (ExpertKernel, MoEAdapter, adapter_for,
                                    find_moe_layers, register_adapter)
from tfopt.pruning.callbacks import ExpertDistiller, MoEPruner
from tfopt.pruning.engine import KernelReport, PruneReport, prune_moe
from tfopt.pruning.experts import ExpertPruneReport, prune_experts
from tfopt.pruning import reference_lm
from tfopt.pruning.export import (apply_sparse, export_saved_model,
                                  export_sparse, load_sparse)
from tfopt.pruning.hooks import capture_inputs
from tfopt.pruning.masks import (MaskConstraint, install_masks,
                                 installed_masks, strip_pruning)
from tfopt.pruning.methods import METHODS, Stats, sparsegpt
from tfopt.pruning.moe_layer import MoE, load_balancing_loss, route
from tfopt.pruning.patterns import Pattern, parse_pattern, select_mask

__all__ = ["ExpertDistiller", "ExpertKernel", "ExpertPruneReport",
           "KernelReport", "METHODS",
           "MaskConstraint", "MoE", "MoEAdapter", "MoEPruner", "Pattern",
           "PruneReport", "Stats", "adapter_for", "apply_sparse",
           "capture_inputs", "export_saved_model", "export_sparse",
           "find_moe_layers", "install_masks", "installed_masks",
           "load_balancing_loss", "load_sparse", "parse_pattern", "prune_experts", "prune_moe",
           "reference_lm", "register_adapter", "route", "select_mask",
           "sparsegpt",
           "strip_pruning"]
