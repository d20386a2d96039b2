"""What a step really allocates, per device, read from TensorFlow.

`measure_peak_bytes` runs a (placed) step in a Session with full tracing
and rebuilds each device's memory over the step from TensorFlow's own
allocation records (RunMetadata step stats: every allocation and
deallocation a node's allocator made, with its time). A device's peak is
its variables' bytes (allocated before the step, held throughout) plus the
highest level its step allocations reach. This is the oracle the
simulator's liveness peaks are checked against (the simulator is within
15 % of it on one device for the zoo's MLP, CNN and Transformer: see
tests/runtime/test_memory.py and benchmarks/fit_across_devices.py).

Not counted: what the runtime keeps outside the step's allocators (kernel
caches, the executors' own state, the Python process); for a whole
process's footprint see `tfopt.runtime.caps.ProcessPeak`.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf

from tfopt._quiet import native_info_logs_quiet
from tfopt.runtime.session import (StepSession, local_device_count,
                                   session_config)
from tfopt.simulate.simulator import peak_level


@dataclasses.dataclass(frozen=True)
class MeasuredMemory:
  """Per device (in the order asked for): variables' bytes, the peak of
  the step's own allocations, and their sum."""
  devices: tuple[str, ...]
  variable_bytes: tuple[int, ...]
  step_peak_bytes: tuple[int, ...]

  @property
  def peak_bytes(self) -> tuple[int, ...]:
    return tuple(v + s for v, s in zip(self.variable_bytes,
                                       self.step_peak_bytes))


def _device_index(name: str, devices: Sequence[str]) -> int | None:
  from tfopt.runtime.session import same_device  # pylint: disable=g-import-not-at-top
  # Either may be the partial name ("/device:CPU:1" in a plan).
  return next((i for i, d in enumerate(devices)
               if same_device(d, name) or same_device(name, d)), None)


def allocation_peaks(run_metadata, devices: Sequence[str]) -> list[int]:
  """Per device of `devices`, the highest level the step's allocations
  reached (allocations minus deallocations, in time order; at one
  microsecond frees first)."""
  records: list[list[tuple[int, int]]] = [[] for _ in devices]
  for dev in run_metadata.step_stats.dev_stats:
    i = _device_index(dev.device, devices)
    if i is None:
      continue
    for ns in dev.node_stats:
      for mem in ns.memory:
        records[i].extend((r.alloc_micros, r.alloc_bytes)
                          for r in mem.allocation_records)
  return [peak_level(events) for events in records]


def measure_peak_bytes(step, inputs: Sequence[np.ndarray], *,
                       graph_def=None, devices: Sequence[str] | None = None,
                       target: str = "", warmup: int = 1,
                       inter_op_threads: int = 0) -> MeasuredMemory:
  """Runs `step` (or its rewritten `graph_def`) and measures each device.

  Args:
    step: the CapturedStep.
    inputs: one batch.
    graph_def: the placed GraphDef to run (default the step's own).
    devices: the device strings to report, in order (default: each device
      the graph's nodes name, or the one local CPU).
    target: a session target for server processes ("" = in-process).
    warmup: untraced runs first (the allocator and kernels warm up).
    inter_op_threads: the session's inter-op threads (0: TensorFlow's
      default, as a real run has; 1 runs one op at a time).
  """
  graph_def = graph_def if graph_def is not None else step.graph_def
  if devices is None:
    named = sorted({n.device for n in graph_def.node if n.device})
    devices = named or ["/job:localhost/replica:0/task:0/device:CPU:0"]
  devices = list(devices)
  variable_bytes = [0] * len(devices)
  by_name = {n.name: n for n in graph_def.node}
  for name, var in step.variables.items():
    where = by_name[name].device or devices[0]
    i = _device_index(where, devices)
    if i is not None:
      variable_bytes[i] += int(np.prod(var.shape)) * var.dtype.size
  config = session_config(inter_op_threads=inter_op_threads,
                          device_count=local_device_count(graph_def))
  metadata = tf.compat.v1.RunMetadata()
  with StepSession(step, config=config, graph_def=graph_def,
                   target=target) as session:
    for _ in range(warmup):
      session.run(inputs)
    with native_info_logs_quiet():  # the profiler's INFO lines
      session.run(inputs, options=tf.compat.v1.RunOptions(
          trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                  run_metadata=metadata)
  return MeasuredMemory(tuple(devices), tuple(variable_bytes),
                        tuple(allocation_peaks(metadata, devices)))
