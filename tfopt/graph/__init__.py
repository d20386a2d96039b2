"""OpGraph, its construction from TensorFlow, its file format and analyses."""

from tfopt._lazy import lazy_getattr
from tfopt.graph.analysis import (CriticalPath, LiveMemoryBound, critical_path,
                                  format_summary, graph_summary,
                                  live_memory_bound, makespan_lower_bound)
from tfopt.graph.costgraph_io import (FORMAT, CostGraph, costgraph_from_dict,
                                      costgraph_to_dict, load_costgraph,
                                      save_costgraph)
from tfopt.graph.opgraph import CONTROL, Edge, Op, OpGraph, topological_order
from tfopt.graph.workloads import load_workload, workload_names, workload_path

# The TensorFlow-facing constructors import TensorFlow; they are exposed
# lazily so that reading a costgraph file does not pay for it.
_LAZY = {
    "CapturedStep": "tfopt.graph.capture",
    "capture_function": "tfopt.graph.capture",
    "capture_train_step": "tfopt.graph.capture",
    "opgraph_from_function": "tfopt.graph.capture",
    "opgraph_from_graphdef": "tfopt.graph.capture",
    "inline_function_calls": "tfopt.graph.inline",
}

__getattr__ = lazy_getattr("tfopt.graph", _LAZY)


__all__ = ["CONTROL", "CostGraph", "CriticalPath", "Edge", "FORMAT",
           "LiveMemoryBound", "Op", "OpGraph", "costgraph_from_dict",
           "costgraph_to_dict", "critical_path", "format_summary",
           "graph_summary", "live_memory_bound", "load_costgraph", "load_workload",
           "makespan_lower_bound", "save_costgraph",
           "topological_order", "workload_names", "workload_path", *_LAZY]
