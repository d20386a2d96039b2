"""The weight-sharing super-network of a `SearchSpace`, as a Keras 3 model.

Every candidate op of every choice layer is a small block with its own
weights; a sub-graph is one op per layer, and all sub-graphs share these
weights. The active path is a non-trainable int32 variable (`active_path`,
one op index per layer): set it with `set_arch`, or from inside a compiled
train step, without retracing.

- `execution="switch"` (default): `keras.ops.switch` runs only the active
  op of each layer (a `tf.switch_case` in graph mode), so untaken ops get a
  zero gradient and their BatchNorm moving statistics do not move. Keras'
  decoupled weight decay (AdamW & co.) still shrinks them, as it decays
  every trainable variable: `tfopt.nas.PathSampler` puts untaken ops back
  after each step.
- `execution="mask"`: every op runs and the outputs are combined with the
  active path's one-hot weights; shapes are static, so it compiles under
  XLA (`jit_compile=True`). Untaken ops get zero gradients, but their
  BatchNorm layers do update their moving statistics in training (undone
  by `PathSampler` too).

`in_graph_sampling=True` draws the path inside the training step itself
(`keras.random.categorical` over `sampling_logits`, one draw per call with
`training=True`, except inside `fixed_path()`, which ranking's BatchNorm
recalibration and export use), so a whole epoch can run on the device without Python
between steps; `set_sampling(constraints)` sets the logits (remove, lock,
prefer; region and limits are not per-layer and need the Python
`PathSampler`). Untaken ops are then not restored after each step: use an
optimizer without weight decay (and in mask execution their BatchNorm
moving statistics move; ranking recalibrates them anyway).

`subnet(arch)` builds the chosen sub-graph as a standalone functional model
with the inherited weights (copied), for ranking, export and retraining.
Candidate ops whose output width differs from their input (skip and pooling
entering a wider stage) carry a 1x1 projection.
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np
from keras import layers as L
from keras import ops

from tfopt._errors import invalid_argument
from tfopt.nas.space import SearchSpace

EXECUTIONS = ("switch", "mask")


def _conv_block(filters, kernel, stride, name):
  return [L.Conv2D(filters, kernel, strides=stride, padding="same",
                   use_bias=False, name=f"{name}_conv"),
          L.BatchNormalization(name=f"{name}_bn"),
          L.ReLU(name=f"{name}_relu")]


def _op_layers(spec: dict, in_channels: int, filters: int, name: str) -> list:
  kind = spec["type"]
  stride = spec.get("stride", 1)
  if kind == "conv":
    return _conv_block(filters, spec["kernel"], stride, name)
  if kind == "dense":
    return [L.Dense(spec["units"], activation="relu", name=f"{name}_dense")]
  if kind == "skip":
    out = []
  elif kind == "maxpool":
    out = [L.MaxPooling2D(spec["pool"], strides=stride, padding="same",
                          name=f"{name}_pool")]
  else:  # avgpool
    out = [L.AveragePooling2D(spec["pool"], strides=stride, padding="same",
                              name=f"{name}_pool")]
  if in_channels != filters:  # a projection to the layer's width
    out += _conv_block(filters, 1, 1, f"{name}_proj")
  if not out:
    out = [L.Identity(name=f"{name}_identity")]
  return out


def _block(spec, in_channels, filters, name):
  return keras.Sequential(_op_layers(spec, in_channels, filters, name),
                          name=name)


class SuperNet(keras.Model):
  """All sub-graphs of `space` with shared weights; see the module doc."""

  def __init__(self, space: SearchSpace, execution: str = "switch",
               in_graph_sampling: bool = False, seed: int | None = None,
               **kwargs):
    if not isinstance(space, SearchSpace):
      raise invalid_argument("space", "a tfopt.nas.SearchSpace", space)
    super().__init__(name=kwargs.pop("name", f"supernet_{space.name}"),
                     **kwargs)
    if execution not in EXECUTIONS:
      raise invalid_argument("execution", f"one of {EXECUTIONS}", execution)
    self.space = space
    self.execution = execution
    stem = space.stem
    width = stem.get("filters", space.layers[0].filters or 16)
    self.stem = keras.Sequential(
        _conv_block(width, stem.get("kernel", 3), 1, "stem"), name="stem")
    self.choices = []
    for layer in space.layers:
      filters = layer.filters or width
      self.choices.append([_block(spec, width, filters, f"{layer.name}_{op}")
                           for op, spec in layer.ops.items()])
      width = filters
    self.pool = L.GlobalAveragePooling2D(name="head_pool")
    self.classifier = L.Dense(space.num_classes, name="head_logits")
    self.active_path = keras.Variable(
        np.zeros(len(space.layers), "int32"), trainable=False, dtype="int32",
        name="active_path")
    self.in_graph_sampling = bool(in_graph_sampling)
    self._path_fixed = False  # see fixed_path()
    widest = max(len(layer.ops) for layer in space.layers)
    self.sampling_logits = keras.Variable(
        np.zeros((len(space.layers), widest), "float32"), trainable=False,
        name="sampling_logits")
    self._seed_generator = keras.random.SeedGenerator(seed)
    self.set_sampling(None)
    self.build((None,) + space.input_shape)

  def build(self, input_shape):
    shape = tuple(input_shape)
    self.stem.build(shape)
    shape = self.stem.compute_output_shape(shape)
    for candidates in self.choices:
      outs = set()
      for block in candidates:
        block.build(shape)
        outs.add(tuple(block.compute_output_shape(shape)))
      if len(outs) != 1:
        raise invalid_argument("space", "choice layers whose ops all give "
                               "the same output shape", sorted(outs))
      shape = outs.pop()
    self.pool.build(shape)
    self.classifier.build(self.pool.compute_output_shape(shape))
    self.built = True

  def compile(self, *args, jit_compile="auto", **kwargs):
    """`keras.Model.compile`; `jit_compile=True` needs `execution="mask"`.

    XLA cannot compile the switch's data-dependent branch choice: under TF
    2.21 it aborts the whole process (a check failure, not an exception),
    so the combination is refused here, and "auto" (which picks XLA on a
    GPU) means no XLA for a switch network.
    """
    if self.execution == "switch":
      if jit_compile is True:
        raise invalid_argument(
            "jit_compile", "False or 'auto' for execution='switch' (XLA "
            "aborts the process on the switch's branch choice); build the "
            "SuperNet with execution='mask' to compile it under XLA",
            jit_compile)
      jit_compile = False
    super().compile(*args, jit_compile=jit_compile, **kwargs)

  def set_sampling(self, constraints=None) -> None:
    """In-graph sampling distribution: each layer's allowed ops with their
    preference weights (uniform without `constraints`, a
    `tfopt.nas.Constraints`)."""
    space = self.space
    logits = np.full(self.sampling_logits.shape, -1e9, np.float32)
    if constraints is None:
      allowed, prefer = space.allowed_ops(), {}
    else:
      from tfopt.nas.steering import Constraints  # pylint: disable=import-outside-toplevel
      if not isinstance(constraints, Constraints):
        raise invalid_argument("constraints", "a tfopt.nas.Constraints or "
                               "None", type(constraints).__name__)
      if constraints.region is not None or constraints.limits:
        raise invalid_argument(
            "constraints", "constraints without region or limits for "
            "in-graph sampling (they are not per-layer; use PathSampler "
            "without in_graph)", {"region": constraints.region,
                                  "limits": constraints.limits})
      constraints.validate(space)
      allowed = space.allowed_ops(constraints.allowed_ops(space))
      prefer = constraints.prefer
    for i, (ops_, layer) in enumerate(zip(allowed, space.layers)):
      for op in ops_:
        logits[i, layer.op_names.index(op)] = np.log(
            prefer.get(layer.name, {}).get(op, 1.0))
    self.sampling_logits.assign(logits)

  def set_arch(self, arch) -> None:
    """Makes `arch` (op names, one per layer) the active path."""
    arch = self.space.check_arch(arch)
    self.active_path.assign(np.array(
        [layer.op_names.index(op) for op, layer in zip(arch, self.space.layers)],
        dtype="int32"))

  def arch(self) -> tuple:
    """The active path as op names."""
    index = ops.convert_to_numpy(self.active_path)
    return tuple(layer.op_names[int(i)]
                 for i, layer in zip(index, self.space.layers))

  @contextlib.contextmanager
  def fixed_path(self):
    """Within it, calls with `training=True` run the active path as set
    (in-graph sampling paused): BatchNorm recalibration, ranking and
    export must run the path they name, not a fresh draw. Eager calls
    only: a step traced inside it keeps the fixed path."""
    before = self._path_fixed
    self._path_fixed = True
    try:
      yield self
    finally:
      self._path_fixed = before

  def call(self, inputs, training=None):
    path = self.active_path
    if training and self.in_graph_sampling and not self._path_fixed:
      path = ops.cast(keras.random.categorical(
          self.sampling_logits, 1, seed=self._seed_generator)[:, 0], "int32")
      self.active_path.assign(path)
    x = self.stem(inputs, training=training)
    for i, candidates in enumerate(self.choices):
      if self.execution == "switch":
        branches = [lambda y, b=block: b(y, training=training)
                    for block in candidates]
        x = ops.switch(path[i], branches, x)
      else:
        outs = ops.stack([block(x, training=training)
                          for block in candidates])
        weights = ops.cast(
            ops.one_hot(path[i], len(candidates)), outs.dtype)
        x = ops.tensordot(weights, outs, axes=1)
    return self.classifier(self.pool(x))

  def subnet(self, arch=None, name: str | None = None) -> keras.Model:
    """The sub-graph `arch` (default: the active path) as a standalone
    functional model whose weights are copies of the shared ones."""
    arch = self.space.check_arch(arch if arch is not None else self.arch())
    inputs = keras.Input(self.space.input_shape, name="image")
    copies = [self.stem] + [
        candidates[layer.op_names.index(op)]
        for op, candidates, layer in zip(arch, self.choices, self.space.layers)]
    x = inputs
    for block in copies:
      clone = keras.models.clone_model(block)
      x = clone(x)
      clone.set_weights(block.get_weights())
    pool = L.GlobalAveragePooling2D(name="head_pool")
    head = L.Dense(self.space.num_classes, name="head_logits")
    outputs = head(pool(x))
    head.set_weights(self.classifier.get_weights())
    return keras.Model(inputs, outputs, name=name or "subnet_" + "_".join(arch))
