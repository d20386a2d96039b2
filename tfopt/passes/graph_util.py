"""Small GraphDef helpers the passes share: tensor names, consumers."""

from __future__ import annotations

import collections

from tensorflow.core.framework import graph_pb2, node_def_pb2


def split_input(text: str) -> tuple[str, int, bool]:
  """"^x" -> ("x", -1, True); "x:1" -> ("x", 1, False); "x" -> ("x", 0, False)."""
  if text.startswith("^"):
    return text[1:], -1, True
  name, _, port = text.partition(":")
  return name, int(port) if port else 0, False


def node_map(graph_def: graph_pb2.GraphDef) -> dict[str, node_def_pb2.NodeDef]:
  return {node.name: node for node in graph_def.node}


def consumers(graph_def: graph_pb2.GraphDef
              ) -> dict[str, list[tuple[node_def_pb2.NodeDef, int, int]]]:
  """Producer name -> [(consumer node, input index, producer port or -1)]."""
  table = collections.defaultdict(list)
  for node in graph_def.node:
    for i, text in enumerate(node.input):
      name, port, _ = split_input(text)
      table[name].append((node, i, port))
  return table


def copy_graph(graph_def: graph_pb2.GraphDef,
               skip: set[str] | frozenset = frozenset()) -> graph_pb2.GraphDef:
  """A copy of `graph_def` (versions, library) without the nodes in `skip`."""
  out = graph_pb2.GraphDef()
  out.versions.CopyFrom(graph_def.versions)
  out.library.CopyFrom(graph_def.library)
  for node in graph_def.node:
    if node.name not in skip:
      out.node.add().CopyFrom(node)
  return out
