"""Op fusion into the fused kernels TensorFlow has on CPU (and GPU).

Rewrites, when the intermediate results have no other use:
  MatMul + BiasAdd [+ act]               -> _FusedMatMul
  Conv2D + BiasAdd [+ act]               -> _FusedConv2D
  Conv2D + FusedBatchNorm{,V2,V3} [+ act] -> _FusedConv2D (inference-mode
                                            batch norm only)
in the graph and inside its library's function bodies (While loops', If
and Case branches: tfopt.passes.function_bodies), with act one of Relu,
Relu6, Elu, LeakyRelu: the activations TF's CPU kernels implement for both (checked on TF 2.21; Tanh, Sigmoid and GELU
fail in the CPU _FusedConv2D kernel). float32 only.

The fused node takes the name of the last node it replaces, so consumers,
fetches and gradient ops that read it (ReluGrad reads the Relu's output) are
untouched. An intermediate read only by shape ops (Shape, ShapeN, Size, Rank)
still fuses: those read the fused output, which has the same shape. Control
inputs of the replaced nodes move to the fused node. Training-mode batch norm
(it also returns the batch statistics) is left alone, as are Keras 3's own
batch-norm layers, which lower to elementwise ops rather than FusedBatchNorm.
"""

from __future__ import annotations

from tensorflow.core.framework import attr_value_pb2, graph_pb2, types_pb2

from tfopt.passes.base import PassContext, PassResult, register_pass
from tfopt.passes.function_bodies import rewrite_bodies
from tfopt.passes.graph_util import consumers, split_input

ACTIVATIONS = ("Relu", "Relu6", "Elu", "LeakyRelu")
BATCH_NORMS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
_SHAPE_OPS = ("Shape", "ShapeN", "Size", "Rank")
_CONV_ATTRS = ("strides", "padding", "explicit_paddings", "data_format",
               "dilations", "use_cudnn_on_gpu")


def _is_float32(node) -> bool:
  return "T" in node.attr and node.attr["T"].type == types_pb2.DT_FLOAT


def _sole_data_use(name, uses, keep, allowed_consumer) -> bool:
  """`name`'s output 0 feeds only `allowed_consumer` (input 0) and shape
  ops; its other outputs feed nothing; control uses are fine."""
  if name in keep:
    return False
  main = 0
  for consumer, index, port in uses.get(name, ()):
    if port == -1:
      continue
    if port != 0:
      return False
    if consumer.name == allowed_consumer:
      if index != 0:
        return False
      main += 1
    elif consumer.op not in _SHAPE_OPS:
      return False
  return main == 1


def _sole_consumer(name, uses, keep):
  """The one node reading `name`:0 as input 0, if fusion may absorb `name`."""
  data = [(c, i, p) for c, i, p in uses.get(name, ())
          if p != -1 and c.op not in _SHAPE_OPS]
  if len(data) != 1:
    return None
  consumer = data[0][0]
  return consumer if _sole_data_use(name, uses, keep, consumer.name) else None


def _match(root, uses, keep):
  """(members, kind) for the fusion starting at MatMul/Conv2D `root`."""
  if root.op not in ("MatMul", "Conv2D") or not _is_float32(root):
    return None
  if root.op == "Conv2D" and root.attr["data_format"].s not in (b"", b"NHWC"):
    return None
  nxt = _sole_consumer(root.name, uses, keep)
  if nxt is None:
    return None
  if nxt.op == "BiasAdd" and _is_float32(nxt) and \
      nxt.attr["data_format"].s in (b"", b"NHWC"):
    kind = "BiasAdd"
  elif (root.op == "Conv2D" and nxt.op in BATCH_NORMS and
        not nxt.attr["is_training"].b and
        nxt.attr["data_format"].s in (b"", b"NHWC") and _is_float32(nxt) and
        ("U" not in nxt.attr or nxt.attr["U"].type == types_pb2.DT_FLOAT)):
    kind = "FusedBatchNorm"
  else:
    return None
  members = [root, nxt]
  act = _sole_consumer(nxt.name, uses, keep)
  if act is not None and act.op in ACTIVATIONS and _is_float32(act):
    members.append(act)
  return members, kind


