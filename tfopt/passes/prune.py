"""Dead-node pruning and identity removal."""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2

from tfopt._errors import invalid_argument
from tfopt.graph.capture import prune_graph_def
from tfopt.passes.base import PassContext, PassResult, register_pass
from tfopt.passes.graph_util import copy_graph, node_map, split_input

# Identity-like ops that forward input 0 unchanged. Not IdentityN (several
# outputs) and not ops whose device differs from their input's: such an
# Identity is an explicit copy to another device.
IDENTITY_OPS = ("Identity", "Snapshot", "StopGradient", "PreventGradient")


@register_pass("prune")
def prune(graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult:
  """Removes every node that no kept node needs (data or control input)."""
  keep = ctx.require_keep("prune")
  missing = sorted(keep - {node.name for node in graph_def.node})
  if missing:
    raise invalid_argument("ctx.keep", "names of nodes in the graph",
                           missing[:5])
  out = prune_graph_def(graph_def, sorted(keep))
  dead = len(graph_def.node) - len(out.node)
  return PassResult(out, bool(dead),
                    f"{dead} dead nodes removed" if dead else "")


@register_pass("identity")
def remove_identities(graph_def: graph_pb2.GraphDef,
                      ctx: PassContext) -> PassResult:
  """Forwards consumers of Identity-like nodes to the nodes they copy.

  Kept: nodes in `ctx.keep`, identities with control inputs (they order
  something), identities of a reference, and identities on another device
  than their input (a deliberate copy). StopGradient and PreventGradient
  only matter while gradients are built; a captured step already holds its
  gradients, so they forward their input like Identity.
  """
  keep = set(ctx.keep)
  nodes = node_map(graph_def)
  forward: dict[str, str] = {}  # identity name -> the tensor it copies
  for node in graph_def.node:
    if node.op not in IDENTITY_OPS or node.name in keep:
      continue
    if len(node.input) != 1 or node.input[0].startswith("^"):
      continue
    src, _, _ = split_input(node.input[0])
    if src not in nodes or nodes[src].device != node.device:
      continue
    if "T" in node.attr and node.attr["T"].type >= 100:  # a ref dtype
      continue
    forward[node.name] = node.input[0]

  def resolve(text: str) -> str:
    name, port, control = split_input(text)
    seen = set()
    while name in forward and name not in seen:
      seen.add(name)
      if control:
        name = split_input(forward[name])[0]
      else:
        if port != 0:
          break
        name, port, _ = split_input(forward[name])
    if control:
      return "^" + name
    return name if port == 0 else f"{name}:{port}"

  out = copy_graph(graph_def, set(forward))
  for node in out.node:
    new_inputs, seen_controls = [], set()
    for text in node.input:
      text = resolve(text)
      if text.startswith("^"):
        if text in seen_controls:
          continue
        seen_controls.add(text)
      new_inputs.append(text)
    # Data inputs first, control inputs last, as GraphDef requires; a control
    # input duplicating a data input's producer is redundant.
    data = [t for t in new_inputs if not t.startswith("^")]
    producers = {split_input(t)[0] for t in data}
    controls = [t for t in new_inputs if t.startswith("^")
                and t[1:] not in producers]
    del node.input[:]
    node.input.extend(data + controls)
  return PassResult(out, bool(forward),
                    f"{len(forward)} identities removed" if forward else "")
