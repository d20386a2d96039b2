"""Constant folding through Grappler's own constant folder.

Grappler's `constfold` is run alone (every other optimizer off) through
`tf_optimizer.OptimizeGraph`, with the context's kept nodes as fetches so it
preserves them. It only evaluates subgraphs whose inputs are all constants,
with the same kernels the runtime would use, so the values do not change;
Grappler itself refuses to materialize constants over 10 MB.
"""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import (config_pb2, meta_graph_pb2,
                                      rewriter_config_pb2)

from tfopt.passes.base import PassContext, PassResult, register_pass
from tfopt.passes.graph_util import node_map


def _graph_key(graph_def: graph_pb2.GraphDef) -> list[tuple]:
  return sorted((n.name, n.op, tuple(n.input)) for n in graph_def.node)


@register_pass("fold")
def fold_constants(graph_def: graph_pb2.GraphDef,
                   ctx: PassContext) -> PassResult:
  """Folds constant subgraphs with Grappler's constant folder."""
  # Imported here: the Grappler bindings are private TensorFlow modules.
  from tensorflow.python.grappler import tf_optimizer  # pylint: disable=g-import-not-at-top

  keep = ctx.require_keep("fold")
  meta = meta_graph_pb2.MetaGraphDef()
  meta.graph_def.CopyFrom(graph_def)
  meta.collection_def["train_op"].node_list.value.extend(sorted(keep))
  config = config_pb2.ConfigProto()
  rewrite = config.graph_options.rewrite_options
  rewrite.optimizers.append("constfold")
  rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
  rewrite.min_graph_nodes = -1
  out = tf_optimizer.OptimizeGraph(config, meta, graph_id=b"tfopt_fold")
  # Grappler may drop attributes such as device strings of untouched nodes
  # or reorder nodes; only report a change when the structure changed.
  before = node_map(graph_def)
  for node in out.node:
    if node.name in before and not node.device:
      node.device = before[node.name].device
  changed = _graph_key(out) != _graph_key(graph_def)
  fewer = len(graph_def.node) - len(out.node)
  return PassResult(out, changed,
                    f"{fewer} nodes fewer" if changed else "")
