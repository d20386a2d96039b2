"""Analytic cost estimates: FLOPs and bytes, turned into time by a roofline.

Used when profiling is not wanted, and for the ops a profile did not see
(those are flagged `profiled=False`). time = max(FLOPs / peak, bytes moved /
memory bandwidth) + a fixed launch overhead.
"""

from __future__ import annotations

import dataclasses
import math
import re

from tfopt._errors import invalid_argument
from tfopt.cost.cost_model import CostModel, OpCost
from tfopt.graph import aliasing
from tfopt.graph.opgraph import OpGraph


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
  """Roofline numbers of one device.

  Defaults describe one core-pair of a commodity x86 server CPU (what CI
  has): ~50 GFLOP/s sustained float32, ~10 GB/s memory bandwidth, ~2 us to
  dispatch an op. `GPU_V100` is the class of device the MSR profiles used.
  """
  peak_gflops: float = 50.0
  memory_gbps: float = 10.0
  overhead_us: float = 2.0

  def __post_init__(self):
    for field in ("peak_gflops", "memory_gbps"):
      if not getattr(self, field) > 0:
        raise invalid_argument(field, "a number > 0", getattr(self, field))
    if not self.overhead_us >= 0:
      raise invalid_argument("overhead_us", "a number >= 0", self.overhead_us)


CPU = DeviceSpec()
GPU_V100 = DeviceSpec(peak_gflops=14000.0, memory_gbps=900.0, overhead_us=5.0)

# Ops that move or name data but compute nothing.
_FREE_OPS = frozenset({
    "Const", "Placeholder", "VarHandleOp", "VariableV2", "NoOp", "Identity",
    "IdentityN", "Reshape", "Squeeze", "ExpandDims", "Shape", "ShapeN", "Size",
    "Rank", "StopGradient", "PreventGradient", "_Arg", "_Retval"})


def _elements(shape) -> int:
  return math.prod(shape) if shape is not None else 0


def _input_shapes(graph: OpGraph, name: str) -> list:
  shapes = []
  for e in sorted((e for e in graph.in_edges(name) if not e.is_control),
                  key=lambda e: (e.dst_input is None, e.dst_input or 0)):
    src = graph[e.src]
    shapes.append(src.output_shapes[e.src_output]
                  if e.src_output < len(src.output_shapes) else None)
  return shapes


def op_flops(graph: OpGraph, name: str) -> int:
  """Floating-point operations of op `name` (multiply-add = 2).

  Matrix products and convolutions (forward and both backward forms) are
  counted exactly from shapes; einsum from its equation; every other op as
  one operation per output element. Unknown shapes count 0.

  >>> from tfopt.graph.opgraph import Op, Edge
  >>> g = OpGraph([Op("a", "Placeholder", (0,), ((4, 3),)),
  ...              Op("b", "Placeholder", (0,), ((3, 5),)),
  ...              Op("m", "MatMul", (0,), ((4, 5),))],
  ...             [Edge("a", "m", 0, 0), Edge("b", "m", 0, 1)])
  >>> op_flops(g, "m")   # 2 * 4 * 5 * 3
  120
  """
  op = graph[name]
  if op.type in _FREE_OPS:
    return 0
  out = op.output_shapes[0] if op.output_shapes else None
  ins = _input_shapes(graph, name)
  try:
    if op.type == "MatMul" and out and ins[0]:
      k = ins[0][0] if op.attrs.get("transpose_a") else ins[0][1]
      return 2 * _elements(out) * k
    if op.type.startswith("BatchMatMul") and out and ins[0]:
      k = ins[0][-2] if op.attrs.get("adj_x") else ins[0][-1]
      return 2 * _elements(out) * k
    if op.type in ("Conv2D", "Conv3D") and out and ins[1]:
      kernel = ins[1]
      return 2 * _elements(out) * math.prod(kernel[:-1])
    if op.type in ("Conv2DBackpropInput", "Conv3DBackpropInputV2") and \
        ins[1] and ins[2]:
      return 2 * _elements(ins[2]) * math.prod(ins[1][:-1])
    if op.type in ("Conv2DBackpropFilter", "Conv3DBackpropFilterV2") and \
        out and ins[2]:
      return 2 * _elements(ins[2]) * math.prod(out[:-1])
    if op.type == "DepthwiseConv2dNative" and out and ins[1]:
      return 2 * _elements(out) * ins[1][0] * ins[1][1]
    if op.type == "Einsum" and "equation" in op.attrs and all(ins):
      return _einsum_flops(op.attrs["equation"], ins)
  except (IndexError, TypeError):
    # A shape with unknown dimensions (None) or fewer of them than the op
    # type implies (a malformed capture): no FLOP formula applies, so the
    # op is costed like an element-wise one below, as unknown op types are.
    pass
  return sum(_elements(s) for s in op.output_shapes)


def _einsum_flops(equation: str, shapes) -> int:
  lhs, _, _ = equation.replace(" ", "").partition("->")
  sizes = {}
  for term, shape in zip(lhs.split(","), shapes):
    term = term.replace("...", "")
    offset = len(shape) - len(term)
    for letter, dim in zip(term, shape[offset:]):
      sizes[letter] = dim
  return 2 * math.prod(sizes.values()) if sizes else 0


def op_bytes_moved(graph: OpGraph, name: str) -> int:
  """Bytes an op reads and writes: its inputs plus its outputs."""
  op = graph[name]
  if op.type in _FREE_OPS:
    return 0
  read = sum(e.bytes for e in graph.in_edges(name) if not e.is_control)
  return read + sum(op.output_bytes)


def estimate_op(graph: OpGraph, name: str, device: DeviceSpec = CPU) -> OpCost:
  """The roofline estimate of one op, flagged profiled=False."""
  op = graph[name]
  persistent = int(op.attrs.get("variable_bytes", 0))
  if op.type in aliasing.PERSISTENT_VIEW_OPS and op.type != "ReadVariableOp":
    # A constant's kernel holds its value for as long as the graph lives.
    persistent += sum(op.output_bytes)
  if op.type in _FREE_OPS:
    return OpCost(0.0, 0, persistent, profiled=False)
  # 1 GFLOP/s = 1e3 FLOP/us; 1 GB/s = 1e3 B/us.
  compute = op_flops(graph, name) / (device.peak_gflops * 1e3)
  memory = op_bytes_moved(graph, name) / (device.memory_gbps * 1e3)
  return OpCost(device.overhead_us + max(compute, memory), 0, persistent,
                profiled=False)


def estimate_costs(graph: OpGraph, device: DeviceSpec = CPU) -> CostModel:
  """A CostModel for every op of `graph` from `estimate_op`."""
  return CostModel({op.name: estimate_op(graph, op.name, device)
                    for op in graph.ops},
                   source=f"analytic estimate ({device})")


def parse_device_spec(text: str) -> DeviceSpec:
  """'cpu', 'v100', or 'GFLOPS,GBPS[,OVERHEAD_US]' -> DeviceSpec."""
  presets = {"cpu": CPU, "v100": GPU_V100}
  if text.lower() in presets:
    return presets[text.lower()]
  parts = re.split(r"\s*,\s*", text.strip())
  try:
    return DeviceSpec(*(float(p) for p in parts))
  except (TypeError, ValueError):
    raise invalid_argument("device", "'cpu', 'v100' or 'GFLOPS,GBPS[,US]'",
                           text) from None
