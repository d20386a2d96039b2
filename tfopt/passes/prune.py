"""Dead-node pruning and identity removal."""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2

from tfopt._errors import invalid_argument
from tfopt.graph.capture import prune_graph_def
from tfopt.passes.base import PassContext, PassResult, register_pass
from tfopt.passes.graph_util import copy_graph, node_map, split_input

# Identity-like ops that forward input 0 unchanged (IdentityN, their
# several-output form, is handled beside them). Not ops whose device
# differs from their input's: such an Identity is an explicit copy to
# another device.
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


def _ref_dtype(node) -> bool:
  if "T" not in node.attr:
    return False
  types = list(node.attr["T"].list.type) or [node.attr["T"].type]
  return any(t >= 100 for t in types)  # DT_*_REF


@register_pass("identity")
def remove_identities(graph_def: graph_pb2.GraphDef,
                      ctx: PassContext) -> PassResult:
  """Forwards consumers of Identity-like nodes to the nodes they copy.

  IdentityN is split the same way: each consumer of its output k reads
  its input k. (Keras' optimizers gather every gradient in one IdentityN;
  left whole, it is one op that reads every gradient, so a placer must
  bring all of them to one device.) A control input on an IdentityN
  becomes a control input on each of the producers it forwarded.

  Kept: nodes in `ctx.keep`, identities with control inputs (they order
  something), identities of a reference, and identities on another device
  than one of their inputs (a deliberate copy). StopGradient and
  PreventGradient only matter while gradients are built; a captured step
  already holds its gradients, so they forward their input like Identity.
  """
  keep = set(ctx.keep)
  nodes = node_map(graph_def)
  # identity name -> the tensor each of its outputs copies
  forward: dict[str, list[str]] = {}
  for node in graph_def.node:
    if node.name in keep or _ref_dtype(node):
      continue
    if node.op in IDENTITY_OPS and len(node.input) != 1:
      continue
    if node.op not in IDENTITY_OPS and node.op != "IdentityN":
      continue
    if not node.input or any(t.startswith("^") for t in node.input):
      continue
    producers = [split_input(t)[0] for t in node.input]
    if any(p not in nodes or nodes[p].device != node.device
           for p in producers):
      continue
    forward[node.name] = list(node.input)

  def resolve(text: str, seen=frozenset()) -> list[str]:
    name, port, control = split_input(text)
    if name not in forward or name in seen:
      return [text]
    seen = seen | {name}
    if control:
      return [c for t in forward[name]
              for c in resolve("^" + split_input(t)[0], seen)]
    if port >= len(forward[name]):
      return [text]
    return resolve(forward[name][port], seen)

  out = copy_graph(graph_def, set(forward))
  for node in out.node:
    new_inputs, seen_controls = [], set()
    for text in node.input:
      for text in resolve(text):
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
