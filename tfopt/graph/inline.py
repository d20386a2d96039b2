"""Inlining of function calls in a GraphDef, so that every op is visible.

`PartitionedCall` / `StatefulPartitionedCall` nodes and direct calls of
library functions are replaced by the function's body, recursively. Body
nodes are named `<call node>/<body node>` (the runtime's own convention). The
call node's name survives as a `NoOp` that depends on every inlined node, so
control consumers (`^call`) still wait for the whole body; its data consumers
are rewired to the body's return tensors. The call's control inputs become
control inputs of the inlined nodes that have no other inlined input.

Control-flow ops (`If`, `While`, `Case` and their stateless forms) keep their
branch and loop bodies in the library: they are single ops of the step.
"""

from __future__ import annotations

from typing import Mapping

from tensorflow.core.framework import graph_pb2, node_def_pb2

_CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")


def _split(tensor: str) -> tuple[str, int]:
  """'a:1' -> ('a', 1); 'a' -> ('a', 0). Control inputs are not passed here."""
  name, _, port = tensor.partition(":")
  return name, int(port) if port else 0


def _called_function(node: node_def_pb2.NodeDef,
                     library: Mapping[str, object]) -> str | None:
  if node.op in _CALL_OPS and "f" in node.attr:
    return node.attr["f"].func.name
  if node.op in library:
    return node.op
  return None


def inline_function_calls(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
  """Returns a copy of `graph_def` with every function call inlined.

  The function library is kept (control-flow ops still need their bodies).
  """
  library = {f.signature.name: f for f in graph_def.library.function}
  out = graph_pb2.GraphDef()
  out.versions.CopyFrom(graph_def.versions)
  out.library.CopyFrom(graph_def.library)
  if not any(_called_function(n, library) for n in graph_def.node):
    out.node.extend(graph_def.node)
    return out
  nodes, remap = _inline_nodes(list(graph_def.node), library, prefix="")
  for node in nodes:
    _rewire(node, remap)
  out.node.extend(nodes)
  return out


def _rewire(node: node_def_pb2.NodeDef, remap: Mapping[str, str]) -> None:
  """Points data inputs that named a call's outputs at the inlined tensors."""
  for i, inp in enumerate(node.input):
    if not inp.startswith("^"):
      name, port = _split(inp)
      key = f"{name}:{port}"
      if key in remap:
        node.input[i] = remap[key]


def _inline_nodes(nodes, library, prefix: str):
  """Inlines calls among `nodes`; returns (new nodes, call-output remap).

  The remap sends 'call:i' to the tensor that replaces it; it may chain
  ('outer:0' -> 'outer/inner:0' -> ...), so it is resolved to a fixed point.
  """
  # Imported here: function_def_to_graph pulls in a large part of TF.
  from tensorflow.python.framework import function_def_to_graph

  result, remap = [], {}
  for node in nodes:
    fname = _called_function(node, library)
    if fname is None:
      result.append(node)
      continue
    body, flat_names = function_def_to_graph.function_def_to_graph_def(
        library[fname])
    fdef = library[fname]
    scope = node.name
    args = [a.name for a in fdef.signature.input_arg]
    data_inputs = [i for i in node.input if not i.startswith("^")]
    control_inputs = [i for i in node.input if i.startswith("^")]
    arg_to_input = dict(zip(args, data_inputs))
    inner_nodes, inner_remap = _inline_nodes(list(body.node), library,
                                             prefix=scope)
    renamed = {n.name: f"{scope}/{n.name}" for n in inner_nodes
               if n.name not in arg_to_input}

    def resolve(tensor: str) -> str:
      name, port = _split(tensor)
      key = f"{name}:{port}"
      while key in inner_remap:
        key = inner_remap[key]
      name, port = _split(key)
      if name in arg_to_input:
        return arg_to_input[name]
      return f"{renamed[name]}:{port}"

    inlined = []
    for n in inner_nodes:
      if n.name in arg_to_input:
        continue
      new = node_def_pb2.NodeDef()
      new.CopyFrom(n)
      new.name = renamed[n.name]
      del new.input[:]
      has_inlined_input = False
      for inp in n.input:
        if inp.startswith("^"):
          src = inp[1:]
          if src in arg_to_input:  # a control edge on an argument
            src_name = _split(arg_to_input[src].lstrip("^"))[0]
            new.input.append(f"^{src_name}")
          else:
            new.input.append(f"^{renamed[src]}")
            has_inlined_input = True
        else:
          src = _split(inp)[0]
          resolved = resolve(inp)
          has_inlined_input |= src not in arg_to_input
          new.input.append(resolved)
      if not has_inlined_input:
        new.input.extend(control_inputs)
      if not new.device and node.device:
        new.device = node.device
      inlined.append(new)
    # The call's outputs, in signature order, map to the body's returns.
    for k, out_arg in enumerate(fdef.signature.output_arg):
      body_tensor = flat_names[fdef.ret[out_arg.name]]
      remap[f"{node.name}:{k}"] = resolve(body_tensor)
    # Keep the call's name as a NoOp so '^call' consumers still wait for it.
    done = node_def_pb2.NodeDef(name=node.name, op="NoOp", device=node.device)
    done.input.extend(f"^{n.name}" for n in inlined)
    if not inlined:
      done.input.extend(control_inputs)
    result.extend(inlined)
    result.append(done)
  # Resolve chains ('a:0' -> 'b:0' -> 'c:1') once, here.
  for key in list(remap):
    target = remap[key]
    seen = {key}
    while target in remap and target not in seen:
      seen.add(target)
      target = remap[target]
    remap[key] = target
  for n in result:
    _rewire(n, remap)
  return result, remap
