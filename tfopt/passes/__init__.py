"""Grappler-style GraphDef rewrites: prune, identity, fold, fuse, coarsen,
place, control; a PassManager runs them as a pipeline string."""

from tfopt.passes.base import (PassContext, PassError, PassManager, PassReport,
                               PassResult, PipelineResult, op_counts,
                               parse_pipeline, register_pass,
                               registered_passes)
from tfopt.passes.control import merge_control_inputs
from tfopt.passes.fold import fold_constants
from tfopt.passes.fuse import fuse
from tfopt.passes.place import apply_placement, check_colocation
from tfopt.passes.prune import prune, remove_identities

__all__ = ["PassContext", "PassError", "PassManager", "PassReport",
           "PassResult", "PipelineResult", "apply_placement",
           "check_colocation", "fold_constants", "fuse",
           "merge_control_inputs", "op_counts",
           "parse_pipeline", "prune", "register_pass", "registered_passes",
           "remove_identities"]
