"""tfopt: TensorFlow-native graph optimization.

One tool for the three walls of training a TensorFlow/Keras model: it does
not fit one device, it trains slowly or unstably at scale, it is bigger than
it needs to be. The capabilities, their modules and their guides (docs/):

- **Capture and cost a step**: `tfopt.graph` (`OpGraph`, the shipped
  workloads: `tfopt.graph.load_workload`), `tfopt.cost` (profiled or
  analytic costs, communication models), `tfopt.cluster` (devices, caps,
  links, core sharing), `tfopt.calibration` (a machine's fitted numbers).
  Guide: docs/placement.md.
- **Placement (Baechi)**: `tfopt.placement` (m-TOPO, m-ETF, m-SCT, m-stage,
  m-branch, exact CP-SAT, the `auto` portfolio), `tfopt.simulate` (the one
  simulator), `tfopt.passes` (GraphDef rewrites), `tfopt.runtime` (placed
  steps run for real, across processes too). Guide: docs/placement.md.
- **The Keras hook**: `tfopt.compile` (fusion, placement, variables moved
  to their planned devices, XLA). Guide: docs/compile.md.
- **Cautious Weight Decay optimizers**: `tfopt.optimizers` (CautiousAdamW,
  CautiousLion, CautiousMuon). Guide: docs/optimizers.md.
- **MoE pruning (MoE-Pruner)**: `tfopt.pruning`. Guide: docs/pruning.md.
- **One-shot NAS with visual steering**: `tfopt.nas`. Guide: docs/nas.md.
- **Training at scale (MegaScale's lessons)**: `tfopt.scale` (MFU,
  stragglers, heartbeats, restarts). Guide: docs/scale.md.
- **Export**: `tfopt.export` (SavedModel for TF Serving). Guide:
  docs/export.md.
- **Command-line tools**: `tfopt.cli` (`tfopt-place`, `tfopt-train`, ...).
"""

__version__ = "0.1.0"

# Before anything loads TensorFlow: a clear message for unsupported versions.
from tfopt._versions import check_versions as _check_versions

_check_versions()

# First: OR-Tools must load before TensorFlow (see _native.py).
from tfopt import _native  # noqa: F401  pylint: disable=unused-import

from tfopt.cluster import Cluster, ComputeSharing, Device
# tfopt.compile(model, ...): Keras' compile plus the optimized train step.
from tfopt.compile import compile  # noqa: A004  pylint: disable=redefined-builtin
from tfopt.cost import CommModel, CostModel, OpCost
from tfopt.graph import Edge, Op, OpGraph

__all__ = ["Cluster", "CommModel", "ComputeSharing", "CostModel", "Device",
           "Edge", "Op", "OpCost", "OpGraph", "__version__", "compile"]
