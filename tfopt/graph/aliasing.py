"""Which op outputs share a buffer with something else: TensorFlow's memory
semantics, by op type, for honest memory accounting.

Three kinds of output allocate nothing new (measured on TF 2.21's CPU
runtime by comparing each output's buffer address with its inputs' in
RunMetadata step stats; `tests/simulate/test_memory.py` checks the
simulator's peaks built on these rules against TF's allocation records):

* **views** -- the output *is* an input's buffer, always: Identity,
  IdentityN (output k is input k), Reshape, ExpandDims, Squeeze,
  StopGradient, control-flow plumbing (Enter, Exit, Switch, ...). The
  buffer stays live until the last reader of the input *or* of any view
  of it has finished.
* **persistent views** -- the output is memory the step holds anyway:
  ReadVariableOp returns the variable's own buffer, Const its kernel's
  tensor. Both are charged once, as the variable's or constant's
  persistent bytes.
* **forwards** -- element-wise kernels (and the reductions, slices and
  broadcasts that leave the size unchanged) call
  `forward_input_or_allocate_output`: they write into an input's buffer
  when it has the same size and no one else holds it, i.e. when this op is
  its last reader. Whether that holds depends on the schedule, so the
  simulator decides it on its timeline; static accounting charges them.

Outputs of any other op are new allocations. Layer-level graphs (op type
"Layer", the MSR workloads) have none of these types, so their accounting
is unchanged.
"""

from __future__ import annotations

from tfopt.graph.opgraph import Op

# Output 0 (IdentityN: every output k) is a view of data input 0 (k).
VIEW_OPS = frozenset({
    "Identity", "IdentityN", "StopGradient", "PreventGradient",
    "Reshape", "ExpandDims", "Squeeze", "EnsureShape", "CheckNumerics",
    "Bitcast", "Enter", "RefEnter", "Exit", "RefExit", "Switch", "RefSwitch",
    "NextIteration", "RefNextIteration", "LoopCond", "RefIdentity",
})

# The output is memory already charged as persistent bytes.
PERSISTENT_VIEW_OPS = frozenset({"ReadVariableOp", "Const", "HostConst"})

# May write into a same-sized input that no one else holds any more.
FORWARDING_OPS = frozenset({
    # unary element-wise
    "Abs", "Neg", "Exp", "Expm1", "Log", "Log1p", "Sqrt", "Rsqrt", "Square",
    "Reciprocal", "Inv", "Sign", "Floor", "Ceil", "Round", "Rint", "Tanh",
    "Sigmoid", "Sin", "Cos", "Erf", "Erfc", "Softplus", "Softsign", "Relu",
    "Relu6", "Elu", "Selu", "LeakyRelu", "Gelu", "LogicalNot", "OnesLike",
    "ZerosLike", "Softmax", "LogSoftmax", "Snapshot",
    # binary and n-ary element-wise
    "Add", "AddV2", "AddN", "Sub", "Mul", "MulNoNan", "Div", "DivNoNan",
    "RealDiv", "FloorDiv", "FloorMod", "TruncateDiv", "Maximum", "Minimum",
    "Pow", "SquaredDifference", "LogicalAnd", "LogicalOr", "Select",
    "SelectV2", "BiasAdd", "MatrixBandPart", "ClipByValue",
    # gradients of element-wise ops
    "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad",
    "GeluGrad", "TanhGrad", "SigmoidGrad", "SqrtGrad", "RsqrtGrad",
    "SoftplusGrad", "SoftsignGrad", "ReciprocalGrad", "InvGrad",
    # size-preserving cases of shape ops (a reduction over size-1 axes, a
    # slice of everything, a broadcast to the same shape)
    "Sum", "Prod", "Mean", "Max", "Min", "StridedSlice", "Slice",
    "BroadcastTo", "Tile", "Pack", "Transpose", "ConcatV2",
})


def view_input(op: Op, port: int) -> int | None:
  """The data input whose buffer output `port` of `op` is, for a view op;
  None otherwise."""
  if op.type not in VIEW_OPS:
    return None
  if op.type == "IdentityN":
    return port
  if op.type in ("Switch", "RefSwitch"):  # either branch gets the input
    return 0 if port in (0, 1) else None
  return 0 if port == 0 else None


def is_persistent_view(op: Op) -> bool:
  """Whether every output of `op` is memory charged as persistent bytes."""
  return op.type in PERSISTENT_VIEW_OPS


def may_forward(op: Op) -> bool:
  """Whether `op` may write its output 0 into a same-sized input."""
  return op.type in FORWARDING_OPS


def allocates(op: Op, port: int) -> bool:
  """False for a view or a persistent view: output `port` of `op` never
  allocates (a forward is schedule-dependent: it counts as allocating)."""
  return not is_persistent_view(op) and view_input(op, port) is None


def allocated_bytes(op: Op, port: int) -> int:
  """Bytes output `port` of `op` allocates whatever the schedule: 0 where
  it does not `allocate`, else the tensor's size."""
  if not allocates(op, port):
    return 0
  return op.output_bytes[port] if port < len(op.output_bytes) else 0


def allocated_output_bytes(op: Op) -> int:
  """The sum of `allocated_bytes` over the op's outputs: what static
  memory accounting charges the op for its outputs."""
  return sum(allocated_bytes(op, port) for port in range(op.num_outputs))
