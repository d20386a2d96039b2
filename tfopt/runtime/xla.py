"""XLA for a (fused, placed) step: per-device clusters and a report.

Wrapping a multi-device graph in `jit_compile=True` compiles it as one
module and throws the placement away. Instead every node is marked with
`_XlaCompile` and an `_XlaScope` named after its device (what
`tf.xla.experimental.jit_scope` writes), so TensorFlow's own clustering
builds clusters that never cross a device, and leaves out the ops XLA cannot
compile. What ran is read back from the partition graphs: nodes still present
under their own name were not compiled.

Seen with TF 2.21 on CPU: XLA compiled a small CNN placed on 4 logical CPU
devices (clusters per device), but an MLP placed on 2 logical CPUs, or on 2
server tasks, failed in XLA's device picker with "Multiple CPU devices",
even with only one device's nodes marked. `compile_step` then reports XLA
as not possible and why; run the placed step unmarked. TF's fused CPU ops
(_FusedMatMul, _FusedConv2D) have no XLA kernel: fusion and XLA are
alternatives for those ops, and the report lists them as not compiled.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tfopt.runtime.placed import StepRun, run_steps

# Nodes the runtime adds or that are fed: not part of the question.
_RUNTIME_OPS = ("_Send", "_Recv", "_HostSend", "_HostRecv", "_Arg", "_Retval")


def draws_random_numbers(op_type: str) -> bool:
  """Whether ops of `op_type` draw random numbers (dropout's mask, a noise
  layer's noise). XLA's generators are not TensorFlow kernels' (seen: Keras'
  own jit_compile=True gives a Dropout model another mask, its loss 1.17
  where the unjitted step's is 1.25 from the same seed), so these ops stay
  with TensorFlow's kernels and the compiled step draws what Keras' step
  draws.

  >>> draws_random_numbers("StatelessRandomUniformV2"), draws_random_numbers(
  ...     "MatMul")
  (True, False)
  """
  return ("Random" in op_type or op_type.startswith("Rng") or
          "TruncatedNormal" in op_type or "Multinomial" in op_type)


def mark_for_xla(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
  """A copy with every node marked for XLA, scoped by its device, except
  the ops that draw random numbers (`draws_random_numbers`)."""
  out = graph_pb2.GraphDef()
  out.CopyFrom(graph_def)
  for node in out.node:
    if draws_random_numbers(node.op):
      continue
    node.attr["_XlaCompile"].b = True
    node.attr["_XlaScope"].s = f"tfopt_device_{node.device or 'default'}".encode()
  return out


@dataclasses.dataclass(frozen=True)
class XlaReport:
  """What XLA compiled: clusters, compiled ops, and what it left out."""
  compiled: bool
  clusters: int
  compiled_ops: int
  not_compiled: dict[str, int]  # op type -> count of nodes left out
  error: str = ""
  run: StepRun | None = None

  def summary(self) -> str:
    if not self.compiled:
      return f"XLA not used: {self.error}"
    left = ", ".join(f"{op} x{n}" for op, n in sorted(
        self.not_compiled.items(), key=lambda kv: -kv[1])) or "nothing"
    return (f"XLA: {self.compiled_ops} ops in {self.clusters} clusters; "
            f"not compiled: {left}")


def compile_step(step, inputs: Sequence[Sequence[np.ndarray]], *,
                 graph_def=None, config=None, target: str = "",
                 initial_values=None) -> XlaReport:
  """Runs the step with XLA clusters and reports what was compiled.

  Returns a report whose `run` holds the outputs and variables of the XLA
  run (compare them with an unmarked run), or, where TensorFlow refused,
  `compiled=False` and the reason.
  """
  graph_def = graph_def if graph_def is not None else step.graph_def
  marked = mark_for_xla(graph_def)
  try:
    run = run_steps(step, inputs, graph_def=marked, config=config,
                    target=target, initial_values=initial_values)
  except tf.errors.OpError as err:
    lines = [line.strip() for line in str(err.message).splitlines()
             if line.strip() and "Graph execution error" not in line]
    reason = lines[0] if lines else type(err).__name__
    return XlaReport(False, 0, 0, {}, error=reason)
  types = {n.name: n.op for n in graph_def.node}
  fed = set(step.input_names)
  left = collections.Counter(
      types[name] for name in run.devices
      if name in types and name not in fed and types[name] not in _RUNTIME_OPS)
  clusters = {name.split("/")[0] for name in run.devices
              if name.startswith("cluster_")}
  compiled_ops = sum(1 for n in graph_def.node
                     if n.name not in run.devices and n.name not in fed)
  return XlaReport(bool(clusters), len(clusters), compiled_ops, dict(left),
                   error="" if clusters else "XLA formed no cluster",
                   run=run)
