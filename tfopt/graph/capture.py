"""Building an OpGraph from TensorFlow: a GraphDef, a ConcreteFunction, or a
Keras 3 model's real training step.

The fast route to a training step (a naive trace of `model.fit` took minutes
for ResNet-50 on 2 cores): trace `model.train_step` -- the function
`model.fit` runs for each batch: forward, loss, gradients, optimizer update,
metric updates -- once, as a `tf.function` at a fixed batch size, and reuse
the resulting graph for capture, profiling and rewriting.

A captured step is made self-contained: every captured variable handle
becomes a `VarHandleOp` named after the variable's path, so the GraphDef runs
in a `tf.compat.v1.Session` (where profiling sees each op by name and device
strings are honoured) and each variable forms a colocation group with the
ops that read and update it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from tfopt._errors import check_positive_int, invalid_argument
from tfopt.graph.inline import inline_function_calls
from tfopt.graph.opgraph import CONTROL, Edge, Op, OpGraph

# NodeDef attributes kept on Op.attrs: what analytic cost estimates need.
_KEPT_ATTRS = ("transpose_a", "transpose_b", "adj_x", "adj_y", "equation",
               "data_format")


@dataclasses.dataclass(frozen=True)
class CapturedStep:
  """One step as a self-contained, runnable GraphDef plus its OpGraph.

  Attributes:
    graph: the OpGraph of the step.
    graph_def: the inlined GraphDef; variables are `VarHandleOp` nodes.
    input_names: Placeholder op names of the step's inputs, in the order of
      the flattened input signature.
    input_specs: the TensorSpec of each input.
    output_names: tensor names ("op:port") the step returns.
    target_names: op names that must run although nothing consumes them
      (variable updates, metric updates).
    variables: VarHandleOp name -> the tf.Variable holding its value.
    batch_size: the batch size the step was traced at, if known.
    output_structure: the function's structured outputs (e.g. the logs dict
      of a train step), to pack the flat outputs back; None if unknown.
    gradients: (gradient tensor name, VarHandleOp name) for each gradient
      a train step handed its optimizer (`capture_train_step`; the values
      of an embedding's IndexedSlices): what XLA's float reordering is
      checked on (`tfopt.runtime.xla.check_xla_step`). Empty where unknown.
  """
  graph: OpGraph
  graph_def: graph_pb2.GraphDef
  input_names: tuple[str, ...]
  input_specs: tuple[tf.TensorSpec, ...]
  output_names: tuple[str, ...]
  target_names: tuple[str, ...]
  variables: Mapping[str, tf.Variable]
  batch_size: int | None = None
  output_structure: Any = None
  gradients: tuple[tuple[str, str], ...] = ()

  def input_bytes(self) -> int:
    """The bytes of one batch of the step's inputs: an unknown first
    dimension is the batch size, another unknown dimension counts 1;
    strings and other unsized inputs count 0.

    >>> step = CapturedStep(None, None, ("x",), (tf.TensorSpec(
    ...     [None, None, 8], tf.float32),), (), (), {}, batch_size=32)
    >>> step.input_bytes()  # 32 x 1 x 8 float32
    1024
    """
    total = 0
    for spec in self.input_specs:
      dims = list(spec.shape)
      shape = [((self.batch_size or 1) if i == 0 else 1) if d is None else d
               for i, d in enumerate(dims)]
      total += int(np.prod(shape, dtype=np.int64)) * _dtype_size(spec.dtype)
    return total

  def sample_inputs(self, seed: int = 0) -> list[np.ndarray]:
    """Random inputs matching `input_specs`: normal floats, zero integers."""
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in self.input_specs:
      shape = [self.batch_size if d is None else d for d in spec.shape]
      if spec.dtype.is_floating:
        arrays.append(rng.standard_normal(shape).astype(
            spec.dtype.as_numpy_dtype))
      else:
        # Zero is a valid label, token id and index for every model.
        arrays.append(np.zeros(shape, spec.dtype.as_numpy_dtype))
    return arrays


# -- GraphDef -> OpGraph --------------------------------------------------------
def _dtype_size(dtype: tf.DType) -> int:
  # Handles (resource, variant) and strings move no tensor payload we can
  # size statically; they are charged 0 bytes.
  if dtype in (tf.resource, tf.variant, tf.string):
    return 0
  return dtype.size


def _static_shape(shape: tf.TensorShape,
                  batch_size: int | None) -> tuple[int, ...] | None:
  if shape.rank is None:
    return None
  dims = list(shape.as_list())
  if dims and dims[0] is None and batch_size is not None:
    dims[0] = batch_size
  if any(d is None for d in dims):
    return None
  return tuple(int(d) for d in dims)


def _is_backward(name: str) -> bool:
  # TF2 names gradient ops under the tape's scope; TF1 under "gradients".
  return ("gradient_tape/" in name or name.startswith("gradients/")
          or "/gradients/" in name)


def _attr_value(value) -> Any:
  kind = value.WhichOneof("value")
  if kind == "s":
    return value.s.decode("utf-8", "replace")
  if kind in ("b", "i", "f"):
    return getattr(value, kind)
  return None


class _UnionFind:
  def __init__(self):
    self.parent: dict[str, str] = {}

  def find(self, x: str) -> str:
    root = x
    while self.parent.get(root, root) != root:
      root = self.parent[root]
    while self.parent.get(x, x) != root:
      self.parent[x], x = root, self.parent[x]
    return root

  def union(self, a: str, b: str) -> None:
    self.parent.setdefault(a, a)
    self.parent.setdefault(b, b)
    ra, rb = self.find(a), self.find(b)
    if ra != rb:
      self.parent[rb] = ra


def _import(graph_def: graph_pb2.GraphDef) -> tf.Graph:
  graph = tf.Graph()
  try:
    with graph.as_default():
      tf.graph_util.import_graph_def(graph_def, name="")
  except (ValueError, TypeError, tf.errors.OpError) as err:
    raise invalid_argument("graph_def", "a GraphDef that TensorFlow can import",
                           f"<GraphDef with {len(graph_def.node)} nodes; "
                           f"import failed: {err}>") from None
  return graph


def opgraph_from_graphdef(graph_def: graph_pb2.GraphDef, *,
                          name: str = "graph", batch_size: int | None = None,
                          inline: bool = True) -> OpGraph:
  """The OpGraph of a GraphDef.

  Function calls are inlined first (unless `inline=False`). Output shapes
  come from TensorFlow's shape inference on import; an unknown leading
  dimension is taken as `batch_size`. Tensors whose shape stays unknown are
  charged 0 bytes (their Op.output_shapes entry is None).

  Colocation groups join (a) ops named by `_class: loc:@x` attributes and
  (b) every op that consumes a resource handle with the op producing it, as
  TensorFlow's placer does: a variable lives with its readers and updaters.
  Each group is named "loc:@<first op of the group in graph order>", where a
  variable handle goes first.
  """
  if batch_size is not None:
    check_positive_int("batch_size", batch_size)
  if not isinstance(graph_def, graph_pb2.GraphDef):
    raise invalid_argument("graph_def", "a tf.compat.v1.GraphDef", graph_def)
  if inline:
    graph_def = inline_function_calls(graph_def)
  tf_graph = _import(graph_def)
  ops, edges = [], []
  colocate = _UnionFind()
  known = {n.name for n in graph_def.node}
  handle_producers = set()
  for node in graph_def.node:
    tf_op = tf_graph.get_operation_by_name(node.name)
    shapes, dtypes, sizes = [], [], []
    for t in tf_op.outputs:
      shape = _static_shape(t.shape, batch_size)
      shapes.append(shape)
      dtypes.append(t.dtype.name)
      sizes.append(int(np.prod(shape, dtype=np.int64)) * _dtype_size(t.dtype)
                   if shape is not None else 0)
      if t.dtype == tf.resource:
        handle_producers.add(node.name)
    attrs = {k: _attr_value(node.attr[k]) for k in _KEPT_ATTRS
             if k in node.attr}
    if node.op in ("VarHandleOp", "VariableV2") and "shape" in node.attr:
      # The variable's own size: its persistent memory, not an output.
      var_shape = tf.TensorShape(node.attr["shape"].shape)
      if var_shape.is_fully_defined():
        attrs["variable_bytes"] = int(np.prod(var_shape.as_list(),
                                              dtype=np.int64)) * _dtype_size(
                                                  tf.as_dtype(
                                                      node.attr["dtype"].type))
    ops.append(Op(name=node.name, type=node.op, output_bytes=tuple(sizes),
                  output_shapes=tuple(shapes), output_dtypes=tuple(dtypes),
                  backward=_is_backward(node.name),
                  requested_device=node.device,
                  attrs={k: v for k, v in attrs.items() if v is not None}))
    if "_class" in node.attr:
      for entry in node.attr["_class"].list.s:
        target = entry.decode()
        if target.startswith("loc:@") and target[5:] in known:
          colocate.union(target[5:], node.name)
  sizes_of = {op.name: op.output_bytes for op in ops}
  dtype_of = {op.name: op.output_dtypes for op in ops}
  for node in graph_def.node:
    controls = set()
    data_index = 0
    for inp in node.input:
      if inp.startswith("^"):
        src = inp[1:]
        if src not in controls:
          controls.add(src)
          edges.append(Edge(src, node.name, CONTROL, None, 0))
        continue
      src, _, port = inp.partition(":")
      port = int(port) if port else 0
      edges.append(Edge(src, node.name, port, data_index,
                        sizes_of[src][port] if src in sizes_of else 0))
      if src in dtype_of and dtype_of[src][port] == "resource":
        colocate.union(src, node.name)
      data_index += 1
  members: dict[str, list[str]] = {}
  for op in ops:
    if op.name in colocate.parent:
      members.setdefault(colocate.find(op.name), []).append(op.name)
  group_of = {}
  for group in members.values():
    if len(group) < 2:
      continue
    head = next((m for m in group if m in handle_producers), group[0])
    for m in group:
      group_of[m] = f"loc:@{head}"
  if group_of:
    ops = [dataclasses.replace(op, colocation=group_of[op.name])
           if op.name in group_of else op for op in ops]
  return OpGraph(ops, edges, name=name)


# -- ConcreteFunction -> self-contained GraphDef -----------------------------------
def _sanitize(name: str) -> str:
  return re.sub(r"[^A-Za-z0-9_./-]", "_", name).lstrip("_/.") or "variable"


def _lift_captures(fn, variable_names: Callable[[tf.Variable], str] | None):
  """The function's inlined GraphDef with captures made into graph nodes.

  Returns (graph_def, variables {node name: tf.Variable}, input names).
  Captured variable handles become `VarHandleOp` nodes named after the
  variable; captured constants become `Const` nodes.
  """
  graph_def = inline_function_calls(fn.graph.as_graph_def())
  by_handle = {id(v.handle): v for v in fn.graph.variables}
  existing = {n.name for n in graph_def.node}
  replace: dict[str, node_def_pb2.NodeDef] = {}
  variables: dict[str, tf.Variable] = {}
  for external, internal in fn.graph.captures:
    old = internal.op.name
    if internal.dtype == tf.resource:
      var = by_handle.get(id(external))
      if var is None:
        raise ValueError(
            f"The function captures a resource {old!r} that is not a variable "
            f"(a lookup table or iterator?); such steps cannot be captured.")
      base = _sanitize(variable_names(var) if variable_names else var.name)
      new_name, k = base, 1
      while new_name in existing or new_name in variables:
        new_name, k = f"{base}_{k}", k + 1
      node = node_def_pb2.NodeDef(name=new_name, op="VarHandleOp")
      node.attr["dtype"].type = var.dtype.as_datatype_enum
      node.attr["shape"].shape.CopyFrom(var.shape.as_proto())
      node.attr["shared_name"].s = new_name.encode()
      node.attr["container"].s = b""
      variables[new_name] = var
    else:
      node = node_def_pb2.NodeDef(name=old, op="Const")
      node.attr["dtype"].type = internal.dtype.as_datatype_enum
      node.attr["value"].tensor.CopyFrom(
          tf.make_tensor_proto(external.numpy()))
    replace[old] = node
  renames = {old: node.name for old, node in replace.items()
             if old != node.name}
  out = graph_pb2.GraphDef()
  out.versions.CopyFrom(graph_def.versions)
  out.library.CopyFrom(graph_def.library)
  for node in graph_def.node:
    new = out.node.add()
    new.CopyFrom(replace.get(node.name, node))
    if renames:
      for i, inp in enumerate(new.input):
        ctrl = inp.startswith("^")
        src, sep, port = inp.lstrip("^").partition(":")
        if src in renames:
          new.input[i] = ("^" if ctrl else "") + renames[src] + sep + port
  num_args = len(fn.graph.inputs) - len(fn.graph.captures)
  input_names = tuple(t.op.name for t in fn.graph.inputs[:num_args])
  return out, variables, input_names


def prune_graph_def(graph_def: graph_pb2.GraphDef, keep_ops: Sequence[str]):
  """A copy with only the nodes `keep_ops` need (data and control inputs,
  transitively): what actually runs for those fetches and targets."""
  by_name = {n.name: n for n in graph_def.node}
  needed, stack = set(), list(keep_ops)
  while stack:
    name = stack.pop()
    if name in needed:
      continue
    needed.add(name)
    for inp in by_name[name].input:
      stack.append(inp.lstrip("^").partition(":")[0])
  out = graph_pb2.GraphDef()
  out.versions.CopyFrom(graph_def.versions)
  out.library.CopyFrom(graph_def.library)
  out.node.extend(n for n in graph_def.node if n.name in needed)
  return out


def capture_function(fn, *, name: str = "function",
                     batch_size: int | None = None,
                     variable_names: Callable[[tf.Variable], str] | None = None
                     ) -> CapturedStep:
  """Captures a `tf.function` ConcreteFunction as a self-contained step.

  Only ops needed for the outputs and the function's side effects (its
  control outputs) are kept: the ops that really run.
  """
  if not hasattr(fn, "graph") or not hasattr(fn.graph, "captures"):
    raise invalid_argument("fn", "a tf.function ConcreteFunction (use "
                           "f.get_concrete_function(...))", fn)
  graph_def, variables, input_names = _lift_captures(fn, variable_names)
  output_names = tuple(t.name for t in fn.outputs)
  targets = tuple(sorted(op.name for op in fn.graph.control_outputs))
  roots = [t.partition(":")[0] for t in output_names] + list(targets)
  graph_def = prune_graph_def(graph_def, roots + list(input_names))
  specs = tuple(tf.TensorSpec(t.shape, t.dtype, name=t.op.name)
                for t in fn.graph.inputs[:len(input_names)])
  graph = opgraph_from_graphdef(graph_def, name=name, batch_size=batch_size,
                                inline=False)
  return CapturedStep(graph, graph_def, input_names, specs, output_names,
                      targets, variables, batch_size, fn.structured_outputs)


def opgraph_from_function(fn, *, name: str = "function",
                          batch_size: int | None = None) -> OpGraph:
  """The OpGraph of a ConcreteFunction (see `capture_function`)."""
  return capture_function(fn, name=name, batch_size=batch_size).graph


# -- Keras 3 training step ----------------------------------------------------
def _target_spec(model, output, batch_size: int) -> tf.TensorSpec:
  shape = (batch_size,) + tuple(output.shape[1:])
  loss = model.loss
  loss_name = loss if isinstance(loss, str) else type(loss).__name__
  if "sparse" in str(loss_name).lower():
    return tf.TensorSpec(shape[:-1], tf.int32)
  return tf.TensorSpec(shape, output.dtype)


def capture_train_step(model, *, batch_size: int | None = None, x=None, y=None,
                       sample_weight=None, data: tuple | None = None,
                       name: str | None = None) -> CapturedStep:
  """Captures the training step `model.fit` runs for one batch.

  Args:
    model: a built and compiled Keras 3 model.
    batch_size: the batch size to trace at. Defaults to the leading dimension
      of `x`; required when `x` is not given.
    x, y: an example batch (arrays or nested structures of arrays) fixing the
      input and target signature. Without them the inputs come from
      `model.inputs` and the target from the output's shape (integer labels
      for sparse losses).
    sample_weight: the batch's sample weights (an array or a structure
      matching y's: per example, per timestep, or Keras' weights from
      `class_weight`), or None. Given, the step is traced on
      `(x, y, sample_weight)` as Keras' `fit` feeds it.
    data: instead of x / y / sample_weight, the batch exactly as `fit`
      hands it to `train_step`: `(x,)`, `(x, y)` or `(x, y, sample_weight)`
      (a part may be None: nothing is derived for it), or any structure of
      arrays a model's own train_step reads (a dict batch), traced as is.
    name: the graph's name (default: the model's name).

  Returns:
    A CapturedStep whose graph holds the forward ops, their gradients, the
    optimizer's updates and the metric updates, each variable colocated with
    its readers and updaters. Its inputs are the batch's tensors in the
    order of `tf.nest.flatten((x, y[, sample_weight]))` (of `data`, where
    given, its None parts left out).
  """
  _check_trainable(model)
  if data is not None:
    if x is not None or y is not None or sample_weight is not None:
      raise invalid_argument("data", "given without x, y or sample_weight",
                             "<data and x / y / sample_weight>")
    leaves = [a for a in tf.nest.flatten(data) if a is not None]
    if not leaves or (isinstance(data, tuple) and data[0] is None):
      raise invalid_argument("data", "a batch as fit yields it: (x,), (x, "
                             "y), (x, y, sample_weight) with x given, or a "
                             "structure of arrays", type(data).__name__)
    batch_size = batch_size or int(np.shape(leaves[0])[0])
  if x is not None:
    first = tf.nest.flatten(x)[0]
    batch_size = batch_size or int(np.shape(first)[0])
  if batch_size is None:
    raise invalid_argument("batch_size", "given when `x` is not", batch_size)
  check_positive_int("batch_size", batch_size)
  if data is not None:
    data_spec = tf.nest.map_structure(
        lambda a: None if a is None else _batch_spec(a, batch_size), data)
  else:
    data_spec = _data_spec(model, batch_size, x, y, sample_weight)
  _build_training_state(model, data_spec)
  keras_names = {id(v.value.handle): v.path for v in _all_keras_variables(model)
                 if hasattr(v, "value") and hasattr(v.value, "handle")}
  step = tf.function(model.train_step, autograph=False)
  handed = []
  with _recording_gradients(model.optimizer, handed):
    concrete = step.get_concrete_function(data_spec)
  captured = capture_function(
      concrete, name=name or model.name, batch_size=batch_size,
      variable_names=lambda v: keras_names.get(id(v.handle), v.name))
  return dataclasses.replace(
      captured, gradients=_gradient_names(handed, captured))


@contextlib.contextmanager
def _recording_gradients(optimizer, out: list):
  """Records the (gradients, variables) the traced step hands to
  `optimizer.apply` (what `apply_gradients` calls), without changing them."""
  original = optimizer.apply
  own = "apply" in vars(optimizer)

  def apply(grads, trainable_variables=None):
    grads = list(grads)
    variables = (list(trainable_variables) if trainable_variables is not None
                 else list(optimizer._trainable_variables))  # pylint: disable=protected-access
    out.append((grads, variables))
    return original(grads, trainable_variables)

  object.__setattr__(optimizer, "apply", apply)
  try:
    yield
  finally:
    if own:
      object.__setattr__(optimizer, "apply", original)
    else:
      object.__delattr__(optimizer, "apply")


def _gradient_names(handed: list, step: CapturedStep
                    ) -> tuple[tuple[str, str], ...]:
  """(gradient tensor, VarHandleOp) names of the recorded gradients that
  are in the captured graph."""
  op_of = {id(var.handle): name for name, var in step.variables.items()}
  nodes = {n.name for n in step.graph_def.node}
  out = []
  for grads, variables in handed:
    for grad, var in zip(grads, variables):
      if grad is None:
        continue
      grad = getattr(grad, "values", grad)  # IndexedSlices
      handle = getattr(getattr(var, "value", var), "handle", None)
      name = op_of.get(id(handle))
      if name is not None and grad.name.partition(":")[0] in nodes:
        out.append((grad.name, name))
  return tuple(out)


def _check_trainable(model) -> None:
  """A built, compiled Keras model, or a clear error."""
  import keras  # pylint: disable=g-import-not-at-top
  if not isinstance(model, keras.Model):
    raise invalid_argument("model", "a keras.Model", model)
  if not model.built:
    raise invalid_argument("model", "a built Keras model (call it on data or "
                           "construct it from keras.Input)",
                           f"<{model.name}: built=False>")
  if getattr(model, "optimizer", None) is None or not getattr(
      model, "compiled", False):
    raise invalid_argument("model", "compiled with an optimizer and a loss "
                           "(model.compile(...))",
                           f"<{model.name}: compiled=False>")


def _batch_spec(array, batch_size: int) -> tf.TensorSpec:
  """One batch tensor's spec at `batch_size`."""
  dtype = array.dtype if hasattr(array, "dtype") else np.asarray(array).dtype
  return tf.TensorSpec((batch_size,) + tuple(np.shape(array)[1:]),
                       tf.as_dtype(dtype))


