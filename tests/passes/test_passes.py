"""Rewrite passes, each checked by running the graph before and after it."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tfopt import zoo
from tfopt.graph import capture_function, capture_train_step
from tfopt.passes import (PassContext, PassError, PassManager, apply_placement,
                          fold_constants, fuse, op_counts, prune,
                          registered_passes, remove_identities)
from tfopt.runtime import local_cluster, run_and_compare, run_steps


def _mlp_step(hidden=(16, 16), act="relu"):
  tf.random.set_seed(1)
  m = zoo.mlp(hidden=hidden, input_dim=12, classes=5)
  x, y = m.batch(8)
  step = capture_train_step(m.model, x=x, y=y)
  return step, [[x, y], list(m.batch(8, seed=1))]


@pytest.fixture(scope="module")
def mlp():
  return _mlp_step()


def _function_step(fn, *specs):
  step = capture_function(fn.get_concrete_function(*specs), batch_size=4)
  rng = np.random.default_rng(0)
  inputs = [[rng.standard_normal([4] + s.shape.as_list()[1:]).astype(
      np.float32) for s in specs]]
  return step, inputs


def test_fuse_training_step_leaves_exactly_one_fused_matmul_per_dense(mlp):
  step, inputs = mlp
  ctx = PassContext.for_step(step)
  result = PassManager("fuse", verify=run_and_compare(step, inputs)).run(
      step.graph_def, ctx)
  counts = op_counts(result.graph)
  # Two hidden Dense+ReLU and the logits Dense (bias only): three fusions.
  assert counts["_FusedMatMul"] == 3
  assert counts["BiasAdd"] == 0 and counts["Relu"] == 0
  # Gradient MatMuls are not fused (no bias follows them).
  assert counts["MatMul"] == op_counts(step.graph_def)["MatMul"] - 3
  fused_ops = sorted(tuple(n.attr["fused_ops"].list.s) for n in
                     result.graph.node if n.op == "_FusedMatMul")
  assert fused_ops == [(b"BiasAdd",), (b"BiasAdd", b"Relu"),
                       (b"BiasAdd", b"Relu")]
  report = result.reports[0]
  assert report.verified and report.op_diff["_FusedMatMul"] == 3
  assert set(ctx.fused) == {n.name for n in result.graph.node
                            if n.op == "_FusedMatMul"}
  # The original graph is untouched.
  assert op_counts(step.graph_def)["_FusedMatMul"] == 0


@pytest.mark.parametrize("act,expected", [
    ("relu", b"Relu"), ("relu6", b"Relu6"), ("elu", b"Elu"),
    ("leaky_relu", b"LeakyRelu"), ("tanh", None)])
def test_fuse_conv_bias_activation(act, expected):
  tf.random.set_seed(0)
  kernel = tf.Variable(tf.random.normal([3, 3, 3, 4]))
  bias = tf.Variable(tf.random.normal([4]))
  fns = {"relu": tf.nn.relu, "relu6": tf.nn.relu6, "elu": tf.nn.elu,
         "leaky_relu": lambda t: tf.nn.leaky_relu(t, alpha=0.3),
         "tanh": tf.nn.tanh}

  @tf.function
  def f(x):
    y = tf.nn.bias_add(tf.nn.conv2d(x, kernel, 1, "SAME"), bias)
    return fns[act](y) * 2.0

  step, inputs = _function_step(f, tf.TensorSpec([None, 6, 6, 3]))
  result = PassManager("fuse", verify=run_and_compare(step, inputs)).run(
      step.graph_def, PassContext.for_step(step))
  nodes = [n for n in result.graph.node if n.op == "_FusedConv2D"]
  assert len(nodes) == 1
  ops = tuple(nodes[0].attr["fused_ops"].list.s)
  if expected is None:  # no CPU kernel fuses Tanh: bias only, Tanh stays
    assert ops == (b"BiasAdd",) and op_counts(result.graph)["Tanh"] == 1
  else:
    assert ops == (b"BiasAdd", expected)
  if act == "leaky_relu":
    assert nodes[0].attr["leakyrelu_alpha"].f == pytest.approx(0.3)


def test_fuse_conv_inference_batch_norm_but_not_training_batch_norm():
  tf.random.set_seed(0)
  kernel = tf.Variable(tf.random.normal([3, 3, 3, 4]))
  scale, offset = tf.Variable(tf.ones([4]) * 1.5), tf.Variable(tf.zeros([4]))
  mean, var = tf.Variable(tf.fill([4], 0.2)), tf.Variable(tf.fill([4], 2.0))

  def conv_bn(x, training):
    y = tf.nn.conv2d(x, kernel, 1, "SAME")
    if training:
      y, _, _ = tf.compat.v1.nn.fused_batch_norm(y, scale, offset,
                                                 is_training=True)
    else:
      y, _, _ = tf.compat.v1.nn.fused_batch_norm(
          y, scale, offset, mean=mean, variance=var, epsilon=0.01,
          is_training=False)
    return tf.nn.relu(y)

  spec = tf.TensorSpec([None, 5, 5, 3])
  step, inputs = _function_step(tf.function(lambda x: conv_bn(x, False)), spec)
  result = PassManager("fuse", verify=run_and_compare(step, inputs)).run(
      step.graph_def, PassContext.for_step(step))
  (node,) = [n for n in result.graph.node if n.op == "_FusedConv2D"]
  assert tuple(node.attr["fused_ops"].list.s) == (b"FusedBatchNorm", b"Relu")
  assert node.attr["epsilon"].f == pytest.approx(0.01)
  assert node.attr["num_args"].i == 4
  step, inputs = _function_step(tf.function(lambda x: conv_bn(x, True)), spec)
  result = fuse(step.graph_def, PassContext.for_step(step))
  assert not result.changed


def test_fuse_keeps_intermediates_someone_else_reads():
  w = tf.Variable(tf.ones([3, 2]))
  b = tf.Variable(tf.ones([2]))

  @tf.function
  def f(x):
    mm = tf.matmul(x, w)
    y = tf.nn.relu(tf.nn.bias_add(mm, b))
    return y + tf.reduce_sum(mm)  # the MatMul is read twice

  step, inputs = _function_step(f, tf.TensorSpec([None, 3]))
  assert not fuse(step.graph_def, PassContext.for_step(step)).changed


def _hand_graph():
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
    c = tf.constant([1.0, 2.0], name="c")
    d = tf.multiply(c, 3.0, name="c3")  # constant subgraph
    i1 = tf.identity(x, name="id1")
    i2 = tf.identity(i1, name="id2")
    tf.add(i2, d, name="out")
    tf.square(x, name="dead_square")
    tf.identity(c, name="dead_id")
  return graph.as_graph_def()


def _run_graph(graph_def, feed):
  graph = tf.Graph()
  with graph.as_default():
    tf.graph_util.import_graph_def(graph_def, name="")
  with tf.compat.v1.Session(graph=graph) as sess:
    return sess.run("out:0", {"x:0": feed})


def test_prune_identity_and_fold_on_a_hand_graph():
  graph_def = _hand_graph()
  ctx = PassContext(keep=("x", "out"))
  feed = np.array([1.0, -2.0], np.float32)
  pruned = prune(graph_def, ctx)
  assert {n.name for n in graph_def.node} - {n.name for n in
                                             pruned.graph.node} == {
                                                 "dead_square", "dead_id"}
  no_ids = remove_identities(pruned.graph, ctx)
  assert op_counts(no_ids.graph)["Identity"] == 0
  out = [n for n in no_ids.graph.node if n.name == "out"][0]
  assert out.input[0] == "x"
  folded = fold_constants(no_ids.graph, ctx)
  assert folded.changed and "c3" not in [n.name for n in folded.graph.node
                                         if n.op == "Mul"]
  np.testing.assert_allclose(_run_graph(folded.graph, feed), [4.0, 4.0])
  assert _run_graph(folded.graph, feed).tolist() == _run_graph(graph_def,
                                                               feed).tolist()


def test_identity_n_is_split_so_each_gradient_travels_alone(mlp):
  # Keras' optimizer gathers every gradient in one IdentityN: after the
  # pass no op reads all of them, each update reads its gradient directly,
  # and the step computes the same (run before and after).
  step, inputs = mlp
  assert op_counts(step.graph_def)["IdentityN"] == 1
  ctx = PassContext.for_step(step)
  result = PassManager("identity", verify=run_and_compare(step, inputs)).run(
      step.graph_def, ctx)
  assert op_counts(result.graph)["IdentityN"] == 0
  ids = next(n for n in step.graph_def.node if n.op == "IdentityN")
  readers = [n for n in result.graph.node
             if any(i.startswith(ids.name) for i in n.input)]
  assert not readers
  assert result.reports[0].verified


def test_identity_n_control_inputs_move_to_its_producers():
  graph = tf.Graph()
  with graph.as_default():
    a = tf.constant(1.0, name="a")
    b = tf.constant(2.0, name="b")
    ids = tf.identity_n([a, b], name="ids")
    c = tf.constant(3.0, name="c")
    with tf.control_dependencies([ids[0].op]):
      tf.add(c, 1.0, name="after")
    tf.add(ids[0], ids[1], name="out")
  out = remove_identities(graph.as_graph_def(),
                          PassContext(keep=("out", "after")))
  nodes = {n.name: n for n in out.graph.node}
  assert "ids" not in nodes
  assert list(nodes["out"].input) == ["a", "b"]
  # The control dependency sits on the add's constant operand.
  assert sorted(nodes["after/y"].input) == ["^a", "^b"]


def test_fold_keeps_large_splats_as_fill():
  # zeros of a 2 MB shape: Grappler folds them into a 2 MB Const (memory
  # held all run); the pass writes it back as Fill (made when used).
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [512, 1024], name="x")
    tf.add(x, tf.zeros([512, 1024]), name="out")
    tf.add(x, tf.constant(np.arange(4.0, dtype=np.float32).reshape(1, 4)[
        :, :1] * 0 + 1.0), name="small")
  ctx = PassContext(keep=("x", "out", "small"))
  folded = fold_constants(graph.as_graph_def(), ctx)
  big = [n for n in folded.graph.node if n.op == "Const" and
         sum(1 for _ in n.attr["value"].tensor.tensor_shape.dim) == 2 and
         n.attr["value"].tensor.tensor_shape.dim[0].size == 512]
  assert not big
  assert "large splat constants kept as Fill" in folded.note
  feed = np.ones((512, 1024), np.float32)
  g2 = tf.Graph()
  with g2.as_default():
    tf.graph_util.import_graph_def(folded.graph, name="")
  with tf.compat.v1.Session(graph=g2) as sess:
    np.testing.assert_array_equal(sess.run("out:0", {"x:0": feed}), feed)


def test_prune_needs_to_know_what_to_keep():
  with pytest.raises(ValueError, match="ctx.keep"):
    prune(_hand_graph(), PassContext())
  with pytest.raises(ValueError, match="nodes in the graph"):
    prune(_hand_graph(), PassContext(keep=("nope",)))


def test_pipeline_reports_and_verification_on_a_training_step(mlp):
  step, inputs = mlp
  ctx = PassContext.for_step(step, cluster=local_cluster(2))
  calls = []
  check = run_and_compare(step, inputs)

  def verify(before, after, name):
    calls.append(name)
    check(before, after, name)

  result = PassManager("prune,identity,fold,fuse,place", verify=verify).run(
      step.graph_def, ctx)
  assert [r.name for r in result.reports] == ["prune", "identity", "fold",
                                              "fuse", "place"]
  assert calls == [r.name for r in result.reports if r.changed]
  assert "fuse" in calls and "place" in calls
  assert "_FusedMatMul" in result.table()
  assert all(n.device for n in result.graph.node)


def test_verification_catches_a_wrong_rewrite(mlp):
  step, inputs = mlp

  def break_bias(before, after, name):
    del before
    broken = tf.compat.v1.GraphDef()
    broken.CopyFrom(after)
    for node in broken.node:
      if node.op == "_FusedMatMul":
        node.attr["fused_ops"].list.s[:] = [b"BiasAdd"]  # drop the ReLU
    run_and_compare(step, inputs)(step.graph_def, broken, name)

  with pytest.raises(PassError, match=r"Pass 'fuse' failed \(passes "
                     r"completed before it: prune\).*differs"):
    PassManager("prune,fuse", verify=break_bias).run(
        step.graph_def, PassContext.for_step(step))


def test_bad_pipelines_and_placements(mlp):
  step, _ = mlp
  assert {"prune", "identity", "fold", "fuse", "coarsen",
          "place"} <= set(registered_passes())
  with pytest.raises(ValueError, match="Argument `pipeline`.*Received: "
                     "pipeline='prune,fuze'"):
    PassManager("prune,fuze")
  with pytest.raises(PassError, match="Pass 'place' failed.*ctx.cluster"):
    PassManager("place").run(step.graph_def, PassContext.for_step(step))
  names = local_cluster(2).devices
  placement = {n.name: 0 for n in step.graph_def.node}
  placement[step.graph_def.node[5].name] = 7
  with pytest.raises(ValueError, match=r"device index in \[0, 2\)"):
    apply_placement(step.graph_def, placement, [d.name for d in names])
  placement = {n.name: 0 for n in step.graph_def.node}
  del placement[step.graph_def.node[3].name]
  with pytest.raises(ValueError, match="unplaced"):
    apply_placement(step.graph_def, placement, [d.name for d in names])
  # A variable on one device and one of its readers on another.
  var = next(n.name for n in step.graph_def.node if n.op == "VarHandleOp")
  reader = next(n.name for n in step.graph_def.node
                if n.op == "ReadVariableOp" and n.input[0] == var)
  placement = {n.name: 0 for n in step.graph_def.node}
  placement[reader] = 1
  with pytest.raises(ValueError, match="colocation group.*" + reader):
    apply_placement(step.graph_def, placement, [d.name for d in names])
  with pytest.raises(ValueError, match="Argument `graph_def`"):
    PassManager("prune").run("not a graph")


def test_unchanged_run_on_original_graph_is_equal(mlp):
  # The oracle itself: two runs of the same graph agree exactly.
  step, inputs = mlp
  a, b = run_steps(step, inputs), run_steps(step, inputs)
  for x, y in zip(a.outputs, b.outputs):
    np.testing.assert_array_equal(x[0], y[0])


def test_control_pass_sends_one_control_message_per_op_and_device(mlp):
  # The second layer's variables (with their reads and updates) on device
  # 1: the step's final ops wait for updates on both devices. After the
  # pass each op has at most one control input per other device (a NoOp
  # there waiting for the rest), and the step computes the same.
  from tfopt.graph.capture import opgraph_from_graphdef
  step, inputs = mlp
  graph = opgraph_from_graphdef(step.graph_def, inline=False)
  on_one = {n for names in graph.colocation_groups.values()
            if any("dense_1" in n for n in names) for n in names}
  placed = apply_placement(
      step.graph_def, {n.name: int(n.name in on_one)
                       for n in step.graph_def.node},
      [d.name for d in local_cluster(2).devices])

  def remote_controls(graph_def):
    device = {n.name: n.device for n in graph_def.node}
    return {n.name: [i for i in n.input if i.startswith("^") and
                     device[i[1:]] != n.device] for n in graph_def.node}

  before = remote_controls(placed)
  assert max(len(v) for v in before.values()) > 1
  ctx = PassContext.for_step(step)
  result = PassManager("control", verify=run_and_compare(step, inputs)).run(
      placed, ctx)
  after = remote_controls(result.graph)
  assert max(len(v) for v in after.values()) == 1
  gates = [n for n in result.graph.node if "tfopt_control" in n.name]
  assert gates and all(n.op == "NoOp" for n in gates)
  saved = sum(map(len, before.values())) - sum(map(len, after.values()))
  assert result.reports[0].note == (f"{saved} cross-device control messages "
                                    f"saved")
  assert result.reports[0].verified
  # Ordering is kept: every gate waits for exactly the inputs it replaced.
  for gate in gates:
    owner = gate.name.split("/tfopt_control")[0]
    assert set(gate.input) <= set(before[owner])
  # Nothing to do on one device.
  one = PassManager("control").run(step.graph_def, ctx)
  assert not one.reports[0].changed


def test_fold_rewrites_inside_a_while_loops_bodies_and_keeps_its_math():
  # A Keras LSTM's step: the forward While and its gradient While, whose
  # bodies live in the function library. Constant folding reaches into
  # the gradient body (a MatMul by a folded constant goes), and the step
  # computes what it computed (run before and after).
  import keras  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(0)
  inputs = keras.Input((6, 4))
  outputs = keras.layers.Dense(1)(keras.layers.LSTM(8)(inputs))
  model = keras.Model(inputs, outputs)
  model.compile(optimizer="adam", loss="mse")
  rng = np.random.default_rng(0)
  batches = [[rng.random((4, 6, 4), np.float32),
              rng.random((4, 1), np.float32)] for _ in range(2)]
  step = capture_train_step(model, data=tuple(batches[0]))

  def bodies(graph_def):
    return {f.signature.name: collections.Counter(n.op for n in f.node_def)
            for f in graph_def.library.function}

  before = bodies(step.graph_def)
  assert sum(op_counts(step.graph_def)[op] for op in ("While",
                                                      "StatelessWhile")) == 2
  result = PassManager("prune,identity,fold",
                       verify=run_and_compare(step, batches)).run(
                           step.graph_def, PassContext.for_step(step))
  after = bodies(result.graph)
  changed = [name for name in before if name in after and
             before[name] != after[name]]
  assert changed and all("grad" in name for name in changed), (before, after)
  assert all(sum(after[name].values()) < sum(before[name].values())
             for name in changed)


def test_fuse_rewrites_dense_layers_inside_cond_branches():
  # keras.ops.cond with a Dense + ReLU in each branch: the branches are
  # If's function bodies. Each branch's MatMul + BiasAdd + Relu becomes one
  # _FusedMatMul there (none at the top level has a bias), the step
  # computes what it computed, and training through tfopt.compile gives
  # plain Keras' losses.
  import keras  # pylint: disable=g-import-not-at-top
  import tfopt  # pylint: disable=g-import-not-at-top

  class Branches(keras.layers.Layer):

    def __init__(self, **kwargs):
      super().__init__(**kwargs)
      self.a = keras.layers.Dense(8, activation="relu")
      self.b = keras.layers.Dense(8, activation="relu")

    def build(self, shape):
      self.a.build(shape)
      self.b.build(shape)

    def call(self, x):
      return keras.ops.cond(keras.ops.mean(x) > 0, lambda: self.a(x),
                            lambda: self.b(x))

  def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(1, use_bias=False)(
        Branches()(inputs)))

  rng = np.random.default_rng(0)
  x = rng.normal(size=(32, 4)).astype(np.float32)
  y = rng.normal(size=(32, 1)).astype(np.float32)
  model = build()
  model.compile(optimizer="adam", loss="mse")
  step = capture_train_step(model, data=(x[:8], y[:8]))
  batches = [[x[:8], y[:8]], [-x[8:16], y[8:16]]]  # both branches taken
  result = PassManager("prune,identity,fold,fuse",
                       verify=run_and_compare(step, batches)).run(
                           step.graph_def, PassContext.for_step(step))
  in_bodies = collections.Counter(
      n.op for f in result.graph.library.function for n in f.node_def)
  assert in_bodies["_FusedMatMul"] == 2 and in_bodies["BiasAdd"] == 0
  assert op_counts(result.graph)["_FusedMatMul"] == 0
  assert "2 _FusedMatMul in function bodies" in result.table()
  assert result.reports[-1].verified
  losses = []
  for hooked in (False, True):
    model = build()
    kwargs = dict(optimizer="adam", loss="mse")
    if hooked:
      tfopt.compile(model, verbose=False, **kwargs)
    else:
      model.compile(**kwargs)
    losses.append(model.fit(x, y, epochs=2, batch_size=8, shuffle=False,
                            verbose=0).history["loss"])
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)
