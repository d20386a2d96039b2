"""`tfopt.compile`: the model.compile-time hook.

    model = tfopt.compile(model, optimizer=tfopt.optimizers.CautiousAdamW(),
                          loss="sparse_categorical_crossentropy",
                          fusion=True, placement="auto",
                          devices=["/device:CPU:0", "/device:CPU:1"],
                          memory_per_device=64 << 20)
    model.fit(x, y, ...)          # unchanged: trains with the optimized step

`compile` calls Keras' own `model.compile` with the Keras arguments, then
installs a train function. On the first batch of each input signature it
captures the real training step, runs the pass pipeline (prune, identity,
fold, then fuse and coarsen,place as asked), checks the rewritten step
against the original on that batch in a Session (same loss, same variable
updates, and, when placed, every op where planned: `check_rewritten`),
prints a report, and from then on `fit` runs the rewritten GraphDef inside
a `tf.function` on the model's own variables (each captured variable
handle is mapped to the Keras variable's handle on import). Profiling
(placement only) happens once per model and signature.

`jit_compile=True` with the hook means XLA where possible: every op of the
rewritten step is marked for XLA with a scope per device
(`tfopt.runtime.xla`), so XLA clusters never cross the placement; the
marked step is run in a Session on the first batch and compared with the
unmarked one (XLA reorders float math: rtol 1e-4); the function runtime
honours the same marks inside `fit`. Where TensorFlow refuses (seen: "Multiple
CPU devices" for some multi-device plans) or the numbers differ, the step
runs unmarked and the report says why. TF's fused CPU ops have no XLA
kernel, so with XLA on, fusion is left to XLA (the `fuse` pass is skipped).

Keras' `evaluate`, `predict` and saving are untouched. What tfopt cannot
honour is refused up front: another Keras backend, `steps_per_execution`
other than 1, a distribution strategy, devices that do not exist, a
variable living on a device outside `devices`. `jit_compile=True` with
fusion=False and no placement is Keras' own XLA step (no hook). Calling
`model.compile` again removes the hook.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Sequence

import numpy as np

from tfopt._errors import invalid_argument

PIPELINE_BASE = "prune,identity,fold"


@dataclasses.dataclass
class HookReport:
  """What the hook did for one input signature."""
  signature: tuple
  pipeline: str
  pipeline_table: str
  placer: str | None = None
  predicted_us: float | None = None
  single_device_us: float | None = None
  peak_bytes: tuple[int, ...] = ()
  devices_used: tuple[str, ...] = ()
  ops_verified: int = 0
  xla: str = ""  # what XLA did (jit_compile=True), or why it was not used

  def table(self) -> str:
    lines = [f"tfopt.compile: step for inputs {self.signature}",
             self.pipeline_table]
    if self.placer is not None:
      peaks = ", ".join(f"{p / 1e6:.1f}" for p in self.peak_bytes)
      lines.append(
          f"placement {self.placer}: predicted {self.predicted_us / 1e3:.2f} "
          f"ms vs one device {self.single_device_us / 1e3:.2f} ms; peak MB "
          f"per device: {peaks}; devices used: {list(self.devices_used)}")
    where = (f"; {self.ops_verified} ops ran where planned"
             if self.placer is not None else " (one device)")
    lines.append(f"verified on the first batch: same loss and variable "
                 f"updates as the original step{where}")
    if self.xla:
      lines.append(self.xla)
    return "\n".join(lines)


def _signature(x, y) -> tuple:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tuple((tuple(t.shape), t.dtype.name)
               for t in tf.nest.flatten((x, y)))


class _OptimizedTrainFunction:
  """The callable Keras' `fit` calls with its data iterator, once a step."""

  def __init__(self, model, *, fusion: bool, placement: str | None,
               devices: Sequence[str] | None, memory_per_device: int | None,
               verbose: bool, xla: bool = False):
    self.model = model
    self.xla = xla
    self.fusion = fusion
    self.placement = placement
    self.devices = list(devices or [])
    self.memory_per_device = memory_per_device
    self.verbose = verbose
    self.steps: dict[tuple, Any] = {}
    self.reports: dict[tuple, HookReport] = {}

  def __call__(self, iterator):
    import keras  # pylint: disable=g-import-not-at-top
    data = next(iterator)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    if sample_weight is not None:
      raise invalid_argument("sample_weight", "None with tfopt.compile (the "
                             "captured step takes (x, y) only)", "<given>")
    key = _signature(x, y)
    if key not in self.steps:
      self.steps[key] = self._build(x, y, key)
    return self.steps[key](x, y)

  def _pipeline(self) -> str:
    fuse = self.fusion and not self.xla  # XLA fuses; _Fused* have no kernel
    return ",".join([PIPELINE_BASE] + (["fuse"] if fuse else []) +
                    (["coarsen", "place"] if self.placement else []))

  def _build(self, x, y, key):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tfopt.graph.capture import capture_train_step  # pylint: disable=g-import-not-at-top
    from tfopt.passes import PassContext, PassManager  # pylint: disable=g-import-not-at-top
    from tfopt.runtime.placed import check_rewritten  # pylint: disable=g-import-not-at-top
    x_np = tf.nest.map_structure(np.asarray, x)
    y_np = tf.nest.map_structure(np.asarray, y)
    scopes = _name_scope_stack()
    try:
      step = capture_train_step(self.model, x=x_np, y=y_np)
    except Exception as err:  # pylint: disable=broad-except
      _restore_name_scope_stack(scopes)
      raise RuntimeError(
          f"tfopt.compile could not capture {self.model.name}'s training step "
          f"({type(err).__name__}: {err}). It traces `model.train_step` as a "
          f"graph: use a functional or Sequential model, or a subclassed one "
          f"whose train_step traces with autograph off; or train with plain "
          f"`model.compile`.") from err
    inputs = [*tf.nest.flatten(x_np), *tf.nest.flatten(y_np)]
    pipeline = self._pipeline()
    ctx = PassContext.for_step(step)
    if self.placement:
      ctx.cluster = self._cluster()
      ctx.placer = self.placement
      ctx.costs = self._costs(step, key, inputs)
      ctx.pins = self._variable_pins(step)
    result = PassManager(pipeline).run(step.graph_def, ctx)
    graph = result.graph
    # The check: the rewritten step computes what the original computes, on
    # copies of the variables (the model's own are not touched).
    run, check = check_rewritten(step, [inputs], graph)
    report = HookReport(key, pipeline, result.table(),
                        ops_verified=check.checked)
    if self.xla:
      graph, report.xla = _with_xla(step, inputs, graph, run)
    plan = ctx.results.get("placement")
    if plan is not None:
      report.placer = plan.placer
      report.predicted_us = plan.makespan_us
      report.single_device_us = plan.single_device_us
      report.peak_bytes = tuple(plan.schedule.peak_bytes)
      report.devices_used = tuple(sorted({n.device for n in graph.node
                                          if n.device}))
    self.reports[key] = report
    if self.verbose:
      print(report.table())
    return _imported_step(step, graph)

  def _cluster(self):
    """The devices as a Cluster; each device's type from its string (a
    placer keeps CPU-only ops off GPUs)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tfopt.cluster import Cluster, Device  # pylint: disable=g-import-not-at-top
    return Cluster(tuple(
        Device(d, (tf.DeviceSpec.from_string(d).device_type or
                   "CPU").upper(), self.memory_per_device)
        for d in self.devices))

  def _costs(self, step, key, inputs):
    """The step profiled once per model and input signature."""
    from tfopt.cost.profile import profile_step  # pylint: disable=g-import-not-at-top
    cache = _PROFILES.setdefault(self.model, {})
    if key not in cache:
      cache[key] = profile_step(step, inputs=inputs)
    return cache[key]

  def _variable_pins(self, step) -> dict[str, int]:
    """Each variable stays where Keras created it: TensorFlow would move its
    readers and updaters there whatever the plan says."""
    from tfopt.runtime.session import same_device  # pylint: disable=g-import-not-at-top
    pins = {}
    for name, var in step.variables.items():
      index = next((i for i, d in enumerate(self.devices)
                    if var.device and same_device(d, var.device)), None)
      if index is None:
        raise invalid_argument(
            "devices", f"a list including the device of every variable "
            f"({name!r} lives on {var.device or 'an unknown device'})",
            self.devices)
      pins[name] = index
    return pins


def _with_xla(step, inputs, graph, unmarked_run):
  """The graph marked for XLA per device when TensorFlow compiles it and the
  XLA step computes what the unmarked one does; else the graph unchanged.
  Returns (graph, a line for the report)."""
  from tfopt.runtime.placed import compare_runs  # pylint: disable=g-import-not-at-top
  from tfopt.runtime.xla import compile_step, mark_for_xla  # pylint: disable=g-import-not-at-top
  xla = compile_step(step, [inputs], graph_def=graph)
  if not xla.compiled:
    return graph, f"{xla.summary()}; the step runs without XLA"
  try:
    # XLA reorders and fuses float math: not bit-exact, but close.
    compare_runs(unmarked_run, xla.run, rtol=1e-4, atol=1e-5,
                 what="XLA-compiled step")
  except ValueError as err:
    return graph, f"XLA not used: {err}"
  return mark_for_xla(graph), (f"{xla.summary()}; checked on the first "
                               f"batch (rtol 1e-4)")


# Profiles per model and input signature: profiling runs once.
_PROFILES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _name_scope_stack():
  """A copy of Keras' global name-scope stack (private Keras state)."""
  try:
    from keras.src.backend.common import global_state  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return list(global_state.get_global_attribute("name_scope_stack") or [])


