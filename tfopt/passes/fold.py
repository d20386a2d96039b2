"""Constant folding through Grappler's own constant folder.

Grappler's `constfold` is run alone (every other optimizer off) through
`tf_optimizer.OptimizeGraph`, with the context's kept nodes as fetches so it
preserves them. It only evaluates subgraphs whose inputs are all constants,
with the same kernels the runtime would use, so the values do not change;
Grappler itself refuses to materialize constants over 10 MB.

A folded constant is persistent memory for as long as the graph lives.
Grappler folds `Fill` / `zeros_like` of a static shape (an optimizer's
mask of ones, say) into a Const as large as a weight matrix: a 9 MB
constant per layer that the step used to build in microseconds and free
again. Folded constants of at least `SPLAT_FILL_MIN_BYTES` whose elements
are all equal are therefore written back as `Fill(shape, value)`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.core.protobuf import (config_pb2, meta_graph_pb2,
                                      rewriter_config_pb2)

from tfopt.passes.base import PassContext, PassResult, register_pass
from tfopt.passes.graph_util import node_map


# Folded splat constants at least this large go back to Fill (see above).
SPLAT_FILL_MIN_BYTES = 1 << 20


def _splat_value(node) -> np.ndarray | None:
  """The one value of a large folded Const whose elements are all equal."""
  tensor = node.attr["value"].tensor
  dims = [d.size for d in tensor.tensor_shape.dim]
  dtype = tf.as_dtype(tensor.dtype)
  if not dims or dtype in (tf.string, tf.resource, tf.variant) or \
      int(np.prod(dims)) * dtype.size < SPLAT_FILL_MIN_BYTES:
    return None
  value = tf.make_ndarray(tensor)
  first = value.reshape(-1)[:1]
  return first[0] if np.all(value == first[0]) else None


def _fill_splats(graph_def: graph_pb2.GraphDef,
                 before: dict) -> tuple[graph_pb2.GraphDef, int]:
  """Large splat Consts Grappler created, written back as Fill nodes."""
  out = graph_pb2.GraphDef()
  out.versions.CopyFrom(graph_def.versions)
  out.library.CopyFrom(graph_def.library)
  count = 0
  for node in graph_def.node:
    old = before.get(node.name)
    value = (_splat_value(node) if node.op == "Const" and
             (old is None or old.op != "Const") else None)
    if value is None:
      out.node.add().CopyFrom(node)
      continue
    count += 1
    tensor = node.attr["value"].tensor
    dims = [d.size for d in tensor.tensor_shape.dim]
    for suffix, array in (("shape", np.asarray(dims, np.int32)),
                          ("value", np.asarray(value))):
      const = out.node.add(name=f"{node.name}/{suffix}", op="Const",
                           device=node.device)
      const.attr["dtype"].type = tf.as_dtype(array.dtype).as_datatype_enum
      const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(array))
    fill = node_def_pb2.NodeDef(name=node.name, op="Fill", device=node.device,
                                input=[f"{node.name}/shape",
                                       f"{node.name}/value"] +
                                [t for t in node.input if t.startswith("^")])
    fill.attr["T"].type = tensor.dtype
    fill.attr["index_type"].type = tf.int32.as_datatype_enum
    out.node.add().CopyFrom(fill)
  return out, count


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
  # TFG's region passes specialize Case/If branch functions under names
  # that import into a GraphDef but not into a tf.function (seen with TF
  # 2.21: "Op type not registered '..._rewritten_tfg_region_specialized_...'"
  # when fit ran a NAS switch network's folded step).
  rewrite.disable_tfg_optimizer = True
  out = tf_optimizer.OptimizeGraph(config, meta, graph_id=b"tfopt_fold")
  # Grappler may drop attributes such as device strings of untouched nodes
  # or reorder nodes; only report a change when the structure changed.
  before = node_map(graph_def)
  for node in out.node:
    if node.name in before and not node.device:
      node.device = before[node.name].device
  out, splats = _fill_splats(out, before)
  changed = _graph_key(out) != _graph_key(graph_def)
  fewer = len(graph_def.node) - len(out.node)
  note = f"{fewer} nodes fewer" if changed else ""
  if splats:
    note += f"; {splats} large splat constants kept as Fill"
  return PassResult(out, changed, note)
