"""The coarsening and placement passes: decide with `tfopt.placement`, then
write `NodeDef.device` (the only step that writes device strings).

TensorFlow honours per-node device strings, but silently moves any op that
reads or updates a resource variable to the variable's device, and
`_class: loc:@` groups override device strings. So before writing,
`apply_placement` checks that each colocation group (a variable with all its
readers and updaters, and `_class` groups; see `opgraph_from_graphdef`) is
on one device, and refuses a plan that splits one.

Function-library bodies: a node calling a function (While, If,
PartitionedCall) is one node to the placer; its device is written on the
call, and on every node of the called functions when all their callers share
one device.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from tensorflow.core.framework import graph_pb2

from tfopt._errors import invalid_argument
from tfopt.cost import analytic
from tfopt.cost.cost_model import CostModel, OpCost
from tfopt.graph.capture import opgraph_from_graphdef
from tfopt.passes.base import PassContext, PassResult, register_pass
from tfopt.placement.api import place
from tfopt.placement.coarsen import coarsen


def _called_functions(node, library_names) -> list[str]:
  names = []
  for value in node.attr.values():
    if value.HasField("func") and value.func.name in library_names:
      names.append(value.func.name)
    for f in value.list.func:
      if f.name in library_names:
        names.append(f.name)
  if node.op in library_names:
    names.append(node.op)
  return names


def check_colocation(graph, placement: Mapping[str, int]) -> None:
  """Raises ValueError naming a colocation group split across devices."""
  first: dict[str, tuple[str, int]] = {}
  for op in graph.ops:
    if not op.colocation or op.name not in placement:
      continue
    device = placement[op.name]
    if op.colocation not in first:
      first[op.colocation] = (op.name, device)
    elif first[op.colocation][1] != device:
      other, other_device = first[op.colocation]
      raise invalid_argument(
          "placement", "one device for every colocation group (a variable "
          "lives with every op that reads or updates it; TensorFlow would "
          "silently move the op to the variable's device)",
          f"<group {op.colocation!r}: {other!r} on device {other_device}, "
          f"{op.name!r} on device {device}>")


def apply_placement(graph_def: graph_pb2.GraphDef, placement: Mapping[str, int],
                    device_names: Sequence[str], *, graph=None,
                    colocation: bool = True) -> graph_pb2.GraphDef:
  """A copy of `graph_def` with `NodeDef.device` written from `placement`.

  Args:
    graph_def: the graph (not modified).
    placement: node name -> device index, for every top-level node.
    device_names: TF device strings, indexed by device.
    graph: its OpGraph, if already built (for the colocation check).
    colocation: check that no colocation group is split (see module doc).
      Turning it off exists to test that runtime verification catches what
      TensorFlow silently does with such a plan.
  """
  device_names = list(device_names)
  if not device_names or not all(isinstance(d, str) and d
                                 for d in device_names):
    raise invalid_argument("device_names", "a non-empty list of TF device "
                           "strings", device_names)
  for node in graph_def.node:
    if node.name not in placement:
      raise invalid_argument("placement", "a device for every node of the "
                             "graph", f"<node {node.name!r} unplaced>")
    d = placement[node.name]
    if isinstance(d, bool) or not isinstance(d, int) or \
        not 0 <= d < len(device_names):
      raise invalid_argument(
          f"placement[{node.name!r}]", f"a device index in [0, "
          f"{len(device_names)}) (devices: {device_names})", d)
  if colocation:
    if graph is None:
      graph = opgraph_from_graphdef(graph_def, inline=False)
    check_colocation(graph, placement)
  out = graph_pb2.GraphDef()
  out.CopyFrom(graph_def)
  library = {f.signature.name: f for f in out.library.function}
  callers: dict[str, set[str]] = {}
  for node in out.node:
    node.device = device_names[placement[node.name]]
    for fname in _called_functions(node, library):
      callers.setdefault(fname, set()).add(node.device)
  # Nested calls inherit the device of the outermost caller.
  pending = list(callers)
  while pending:
    fname = pending.pop()
    devices = callers[fname]
    if len(devices) != 1:
      continue
    for fnode in library[fname].node_def:
      fnode.device = next(iter(devices))
      for inner in _called_functions(fnode, library):
        if callers.setdefault(inner, set()) != devices:
          callers[inner] |= devices
          pending.append(inner)
  return out


def step_costs(graph, ctx: PassContext):
  """Costs for every op of the current graph: measured costs by name; a
  fused op costs the sum of the ops it replaced; anything new is estimated."""
  given = ctx.costs or {}
  table = {}
  for op in graph.ops:
    members = ctx.fused.get(op.name)
    if members and all(m in given for m in members):
      parts = [given[m] for m in members]
      table[op.name] = OpCost(
          compute_us=sum(p.compute_us for p in parts),
          temp_bytes=max(p.temp_bytes for p in parts),
          persistent_bytes=sum(p.persistent_bytes for p in parts),
          profiled=all(p.profiled for p in parts))
    elif op.name in given:
      table[op.name] = given[op.name]
    else:
      table[op.name] = analytic.estimate_op(graph, op.name, analytic.CPU)
  return CostModel(table, source=getattr(ctx.costs, "source", "estimated"))


def _opgraph(graph_def, ctx):
  return opgraph_from_graphdef(graph_def, batch_size=ctx.batch_size,
                               inline=False)


@register_pass("coarsen")
def coarsen_pass(graph_def: graph_pb2.GraphDef,
                 ctx: PassContext) -> PassResult:
  """Proposes coarse groups and lets the placement pass try them.

  The graph is not rewritten (decide, then rewrite): the placement pass
  places the contracted graph as well as the original one and expands the
  coarse plan back to every op. `ctx.results["coarsening"]` has the report.
  """
  graph = _opgraph(graph_def, ctx)
  coarse = coarsen(graph, step_costs(graph, ctx))
  ctx.coarsen = True
  ctx.results["coarsening"] = coarse
  return PassResult(graph_def, False, coarse.describe())


@register_pass("place")
def place_pass(graph_def: graph_pb2.GraphDef, ctx: PassContext) -> PassResult:
  """Places the graph on `ctx.cluster` and writes the device strings.

  Uses `ctx.placement` when given; otherwise runs `tfopt.placement.place`
  with `ctx.placer` on the current graph's costs (`ctx.results["placement"]`
  holds the PlacementResult) and, with `ctx.choose`, lets it pick among the
  candidates (by measurement: `ctx.results["selection"]`).
  """
  if ctx.cluster is None:
    raise invalid_argument("ctx.cluster", "a tfopt.Cluster for pass 'place'",
                           None)
  graph = _opgraph(graph_def, ctx)
  placement = ctx.placement
  if placement is None:
    result = place(graph, ctx.cluster, step_costs(graph, ctx), ctx.placer,
                   pins=ctx.pins, coarsen=True if ctx.coarsen else None)
    ctx.results["placement"] = result
    placement = result.placement
  names = [d.name for d in ctx.cluster.devices]
  out = apply_placement(graph_def, placement, names, graph=graph)
  if ctx.placement is None and ctx.choose is not None:
    result, ctx.results["selection"] = ctx.choose(out, result)
    ctx.results["placement"] = result
    placement = result.placement
    out = apply_placement(graph_def, placement, names, graph=graph)
  used = sorted(set(placement[n.name] for n in graph_def.node))
  return PassResult(out, True, f"on devices {used}")
