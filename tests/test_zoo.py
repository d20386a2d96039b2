"""Every zoo model builds, and its training step captures with the ops its
architecture implies."""

import collections

import pytest

from tfopt import zoo
from tfopt.graph import capture_train_step

SMALL = {
    "mlp": {},
    "small_cnn": {},
    "transformer_lm": dict(vocab_size=100, seq_len=8, num_layers=2,
                           d_model=32, num_heads=2, d_ff=64),
    "gnmt": dict(vocab_size=100, seq_len=4, units=16),
    "inception_v3": dict(image_size=75, classes=10),
    "resnet50": dict(image_size=32, classes=10),
    "towers": dict(input_dim=8, towers=3, depth=2, width=16),
}


def _capture(name, batch_size=2):
  model = zoo.build(name, **SMALL[name])
  x, y = model.batch(batch_size)
  step = capture_train_step(model.model, x=x, y=y)
  return model, step, collections.Counter(op.type for op in step.graph.ops)


@pytest.mark.parametrize("name", ["mlp", "small_cnn", "transformer_lm",
                                  "gnmt", "towers"])
def test_small_models_capture(name):
  model, step, types = _capture(name)
  assert len(step.graph) > 100
  assert not {"While", "StatelessWhile", "PartitionedCall",
              "StatefulPartitionedCall"} & set(types)
  # Every trainable variable is a VarHandleOp with an update colocated.
  for var in model.model.trainable_variables:
    group = step.graph.colocation_groups[f"loc:@{var.path}"]
    assert any("Assign" in step.graph[m].type for m in group), var.path


def test_towers_are_parallel_stacks_joined_once():
  model, step, types = _capture("towers")
  # 3 towers x 2 Dense layers + the classifier: 7 forward MatMuls, a kernel
  # gradient for each, and an input gradient for the 4 layers that do not
  # read the model's input (each tower's second layer and the classifier).
  assert types["MatMul"] == 7 + 7 + 4
  assert types["ConcatV2"] == 1
  layers = [l.name for l in model.model.layers]
  assert layers.count("join") == 1 and "tower2_dense1" in layers


def test_gnmt_is_unrolled_into_per_step_ops():
  _, step, types = _capture("gnmt")
  # 4 time steps x (encoder fwd + bwd + 1 encoder + 2 decoder LSTMs) cells,
  # each with a gate MatMul on the input and one on the state.
  assert types["MatMul"] >= 4 * 5 * 2


@pytest.mark.slow
@pytest.mark.parametrize("name, convs", [("resnet50", 53),
                                         ("inception_v3", 94)])
def test_conv_nets_have_every_convolution_and_its_gradients(name, convs):
  _, step, types = _capture(name)
  assert types["Conv2D"] == convs
  assert types["Conv2DBackpropFilter"] == convs
  # The first convolution needs no gradient with respect to the image.
  assert types["Conv2DBackpropInput"] == convs - 1


def test_unknown_model_name_is_refused():
  with pytest.raises(ValueError, match="Argument `name` must be one of"):
    zoo.build("alexnet")
  with pytest.raises(ValueError, match="image_size=10"):
    zoo.inception_v3(image_size=10)
  with pytest.raises(ValueError, match="batch_size=0"):
    zoo.mlp().batch(0)


@pytest.mark.parametrize("name,kwargs", [
    ("transformer_lm", SMALL["transformer_lm"]),
    ("moe_lm", dict(vocab_size=50, seq_len=8, d_model=16, num_heads=2,
                    num_experts=4, expert_dim=8))])
def test_position_embeddings_train_and_save(name, kwargs):
  # A position embedding applied to a constant is folded into the graph at
  # construction: not a weight, never trained. It must be one.
  model = zoo.build(name, **kwargs).model
  pos = model.get_layer("pos_embed")
  assert pos.embeddings.path in {v.path for v in model.trainable_variables}
  before = pos.embeddings.numpy().copy()
  x, y = zoo.build(name, **kwargs).batch(4)
  model.fit(x, y, epochs=1, verbose=0)
  assert not (pos.embeddings.numpy() == before).all()
