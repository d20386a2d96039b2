"""StepSession: a captured step running in a `tf.compat.v1.Session`.

A Session runs the step's GraphDef exactly as written -- every op under its
own name, device strings honoured -- which is what profiling (per-op step
stats) and placed execution need. Variables are created from the current
values of the captured tf.Variables; the originals are never modified.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from tfopt._errors import invalid_argument
from tfopt.graph.capture import CapturedStep


# A run against server processes that takes longer than this is given up:
# a task that died (its memory cap killed it, say) makes a distributed run
# wait forever otherwise.
REMOTE_RUN_TIMEOUT_S = 120


def session_config(*, inter_op_threads: int = 0, intra_op_threads: int = 0,
                   grappler: bool = False,
                   device_count: dict | None = None) -> tf.compat.v1.ConfigProto:
  """A ConfigProto for running a captured step.

  With `grappler=False` (the default) neither Grappler nor the classic graph
  optimizer rewrites the graph, so the ops that run are exactly the graph's
  ops under their own names.
  """
  config = tf.compat.v1.ConfigProto(
      inter_op_parallelism_threads=inter_op_threads,
      intra_op_parallelism_threads=intra_op_threads,
      device_count=device_count or {})
  if not grappler:
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = (
        tf.compat.v1.OptimizerOptions.L0)
  return config


def same_device(planned: str, actual: str) -> bool:
  """Whether full device name `actual` is what `planned` (possibly partial,
  e.g. "/device:CPU:1" or "/job:worker/task:1") names."""
  p, a = tf.DeviceSpec.from_string(planned), tf.DeviceSpec.from_string(actual)
  for field in ("job", "replica", "task", "device_type", "device_index"):
    want = getattr(p, field)
    if want is None:
      continue
    got = getattr(a, field)
    if field == "device_type":
      want, got = want.upper(), (got or "").upper()
    if want != got:
      return False
  return True


def check_devices_exist(graph_def, available) -> None:
  """Raises ValueError naming the first node whose device string names no
  device of `available` (full device names)."""
  known: dict[str, bool] = {}
  for node in graph_def.node:
    if not node.device:
      continue
    if node.device not in known:
      known[node.device] = any(same_device(node.device, a)
                               for a in available)
    if not known[node.device]:
      raise invalid_argument(
          "graph_def", f"device strings naming devices of the session "
          f"({list(available)})", f"<node {node.name!r} on "
          f"{node.device!r}>")


def local_device_count(graph_def) -> dict[str, int]:
  """{"CPU": n} with n covering every /device:CPU:i a node of `graph_def`
  names in this process (a Session ignores logical device configuration and
  needs `device_count` instead)."""
  highest = 0
  for node in graph_def.node:
    if node.device:
      spec = tf.DeviceSpec.from_string(node.device)
      if (spec.job in (None, "localhost") and
          (spec.device_type or "").upper() == "CPU" and spec.device_index):
        highest = max(highest, spec.device_index)
  return {"CPU": highest + 1}


_REMOTE_FAILURES = (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
                    tf.errors.AbortedError)


def _unanswered(graph_def) -> str:
  """Which tasks the graph names do not accept connections any more."""
  from tfopt.runtime import remote  # pylint: disable=g-import-not-at-top
  spec = remote.connected_spec() or {}
  dead = []
  for device in sorted({n.device for n in graph_def.node if n.device}):
    parsed = tf.DeviceSpec.from_string(device)
    addrs = spec.get(parsed.job or "", [])
    if parsed.task is None or parsed.task >= len(addrs):
      continue
    if not remote.answers(addrs[parsed.task]):
      dead.append(f"/job:{parsed.job}/task:{parsed.task} ({addrs[parsed.task]})")
  return (f"tasks no longer answering: {', '.join(dead)}" if dead else
          "every task still answers (the run was slower than "
          f"{REMOTE_RUN_TIMEOUT_S} s, or the servers are not this process's "
          "cluster)")


class StepSession:
  """Imports a CapturedStep into its own graph and session, ready to run."""

  def __init__(self, step: CapturedStep, *,
               config: tf.compat.v1.ConfigProto | None = None,
               target: str = "", graph_def=None,
               initial_values: dict[str, np.ndarray] | None = None):
    """Args:
      step: the captured step (inputs, outputs, targets, variables).
      config: session options; default `session_config()` with as many CPU
        devices as the graph's device strings name.
      target: a session target ("grpc://host:port") or "" for in-process.
      graph_def: a rewritten version of `step.graph_def` to run instead
        (same inputs, outputs, targets and variable names).
      initial_values: variable values to start from (default: the captured
        tf.Variables' current values).
    """
    self.step = step
    self.graph_def = graph_def if graph_def is not None else step.graph_def
    values = dict(initial_values) if initial_values is not None else {
        name: var.numpy() for name, var in step.variables.items()}
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.graph_util.import_graph_def(self.graph_def, name="")
      init_ops, self._init_feeds = [], {}
      for name, value in values.items():
        handle = self.graph.get_tensor_by_name(f"{name}:0")
        with tf.device(handle.device):
          ph = tf.compat.v1.placeholder(handle.op.get_attr("dtype"),
                                        value.shape)
          init_ops.append(tf.raw_ops.AssignVariableOp(resource=handle,
                                                      value=ph))
        self._init_feeds[ph] = value
      self._init = init_ops
    self._inputs = [self.graph.get_tensor_by_name(f"{n}:0")
                    for n in step.input_names]
    self._outputs = [self.graph.get_tensor_by_name(n)
                     for n in step.output_names]
    self._targets = [self.graph.get_operation_by_name(n)
                     for n in step.target_names]
    if config is None:
      config = session_config(device_count=local_device_count(self.graph_def))
    self.target = target
    if target and not config.operation_timeout_in_ms:
      # The master's RPCs get the deadline too (a run option alone does not
      # end a call to a master that died).
      timed = tf.compat.v1.ConfigProto()
      timed.CopyFrom(config)
      timed.operation_timeout_in_ms = REMOTE_RUN_TIMEOUT_S * 1000
      config = timed
    self.session = tf.compat.v1.Session(target=target, graph=self.graph,
                                        config=config)
    try:
      # A device string naming no device would fail deep in the runtime.
      check_devices_exist(self.graph_def,
                          [d.name for d in self.session.list_devices()])
    except ValueError:
      self.session.close()
      raise
    except _REMOTE_FAILURES as err:
      raise self._remote_failure(err) from err
    if target:
      # One variable per call: a server session's master receives every
      # fed value, and all of them at once would put the whole model's
      # state in that one task's memory (its cap killed it).
      for op, (ph, value) in zip(self._init, self._init_feeds.items()):
        self._run(op, {ph: value})
    else:
      self.session.run(self._init, self._init_feeds)

  def _run(self, fetches, feeds=None, options=None, run_metadata=None):
    """session.run; on server processes with a deadline, and a failure
    that names the tasks that no longer answer."""
    if not self.target:
      return self.session.run(fetches, feeds, options=options,
                              run_metadata=run_metadata)
    merged = tf.compat.v1.RunOptions()
    if options is not None:
      merged.CopyFrom(options)
    if not merged.timeout_in_ms:
      merged.timeout_in_ms = REMOTE_RUN_TIMEOUT_S * 1000
    try:
      return self.session.run(fetches, feeds, options=merged,
                              run_metadata=run_metadata)
    except _REMOTE_FAILURES as err:
      raise self._remote_failure(err) from err

  def _remote_failure(self, err) -> RuntimeError:
    return RuntimeError(
        f"A run on the servers at {self.target} failed "
        f"({type(err).__name__}): {_unanswered(self.graph_def)}. A task "
        f"that grows past an OS memory cap is killed by the kernel.")

  def run(self, inputs: Sequence[np.ndarray], *, options=None,
          run_metadata=None) -> list[np.ndarray]:
    """Runs one step on `inputs`; returns the step's outputs."""
    if len(inputs) != len(self._inputs):
      raise invalid_argument("inputs", f"a sequence of {len(self._inputs)} "
                             "arrays, one per step input",
                             f"<{len(inputs)} arrays>")
    feeds = dict(zip(self._inputs, inputs))
    results = self._run([self._outputs, self._targets], feeds,
                        options=options, run_metadata=run_metadata)
    return results[0]

  def variable_values(self) -> dict[str, np.ndarray]:
    """Current values of the step's variables inside this session."""
    with self.graph.as_default():
      reads = {name: tf.raw_ops.ReadVariableOp(
          resource=self.graph.get_tensor_by_name(f"{name}:0"),
          dtype=self.graph.get_operation_by_name(name).get_attr("dtype"))
               for name in self.step.variables}
    if self.target:  # one at a time through the master (see __init__)
      return {name: self._run(read) for name, read in reads.items()}
    return self.session.run(reads)

  def close(self) -> None:
    """Closes the session. On server processes its variables are destroyed
    first: a server keeps a session's variables after the session closes,
    so every check or profile run there would leave a copy of the model's
    state behind in each task's memory."""
    if self.target and not self.session._closed:  # pylint: disable=protected-access
      with self.graph.as_default():
        destroy = [tf.raw_ops.DestroyResourceOp(
            resource=self.graph.get_tensor_by_name(f"{name}:0"),
            ignore_lookup_error=True) for name in self.step.variables]
      try:
        self._run(destroy)
      except (tf.errors.OpError, RuntimeError):
        pass  # a server already gone holds nothing any more
    try:
      self.session.close()
    except _REMOTE_FAILURES:
      if not self.target:
        raise
      # Closing tells a master that died: the run's own error (raised
      # already, or to come) is the one that says what happened.

  def __enter__(self) -> "StepSession":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
