"""tfopt.costgraph/1 round trip, the shared workloads, and bad documents."""

import json
import os

import pytest

from tfopt._errors import CostGraphFormatError
from tfopt.cost import CostModel, OpCost
from tfopt.graph import (FORMAT, Op, OpGraph, costgraph_from_dict,
                         costgraph_to_dict, load_costgraph, save_costgraph)


def _doc(**changes):
  doc = {"format": FORMAT, "name": "tiny", "source": "hand-written",
         "nodes": [
             {"name": "w", "op": "VarHandleOp", "compute_us": 0.0,
              "output_bytes": [0], "temp_bytes": 0, "persistent_bytes": 64,
              "colocation": "loc:@w"},
             {"name": "mm", "op": "MatMul", "compute_us": 12.5,
              "output_bytes": [32], "temp_bytes": 8, "persistent_bytes": 0,
              "backward": False, "device_types": ["CPU", "GPU"]},
             {"name": "upd", "op": "AssignSubVariableOp", "compute_us": 1.0,
              "output_bytes": [], "temp_bytes": 0, "persistent_bytes": 0,
              "colocation": "loc:@w", "backward": True, "profiled": False}],
         "edges": [{"src": "w", "dst": "mm", "src_output": 0, "bytes": 0},
                   {"src": "mm", "dst": "upd", "src_output": 0, "bytes": 32},
                   {"src": "w", "dst": "upd", "src_output": -1, "bytes": 0}],
         "cluster": {"devices": 2, "memory_bytes_per_device": 1 << 30}}
  doc.update(changes)
  return doc


def test_round_trip_is_exact(tmp_path):
  cg = costgraph_from_dict(_doc())
  assert cg.graph["upd"].backward and not cg.costs["upd"].profiled
  assert cg.graph["mm"].device_types == ("CPU", "GPU")
  assert dict(cg.graph.colocation_groups) == {"loc:@w": ("w", "upd")}
  assert cg.graph.edges[2].is_control
  assert len(cg.suggested_cluster()) == 2
  path = tmp_path / "tiny.json"
  save_costgraph(path, cg.graph, cg.costs, source="hand-written",
                 num_devices=2, memory_bytes_per_device=1 << 30)
  again = load_costgraph(path)
  assert again.graph.ops == cg.graph.ops
  assert again.graph.edges == cg.graph.edges
  assert dict(again.costs) == dict(cg.costs)
  assert costgraph_to_dict(again.graph, again.costs, source="hand-written",
                           num_devices=2, memory_bytes_per_device=1 << 30) == \
      json.loads(path.read_text())


def test_every_shared_costgraph_loads(costgraph_files):
  for path in costgraph_files:
    if path.name.startswith("LICENSE"):
      continue
    cg = load_costgraph(path)
    raw = json.loads(path.read_text())
    assert len(cg.graph) == len(raw["nodes"]) > 100
    assert len(cg.graph.edges) == len(raw["edges"])
    assert cg.costs.total_compute_us() == pytest.approx(
        sum(n["compute_us"] for n in raw["nodes"]))
    assert cg.num_devices == raw["cluster"]["devices"]


@pytest.mark.parametrize("change, message", [
    (dict(format="tfopt.costgraph/2"), "Field `format` must be"),
    (dict(nodes="x"), "Field `nodes` must be a list"),
    (dict(cluster={"devices": 0}), "cluster.devices"),
])
def test_bad_top_level_fields(change, message):
  with pytest.raises(CostGraphFormatError, match=message):
    costgraph_from_dict(_doc(**change))


def test_bad_nodes_and_edges_name_the_field():
  doc = _doc()
  doc["nodes"][1]["compute_us"] = -3
  with pytest.raises(CostGraphFormatError,
                     match=r"nodes\[1\].compute_us.*Received.*-3"):
    costgraph_from_dict(doc)
  doc = _doc()
  doc["nodes"][2]["name"] = "mm"
  with pytest.raises(CostGraphFormatError, match=r"nodes\[2\].name.*unique"):
    costgraph_from_dict(doc)
  doc = _doc()
  doc["edges"][0]["dst"] = "ghost"
  with pytest.raises(CostGraphFormatError, match=r"edges\[0\].dst.*'ghost'"):
    costgraph_from_dict(doc)
  doc = _doc()
  doc["edges"].append({"src": "upd", "dst": "w", "src_output": -1, "bytes": 0})
  with pytest.raises(CostGraphFormatError, match="acyclic.*cycle"):
    costgraph_from_dict(doc)
  doc = _doc()
  doc["nodes"][0]["output_bytes"] = [1.5]
  with pytest.raises(CostGraphFormatError, match="output_bytes"):
    costgraph_from_dict(doc)


def test_malformed_json_names_the_position(tmp_path):
  path = tmp_path / "bad.json"
  path.write_text('{"format": "tfopt.costgraph/1", "nodes": [}')
  with pytest.raises(CostGraphFormatError, match="not valid JSON.*line 1"):
    load_costgraph(path)


def test_save_never_overwrites_and_is_atomic(tmp_path):
  g = OpGraph([Op("a", "X", (4,))], [])
  costs = CostModel({"a": OpCost(1.0)})
  path = tmp_path / "g.json"
  path.write_text("precious")
  with pytest.raises(FileExistsError, match="overwrite=True"):
    save_costgraph(path, g, costs)
  assert path.read_text() == "precious"
  save_costgraph(path, g, costs, overwrite=True)
  assert load_costgraph(path).graph.ops == g.ops
  # Written like open() would: readable by others under the usual umask.
  umask = os.umask(0)
  os.umask(umask)
  assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask
  # A failing write (a cost is missing) leaves nothing behind.
  other = tmp_path / "h.json"
  with pytest.raises(ValueError, match="missing op 'b'"):
    save_costgraph(other, OpGraph([Op("a", "X"), Op("b", "X")], []), costs)
  assert sorted(os.listdir(tmp_path)) == ["g.json"]
