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


# A gradient element within this share of its tensor's largest magnitude
# is float noise for XLA's reordering (sums that cancel to about zero).
GRADIENT_NOISE = 1e-4


def check_xla_step(step, inputs: Sequence[Sequence[np.ndarray]], graph_def,
                   unmarked: StepRun, marked: StepRun, *, rtol: float = 1e-4,
                   atol: float = 1e-5) -> str:
  """Checks that the XLA-marked `graph_def` computes what the unmarked one
  does; returns how ("" when outputs and variables agree within the
  tolerance), or raises ValueError naming the first difference.

  XLA reorders float math, so results agree to a tolerance, not bit for
  bit. Variable updates alone can amplify that: an optimizer that
  normalizes its step (Adam's first step moves every weight by +-lr
  whatever the gradient's size) turns the noise in a gradient that sums
  to about zero into an lr-sized difference of sign (seen: a MobileNet's
  1x1 convolution kernels, 0.002 apart at lr 1e-3). Where only variables
  differ and the step's gradients are known (`CapturedStep.gradients`),
  both steps are run again fetching them: the outputs and every gradient
  must agree (gradients to `GRADIENT_NOISE` of their largest magnitude),
  and a variable may differ only where its gradient is within that noise.
  """
  from tfopt.runtime.placed import compare_runs  # pylint: disable=g-import-not-at-top
  try:
    compare_runs(unmarked, marked, rtol=rtol, atol=atol,
                 what="XLA-compiled step")
    return ""
  except ValueError as err:
    first = err
  nodes = {n.name for n in graph_def.node}
  names = [g for g, _ in step.gradients if g.partition(":")[0] in nodes]
  outputs_differ = any(
      not np.allclose(a, b, rtol=rtol, atol=atol)
      for x, y in zip(unmarked.outputs, marked.outputs) for a, b in zip(x, y))
  if outputs_differ or len(inputs) != 1 or not names:
    raise first
  probe = dataclasses.replace(
      step, output_names=tuple(step.output_names) + tuple(names))
  values = {name: var.numpy() for name, var in step.variables.items()}
  ref = run_steps(probe, inputs, graph_def=graph_def, initial_values=values)
  got = run_steps(probe, inputs, graph_def=mark_for_xla(graph_def),
                  initial_values=values)
  count = len(step.output_names)
  moved = judge_by_gradients(
      ref.variables, got.variables,
      dict(zip(names, ref.outputs[0][count:])),
      dict(zip(names, got.outputs[0][count:])), step.gradients,
      rtol=rtol, atol=atol)
  return (f"gradients compared; {moved} weight update(s) differ only where "
          f"their gradient is float noise (|g| <= {GRADIENT_NOISE:g} x the "
          f"tensor's largest)")


def judge_by_gradients(ref_variables: dict, got_variables: dict,
                       ref_gradients: dict, got_gradients: dict,
                       pairs, *, rtol: float, atol: float) -> int:
  """The rule of `check_xla_step` on one step's numbers: every gradient
  agrees (to `GRADIENT_NOISE` of its tensor's largest magnitude), and a
  variable differs only where its gradient (`pairs`: (gradient, variable)
  names) is within that noise. Returns how many elements differ so;
  raises ValueError naming the first gradient or variable that breaks
  the rule."""
  noise = {}
  for name, r in ref_gradients.items():
    r, g = np.asarray(r), np.asarray(got_gradients[name])
    bound = max(atol, GRADIENT_NOISE * float(np.max(np.abs(r), initial=0)))
    if r.shape != g.shape:
      raise ValueError(f"The XLA-compiled step's gradient {name!r} has "
                       f"shape {g.shape}; expected {r.shape}.")
    if not np.allclose(g, r, rtol=rtol, atol=bound):
      raise ValueError(f"The XLA-compiled step computes gradient {name!r} "
                       f"differently: max |diff| "
                       f"{np.max(np.abs(g - r)):.3g}.")
    noise[name] = np.abs(r) <= bound
  noise_of = {var: noise[grad] for grad, var in pairs if grad in noise}
  moved = 0
  for name, x in ref_variables.items():
    y = got_variables.get(name)
    if y is None:
      raise ValueError(f"The XLA-compiled step lost variable {name!r}.")
    x, y = np.asarray(x), np.asarray(y)
    off = ~np.isclose(x, y, rtol=rtol, atol=atol)
    if not off.any():
      continue
    allowed = noise_of.get(name)
    if allowed is None or allowed.shape != off.shape:
      raise ValueError(f"The XLA-compiled step updates variable {name!r} "
                       f"differently: max |diff| "
                       f"{np.max(np.abs(x - y)):.3g}.")
    if (off & ~allowed).any():
      raise ValueError(f"The XLA-compiled step updates variable {name!r} "
                       f"differently where its gradient is not noise: max "
                       f"|diff| {np.max(np.abs(x - y)[~allowed]):.3g}.")
    moved += int(off.sum())
  return moved
