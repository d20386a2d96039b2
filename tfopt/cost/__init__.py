"""CostModel (per-op time and memory) and CommModel (transfer time)."""

from tfopt._lazy import lazy_getattr
from tfopt.cost.analytic import CPU, GPU_V100, DeviceSpec, estimate_costs
from tfopt.cost.comm import (CommFit, CommModel, Link, fit_comm_model,
                             fit_overhead)
from tfopt.cost.cost_model import CostModel, OpCost

_LAZY = {
    "profile_step": "tfopt.cost.profile",
    "measure_transfer_times": "tfopt.cost.comm_measure",
    "measure_comm_model": "tfopt.cost.comm_measure",
}

__getattr__ = lazy_getattr("tfopt.cost", _LAZY)


__all__ = ["CPU", "CommFit", "CommModel", "CostModel", "DeviceSpec",
           "GPU_V100", "Link", "OpCost", "estimate_costs", "fit_comm_model",
           "fit_overhead",
           *_LAZY]
