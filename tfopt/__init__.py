"""tfopt: TensorFlow-native graph optimization.

The foundation: capture a step as an `OpGraph` (`tfopt.graph`), cost it by
profiling or estimate (`tfopt.cost`), describe devices (`tfopt.cluster`), and
build models to try it on (`tfopt.zoo`). Placement: `tfopt.placement`;
Cautious Weight Decay optimizers for Keras 3: `tfopt.optimizers`; graph
rewrites, placed execution and export: `tfopt.passes`, `tfopt.runtime`,
`tfopt.export`; the Keras hook: `tfopt.compile`; MoE
pruning (MoE-Pruner, baselines, distillation, sparse export):
`tfopt.pruning`.
"""

__version__ = "0.1.0"

# First: OR-Tools must load before TensorFlow (see _native.py).
from tfopt import _native  # noqa: F401  pylint: disable=unused-import

from tfopt.cluster import Cluster, ComputeSharing, Device
# tfopt.compile(model, ...): Keras' compile plus the optimized train step.
from tfopt.compile import compile  # noqa: A004  pylint: disable=redefined-builtin
from tfopt.cost import CommModel, CostModel, OpCost
from tfopt.graph import Edge, Op, OpGraph

__all__ = ["Cluster", "CommModel", "ComputeSharing", "CostModel", "Device",
           "Edge", "Op", "OpCost", "OpGraph", "__version__", "compile"]