def _restore_name_scope_stack(saved) -> None:
  """A train_step that fails while traced leaves a Keras name scope open
  (seen with Keras 3.15): every model built afterwards would get its path
  prefixed by the failed layer's name. Put the stack back."""
  if saved is None:
    return
  from keras.src.backend.common import global_state  # pylint: disable=g-import-not-at-top
  global_state.set_global_attribute("name_scope_stack", saved)


def _imported_step(step, graph_def):
  """A tf.function running `graph_def` on the step's real variables."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  outputs = list(step.output_names)
  targets = list(step.target_names)
  structure = step.output_structure
  variables = dict(step.variables)

  @tf.function(autograph=False)
  def run(x, y):
    graph = tf.compat.v1.get_default_graph()
    feeds = tf.nest.flatten((x, y))
    input_map = {f"{name}:0": tensor
                 for name, tensor in zip(step.input_names, feeds)}
    # Each captured variable's handle node reads the Keras variable itself.
    input_map.update({f"{name}:0": graph.capture(var.handle)
                      for name, var in variables.items()})
    results = tf.graph_util.import_graph_def(
        graph_def, input_map=input_map, return_elements=outputs + targets,
        name="tfopt_step")
    with tf.control_dependencies(results[len(outputs):]):
      values = [tf.identity(t) for t in results[:len(outputs)]]
    return tf.nest.pack_sequence_as(structure, values)

  return run


def compile(model, *, fusion: bool = True,  # pylint: disable=redefined-builtin
            placement: str | None = None,
            devices: Sequence[str] | None = None,
            memory_per_device: int | None = None, verbose: bool = True,
            **compile_kwargs):
  """Compiles `model` with Keras and installs tfopt's optimized train step.

  Args:
    model: a Keras 3 model on the TensorFlow backend.
    fusion: fuse MatMul/Conv2D with bias, batch norm and activation (left
      to XLA when `jit_compile=True`).
    placement: None (one device), "auto" or a placer name
      (`tfopt.placement.PLACERS`, "exact").
    devices: TF device strings to place on (required with `placement`); they
      must exist (logical CPUs: `tf.config.set_logical_device_configuration`
      before TensorFlow starts).
    memory_per_device: cap in bytes per device (None: unlimited).
    verbose: print the report when a step is built.
    **compile_kwargs: Keras' `model.compile` arguments (optimizer, loss,
      metrics, ...), with their usual meaning; `jit_compile=True` marks the
      rewritten step for XLA per device, checked on the first batch, and
      falls back to no XLA (said in the report) where TensorFlow cannot.

  Returns:
    `model`, compiled; `model.train_function.reports` holds the reports.
  """
  import keras  # pylint: disable=g-import-not-at-top
  if not isinstance(model, keras.Model):
    raise invalid_argument("model", "a keras.Model", type(model).__name__)
  if keras.backend.backend() != "tensorflow":
    raise invalid_argument("model", "a model on Keras' TensorFlow backend "
                           "(tfopt rewrites TensorFlow graphs)",
                           f"<backend {keras.backend.backend()!r}>")
  steps = compile_kwargs.get("steps_per_execution", 1)
  if steps != 1:
    raise invalid_argument("steps_per_execution", "1 with tfopt.compile (the "
                           "optimized step runs one batch per call)", steps)
  jit = compile_kwargs.pop("jit_compile", "auto")  # Keras' default
  if jit not in (True, False, None, "auto"):
    raise invalid_argument("jit_compile", "True, False, None or 'auto'", jit)
  hooked = bool(fusion or placement)
  if placement is not None:
    from tfopt.placement.api import PLACERS  # pylint: disable=g-import-not-at-top
    names = sorted(PLACERS) + ["auto", "exact"]
    if placement not in names:
      raise invalid_argument("placement", f"None or one of {names}",
                             placement)
    _check_devices(devices)
  elif devices:
    raise invalid_argument("devices", "given only with `placement`", devices)
  if memory_per_device is not None and (
      isinstance(memory_per_device, bool) or
      not isinstance(memory_per_device, int) or memory_per_device <= 0):
    raise invalid_argument("memory_per_device", "a positive integer (bytes) "
                           "or None", memory_per_device)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if tf.distribute.has_strategy() or not isinstance(
      model.distribute_strategy, type(tf.distribute.get_strategy())):
    raise invalid_argument("model", "built outside a tf.distribute strategy "
                           "scope (tfopt.compile places one replica's step)",
                           f"<strategy {type(model.distribute_strategy).__name__}>")
  # Keras' own meaning for its functions (evaluate, predict, and train
  # without the hook); the hook's step gets XLA through per-device marks.
  model.compile(jit_compile=jit, **compile_kwargs)
  if hooked:
    hook = _OptimizedTrainFunction(
        model, fusion=fusion, placement=placement, devices=devices,
        memory_per_device=memory_per_device, verbose=verbose,
        xla=jit is True)
    # Keras' fit calls make_train_function(), which keeps a function that is
    # already set; compile() resets it, which removes the hook.
    model.train_function = hook
  return model


def _check_devices(devices) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfopt.runtime.session import same_device  # pylint: disable=g-import-not-at-top
  devices = list(devices or [])
  if len(devices) < 1 or not all(isinstance(d, str) and d for d in devices):
    raise invalid_argument("devices", "a non-empty list of TF device strings "
                           "when `placement` is given", devices)
  available = [d.name for d in tf.config.list_logical_devices()]
  for d in devices:
    if not any(same_device(d, a) for a in available):
      raise invalid_argument(
          "devices", f"devices of this process ({available}); logical CPU "
          f"devices come from tf.config.set_logical_device_configuration "
          f"before TensorFlow starts", devices)
