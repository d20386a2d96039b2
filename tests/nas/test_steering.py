"""Steering constraints: edits, versioning, round trip through a file, the
restriction they impose on enumeration and sampling, validation."""

import json

import numpy as np
import pytest

from tfopt.nas.space import tiny64
from tfopt.nas.steering import Constraints


def test_edits_restrict_the_space_and_are_logged(tmp_path):
  space = tiny64()
  c = Constraints()
  c.remove_op(space, "layer0", "conv5")
  c.remove_op(space, "layer0", "skip")
  c.lock_layer(space, "layer2", "maxpool")
  assert c.version == 3
  assert [h["action"] for h in c.history] == ["remove", "remove", "lock"]
  allowed = c.allowed_ops(space)
  assert allowed == {"layer0": ["conv3", "maxpool"], "layer2": ["maxpool"]}
  archs = list(space.enumerate(allowed))
  assert len(archs) == 2 * 4 * 1
  rng = np.random.default_rng(0)
  for _ in range(200):  # a removed op is never sampled, a lock holds
    arch = space.sample(rng, allowed)
    assert arch[0] in ("conv3", "maxpool") and arch[2] == "maxpool"
  path = tmp_path / "constraints.json"
  c.save(str(path))
  again = Constraints.load(str(path), space)
  assert again == c
  assert json.loads(path.read_text())["format"] == "tfopt.nas.constraints/1"
  again.unlock("layer2")
  assert again.version == 4 and "layer2" not in again.allowed_ops(space)


def test_a_layer_without_ops_is_refused_and_nothing_changes():
  space = tiny64()
  c = Constraints()
  for op in ("conv3", "conv5", "maxpool"):
    c.remove_op(space, "layer1", op)
  with pytest.raises(ValueError, match="leave layer 'layer1' at least one"):
    c.remove_op(space, "layer1", "skip")
  assert c.version == 3 and "skip" not in c.remove["layer1"]
  with pytest.raises(ValueError, match="leave layer 'layer1' at least one"):
    c.lock_layer(space, "layer1", "conv3")  # locked to a removed op
  assert c.lock == {}


@pytest.mark.parametrize("data,match", [
    ({"format": "x"}, "format tfopt.nas.constraints/1"),
    ({"format": "tfopt.nas.constraints/1", "remove": {"layer0": "conv3"}},
     "Argument `remove` must be a mapping of layer names to lists"),
    ({"format": "tfopt.nas.constraints/1", "lock": {"layer0": 3}},
     "Argument `lock`"),
    ({"format": "tfopt.nas.constraints/1", "version": -1}, "`version`"),
])
def test_malformed_documents(data, match):
  with pytest.raises(ValueError, match=match):
    Constraints.from_dict(data)


def test_file_errors_and_unknown_names(tmp_path):
  space = tiny64()
  with pytest.raises(FileNotFoundError, match="existing constraints file"):
    Constraints.load(str(tmp_path / "missing.json"))
  bad = tmp_path / "bad.json"
  bad.write_text("{not json")
  with pytest.raises(ValueError, match="a JSON file"):
    Constraints.load(str(bad))
  with pytest.raises(ValueError, match="keyed by choice layers of 'tiny64'"):
    Constraints(remove={"layer7": ["skip"]}).allowed_ops(space)
  with pytest.raises(ValueError, match="ops of that layer"):
    Constraints(remove={"layer0": ["conv7"]}).allowed_ops(space)
  with pytest.raises(ValueError, match="an op of that layer"):
    Constraints(lock={"layer0": "conv7"}).allowed_ops(space)


def test_prefer_weights_the_sampling_frequencies():
  space = tiny64()
  c = Constraints()
  c.prefer_op(space, "layer1", "conv3", 4.0)
  c.remove_op(space, "layer1", "skip")
  draw = c.sampler(space)
  rng = np.random.default_rng(0)
  counts = {op: 0 for op in space.layer("layer1").op_names}
  n = 6000
  for _ in range(n):
    counts[draw(rng)[1]] += 1
  # weights conv3 4, conv5 1, maxpool 1, skip removed: 4/6, 1/6, 1/6, 0.
  assert counts["skip"] == 0
  for op, p in (("conv3", 4 / 6), ("conv5", 1 / 6), ("maxpool", 1 / 6)):
    assert abs(counts[op] / n - p) < 4 * np.sqrt(p * (1 - p) / n)
  c.prefer_op(space, "layer1", "conv3", 1)  # neutral again: dropped
  assert c.prefer == {} and c.version == 3
  with pytest.raises(ValueError, match=r"prefer\['layer1'\]\['conv3'\]"):
    c.prefer_op(space, "layer1", "conv3", 0)


def test_region_union_intersection_complement():
  space = tiny64()
  a = ("conv3", "conv3", "conv3")
  b = ("skip", "skip", "skip")
  d = ("conv5", "maxpool", "skip")
  c = Constraints()
  c.select(space, [a, b])                   # region = {a, b}
  c.select(space, [space.index(d)])         # union by index: {a, b, d}
  assert {x for x in space.enumerate() if c.admits(space, x)} == {a, b, d}
  c.select(space, [b, d], how="intersection")  # {b, d}
  c.select(space, [d], how="complement")       # {b}
  assert [x for x in space.enumerate() if c.admits(space, x)] == [b]
  assert c.admitted(space) == [b]
  rng = np.random.default_rng(0)
  assert {c.sampler(space)(rng) for _ in range(20)} == {b}
  with pytest.raises(ValueError, match="admit at least one sub-graph"):
    c.select(space, [b], how="complement")  # would admit nothing
  assert c.admitted(space) == [b]           # refused: unchanged
  with pytest.raises(ValueError, match=r"region.archs\[0\]"):
    c.select(space, [("conv3", "conv3")])
  with pytest.raises(ValueError, match="Argument `how`"):
    c.select(space, [a], how="xor")
  c.clear_region(space)
  assert len(c.admitted(space)) == 64


def test_limits_use_the_parameter_count(tmp_path):
  space = tiny64()
  counts = {a: space.param_count(a) for a in space.enumerate()}
  limit = sorted(counts.values())[20]
  c = Constraints()
  c.set_limits(space, max_params=limit)
  expected = [a for a in space.enumerate() if counts[a] <= limit]
  assert c.admitted(space) == expected
  c.set_limits(space, max_params=limit, min_params=limit)
  assert all(counts[a] == limit for a in c.admitted(space))
  with pytest.raises(ValueError, match="admit at least one"):
    c.set_limits(space, max_params=10)
  c.prefer_op(space, "layer0", "maxpool", 3.0)
  c.select(space, list(c.admitted(space))[:2])
  path = tmp_path / "c.json"
  c.save(str(path))
  again = Constraints.load(str(path), space)
  assert again == c and again.admitted(space) == c.admitted(space)
  data = json.loads(path.read_text())
  data["limits"] = {"max_flops": 3}
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match="keyed by"):
    Constraints.load(str(path), space)
  data["limits"] = {}
  data["region"] = {"xor": []}
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match="exactly one key"):
    Constraints.load(str(path), space)