def _data_spec(model, batch_size: int, x, y, sample_weight) -> tuple:
  """(x_spec, y_spec[, weights_spec]): from the arrays given, else x's from
  `model.inputs` and y's from `model.outputs`."""
  def spec_of(a):
    return _batch_spec(a, batch_size)

  if x is not None:
    x_spec = tf.nest.map_structure(spec_of, x)
  else:
    if not getattr(model, "inputs", None):
      raise invalid_argument("x", "given for a model without `model.inputs` "
                             "(a subclassed model)", x)
    x_spec = [tf.TensorSpec((batch_size,) + tuple(t.shape[1:]), t.dtype)
              for t in model.inputs]
    x_spec = x_spec[0] if len(x_spec) == 1 else x_spec
  if y is not None:
    y_spec = tf.nest.map_structure(spec_of, y)
  else:
    if not getattr(model, "outputs", None):
      raise invalid_argument("y", "given for a model without `model.outputs`",
                             y)
    y_spec = [_target_spec(model, o, batch_size) for o in model.outputs]
    y_spec = y_spec[0] if len(y_spec) == 1 else y_spec
  if sample_weight is None:
    return (x_spec, y_spec)
  return (x_spec, y_spec, tf.nest.map_structure(spec_of, sample_weight))


def _all_keras_variables(model):
  variables = list(model.variables)
  variables += list(model.optimizer.variables)
  variables += list(getattr(model, "metrics_variables", []))
  return variables


def _build_training_state(model, data_spec) -> None:
  """Creates optimizer slots and metric variables before tracing.

  Keras 3 builds them lazily on the first `fit` step; tracing must not create
  variables, so they are built here. `_symbolic_build` is private Keras API
  (present in 3.x); without it only the optimizer is built. It reads the
  batch as Keras' train_step does (x, y, sample_weight), so a model with
  its own train_step and a batch of another structure (a dict) gets only
  its optimizer built here; its metrics' state is then created on the
  trace's first pass (which tf.function allows), as in Keras' own fit.
  """
  import keras  # pylint: disable=g-import-not-at-top

  def zeros(spec):
    if spec is None:
      return None
    return np.zeros([1] + list(spec.shape[1:]), spec.dtype.as_numpy_dtype)

  keras_layout = isinstance(data_spec, tuple) and 1 <= len(data_spec) <= 3
  own_step = type(model).train_step is not keras.Model.train_step
  if hasattr(model, "_symbolic_build") and (keras_layout or not own_step):
    model._symbolic_build(data_batch=tf.nest.map_structure(zeros, data_spec))
  elif not model.optimizer.built:
    model.optimizer.build(model.trainable_variables)
