"""Read and write the `tfopt.costgraph/1` JSON format.

The format (`shared/formats/costgraph.md`) carries a graph's structure and its
costs together; in memory they are an OpGraph and a CostModel, bundled with
the workload's suggested cluster in a `CostGraph`. Every malformed field gets
a CostGraphFormatError naming the field and the value received; files are
written atomically and never overwritten unless asked.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Mapping

from tfopt._errors import CostGraphFormatError, GraphError, _short_repr
from tfopt._io import atomic_write_text
from tfopt.cost.cost_model import CostModel, OpCost
from tfopt.graph.opgraph import Edge, Op, OpGraph

FORMAT = "tfopt.costgraph/1"


@dataclasses.dataclass(frozen=True)
class CostGraph:
  """A graph, its costs, and the workload's own cluster suggestion."""
  graph: OpGraph
  costs: CostModel
  num_devices: int | None = None
  memory_bytes_per_device: int | None = None
  source: str = ""

  def suggested_cluster(self):
    """The file's Cluster, if it had one (a caller's cluster always wins)."""
    from tfopt.cluster import Cluster  # cluster -> cost -> graph: import late
    if self.num_devices is None:
      return None
    return Cluster.uniform(self.num_devices, self.memory_bytes_per_device)


def _bad(field: str, constraint: str, value: Any) -> CostGraphFormatError:
  return CostGraphFormatError(f"Field `{field}` must be {constraint}. "
                              f"Received: {field}={_short_repr(value)}")


def _number(d: Mapping, key: str, where: str, *, integer: bool,
            default: Any = None) -> Any:
  if key not in d:
    if default is not None:
      return default
    raise _bad(f"{where}.{key}", "present", "<missing>")
  value = d[key]
  ok = not isinstance(value, bool) and isinstance(
      value, int if integer else (int, float))
  if ok and not integer:
    ok = math.isfinite(value)
  if not ok or value < 0:
    kind = "an integer >= 0" if integer else "a finite number >= 0"
    raise _bad(f"{where}.{key}", kind, value)
  return value


def costgraph_from_dict(doc: Any) -> CostGraph:
  """Validates a parsed `tfopt.costgraph/1` document and builds a CostGraph."""
  if not isinstance(doc, dict):
    raise _bad("<document>", "a JSON object", doc)
  if doc.get("format") != FORMAT:
    raise _bad("format", f"{FORMAT!r}", doc.get("format", "<missing>"))
  nodes = doc.get("nodes")
  if not isinstance(nodes, list):
    raise _bad("nodes", "a list", nodes)
  edges = doc.get("edges", [])
  if not isinstance(edges, list):
    raise _bad("edges", "a list", edges)
  ops, costs = [], {}
  for i, n in enumerate(nodes):
    where = f"nodes[{i}]"
    if not isinstance(n, dict):
      raise _bad(where, "an object", n)
    name = n.get("name")
    if not isinstance(name, str) or not name:
      raise _bad(f"{where}.name", "a non-empty string", name)
    op_type = n.get("op", "Layer")
    if not isinstance(op_type, str):
      raise _bad(f"{where}.op", "a string", op_type)
    out_bytes = n.get("output_bytes", [])
    if not isinstance(out_bytes, list) or any(
        isinstance(b, bool) or not isinstance(b, int) or b < 0
        for b in out_bytes):
      raise _bad(f"{where}.output_bytes", "a list of integers >= 0", out_bytes)
    colocation = n.get("colocation")
    if colocation is not None and not isinstance(colocation, str):
      raise _bad(f"{where}.colocation", "a string", colocation)
    device_types = n.get("device_types")
    if device_types is not None and (
        not isinstance(device_types, list) or not device_types
        or not all(isinstance(t, str) for t in device_types)):
      raise _bad(f"{where}.device_types", "a non-empty list of strings",
                 device_types)
    for flag in ("backward", "profiled"):
      if flag in n and not isinstance(n[flag], bool):
        raise _bad(f"{where}.{flag}", "a boolean", n[flag])
    ops.append(Op(name=name, type=op_type, output_bytes=tuple(out_bytes),
                  colocation=colocation,
                  device_types=tuple(device_types) if device_types else None,
                  backward=n.get("backward", False)))
    if name in costs:
      raise _bad(f"{where}.name", "unique", name)
    costs[name] = OpCost(
        compute_us=float(_number(n, "compute_us", where, integer=False)),
        temp_bytes=_number(n, "temp_bytes", where, integer=True, default=0),
        persistent_bytes=_number(n, "persistent_bytes", where, integer=True,
                                 default=0),
        profiled=n.get("profiled", True))
  graph_edges = []
  for k, e in enumerate(edges):
    where = f"edges[{k}]"
    if not isinstance(e, dict):
      raise _bad(where, "an object", e)
    for end in ("src", "dst"):
      if not isinstance(e.get(end), str):
        raise _bad(f"{where}.{end}", "a node name", e.get(end, "<missing>"))
      if e[end] not in costs:
        raise _bad(f"{where}.{end}", "the name of a node", e[end])
    port = e.get("src_output", 0)
    if isinstance(port, bool) or not isinstance(port, int) or port < -1:
      raise _bad(f"{where}.src_output", "an integer >= -1", port)
    graph_edges.append(Edge(e["src"], e["dst"], port, None,
                            _number(e, "bytes", where, integer=True,
                                    default=0)))
  name = doc.get("name", "costgraph")
  if not isinstance(name, str):
    raise _bad("name", "a string", name)
  try:
    graph = OpGraph(ops, graph_edges, name=name)
  except GraphError as err:
    raise CostGraphFormatError(f"The graph in the document is invalid: {err}"
                               ) from None
  num_devices = memory = None
  cluster = doc.get("cluster")
  if cluster is not None:
    if not isinstance(cluster, dict):
      raise _bad("cluster", "an object", cluster)
    num_devices = cluster.get("devices")
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or \
        num_devices <= 0:
      raise _bad("cluster.devices", "a positive integer", num_devices)
    memory = cluster.get("memory_bytes_per_device")
    if memory is not None and (isinstance(memory, bool) or not isinstance(
        memory, int) or memory <= 0):
      raise _bad("cluster.memory_bytes_per_device", "a positive integer",
                 memory)
  source = doc.get("source", "")
  return CostGraph(graph, CostModel(costs, source=str(source)), num_devices,
                   memory, str(source))


