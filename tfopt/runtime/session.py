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


class StepSession:
  """Imports a CapturedStep into its own graph and session, ready to run."""

  def __init__(self, step: CapturedStep, *,
               config: tf.compat.v1.ConfigProto | None = None,
               target: str = ""):
    self.step = step
    values = {name: var.numpy() for name, var in step.variables.items()}
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.graph_util.import_graph_def(step.graph_def, name="")
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
    self.session = tf.compat.v1.Session(target=target, graph=self.graph,
                                        config=config or session_config())
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
