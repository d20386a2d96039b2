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

With `placement`, the model's variables follow the plan: nothing is pinned
by default, and once the placed step passed the check, each Keras variable
(weights, optimizer slots, metric state) is moved onto the device the plan
gave it (`tfopt.runtime.variables`; no copy stays behind), so a model whose
state is several times one device's memory trains with an unchanged `fit`,
and `evaluate`, `predict`, `save_weights` / `load_weights` and
`Model.save` act on the placed variables. If placement or the check
fails, nothing was moved. See `tfopt.compile_placement` for pins, the
profiling of a step that does not fit one device, and the refusal.

`jit_compile=True` with the hook means XLA where possible: every op of the
rewritten step is marked for XLA with a scope per device
(`tfopt.runtime.xla`), so XLA clusters never cross the placement; the
marked step is run in a Session on the first batch and compared with the
unmarked one (XLA reorders float math: rtol 1e-4); the function runtime
honours the same marks inside `fit`. Where TensorFlow refuses (seen: "Multiple
CPU devices" for some multi-device plans) or the numbers differ, the step
runs unmarked and the report says why. TF's fused CPU ops have no XLA
kernel, so with XLA on, fusion is left to XLA (the `fuse` pass is skipped).

The step is what `fit` feeds `train_step`: (x, y, sample_weight) in any
structure Keras allows (sample weights per example or per timestep, and
`class_weight`, which Keras turns into them); `steps_per_execution=N` runs
N batches per call, as Keras' own function does. Functional control flow
(While / If / Case: Keras' LSTM and GRU, `keras.ops.cond`) is kept: each
such node is one op to cost and place, its function library travels with
every rewrite.

A model built in a `tf.distribute.MirroredStrategy` or
`MultiWorkerMirroredStrategy` scope trains with the strategy: each replica's forward, loss and gradients are captured and
rewritten, the all-reduce and the updates stay Keras' own
(`tfopt.compile_strategy`).

Keras' `evaluate` and `predict` are not rewritten (they run where the
variables live). What tfopt cannot honour is refused up front: another
Keras backend, other distribution strategies and placement under one,
devices that do not exist or tasks that do not answer, pins to devices
not given, a variable outside Keras living on a device outside
`devices`. `jit_compile=True` with fusion=False and no
placement is Keras' own XLA step (no hook). Calling `model.compile` again
removes the hook.
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
  # Of predicted_us, what the runtime's step costs beyond the simulated ops
  # and transfers: the calibrated dispatch to the server tasks used
  # (Cluster.step_overhead, in the plan's makespan) and the batch's feed
  # (Calibration.feed_us); 0 elsewhere.
  step_overhead_us: float = 0.0
  peak_bytes: tuple[int, ...] = ()
  devices_used: tuple[str, ...] = ()
  ops_verified: int = 0
  xla: str = ""  # what XLA did (jit_compile=True), or why it was not used
  # Placement only: where the variables' bytes live (device -> bytes),
  # where the costs came from, and how many of them were measured.
  variable_bytes: dict = dataclasses.field(default_factory=dict)
  costs_source: str = ""
  costs_unmeasured: str = ""  # CostModel.describe_unmeasured()
  profiled_ops: int = 0
  costed_ops: int = 0
  cluster_source: str = ""  # the calibration used, or the default model
  selection: str = ""  # select="measured": the candidates' times
  replicas: int = 1  # a strategy's replicas (all workers'), each its step
  # Placement only: the PlacementResult (the chosen plan, its simulated
  # Schedule -- tfopt.simulate.draw_gantt draws it -- every candidate).
  plan: Any = dataclasses.field(default=None, repr=False)

  def table(self) -> str:
    lines = [f"tfopt.compile: step for inputs {self.signature}",
             self.pipeline_table]
    if self.placer is not None:
      peaks = ", ".join(f"{p / 1e6:.1f}" for p in self.peak_bytes)
      overhead = (f" ({(self.predicted_us - self.step_overhead_us) / 1e3:.2f}"
                  f" ms simulated + {self.step_overhead_us / 1e3:.2f} ms "
                  f"dispatch and feed)" if self.step_overhead_us else "")
      lines.append(
          f"placement {self.placer}: predicted {self.predicted_us / 1e3:.2f} "
          f"ms{overhead} vs one device {self.single_device_us / 1e3:.2f} ms; "
          f"peak MB per device: {peaks}; devices used: "
          f"{list(self.devices_used)}")
      if getattr(self.plan, "bound", None) is not None:
        lines.append(self.plan.describe_bound())
      total = sum(self.variable_bytes.values()) or 1
      shares = ", ".join(f"{d or '?'} {100 * b / total:.0f} %"
                         for d, b in sorted(self.variable_bytes.items()))
      lines.append(f"variables ({total / 1e6:.1f} MB) moved to the plan's "
                   f"devices: {shares}")
      lines.append(f"costs: {self.profiled_ops} of {self.costed_ops} ops "
                   f"measured, the rest estimated; {self.costs_source}")
      if self.costs_unmeasured:
        lines.append(f"  {self.costs_unmeasured}")
      lines.append(f"cluster: {self.cluster_source}")
      if self.selection:
        lines.append(self.selection)
    where = (f"; {self.ops_verified} ops ran where planned"
             if self.placer is not None else
             f" in each of {self.replicas} replicas (the strategy's "
             f"all-reduce and updates by Keras)" if self.replicas > 1 else
             " (one device)")
    lines.append(f"verified on the first batch: same loss and variable "
                 f"updates as the original step{where}")
    if self.xla:
      lines.append(self.xla)
    return "\n".join(lines)


def _parts(data) -> list:
  """A batch's (part, value) pairs: "x", "y", "sample_weight" for Keras'
  (x,), (x, y) and (x, y, sample_weight) tuples; else the whole batch is
  one part, "batch" (a dict or a tensor: Keras' train_step unpacks it as
  `unpack_x_y_sample_weight` does, a model's own train_step as it likes)."""
  if isinstance(data, tuple) and 1 <= len(data) <= 3:
    return list(zip(("x", "y", "sample_weight"), data))
  return [("batch", data)]


def _signature(data) -> tuple:
  """A batch's input signature: (part, shape, dtype) of every tensor."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tuple((part, tuple(t.shape), t.dtype.name)
               for part, value in _parts(data)
               if value is not None for t in tf.nest.flatten(value))


def _tensors(data) -> list:
  """The batch's tensors in the captured step's input order (a part that
  is None has none)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return [t for _, value in _parts(data) if value is not None
          for t in tf.nest.flatten(value)]


class _OptimizedTrainFunction:
  """The callable Keras' `fit` calls with its data iterator, once a step."""

  def __init__(self, model, *, fusion: bool, placement: str | None,
               where=None, memory_per_device: int | None,
               verbose: bool, xla: bool = False,
               calibration=None, select: str = "simulated",
               measure_steps: int = 5, strategy=None):
    self.model = model
    # A (MultiWorker)MirroredStrategy the model was built under
    # (tfopt.compile_strategy),
    # or None.
    self.strategy = strategy
    self.calibration = calibration
    self.select = select
    self.measure_steps = measure_steps
    self.xla = xla
    self.fusion = fusion
    self.placement = placement
    # The checked devices, cluster and pins (tfopt.compile_devices), None
    # without placement.
    self.where = where
    self.devices = list(where.names) if where is not None else []
    self.memory_per_device = memory_per_device
    self.verbose = verbose
    # Set once the model's variables follow a plan: later input signatures
    # keep them where they are.
    self.variables_placed = False
    self.steps: dict[tuple, Any] = {}
    self.reports: dict[tuple, HookReport] = {}
    # The rewritten (placed) GraphDef per input signature, for measuring it.
    self.graph_defs: dict[tuple, Any] = {}

  def invalidate(self) -> None:
    """The model's step changed (a constraint, a loss term): each input
    signature's step is captured, profiled and placed again at its next
    call (variables already placed stay where they are)."""
    self.steps.clear()
    _PROFILES.pop(self.model, None)

  def __call__(self, iterator):
    """Runs `steps_per_execution` batches of `iterator` (fewer where it
    runs out, none: StopIteration) and returns the last step's logs, as
    Keras' own train function does."""
    logs = None
    for _ in range(int(getattr(self.model, "steps_per_execution", 1) or 1)):
      try:
        data = next(iterator)
      except StopIteration:
        if logs is None:
          raise
        break
      # The batch as fit yields it, which is what Keras hands train_step:
      # a model's own train_step may read a structure Keras' unpacking
      # would change (a dict batch is not x).
      logs = self._one_step(data)
    return logs

  def _one_step(self, data: tuple):
    from tfopt import compile_strategy  # pylint: disable=g-import-not-at-top
    key = (_signature(data) if self.strategy is None else
           compile_strategy.signature(data))
    if key not in self.steps:
      self.steps[key] = self._build(data, key)
    return self.steps[key](data)

  def _pipeline(self) -> str:
    fuse = self.fusion and not self.xla  # XLA fuses; _Fused* have no kernel
    return ",".join([PIPELINE_BASE] + (["fuse"] if fuse else []) +
                    (["coarsen", "place", "control"] if self.placement
                     else []))

  def _build(self, data: tuple, key):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tfopt.passes import PassContext  # pylint: disable=g-import-not-at-top
    from tfopt.runtime.placed import check_rewritten  # pylint: disable=g-import-not-at-top
    from tfopt import compile_strategy  # pylint: disable=g-import-not-at-top
    if self.strategy is None:
      data_np = tf.nest.map_structure(
          lambda a: None if a is None else np.asarray(a), data)
      step = self._capture(data_np)
      # The step's placeholders, in the order of the flattened batch.
      inputs = _tensors(data_np)
    else:
      step, kept = compile_strategy.capture_replica_step(
          self.model, self.strategy, data)
      inputs = compile_strategy.numpy_inputs(data)
      step, on_worker = compile_strategy.for_local_checks(step,
                                                          self.strategy)
    pipeline = self._pipeline()
    ctx = PassContext.for_step(step)
    if self.placement:
      ctx.cluster = self._cluster()
      ctx.placer = self.placement
      ctx.pins = self._pins(step)
      ctx.costs = self._costs(step, key, inputs, ctx)
      if self.select == "measured":
        from tfopt.runtime.select import measured_chooser  # pylint: disable=g-import-not-at-top
        ctx.choose = measured_chooser(
            step, inputs, self.devices, steps=self.measure_steps,
            target=self._devices_target())
    result = self._run_pipeline(pipeline, step, ctx)
    graph = result.graph
    # The check: the rewritten step computes what the original computes, on
    # copies of the variables (the model's own are not touched). atol 1e-5:
    # Adam turns a gradient that is zero up to float noise (an attention
    # key bias's) into a step whose sign is that noise; a rewrite that
    # reorders float sums moves such variables by ~1e-6 (seen on this
    # machine's oneDNN kernels for the zoo Transformer).
    run, check = check_rewritten(step, [inputs], graph,
                                 target=self._target(graph), atol=1e-5)
    report = HookReport(key, pipeline, result.table(),
                        ops_verified=check.checked,
                        replicas=(1 if self.strategy is None else
                                  self.strategy.num_replicas_in_sync))
    if self.xla:
      graph, report.xla = _with_xla(step, inputs, graph, run)
    plan = ctx.results.get("placement")
    # Before any move: the captured tf.Variables identify the Keras ones.
    variables = self._variables_by_name(step)
    if plan is not None:
      self._report_plan(report, plan, graph, step, ctx.costs, ctx.cluster)
      if "selection" in ctx.results:
        report.selection = ctx.results["selection"].table()
      # Checked: the model's own variables now follow the plan.
      self._move_variables(step, graph)
    self.reports[key] = report
    self.graph_defs[key] = graph
    if self.verbose:
      print(report.table())
    self._summarize(report)
    from tfopt.runtime.imported import imported_step  # pylint: disable=g-import-not-at-top
    if self.strategy is not None:
      run = imported_step(step, on_worker(graph), variables)
      return compile_strategy.replica_train_function(self.model,
                                                     self.strategy, run, kept)
    run = imported_step(step, graph, variables)
    return lambda batch: run(_tensors(batch))

  def _summarize(self, report: HookReport) -> None:
    """The report as text and, with a plan, its Gantt chart as an image,
    into the TensorBoard of the fit this step is built in, if it has one
    (`tfopt.summaries`): tags tfopt/compile/report, tfopt/compile/gantt."""
    from tfopt import summaries  # pylint: disable=g-import-not-at-top
    writer = summaries.for_fit(self.model)
    if writer is None:
      return
    step = summaries.training_step(self.model)
    writer.write_text("compile/report", report.table(), step,
                      preformatted=True)
    if report.plan is not None:
      from tfopt.simulate.gantt import draw_gantt  # pylint: disable=g-import-not-at-top
      png = summaries.png_of(lambda path: draw_gantt(
          report.plan.schedule, path, device_names=self.devices,
          title=f"placed step ({report.placer}): predicted "
                f"{report.predicted_us / 1e3:.2f} ms" + (
                    f", of which {report.step_overhead_us / 1e3:.2f} ms "
                    f"dispatch and feed (not drawn)"
                    if report.step_overhead_us else "")))
      if png is not None:
        writer.write_image("compile/gantt", png, step)
    writer.flush()

  def _capture(self, data_np: tuple):
    from tfopt.graph.capture import capture_train_step  # pylint: disable=g-import-not-at-top
    scopes = _name_scope_stack()
    if not self.model.built:
      # As Keras' fit does: an unbuilt model (a Sequential without an Input)
      # is built by calling it on the first batch, here eagerly.
      import keras  # pylint: disable=g-import-not-at-top
      x = keras.utils.unpack_x_y_sample_weight(data_np)[0]
      self.model(x, training=False)
    try:
      step = capture_train_step(self.model, data=data_np)
    except Exception as err:  # pylint: disable=broad-except
      _restore_name_scope_stack(scopes)
      raise RuntimeError(
          f"tfopt.compile could not capture {self.model.name}'s training step "
          f"({type(err).__name__}: {err}). It traces `model.train_step` as a "
          f"graph: use a functional or Sequential model, or a subclassed one "
          f"whose train_step traces with autograph off; or train with plain "
          f"`model.compile`.") from err
    return step

  def _run_pipeline(self, pipeline: str, step, ctx):
    """The pass pipeline; a placement no device count given can hold is
    refused with what the step needs and what would hold it."""
    from tfopt.compile_placement import refusal  # pylint: disable=g-import-not-at-top
    from tfopt.graph.capture import opgraph_from_graphdef  # pylint: disable=g-import-not-at-top
    from tfopt.passes import PassError, PassManager  # pylint: disable=g-import-not-at-top
    from tfopt.passes.place import step_costs  # pylint: disable=g-import-not-at-top
    from tfopt.placement.problem import InfeasiblePlacement  # pylint: disable=g-import-not-at-top
    try:
      return PassManager(pipeline).run(step.graph_def, ctx)
    except PassError as err:
      cause = err.__cause__
      if not isinstance(cause, InfeasiblePlacement):
        raise
      before = PassManager(pipeline.split(",coarsen")[0]).run(
          step.graph_def, dataclasses.replace(ctx, results={}))
      graph = opgraph_from_graphdef(before.graph, batch_size=ctx.batch_size,
                                    inline=False)
      why = refusal(graph, step_costs(graph, ctx), ctx.cluster)
      refused = InfeasiblePlacement(why.message(self.model.name, str(cause)))
      refused.refusal = why  # the numbers, and .message() without the rest
      raise refused from err

  def _devices_target(self) -> str:
    """The session target for the devices given ("" for this process's)."""
    return self.where.target if self.where is not None else ""

  def _target(self, graph_def) -> str:
    """The session target for a graph placed on tasks of a cluster."""
    return self.where.target_of(graph_def) if self.where is not None else ""

  def _report_plan(self, report, plan, graph, step, costs, cluster) -> None:
    from tfopt.compile_placement import placement_summary  # pylint: disable=g-import-not-at-top
    report.placer = plan.placer
    report.plan = plan
    report.peak_bytes = tuple(plan.schedule.peak_bytes)
    report.devices_used = tuple(sorted({n.device for n in graph.node
                                        if n.device}))
    # The plan's makespan holds the cluster's step overhead for the devices
    # it uses (Cluster.step_overhead: the calibrated dispatch to server
    # tasks); the batch's feed is the same for every plan.
    feed = self._feed_us(step)
    outside = self._dispatch_outside_plan_us(report.devices_used, cluster)
    report.step_overhead_us = feed + outside + cluster.step_overhead(
        len(set(plan.placement.values())))
    report.predicted_us = plan.makespan_us + feed + outside
    report.single_device_us = plan.single_device_us + feed + (
        self._dispatch_outside_plan_us(self.where.names[:1], cluster)
        if self.where is not None else 0.0)
    summary = placement_summary(plan, graph, step.variables)
    report.variable_bytes = summary["variable_bytes"]
    report.costs_source = getattr(costs, "source", "")
    describe = getattr(costs, "describe_unmeasured", None)
    report.costs_unmeasured = describe() if describe else ""
    report.profiled_ops = sum(1 for c in costs.values() if c.profiled)
    report.costed_ops = len(costs)
    report.cluster_source = (
        self.calibration.describe() if self.calibration is not None else
        "not calibrated: Baechi's PCIe-like link, devices computing apart "
        "(tfopt-calibrate fits this machine's)")

  def _task_calibration(self):
    """The calibration where the devices are server tasks this process
    drives (what its dispatch and feed were measured for); else None."""
    if self.calibration is None or self.where is None or \
        not self.where.remote:
      return None
    return self.calibration

  def _dispatch_outside_plan_us(self, devices, cluster) -> float:
    """The calibrated dispatch to the server tasks among `devices` where
    the cluster could not carry it (`Cluster.step_overhead_us` counts
    devices: several devices of one task, or devices of this process
    beside tasks): added to the prediction, not weighed by the placers.
    0 where the plan's makespan holds it or nothing was measured."""
    calibration = self._task_calibration()
    if cluster.step_overhead_us or calibration is None:
      return 0.0
    from tfopt.runtime.remote import task_of  # pylint: disable=g-import-not-at-top
    tasks = {t for t in map(task_of, devices) if t is not None}
    return calibration.step_overhead_us(len(tasks)) if tasks else 0.0

  def _feed_us(self, step) -> float:
    """The batch's feed from this process to server tasks, at the
    calibration's measured rate (`Calibration.feed_us`); 0 for devices of
    this process or without one."""
    calibration = self._task_calibration()
    return 0.0 if calibration is None else calibration.feed_us(
        step.input_bytes())

  def _cluster(self):
    """The devices as a Cluster (`PlacementDevices.cluster`)."""
    return self.where.cluster(self.memory_per_device, self.calibration)

  def _pins(self, step) -> dict[str, int]:
    """What the placer must keep (see tfopt.compile_placement): the user's
    pins, variables tfopt cannot move, and variables already placed."""
    from tfopt.compile_placement import resolve_pins, step_pins  # pylint: disable=g-import-not-at-top
    user = resolve_pins(self.model, self.where.pins)
    return step_pins(step, self.model, self.devices, user,
                     keep_in_place=self.variables_placed)

  def _costs(self, step, key, inputs, ctx):
    """The step profiled once per model and input signature: on one device
    when the devices are this process's and either the step fits one by the
    analytic estimate or they are logical CPUs (whose caps bind the plan,
    not TensorFlow's allocator: the whole step runs on one of them, as on
    the process); else under a first plan (analytic costs) on the devices,
    where a cap is real memory (server tasks under OS caps, GPUs)."""
    from tfopt.compile_placement import fits_one_device  # pylint: disable=g-import-not-at-top
    from tfopt.cost.profile import profile_step  # pylint: disable=g-import-not-at-top
    cache = _PROFILES.setdefault(self.model, {})
    if key in cache:
      return cache[key]
    if self.where.in_process_cpus or (
        not self.where.remote and
        fits_one_device(step, self.memory_per_device)):
      # Scaled to the step as this hook runs it (a tf.function), not to
      # the profiling session's, which ran it up to 1.9x slower.
      cache[key] = profile_step(step, inputs=inputs, clock="function")
      return cache[key]
    first = dataclasses.replace(ctx, costs=None, results={}, choose=None)
    plan = self._run_pipeline(self._pipeline(), step, first).graph
    cores = (None if self.calibration is None else
             self.calibration.cores_per_device)
    cache[key] = profile_step(step, inputs=inputs, graph_def=plan,
                              target=self._target(plan),
                              cores_per_device=cores)
    return cache[key]

  def _move_variables(self, step, graph) -> None:
    """The model's Keras variables onto the devices the plan gave them;
    Keras' own functions are rebuilt on them at their next call."""
    from tfopt.compile_placement import keras_assignment  # pylint: disable=g-import-not-at-top
    from tfopt.runtime.variables import move_variables  # pylint: disable=g-import-not-at-top
    move_variables(keras_assignment(step, self.model, graph),
                   optimizer=self.model.optimizer)
    self.variables_placed = True
    for name in ("predict_function", "test_function"):
      if getattr(self.model, name, None) is not None:
        setattr(self.model, name, None)

  def _variables_by_name(self, step) -> dict[str, Any]:
    """VarHandleOp name -> the Keras variable (whose tf.Variable may have
    moved) or, for variables outside Keras, the tf.Variable itself."""
    from tfopt.runtime.variables import keras_variables  # pylint: disable=g-import-not-at-top
    keras_of = {id(v.value): v for v in keras_variables(self.model)}
    return {name: keras_of.get(id(var), var)
            for name, var in step.variables.items()}


def _with_xla(step, inputs, graph, unmarked_run):
  """The graph marked for XLA per device when TensorFlow compiles it and the
  XLA step computes what the unmarked one does; else the graph unchanged.
  Returns (graph, a line for the report)."""
  from tfopt.runtime.xla import check_xla_step, compile_step, mark_for_xla  # pylint: disable=g-import-not-at-top
  xla = compile_step(step, [inputs], graph_def=graph)
  if not xla.compiled:
    return graph, f"{xla.summary()}; the step runs without XLA"
  try:
    # XLA reorders and fuses float math: not bit-exact, but close.
    how = check_xla_step(step, [inputs], graph, unmarked_run, xla.run,
                         rtol=1e-4, atol=1e-5)
  except ValueError as err:
    return graph, f"XLA not used: {err}"
  return mark_for_xla(graph), (f"{xla.summary()}; checked on the first "
                               f"batch (rtol 1e-4{'; ' + how if how else ''})")


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


def compile(model, *, fusion: bool = True,  # pylint: disable=redefined-builtin
            placement: str | None = None,
            devices: Sequence[str] | None = None,
            memory_per_device: int | None = None, verbose: bool = True,
            pins: dict | None = None, cluster: Any = None,
            calibration: Any = "default", select: str = "simulated",
            measure_steps: int = 5, **compile_kwargs):
  """Compiles `model` with Keras and installs tfopt's optimized train step.

  Args:
    model: a Keras 3 model on the TensorFlow backend.
    fusion: fuse MatMul/Conv2D with bias, batch norm and activation (left
      to XLA when `jit_compile=True`).
    placement: None (one device), "auto" or a placer name
      (`tfopt.placement.PLACERS`, "exact").
    devices: TF device strings to place on (required with `placement`); they
      must exist: logical CPUs (`tf.config.set_logical_device_configuration`
      before TensorFlow starts), or tasks of TF's distributed runtime
      ("/job:worker/task:1/device:CPU:0") with `cluster`.
    memory_per_device: cap in bytes per device (None: unlimited). A step
      whose liveness peak exceeds it on one device is spread over the
      devices, the model's own variables with it.
    pins: {layer name or variable path: device index or string}: those
      variables stay on that device (default: nothing pinned; the placer
      puts every variable, and the hook moves it there).
    cluster: the cluster the `devices` tasks belong to: {job: ["host:port",
      ...]} (`LoopbackServers.spec`), a `tf.train.ClusterSpec`, a
      TF_CONFIG-style dict or JSON string; None reads `TF_CONFIG` when the
      devices name tasks.
    calibration: "default", "auto", None, a calibration file's path
      (`tfopt-calibrate`) or a `tfopt.calibration.Calibration`: the
      devices' fitted link and core sharing, which the placer's simulator
      uses. "auto": for two or more CPU devices of this process, this
      machine's calibration from the cache, measured briefly (seconds) the
      first time (`tfopt.calibration_cache`); other devices are not
      calibrated. "default" (the default): "auto", unless the environment
      variable `TFOPT_CALIBRATION=none` asks for None. None: Baechi's
      PCIe-like link, devices computing apart. A file from another machine
      or TensorFlow is refused; a stale one is named so in the report,
      which always says which calibration was used and how old it is.
    select: "simulated" (the portfolio's fastest predicted plan) or
      "measured": the best few plans and one device (where it fits) run
      `measure_steps` steps each on the devices, the fastest measured wins;
      the report shows predicted and measured times.
    measure_steps: timed steps per candidate and round with "measured".
    verbose: print the report when a step is built.
    **compile_kwargs: Keras' `model.compile` arguments (optimizer, loss,
      metrics, ...), with their usual meaning; `jit_compile=True` marks the
      rewritten step for XLA per device, checked on the first batch, and
      falls back to no XLA (said in the report) where TensorFlow cannot.

  Returns:
    `model`, compiled; `model.train_function.reports` holds the reports.
  """
  jit, strategy = _check_model(model, compile_kwargs)
  from tfopt import compile_strategy  # pylint: disable=g-import-not-at-top
  compile_strategy.refuse_placement(strategy, placement)
  where = None
  if placement is not None:
    where, calibration = _check_placement(
        placement, devices, cluster, pins, calibration, select,
        measure_steps)
  else:
    _refuse_without_placement(devices=devices, pins=pins, cluster=cluster,
                              calibration=calibration, select=select)
  if memory_per_device is not None and (
      isinstance(memory_per_device, bool) or
      not isinstance(memory_per_device, int) or memory_per_device <= 0):
    raise invalid_argument("memory_per_device", "a positive integer (bytes) "
                           "or None", memory_per_device)
  if placement and memory_per_device is not None:
    _check_inputs_fit(model, memory_per_device)
  # Keras' own meaning for its functions (evaluate, predict, and train
  # without the hook); the hook's step gets XLA through per-device marks.
  if strategy is not None and not _has_strategy():
    with strategy.scope():  # the optimizer's and metrics' variables
      model.compile(jit_compile=jit, **compile_kwargs)
  else:
    model.compile(jit_compile=jit, **compile_kwargs)
  if where is not None and where.remote:
    _renew_after_connect(model)
  if fusion or placement:
    hook = _OptimizedTrainFunction(
        model, fusion=fusion, placement=placement, where=where,
        memory_per_device=memory_per_device, verbose=verbose,
        xla=jit is True, calibration=calibration, select=select,
        measure_steps=measure_steps, strategy=strategy)
    # Keras' fit calls make_train_function(), which keeps a function that is
    # already set; compile() resets it, which removes the hook.
    model.train_function = hook
    _keep_hook(model, hook)
  return model


def _keep_hook(model, hook) -> None:
  """Keeps the hook over `make_train_function(force=True)`.

  Callbacks that change the step (pruning masks as variable constraints,
  a distillation loss) call it so that Keras traces the step again; Keras'
  own would replace the hook with a plain step. This model's
  `make_train_function` puts the hook back instead, and makes it capture
  (profile, place, check) the changed step at its next call. A later plain
  `model.compile` (Keras' compile config replaced) ends it: Keras' own
  method again.
  """
  config = getattr(model, "_compile_config", None)

  def make_train_function(force=False):
    if getattr(model, "_compile_config", None) is not config:
      del model.make_train_function  # recompiled by Keras: its own again
      return model.make_train_function(force=force)
    if force:
      hook.invalidate()
    model.train_function = hook
    return hook

  model.make_train_function = make_train_function


def _check_model(model, compile_kwargs) -> tuple:
  """Refuses what the hook cannot honour about the model and Keras'
  arguments; returns `jit_compile` (removed from them) and the model's
  MirroredStrategy, or None."""
  import keras  # pylint: disable=g-import-not-at-top
  if not isinstance(model, keras.Model):
    raise invalid_argument("model", "a keras.Model", type(model).__name__)
  if keras.backend.backend() != "tensorflow":
    raise invalid_argument("model", "a model on Keras' TensorFlow backend "
                           "(tfopt rewrites TensorFlow graphs)",
                           f"<backend {keras.backend.backend()!r}>")
  jit = compile_kwargs.pop("jit_compile", "auto")  # Keras' default
  if jit not in (True, False, None, "auto"):
    raise invalid_argument("jit_compile", "True, False, None or 'auto'", jit)
  from tfopt.compile_strategy import supported_strategy  # pylint: disable=g-import-not-at-top
  return jit, supported_strategy(model)


def _check_inputs_fit(model, memory_per_device: int) -> None:
  """Refuses, at compile, a cap below one input tensor of one batch where
  the model's input shapes say so: each input tensor is one op's output and
  lives whole on one device. An unknown batch dimension counts as 1 (one
  example must fit); the first batch of `fit` checks the rest."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  try:
    inputs = list(model.inputs or ())
  except (AttributeError, ValueError):  # a subclassed or unbuilt model
    return
  sizes = []
  for tensor in inputs:
    shape = tuple(tensor.shape)
    if any(d is None for d in shape[1:]):
      continue
    batch = shape[0] if shape and shape[0] is not None else 1
    item = np.dtype(getattr(tensor.dtype, "name", tensor.dtype)).itemsize
    sizes.append((int(np.prod(shape[1:], dtype=np.int64)) * batch * item,
                  getattr(tensor, "name", "input"), shape))
  too_big = [(b, n, sh) for b, n, sh in sizes if b > memory_per_device]
  if too_big:
    described = ", ".join(f"{n} {sh}: {b:,} bytes" for b, n, sh in too_big)
    raise invalid_argument(
        "memory_per_device", f"at least the bytes of each input tensor of one "
        f"batch (one example where the batch size is unknown), which lives "
        f"whole on one device; too small for {described}", memory_per_device)


def _check_placement(placement, devices, cluster, pins, calibration, select,
                     measure_steps):
  """The placement arguments checked: (the devices, cluster and pins as one
  `PlacementDevices`, the loaded calibration or None)."""
  from tfopt.compile_devices import check_placement_devices  # pylint: disable=g-import-not-at-top
  from tfopt.compile_placement import check_selection  # pylint: disable=g-import-not-at-top
  from tfopt.placement.api import PLACERS  # pylint: disable=g-import-not-at-top
  names = sorted(PLACERS) + ["auto", "exact"]
  if placement not in names:
    raise invalid_argument("placement", f"None or one of {names}", placement)
  where = check_placement_devices(devices, cluster, pins)
  calibration = _resolve_default_calibration(calibration)
  if isinstance(calibration, str) and calibration == "auto":
    from tfopt.calibration_cache import auto_calibration  # pylint: disable=g-import-not-at-top
    calibration = auto_calibration(where.names)
  return where, check_selection(calibration, select, measure_steps)


def _resolve_default_calibration(calibration):
  """"default" as `tfopt.calibration_cache.default_mode` says: "auto" or
  None; anything else unchanged."""
  if not (isinstance(calibration, str) and calibration == "default"):
    return calibration
  from tfopt.calibration_cache import default_mode  # pylint: disable=g-import-not-at-top
  return "auto" if default_mode() == "auto" else None


def _refuse_without_placement(*, devices, pins, cluster, calibration,
                              select) -> None:
  """Arguments that mean something only with `placement` are refused."""
  if isinstance(calibration, str) and calibration == "default":
    calibration = None  # the default means nothing without placement
  given = ([(n, v) for n, v in (("devices", devices), ("pins", pins)) if v]
           + [(n, v) for n, v in (("cluster", cluster),
                                  ("calibration", calibration))
              if v is not None]
           + ([("select", select)] if select != "simulated" else []))
  if given:
    raise invalid_argument(given[0][0], "given only with `placement`",
                           given[0][1])


def _renew_after_connect(model) -> None:
  """The model's variables (and its optimizer's, metrics' and Keras' global
  seed state) made again after this process connected to a cluster: one
  made before would silently ignore `load_weights` or a checkpoint's
  restore from now on (`tfopt.runtime.variables.renew_variables`)."""
  from tfopt.runtime.variables import keras_variables, renew_variables  # pylint: disable=g-import-not-at-top
  from tfopt.scale.checkpoint import keras_seed_state  # pylint: disable=g-import-not-at-top
  variables = keras_variables(model)
  seed = keras_seed_state()
  if seed is not None and all(seed is not v for v in variables):
    variables.append(seed)
  renew_variables(variables, optimizer=model.optimizer)


def _has_strategy() -> bool:
  """Whether a strategy scope is open (tf.distribute.has_strategy)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.distribute.has_strategy()