def costgraph_to_dict(graph: OpGraph, costs: CostModel, *, source: str = "",
                      num_devices: int | None = None,
                      memory_bytes_per_device: int | None = None) -> dict:
  """The `tfopt.costgraph/1` document of `graph` costed by `costs`."""
  costs.check_covers(graph)
  nodes = []
  for op in graph.ops:
    c = costs[op.name]
    node = {"name": op.name, "op": op.type, "compute_us": c.compute_us,
            "output_bytes": list(op.output_bytes), "temp_bytes": c.temp_bytes,
            "persistent_bytes": c.persistent_bytes, "backward": op.backward,
            "profiled": c.profiled}
    if op.colocation is not None:
      node["colocation"] = op.colocation
    if op.device_types is not None:
      node["device_types"] = list(op.device_types)
    nodes.append(node)
  doc = {"format": FORMAT, "name": graph.name,
         "source": source or costs.source, "nodes": nodes,
         "edges": [{"src": e.src, "dst": e.dst, "src_output": e.src_output,
                    "bytes": e.bytes} for e in graph.edges]}
  if num_devices is not None:
    doc["cluster"] = {"devices": num_devices}
    if memory_bytes_per_device is not None:
      doc["cluster"]["memory_bytes_per_device"] = memory_bytes_per_device
  return doc


def load_costgraph(path: str | os.PathLike) -> CostGraph:
  """Reads a `tfopt.costgraph/1` file; malformed JSON names the position."""
  path = os.fspath(path)
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except FileNotFoundError:
    raise FileNotFoundError(
        f"Costgraph file {path!r} does not exist (the shipped workloads load "
        f"by name: tfopt.graph.load_workload)") from None
  except IsADirectoryError:
    raise IsADirectoryError(
        f"Costgraph file {path!r} is a directory, not a file") from None
  try:
    doc = json.loads(text)
  except json.JSONDecodeError as err:
    raise CostGraphFormatError(
        f"File {path!r} is not valid JSON: {err.msg} at line {err.lineno} "
        f"column {err.colno}") from None
  try:
    return costgraph_from_dict(doc)
  except CostGraphFormatError as err:
    raise CostGraphFormatError(f"File {path!r}: {err}") from None


def save_costgraph(path: str | os.PathLike, graph: OpGraph, costs: CostModel,
                   *, source: str = "", num_devices: int | None = None,
                   memory_bytes_per_device: int | None = None,
                   overwrite: bool = False) -> None:
  """Writes `graph` and `costs` atomically as a `tfopt.costgraph/1` file."""
  doc = costgraph_to_dict(graph, costs, source=source, num_devices=num_devices,
                          memory_bytes_per_device=memory_bytes_per_device)
  atomic_write_text(path, json.dumps(doc, separators=(",", ":")) + "\n",
                    overwrite=overwrite)
