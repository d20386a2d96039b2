"""FLOP counts against hand-computed values, and the roofline."""

import pytest

from tfopt.cost.analytic import (CPU, DeviceSpec, estimate_costs, estimate_op,
                                 op_flops, parse_device_spec)
from tfopt.graph import Edge, Op, OpGraph


def _with_inputs(op, *input_shapes):
  ops = [Op(f"in{i}", "Placeholder", (0,), (s,))
         for i, s in enumerate(input_shapes)]
  edges = [Edge(f"in{i}", op.name, 0, i, 0) for i in range(len(ops))]
  return OpGraph(ops + [op], edges)


def test_matmul_and_transposes():
  g = _with_inputs(Op("m", "MatMul", (0,), ((4, 5),)), (4, 3), (3, 5))
  assert op_flops(g, "m") == 2 * 4 * 5 * 3
  g = _with_inputs(Op("m", "MatMul", (0,), ((4, 5),),
                      attrs={"transpose_a": True}), (3, 4), (3, 5))
  assert op_flops(g, "m") == 2 * 4 * 5 * 3


def test_conv_forward_and_both_gradients_cost_the_same():
  # 2x8x8x3 input, 3x3x3x16 filter, SAME: 2x8x8x16 output.
  fwd = 2 * (2 * 8 * 8 * 16) * (3 * 3 * 3)
  g = _with_inputs(Op("c", "Conv2D", (0,), ((2, 8, 8, 16),)),
                   (2, 8, 8, 3), (3, 3, 3, 16))
  assert op_flops(g, "c") == fwd
  g = _with_inputs(Op("c", "Conv2DBackpropInput", (0,), ((2, 8, 8, 3),)),
                   (4,), (3, 3, 3, 16), (2, 8, 8, 16))
  assert op_flops(g, "c") == fwd
  g = _with_inputs(Op("c", "Conv2DBackpropFilter", (0,), ((3, 3, 3, 16),)),
                   (2, 8, 8, 3), (4,), (2, 8, 8, 16))
  assert op_flops(g, "c") == fwd


def test_einsum_and_elementwise():
  g = _with_inputs(Op("e", "Einsum", (0,), ((2, 4, 6),),
                      attrs={"equation": "bij,bjk->bik"}), (2, 4, 5), (2, 5, 6))
  assert op_flops(g, "e") == 2 * 2 * 4 * 5 * 6
  g = _with_inputs(Op("r", "Relu", (0,), ((10, 10),)), (10, 10))
  assert op_flops(g, "r") == 100
  g = _with_inputs(Op("i", "Identity", (0,), ((10, 10),)), (10, 10))
  assert op_flops(g, "i") == 0


def test_roofline_time_and_flags():
  spec = DeviceSpec(peak_gflops=1.0, memory_gbps=1000.0, overhead_us=0.5)
  g = _with_inputs(Op("m", "MatMul", (80,), ((4, 5),)), (4, 3), (3, 5))
  cost = estimate_op(g, "m", spec)
  assert cost.compute_us == pytest.approx(0.5 + 120 / 1e3)
  assert not cost.profiled
  var = OpGraph([Op("v", "VarHandleOp", (0,), ((),),
                    attrs={"variable_bytes": 4096})], [])
  assert estimate_costs(var, CPU)["v"].persistent_bytes == 4096
  assert estimate_costs(var, CPU)["v"].compute_us == 0.0


def test_device_spec_parsing_and_errors():
  assert parse_device_spec("v100").peak_gflops == 14000.0
  assert parse_device_spec("10, 20, 3") == DeviceSpec(10.0, 20.0, 3.0)
  with pytest.raises(ValueError, match="Argument `device`.*'fast'"):
    parse_device_spec("fast")
  with pytest.raises(ValueError, match="peak_gflops=0"):
    DeviceSpec(0.0)
