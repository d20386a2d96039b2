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
    self.session = tf.compat.v1.Session(target=target, graph=self.graph,
                                        config=config)
    try:
      # A device string naming no device would fail deep in the runtime.
      check_devices_exist(self.graph_def,
                          [d.name for d in self.session.list_devices()])
    except ValueError:
      self.session.close()
      raise
    self.session.run(self._init, self._init_feeds)

  def run(self, inputs: Sequence[np.ndarray], *, options=None,
          run_metadata=None) -> list[np.ndarray]:
    """Runs one step on `inputs`; returns the step's outputs."""
    if len(inputs) != len(self._inputs):
      raise invalid_argument("inputs", f"a sequence of {len(self._inputs)} "
                             "arrays, one per step input",
                             f"<{len(inputs)} arrays>")
    feeds = dict(zip(self._inputs, inputs))
    results = self.session.run([self._outputs, self._targets], feeds,
                               options=options, run_metadata=run_metadata)
    return results[0]

  def variable_values(self) -> dict[str, np.ndarray]:
    """Current values of the step's variables inside this session."""
    with self.graph.as_default():
      reads = {name: tf.raw_ops.ReadVariableOp(
          resource=self.graph.get_tensor_by_name(f"{name}:0"),
          dtype=self.graph.get_operation_by_name(name).get_attr("dtype"))
               for name in self.step.variables}
    return self.session.run(reads)

  def close(self) -> None:
    self.session.close()

  def __enter__(self) -> "StepSession":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
