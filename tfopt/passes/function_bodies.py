"""Rewriting the function bodies of a GraphDef's library with a pass made
for GraphDefs.

A While / If / Case node's bodies are FunctionDefs, whose node inputs name
an output by its op's output argument ("mm:product:0", an argument of the
function by its name "x"), where a GraphDef names it by a flat index
("mm:0"). `rewrite_bodies` turns each body into a GraphDef (its arguments
as Placeholders, the nodes its results and control results read kept),
lets a GraphDef rewrite run on it, and writes the result back into the
FunctionDef under the same signature, the inputs named by the (possibly
new) ops' output arguments again.
"""

from __future__ import annotations

from typing import Callable

from tensorflow.core.framework import function_pb2, graph_pb2
from tensorflow.python.framework import op_def_registry

# A rewrite of one body: (graph, names to keep) -> the new graph, or None
# when nothing changed.
BodyRewrite = Callable[[graph_pb2.GraphDef, set], "graph_pb2.GraphDef | None"]


def _output_layout(node, signatures) -> list[tuple[str, int]]:
  """(output argument, number of tensors) of `node`'s op, in order."""
  op_def = signatures.get(node.op) or op_def_registry.get(node.op)
  if op_def is None:
    raise ValueError(f"op {node.op!r} of node {node.name!r} is unknown")
  layout = []
  for arg in op_def.output_arg:
    if arg.number_attr:
      count = node.attr[arg.number_attr].i
    elif arg.type_list_attr:
      count = len(node.attr[arg.type_list_attr].list.type)
    else:
      count = 1
    layout.append((arg.name, count))
  return layout


def _to_flat(text: str, layouts) -> str:
  """"mm:product:0" -> "mm:0"; an argument's name and "^x" unchanged."""
  if text.startswith("^") or ":" not in text:
    return text
  name, arg, index = (text.split(":") + ["0"])[:3]
  offset = 0
  for out_arg, count in layouts[name]:
    if out_arg == arg:
      return f"{name}:{offset + int(index)}"
    offset += count
  raise ValueError(f"node {name!r} has no output {arg!r}")


def _to_named(text: str, layouts) -> str:
  """"mm:0" (or "mm") -> "mm:product:0"; an argument and "^x" unchanged."""
  if text.startswith("^"):
    return text
  name, _, port = text.partition(":")
  if name not in layouts:
    return text  # a function argument
  index = int(port or 0)
  for out_arg, count in layouts[name]:
    if index < count:
      return f"{name}:{out_arg}:{index}"
    index -= count
  raise ValueError(f"node {name!r} has no output {port}")


def body_as_graph(fdef, signatures) -> tuple[graph_pb2.GraphDef, set]:
  """The body as a GraphDef (arguments as Placeholders named like them)
  and the names its results and control results read."""
  layouts = {n.name: _output_layout(n, signatures) for n in fdef.node_def}
  graph = graph_pb2.GraphDef()
  for arg in fdef.signature.input_arg:
    placeholder = graph.node.add(name=arg.name, op="Placeholder")
    placeholder.attr["dtype"].type = arg.type
  for node in fdef.node_def:
    copy = graph.node.add()
    copy.CopyFrom(node)
    del copy.input[:]
    copy.input.extend(_to_flat(t, layouts) for t in node.input)
  keep = {t.split(":")[0] for t in fdef.ret.values()}
  keep |= set(fdef.control_ret.values())
  keep |= {a.name for a in fdef.signature.input_arg}
  return graph, keep


def graph_as_body(graph, fdef, signatures) -> function_pb2.FunctionDef:
  """`fdef` with the body `graph` (from body_as_graph, rewritten)."""
  args = {a.name for a in fdef.signature.input_arg}
  nodes = [n for n in graph.node if n.name not in args]
  layouts = {n.name: _output_layout(n, signatures) for n in nodes}
  out = function_pb2.FunctionDef()
  out.CopyFrom(fdef)
  del out.node_def[:]
  for node in nodes:
    copy = out.node_def.add()
    copy.CopyFrom(node)
    del copy.input[:]
    copy.input.extend(_to_named(t, layouts) for t in node.input)
  return out


def rewrite_bodies(graph_def: graph_pb2.GraphDef, rewrite: BodyRewrite
                   ) -> tuple[graph_pb2.GraphDef, list[str]]:
  """`graph_def` with every library function's body rewritten (a copy;
  the input is not modified) and the names of the functions changed."""
  signatures = {f.signature.name: f.signature
                for f in graph_def.library.function}
  changed, bodies = [], []
  for fdef in graph_def.library.function:
    graph, keep = body_as_graph(fdef, signatures)
    result = rewrite(graph, keep)
    if result is None:
      bodies.append(fdef)
      continue
    bodies.append(graph_as_body(result, fdef, signatures))
    changed.append(fdef.signature.name)
  if not changed:
    return graph_def, []
  out = graph_pb2.GraphDef()
  out.CopyFrom(graph_def)
  del out.library.function[:]
  out.library.function.extend(bodies)
  return out, changed
