"""OpGraphs from a GraphDef, a ConcreteFunction and a Keras training step.

Oracles: the op types a 2-layer MLP's training step must contain (counted by
hand), TensorFlow itself (running the captured step against Keras'
`train_on_batch`, and an inlined GraphDef against the original function).
"""

import numpy as np
import pytest
import tensorflow as tf
import keras

from tfopt.graph import (capture_train_step, opgraph_from_function,
                         opgraph_from_graphdef)
from tfopt.graph.inline import inline_function_calls
from tfopt.runtime import StepSession

BATCH = 16


def _mlp():
  keras.utils.set_random_seed(1)
  inp = keras.Input((8,), name="x")
  h = keras.layers.Dense(16, activation="relu", name="hidden")(inp)
  out = keras.layers.Dense(4, name="out")(h)
  model = keras.Model(inp, out, name="mlp2")
  model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
  return model


@pytest.fixture(scope="module")
def mlp_step():
  model = _mlp()
  return model, capture_train_step(model, batch_size=BATCH)


def test_train_step_has_forward_backward_and_update_ops(mlp_step):
  model, step = mlp_step
  g = step.graph
  matmuls = [op for op in g.ops if op.type == "MatMul"]
  forward = [op for op in matmuls if not op.backward]
  backward = [op for op in matmuls if op.backward]
  # Forward: x@W1, h@W2. Backward: dW2, dh (= dy @ W2^T), dW1; no dx is
  # needed since x is an input.
  assert len(forward) == 2 and len(backward) == 3
  assert sorted(op.output_shapes[0] for op in forward) == [(BATCH, 4),
                                                           (BATCH, 16)]
  assert sorted(op.output_shapes[0] for op in backward) == [(8, 16), (16, 4),
                                                            (BATCH, 16)]
  # Tensor bytes come from shapes: a (16, 16) float32 output is 1024 bytes.
  hidden = next(op for op in forward if op.output_shapes[0] == (BATCH, 16))
  assert hidden.output_bytes == (BATCH * 16 * 4,)
  assert {e.bytes for e in g.out_edges(hidden.name)
          if not e.is_control} == {BATCH * 16 * 4}
  # Adam: one parameter update per trainable variable ...
  updates = [op for op in g.ops if op.type == "AssignSubVariableOp"]
  assert len(updates) == 4
  # ... each colocated with the variable it updates.
  for var in ("hidden/kernel", "hidden/bias", "out/kernel", "out/bias"):
    assert g[var].type == "VarHandleOp"
    group = g.colocation_groups[f"loc:@{var}"]
    assert sum(g[m].type == "AssignSubVariableOp" for m in group) == 1
    assert any(g[m].type == "ReadVariableOp" for m in group)
  # Slots are updated in place (m and v: AssignAdd on each slot variable).
  prefix = model.optimizer.name  # "adam", or "adam_1" if one existed
  for slot in (f"{prefix}/hidden_kernel_momentum",
               f"{prefix}/hidden_kernel_velocity"):
    group = g.colocation_groups[f"loc:@{slot}"]
    assert any(g[m].type == "AssignAddVariableOp" for m in group)
  assert g["hidden/kernel"].attrs["variable_bytes"] == 8 * 16 * 4


def test_captured_step_trains_exactly_like_keras(mlp_step):
  model, step = mlp_step
  twin = _mlp()
  twin.set_weights(model.get_weights())
  rng = np.random.default_rng(0)
  batches = [(rng.standard_normal((BATCH, 8)).astype(np.float32),
              rng.standard_normal((BATCH, 4)).astype(np.float32))
             for _ in range(3)]
  with StepSession(step) as session:
    for x, y in batches:
      session.run([x, y])
    ours = session.variable_values()
  for x, y in batches:
    twin.train_on_batch(x, y)
  for var in twin.trainable_variables:
    np.testing.assert_allclose(ours[var.path], var.numpy(), rtol=1e-5,
                               atol=1e-6)
  # The model that was captured was not trained by the session.
  np.testing.assert_array_equal(model.get_weights()[0],
                                _mlp().get_weights()[0])


def test_unbuilt_and_uncompiled_models_are_refused():
  unbuilt = keras.Sequential([keras.layers.Dense(2)])
  unbuilt.compile(optimizer="sgd", loss="mse")
  with pytest.raises(ValueError, match=r"Argument `model` must be a built.*"
                     r"built=False"):
    capture_train_step(unbuilt, batch_size=4)
  uncompiled = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  with pytest.raises(ValueError, match="compiled with an optimizer"):
    capture_train_step(uncompiled, batch_size=4)
  with pytest.raises(ValueError, match="batch_size=0"):
    capture_train_step(_mlp(), batch_size=0)
  with pytest.raises(ValueError, match="Argument `model` must be a keras"):
    capture_train_step("not a model", batch_size=4)


def test_nested_functions_are_inlined_and_still_compute_the_same():
  w = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))

  @tf.function
  def inner(x):
    return tf.nn.relu(tf.matmul(x, w)) - 1.0

  @tf.function
  def outer(x):
    return inner(x) * 2.0 + tf.reduce_sum(inner(x + 1.0))

  concrete = outer.get_concrete_function(tf.TensorSpec((4, 2), tf.float32))
  raw = concrete.graph.as_graph_def()
  assert sum(n.op == "StatefulPartitionedCall" for n in raw.node) == 2
  g = opgraph_from_function(concrete, name="nested")
  assert not any(op.type.endswith("PartitionedCall") for op in g.ops)
  assert sum(op.type == "MatMul" for op in g.ops) == 2
  assert all("/" in op.name for op in g.ops if op.type == "MatMul")
  # Run-and-compare: the inlined, self-contained step computes what the
  # original function computes.
  from tfopt.graph.capture import capture_function
  step = capture_function(concrete)
  assert not any(n.op.endswith("PartitionedCall") for n in step.graph_def.node)
  x = np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32)
  with StepSession(step) as session:
    got = session.run([x])[0]
  np.testing.assert_allclose(got, outer(x).numpy(), rtol=1e-6)
  flat = inline_function_calls(raw)
  assert len(flat.node) > len(raw.node)


def test_graphdef_with_class_colocation_and_unknown_batch():
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, (None, 5), name="x")
    a = tf.identity(x, name="a")
    with tf.compat.v1.colocate_with(a):
      b = tf.square(a, name="b")
    tf.reduce_sum(b, name="c")
  g = opgraph_from_graphdef(graph.as_graph_def(), name="v1", batch_size=7)
  assert g["b"].colocation == g["a"].colocation == "loc:@a"
  assert g["a"].output_shapes == ((7, 5),) and g["a"].output_bytes == (140,)
  unknown = opgraph_from_graphdef(graph.as_graph_def())
  assert unknown["a"].output_shapes == (None,)
  assert unknown["a"].output_bytes == (0,)


def test_graphdef_that_does_not_import_is_named():
  gd = tf.compat.v1.GraphDef()
  gd.node.add(name="n", op="NoSuchOpAnywhere")
  with pytest.raises(ValueError, match="Argument `graph_def` must be a "
                     "GraphDef that TensorFlow can import"):
    opgraph_from_graphdef(gd)
  with pytest.raises(ValueError, match="batch_size=-1"):
    opgraph_from_graphdef(tf.compat.v1.GraphDef(), batch_size=-1)