def _fused_node(members, kind, out_graph):
  root, second = members[0], members[1]
  last = members[-1]
  node = out_graph.node.add()
  node.name = last.name
  node.device = root.device or last.device
  node.op = "_FusedMatMul" if root.op == "MatMul" else "_FusedConv2D"
  args = ([second.input[1]] if kind == "BiasAdd" else list(second.input[1:5]))
  node.input.extend(list(root.input[:2]) + args)
  controls = []
  for m in members:
    for text in m.input:
      if text.startswith("^") and text not in controls and \
          text[1:] not in {x.name for x in members}:
        controls.append(text)
  node.input.extend(controls)
  node.attr["T"].type = types_pb2.DT_FLOAT
  node.attr["num_args"].i = len(args)
  if root.op == "MatMul":
    node.attr["transpose_a"].b = root.attr["transpose_a"].b
    node.attr["transpose_b"].b = root.attr["transpose_b"].b
  else:
    node.attr["TArgs"].list.type.extend([types_pb2.DT_FLOAT] * len(args))
    for attr in _CONV_ATTRS:
      if attr in root.attr:
        node.attr[attr].CopyFrom(root.attr[attr])
  ops = [kind] + ([last.op] if len(members) == 3 else [])
  node.attr["fused_ops"].CopyFrom(attr_value_pb2.AttrValue(
      list=attr_value_pb2.AttrValue.ListValue(s=[o.encode() for o in ops])))
  if kind == "FusedBatchNorm":
    node.attr["epsilon"].f = second.attr["epsilon"].f
  if last.op == "LeakyRelu":
    node.attr["leakyrelu_alpha"].f = last.attr["alpha"].f
  return node


@register_pass("fuse")
def fuse(graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult:
  """Fuses MatMul/Conv2D with their bias or batch norm and activation, in
  the graph and in its library's function bodies (a While loop's, an If's
  or Case's branches)."""
  fused = _fuse_nodes(graph_def, set(ctx.keep))
  out, counts = graph_def, {}
  if fused is not None:
    out, groups = fused
    for name, (members, _) in groups.items():
      ctx.fused[name] = tuple(m.name for m in members)
    counts = _counts(groups)
  in_bodies: dict[str, int] = {}

  def fuse_body(body, keep):
    result = _fuse_nodes(body, keep)
    if result is None:
      return None
    for op, n in _counts(result[1]).items():
      in_bodies[op] = in_bodies.get(op, 0) + n
    return result[0]

  out, _ = rewrite_bodies(out, fuse_body)
  if not counts and not in_bodies:
    return PassResult(graph_def, False)
  note = ", ".join([f"{n} {op}" for op, n in sorted(counts.items())] +
                   [f"{n} {op} in function bodies"
                    for op, n in sorted(in_bodies.items())])
  return PassResult(out, True, note)


def _counts(groups) -> dict[str, int]:
  counts: dict[str, int] = {}
  for members, _ in groups.values():
    op = "_FusedMatMul" if members[0].op == "MatMul" else "_FusedConv2D"
    counts[op] = counts.get(op, 0) + 1
  return counts


def _fuse_nodes(graph_def: graph_pb2.GraphDef, keep: set):
  """(the graph with its nodes fused, {fused node: (members, kind)}), or
  None when nothing fuses. The library is copied as it is."""
  uses = consumers(graph_def)
  groups, absorbed = {}, {}
  for node in graph_def.node:
    found = _match(node, uses, keep)
    if found is None:
      continue
    members, kind = found
    if any(m.name in absorbed for m in members):
      continue
    groups[members[-1].name] = (members, kind)
    for m in members:
      absorbed[m.name] = members[-1].name
  if not groups:
    return None
  out = graph_pb2.GraphDef()
  out.versions.CopyFrom(graph_def.versions)
  out.library.CopyFrom(graph_def.library)
  for node in graph_def.node:
    if node.name in groups:
      members, kind = groups[node.name]
      _fused_node(members, kind, out)
    elif node.name not in absorbed:
      out.node.add().CopyFrom(node)
  # Readers of an absorbed node (shape ops, control edges) read the fused
  # node instead: same shape, and it runs after everything it replaced.
  for node in out.node:
    inputs, seen = [], set()
    for text in node.input:
      name, _, control = split_input(text)
      if name in absorbed and absorbed[name] != name and \
          node.name != absorbed[name]:
        text = ("^" if control else "") + absorbed[name]
      if control and text in seen:
        continue  # two absorbed nodes may redirect to one fused node
      seen.add(text)
      inputs.append(text)
    del node.input[:]
    node.input.extend(inputs)
  return out, groups
