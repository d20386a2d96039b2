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
