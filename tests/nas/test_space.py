"""Search spaces as data: size, enumeration, indexing, sampling, encoding,
JSON round trip and validation (pure Python, no TensorFlow)."""

import collections
import json

import numpy as np
import pytest

from tfopt.nas.space import ChoiceLayer, SearchSpace, stage_block, tiny64


def test_tiny64_enumerates_64_distinct_archs_in_index_order():
  space = tiny64()
  assert space.size == 64
  archs = list(space.enumerate())
  assert len(archs) == len(set(archs)) == 64
  assert archs[0] == ("conv3", "conv3", "conv3")
  assert archs[1] == ("conv3", "conv3", "conv5")
  assert archs[-1] == ("skip", "skip", "skip")
  for i, arch in enumerate(archs):
    assert space.index(arch) == i
    assert space.arch_at(i) == arch


def test_stage_block_size_and_layers():
  space = stage_block(stages=2, blocks=2, filters=(8, 16))
  # Per stage: 3 x 3 block choices and 3 poolings.
  assert space.size == (3 * 3 * 3) ** 2
  assert [l.name for l in space.layers][:3] == [
      "stage0_block0", "stage0_block1", "stage0_pool"]
  assert space.layer("stage1_pool").filters == 16
  with pytest.raises(ValueError, match="one width per stage"):
    stage_block(stages=3, filters=(8, 16))


def test_allowed_restricts_enumeration_and_sampling():
  space = tiny64()
  allowed = {"layer0": ["conv5", "skip"], "layer2": ["maxpool"]}
  archs = list(space.enumerate(allowed))
  assert len(archs) == 2 * 4 * 1
  assert all(a[0] in ("conv5", "skip") and a[2] == "maxpool" for a in archs)
  rng = np.random.default_rng(0)
  samples = [space.sample(rng, allowed) for _ in range(400)]
  assert all(a[0] != "conv3" and a[2] == "maxpool" for a in samples)
  # Layer order of the allowed list does not matter; the layer's does.
  assert space.allowed_ops({"layer0": ["skip", "conv5"]})[0] == [
      "conv5", "skip"]


def test_sampling_is_uniform():
  space = tiny64()
  rng = np.random.default_rng(1)
  n = 12800
  counts = collections.Counter(space.sample(rng) for _ in range(n))
  assert len(counts) == 64
  expected = n / 64
  chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
  assert chi2 < 110  # 63 degrees of freedom: p < 0.001 above ~104


def test_encoding_is_one_hot_per_layer():
  space = tiny64()
  code = space.encode(("conv5", "skip", "conv3"))
  assert code.shape == (12,)
  assert code.tolist() == [0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0]
  codes = np.stack([space.encode(a) for a in space.enumerate()])
  assert len({c.tobytes() for c in codes}) == 64
  assert space.describe(("conv5", "skip", "conv3")) == (
      "layer0=conv5 > layer1=skip > layer2=conv3")


def test_json_round_trip():
  for space in (tiny64(), stage_block()):
    again = SearchSpace.from_json(space.to_json())
    assert again == space
    assert json.loads(again.to_json()) == json.loads(space.to_json())


@pytest.mark.parametrize("edit,match", [
    (lambda d: d.update(format="other"), "format tfopt.nas.space/1"),
    (lambda d: d.pop("layers"), "missing or malformed"),
    (lambda d: d["layers"][0]["ops"].update(bad={"type": "lstm"}),
     "op 'bad'.*'type' in"),
    (lambda d: d["layers"][0]["ops"]["conv3"].pop("kernel"),
     "op 'conv3'.kernel.*positive integer"),
    (lambda d: d["layers"][1].update(name="layer0"), "unique names"),
    (lambda d: d["layers"][0].update(ops={}), "non-empty mapping"),
    (lambda d: d.update(num_classes=0), "num_classes"),
])
def test_validation_errors(edit, match):
  data = tiny64().to_dict()
  edit(data)
  with pytest.raises(ValueError, match=match):
    SearchSpace.from_dict(data)


def test_bad_queries():
  space = tiny64()
  with pytest.raises(ValueError, match="at least one op"):
    space.allowed_ops({"layer1": []})
  with pytest.raises(ValueError, match="ops of that layer"):
    space.allowed_ops({"layer1": ["conv7"]})
  with pytest.raises(ValueError, match="keyed by choice layer names"):
    space.allowed_ops({"layer9": ["skip"]})
  with pytest.raises(ValueError, match="one op name per choice layer"):
    space.index(("conv3", "conv3"))
  with pytest.raises(ValueError, match="an integer in \\[0, 64\\)"):
    space.arch_at(64)
  with pytest.raises(ValueError, match="Argument `name`"):
    ChoiceLayer("", {"skip": {"type": "skip"}})


@pytest.mark.parametrize("space_fn", [
    lambda: tiny64(filters=6),
    lambda: stage_block(input_shape=(8, 8, 3), filters=(4, 6))])
def test_param_count_matches_keras(space_fn):
  # The oracle: Keras' own count on the built sub-graph.
  from tfopt.nas.supernet import SuperNet
  space = space_fn()
  net = SuperNet(space)
  rng = np.random.default_rng(0)
  archs = list(space.enumerate())
  for i in rng.choice(len(archs), size=6, replace=False):
    arch = archs[i]
    assert space.param_count(arch) == net.subnet(arch).count_params(), arch
