"""Profiling a captured step on this machine into a CostModel.

The step runs in a `tf.compat.v1.Session` with full tracing; each op's time is
read from the RunMetadata step stats (nanosecond op start/end), taken as the
median over `steps` traced runs after `warmup` untraced ones. Memory per op:
temp bytes = what the op allocated beyond its outputs; persistent bytes = a
variable's own size plus any persistent kernel memory. An op the runtime
rewrote away -- absent from every partition graph although the step needs
it: TensorFlow's oneDNN build fuses Conv2D + BiasAdd into one kernel named
after the BiasAdd, and BiasAddGrad into the filter gradient -- costs 0
compute: its time is measured on the node that absorbed it (estimating it
too counted a convolution twice). Ops the runtime did not report otherwise
(fed placeholders, ops that did not run in every traced step, ops absent
from the runtime's graphs with no fused neighbour) keep the analytic
estimate and are flagged `profiled=False`; `CostModel.notes` says why for
each, and names the node that absorbed each fused op.

Profile in a fresh process where it matters: seen with TF 2.21 on CPU, the
same CNN profiled four times in one process (each time a new model, after
other sessions ran) gave 12.1, 15.0, 16.7 and 18.8 ms of summed op time,
while its untraced step time stayed at about 12 ms.

Profiling runs ops one at a time by default (`inter_op_threads=1`): each op's
time is then its own, not shared with whatever ran beside it, which is what a
placer needs. Grappler is off, so the ops measured are exactly the graph's.

Tracing perturbs what it times: the same step's traced op times summed to
0.8x-1.2x of its untraced step from one profile to the next. On one device
the traced times are therefore scaled to add up to the median untraced step
of the same session (`clock=True`), timed between the traced runs: the
profile gives each op's share, the clock the total.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Sequence

import numpy as np
import tensorflow as tf

from tfopt._quiet import native_info_logs_quiet
from tfopt._errors import check_positive_int, invalid_argument
from tfopt.cost import analytic
from tfopt.cost.cost_model import CostModel, OpCost
from tfopt.graph.capture import CapturedStep, opgraph_from_graphdef
from tfopt.graph.opgraph import FUNCTIONAL_OPS
from tfopt.runtime.session import (StepSession, local_device_count,
                                   session_config)


def _node_time_us(ns) -> float:
  if ns.op_end_rel_nanos or ns.op_start_rel_nanos:
    return max(0.0, (ns.op_end_rel_nanos - ns.op_start_rel_nanos) / 1e3)
  return float(max(0, ns.op_end_rel_micros - ns.op_start_rel_micros))


def _node_temp_bytes(ns) -> int:
  allocated = sum(m.total_bytes for m in ns.memory)
  outputs = sum(o.tensor_description.allocation_description.requested_bytes
                for o in ns.output)
  return max(0, allocated - outputs)


def _read_step_stats(run_metadata, cores: int | None = None,
                     ops=None) -> dict[str, tuple[float, int, int]]:
  """op name -> (time us, temp bytes, persistent bytes) for one run.

  With `cores`, each device computes on that many cores and ops of `ops`
  that overlapped in time on one device shared them: an op's time is its
  share (`shared_times`), not its wall interval."""
  stats: dict[str, tuple[float, int, int]] = {}
  for dev in run_metadata.step_stats.dev_stats:
    shared = (shared_times(dev.node_stats, cores, ops) if cores is not None
              else {})
    for ns in dev.node_stats:
      t, temp, pers = stats.get(ns.node_name, (0.0, 0, 0))
      took = shared.get(ns.node_name, _node_time_us(ns))
      stats[ns.node_name] = (
          t + took, max(temp, _node_temp_bytes(ns)),
          max(pers, ns.memory_stats.persistent_memory_size))
  return stats


def fold_lowered_nodes(stats: dict, op_names, functional
                       ) -> dict[str, tuple[float, int, int]]:
  """One run's stats with each lowered control-flow op whole again.

  A Session lowers a `While` / `If` / `Case` node into the v1 frame ops of
  its bodies (Switch, Merge, Enter, ... and every body op), which the step
  stats report under the node's name as a prefix ("<while>/body/...",
  "Func/<while>/input/..."); the node's own record, if any, is a few
  microseconds. Each such runtime node is counted as the innermost
  functional op (of `functional`) whose name prefixes it: times add up (one
  inter-op thread runs them one at a time), temp bytes are the largest one
  node allocated (a body's temporaries are freed between iterations; loop
  accumulators held in TensorLists are not counted beyond that), persistent
  bytes add up. Nodes of `op_names` stay as they are.

  >>> fold_lowered_nodes({"w": (2.0, 0, 0), "w/body/a": (5.0, 8, 0),
  ...                     "Func/w/input/_1": (1.0, 0, 0), "x": (3.0, 4, 0)},
  ...                    {"w", "x"}, {"w"})
  {'w': (8.0, 8, 0), 'x': (3.0, 4, 0)}
  """
  if not functional:
    return stats
  out: dict[str, tuple[float, int, int]] = {}
  for name, value in stats.items():
    owner = name if name in op_names else _lowered_owner(name, functional)
    if owner is None:
      out[name] = value
      continue
    t, temp, pers = out.get(owner, (0.0, 0, 0))
    out[owner] = (t + value[0], max(temp, value[1]), pers + value[2])
  return out


def _lowered_owner(name: str, functional) -> str | None:
  """The innermost functional op whose lowered node `name` is."""
  if name.startswith("Func/"):
    name = name[len("Func/"):]
  parts = name.split("/")
  for end in range(len(parts) - 1, 0, -1):
    prefix = "/".join(parts[:end])
    if prefix in functional:
      return prefix
  return None


def shared_times(node_stats, cores: int, ops=None) -> dict[str, float]:
  """Per op, the microseconds of `cores` cores it had: while n ops ran at
  once on the device, each had min(1, cores / n) of its wall time (the
  simulator's sharing model, inverted). A server task pinned to one core
  with two inter-op threads runs two ops side by side at half speed each:
  their wall intervals double-count the core. Only ops of `ops` (None: all
  with a kernel time) count as running: a Recv waiting for a tensor does
  not use the core.

  >>> from types import SimpleNamespace as N
  >>> a = N(node_name="a", all_start_nanos=0, op_start_rel_nanos=0,
  ...       op_end_rel_nanos=4000)
  >>> b = N(node_name="b", all_start_nanos=2000, op_start_rel_nanos=0,
  ...       op_end_rel_nanos=4000)
  >>> shared_times([a, b], 1)   # 2 us alone, then 2 us at half speed each
  {'a': 3.0, 'b': 3.0}
  """
  spans = []
  for ns in node_stats:
    if not ns.op_end_rel_nanos or (ops is not None and
                                   ns.node_name not in ops):
      continue  # no kernel time (an RPC record), or not an op of the step
    begin = ns.all_start_nanos + ns.op_start_rel_nanos
    end = ns.all_start_nanos + ns.op_end_rel_nanos
    if end > begin:
      spans.append((begin / 1e3, end / 1e3, ns.node_name))
  return core_shares(spans, cores)


def core_shares(spans, cores: int) -> dict[str, float]:
  """Per name, the core time its (begin, end, name) spans had on `cores`
  cores: while n spans are open, each has min(1, cores / n) of the time
  (`shared_times`' rule, for any timeline, e.g. a simulated one).

  >>> core_shares([(0.0, 4.0, "a"), (2.0, 6.0, "b")], 1)
  {'a': 3.0, 'b': 3.0}
  """
  events = sorted([(b, 1, k) for k, (b, _, _) in enumerate(spans)] +
                  [(e, -1, k) for k, (_, e, _) in enumerate(spans)])
  share = [0.0] * len(spans)
  active: set[int] = set()
  last = None
  for when, kind, k in events:
    if active and when > last:
      rate = min(1.0, cores / len(active))
      for j in active:
        share[j] += (when - last) * rate
    last = when
    if kind > 0:
      active.add(k)
    else:
      active.discard(k)
  out: dict[str, float] = {}
  for (_, _, name), ns in zip(spans, share):
    out[name] = out.get(name, 0.0) + ns
  return out


def profile_step(step: CapturedStep, *,
                 inputs: Sequence[np.ndarray] | None = None, steps: int = 5,
                 warmup: int = 2, inter_op_threads: int = 1,
                 fallback: analytic.DeviceSpec = analytic.CPU,
                 progress: bool = False, graph_def=None,
                 target: str = "", cores_per_device: int | None = None,
                 clock: bool | str = True) -> CostModel:
  """Measures every op of `step` on this machine.

  Args:
    step: a CapturedStep (see `tfopt.graph.capture_train_step`).
    inputs: one batch, one array per step input; random by default.
    steps: traced runs; each op's time is the median over them.
    warmup: untraced runs first (allocator warm-up, kernel caches).
    inter_op_threads: 1 runs ops one at a time (see module docstring).
    fallback: roofline used for ops no measurement covered.
    progress: show a Keras progress bar.
    graph_def: a rewritten (e.g. placed) version of the step to profile
      instead, with its device strings: a step too large for one device
      is profiled under a first plan on the devices it will run on. The
      costs are then keyed by its node names.
    target: a session target for server processes ("" = in-process).
    cores_per_device: the cores each device computes on, when ops that run
      side by side on a device share them (a server task pinned to one core
      with two inter-op threads, `Calibration.cores_per_device`): each op's
      time is then its share of those cores, not its wall interval.
    clock: where the step runs on one device, scale the measured op times
      so that they add up to the median *untraced* step time: True (or
      "session") of the same session (ops one at a time, so the step is
      their sum plus the executor's dispatch), the runtime of
      `tfopt.cli.run_placed` and the benchmarks' placed sessions;
      "function" of the step as `tfopt.compile`'s hook runs it, imported
      into a `tf.function` (`tfopt.runtime.imported`) on copies of its
      variables, which ran the same graph 1.3-1.9x faster than a session
      here (without XLA; with a `target` the session's clock is used);
      False: not scaled. The function runs independent ops side by side on
      TensorFlow's inter-op pool, which the simulator models again from
      the costs: on a graph of many parallel branches the one-device
      prediction can come out below the step. Tracing perturbs the kernels it times: the
      same MLP step's traced op times summed to 2.5 ms in one profile and
      3.8 ms in the next, its untraced step 3.1 ms.

  The captured variables are copied into the profiling session; the model's
  own variables are not changed.
  """
  check_positive_int("steps", steps)
  if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
    raise invalid_argument("warmup", "an integer >= 0", warmup)
  if clock not in (True, False, "session", "function"):
    raise invalid_argument("clock", "True, False, 'session' or 'function'",
                           clock)
  inputs = list(inputs) if inputs is not None else step.sample_inputs()
  bar = None
  if progress:
    import keras  # pylint: disable=g-import-not-at-top
    bar = keras.utils.Progbar(warmup + steps, unit_name="step")
  config = session_config(inter_op_threads=inter_op_threads)
  if graph_def is not None:
    config = session_config(inter_op_threads=inter_op_threads,
                            device_count=local_device_count(graph_def))
  graph = step.graph if graph_def is None else opgraph_from_graphdef(
      graph_def, batch_size=step.batch_size, inline=False)
  devices = ({n.device for n in graph_def.node if n.device}
             if graph_def is not None else set())
  scaled = bool(clock) and len(devices) <= 1 and cores_per_device is None
  by_function = scaled and clock == "function" and not target
  with StepSession(step, config=config, graph_def=graph_def,
                   target=target) as session:
    untraced_run = (_function_clock(step, graph_def, inputs) if by_function
                    else lambda: session.run(inputs))
    samples = _traced_samples(
        session, inputs, steps, warmup, bar, cores_per_device,
        {op.name for op in graph.ops}, UNTRACED_PER_TRACED if scaled else 0,
        frozenset(op.name for op in graph.ops
                  if op.type in FUNCTIONAL_OPS), untraced_run)
  untraced = statistics.median(samples.untraced_us) if scaled else None
  costs, notes = _costs_from(graph, samples, steps, set(step.input_names),
                             fallback)
  where = ("one device" if graph_def is None else
           f"{len(devices)} devices of a first plan" if len(devices) > 1
           else "one device")
  model = CostModel(costs, notes=notes, source=(
      f"profiled on this machine ({where}): median of {steps} traced steps "
      f"after {warmup} warm-up, inter_op_threads={inter_op_threads}"
      + (f", shared among {cores_per_device} core(s) per device"
         if cores_per_device else "") + f", TF {tf.__version__}"))
  if untraced is None:
    return model
  return model.scaled_to(untraced, why=f"to the untraced step "
                         f"({untraced / 1e3:.2f} ms" + (
                             " as a tf.function)" if by_function else ")"))


def _function_clock(step: CapturedStep, graph_def, inputs):
  """One untraced step as `tfopt.compile`'s hook runs it (the graph
  imported into a `tf.function`, `tfopt.runtime.imported`), on copies of
  the step's variables (the model's own are not changed), warmed up:
  a callable that runs it and returns its outputs as NumPy (waiting for
  them, as session.run does)."""
  from tfopt.runtime.imported import imported_step  # pylint: disable=g-import-not-at-top
  copies = {}
  with tf.init_scope():
    for name, var in step.variables.items():
      copies[name] = tf.Variable(var.read_value(), trainable=False,
                                 name=f"clock_{name}")
  run = imported_step(step, step.graph_def if graph_def is None
                      else graph_def, copies)
  feeds = [tf.constant(value) for value in inputs]

  def once():
    return [value.numpy() for value in
            tf.nest.flatten(run(feeds), expand_composites=True)]
  for _ in range(2):  # tracing, then the first run's allocations
    once()
  return once


@dataclasses.dataclass
class _Samples:
  """Per op, what the traced runs measured, and what ran at all."""
  times: dict[str, list[float]] = dataclasses.field(default_factory=dict)
  temps: dict[str, list[int]] = dataclasses.field(default_factory=dict)
  persistent: dict[str, int] = dataclasses.field(default_factory=dict)
  ran: dict[str, str] = dataclasses.field(default_factory=dict)  # op type
  untraced_us: list[float] = dataclasses.field(default_factory=list)


# Untraced steps timed after each traced one, for the clock the op times
# are scaled to: spread over the whole profile, they see the machine the
# traced runs saw (this VM's speed drifts within seconds; five untraced
# steps timed back to back once, about 50 ms of a CNN's, put one profile's
# level 1.6x off the step measured seconds later).
UNTRACED_PER_TRACED = 3


def _traced_samples(session, inputs, steps, warmup, bar, cores,
                    op_names, untraced_per_traced: int = 0,
                    functional: frozenset = frozenset(),
                    untraced_run=None) -> _Samples:
  """`warmup` untraced runs, then `steps` traced ones read op by op, each
  followed by `untraced_per_traced` timed runs of `untraced_run` (default:
  an untraced run of the session). The runtime nodes of a lowered
  `functional` op count as that op."""
  untraced_run = untraced_run or (lambda: session.run(inputs))
  for i in range(warmup):
    session.run(inputs)
    if bar:
      bar.update(i + 1)
  out = _Samples()
  for i in range(steps):
    metadata = tf.compat.v1.RunMetadata()
    options = tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
        output_partition_graphs=i == 0)
    # Each traced run logs five profiler INFO lines natively.
    with native_info_logs_quiet():
      session.run(inputs, options=options, run_metadata=metadata)
    if i == 0:
      out.ran = {node.name: node.op for partition in
                 metadata.partition_graphs for node in partition.node}
    stats = fold_lowered_nodes(_read_step_stats(metadata, cores, op_names),
                               op_names, functional)
    for name, (t, temp, pers) in stats.items():
      out.times.setdefault(name, []).append(t)
      out.temps.setdefault(name, []).append(temp)
      out.persistent[name] = max(out.persistent.get(name, 0), pers)
    for _ in range(untraced_per_traced):
      began = time.perf_counter()
      untraced_run()
      out.untraced_us.append((time.perf_counter() - began) * 1e6)
    if bar:
      bar.update(warmup + i + 1)
  return out


def _costs_from(graph, samples: _Samples, steps: int, fed: set[str],
                fallback) -> tuple[dict[str, OpCost], dict[str, str]]:
  """Each op's OpCost, and why for each op not measured on its own node:
  measured where it ran in every traced step; 0 where the runtime fused it
  into a neighbour (measured there); else the analytic estimate, flagged
  `profiled=False`."""
  costs, notes = {}, {}
  for op in graph.ops:
    estimate = analytic.estimate_op(graph, op.name, fallback)
    # A measurement is only trusted if the op ran in every traced step.
    runs = len(samples.times.get(op.name, ()))
    if runs == steps:
      costs[op.name] = OpCost(
          compute_us=float(statistics.median(samples.times[op.name])),
          temp_bytes=int(statistics.median(samples.temps[op.name])),
          # The larger of the two: a constant's value is both in the
          # estimate and in the kernel's measured persistent memory.
          persistent_bytes=max(estimate.persistent_bytes,
                               samples.persistent[op.name]),
          profiled=True)
      continue
    host = (_fused_into(graph, op.name, samples.ran)
            if op.name not in samples.ran and op.name not in fed else None)
    if host is not None:
      costs[op.name] = OpCost(compute_us=0.0, temp_bytes=0,
                              persistent_bytes=estimate.persistent_bytes,
                              profiled=True)
      notes[op.name] = (f"fused by the runtime into {host} "
                        f"({samples.ran[host]}), measured there")
      continue
    costs[op.name] = dataclasses.replace(estimate, profiled=False)
    notes[op.name] = (
        "fed by the caller: analytic estimate" if op.name in fed else
        f"ran in {runs} of {steps} traced steps: analytic estimate"
        if op.name in samples.ran else
        "absent from the runtime's graphs and fused into no neighbour: "
        "analytic estimate")
  return costs, notes


def _fused_into(graph, name: str, ran: dict[str, str]) -> str | None:
  """The node that absorbed `name`, an op absent from the runtime's graphs:
  a data neighbour (consumer, producer, or a reader of the same input, as
  oneDNN folds BiasAddGrad into the filter gradient that reads the same
  output gradient) that ran as a fused kernel. None if there is none."""
  def fused(node):
    kind = ran.get(node, "")
    return "Fused" in kind or "WithBias" in kind
  edges = [e for e in graph.in_edges(name) if not e.is_control]
  outs = [e for e in graph.out_edges(name) if not e.is_control]
  near = ([e.dst for e in outs] + [e.src for e in edges] +
          [s.dst for e in edges for s in graph.out_edges(e.src)
           if not s.is_control and s.dst != name])
  return next((n for n in sorted(set(near)) if fused(n)), None)
