"""Running a rewritten or placed step and checking what really happened.

* `run_steps`: several training steps of a step's GraphDef (the original or
  a rewritten one) from given variable values; returns outputs, variable
  values and step times.
* `actual_devices` / `verify_devices`: where each node really ran, read from
  the partition graphs TensorFlow reports in RunMetadata (every node of every
  partition, with its assigned device), compared with the device string the
  plan wrote. Never assumed: soft placement, resource-variable colocation
  and `_class` groups all move ops silently.
* `run_and_compare`: a PassManager verifier: the rewritten graph must give
  the original's outputs and variable updates.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from tfopt._errors import check_positive_int, invalid_argument
from tfopt.cluster import Cluster
from tfopt.cost.comm import CommModel
from tfopt.runtime.session import (StepSession, local_device_count,
                                   same_device, session_config)

LOCAL_PREFIX = "/job:localhost/replica:0/task:0/device:CPU:"


def local_cluster(num_devices: int, memory_bytes: int | None = None, *,
                  comm: CommModel | None = None) -> Cluster:
  """`num_devices` logical CPU devices of this process, as a Cluster.
  `comm` (default Baechi's link) hands buffers over without a copy, as
  TensorFlow does between CPU devices of one process."""
  check_positive_int("num_devices", num_devices)
  comm = dataclasses.replace(comm or CommModel(), shared_buffers=True)
  return Cluster.uniform(num_devices, memory_bytes, device_type="CPU",
                         comm=comm, names=[f"{LOCAL_PREFIX}{i}"
                                           for i in range(num_devices)])


@dataclasses.dataclass(frozen=True)
class StepRun:
  """What `run_steps` measured."""
  outputs: list[list[np.ndarray]]
  variables: dict[str, np.ndarray]
  step_seconds: list[float]
  devices: dict[str, str]

  @property
  def median_step_seconds(self) -> float:
    return statistics.median(self.step_seconds)


def actual_devices(run_metadata) -> dict[str, str]:
  """Node name -> device it was assigned, from the partition graphs."""
  found = {}
  for partition in run_metadata.partition_graphs:
    for node in partition.node:
      found.setdefault(node.name, node.device)
  return found


@dataclasses.dataclass(frozen=True)
class DeviceCheck:
  """Planned vs actual device per node."""
  checked: int
  mismatches: tuple[tuple[str, str, str], ...]  # (node, planned, actual)
  not_run: tuple[str, ...]  # planned nodes absent from every partition

  @property
  def ok(self) -> bool:
    return not self.mismatches

  def raise_if_mismatched(self) -> None:
    if self.mismatches:
      lines = "; ".join(f"{n!r} planned {p}, ran on {a}"
                        for n, p, a in self.mismatches[:5])
      raise RuntimeError(f"{len(self.mismatches)} of {self.checked} ops did "
                         f"not run where the plan put them: {lines}")


def verify_devices(graph_def, devices: Mapping[str, str]) -> DeviceCheck:
  """Compares each node's device string with where it actually ran."""
  mismatches, not_run, checked = [], [], 0
  for node in graph_def.node:
    if not node.device:
      continue
    if node.name not in devices:
      not_run.append(node.name)
      continue
    checked += 1
    if not same_device(node.device, devices[node.name]):
      mismatches.append((node.name, node.device, devices[node.name]))
  return DeviceCheck(checked, tuple(mismatches), tuple(not_run))


def run_steps(step, inputs: Sequence[Sequence[np.ndarray]], *,
              graph_def=None, initial_values: Mapping[str, np.ndarray] | None =
              None, config: tf.compat.v1.ConfigProto | None = None,
              target: str = "", warmup: int = 0) -> StepRun:
  """Runs `len(inputs)` training steps (one batch each) in a fresh session.

  Args:
    step: the CapturedStep whose feeds, fetches and variables are used.
    inputs: one list of arrays per step.
    graph_def: the (rewritten, placed) GraphDef to run; default the step's.
    initial_values: variable values to start from; default the captured
      variables' current values (never modified).
    config, target: session options and target ("" = in-process).
    warmup: untimed runs of the first batch before the timed steps (they
      build the executors; they also update the variables, so compare
      values only between runs with the same warmup).

  The devices come from the partition graphs of the first run.
  """
  if not inputs:
    raise invalid_argument("inputs", "a non-empty list of batches", inputs)
  graph_def = graph_def if graph_def is not None else step.graph_def
  values = dict(initial_values) if initial_values is not None else {
      name: var.numpy() for name, var in step.variables.items()}
  if config is None:
    config = session_config(device_count=local_device_count(graph_def))
  outputs, seconds = [], []
  metadata = tf.compat.v1.RunMetadata()
  with StepSession(step, config=config, target=target, graph_def=graph_def,
                   initial_values=values) as session:
    batches = [inputs[0]] * warmup + list(inputs)
    for i, batch in enumerate(batches):
      options = (tf.compat.v1.RunOptions(output_partition_graphs=True)
                 if i == 0 else None)
      start = time.perf_counter()
      result = session.run(batch, options=options,
                           run_metadata=metadata if i == 0 else None)
      if i >= warmup:
        seconds.append(time.perf_counter() - start)
        outputs.append(result)
    final = session.variable_values()
  devices = actual_devices(metadata)
  return StepRun(outputs, final, seconds, devices)


def compare_runs(expected: StepRun, actual: StepRun, *, rtol: float = 1e-5,
                 atol: float = 1e-6, what: str = "rewritten graph",
                 variables: bool = True) -> None:
  """Raises a ValueError naming the first output (or, with `variables`, the
  first variable after the steps) that differs beyond the tolerance."""
  for i, (a, b) in enumerate(zip(expected.outputs, actual.outputs)):
    for j, (x, y) in enumerate(zip(a, b)):
      x, y = np.asarray(x), np.asarray(y)
      if x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(f"The {what}'s output {j} of step {i} has shape "
                         f"{y.shape} {y.dtype}; expected {x.shape} {x.dtype}.")
      if not np.allclose(x, y, rtol=rtol, atol=atol):
        raise ValueError(f"The {what}'s output {j} of step {i} differs: "
                         f"max |diff| {np.max(np.abs(x - y)):.3g}.")
  for name, x in (expected.variables.items() if variables else ()):
    y = actual.variables.get(name)
    if y is None:
      raise ValueError(f"The {what} lost variable {name!r}.")
    if not np.allclose(x, y, rtol=rtol, atol=atol):
      raise ValueError(f"The {what} updates variable {name!r} differently: "
                       f"max |diff| {np.max(np.abs(x - y)):.3g}.")


def check_rewritten(step, inputs: Sequence[Sequence[np.ndarray]], graph_def,
                    *, reference: StepRun | None = None, target: str = "",
                    config=None, what: str = "rewritten step",
                    rtol: float = 1e-5, atol: float = 1e-6
                    ) -> tuple[StepRun, DeviceCheck]:
  """Runs the rewritten `graph_def` for the batches and checks it: outputs
  and variable updates equal the original step's (`reference`, run here
  in-process when not given), and every op ran where its device string says.
  Returns the run and the device check; raises ValueError / RuntimeError
  naming the first difference."""
  if reference is None:
    reference = run_steps(step, inputs)
  run = run_steps(step, inputs, graph_def=graph_def, target=target,
                  config=config)
  compare_runs(reference, run, rtol=rtol, atol=atol, what=what)
  check = verify_devices(graph_def, run.devices)
  check.raise_if_mismatched()
  return run, check


def run_and_compare(step, inputs: Sequence[Sequence[np.ndarray]], *,
                    rtol: float = 1e-5, atol: float = 1e-6):
  """A PassManager `verify` callable: runs the graph before and after a pass
  for the given batches from the same variable values and requires equal
  outputs, dtypes, shapes and variable updates (to float tolerance)."""
  values = {name: var.numpy() for name, var in step.variables.items()}

  def verify(before, after, pass_name: str) -> None:
    expected = run_steps(step, inputs, graph_def=before,
                         initial_values=values)
    actual = run_steps(step, inputs, graph_def=after, initial_values=values)
    compare_runs(expected, actual, rtol=rtol, atol=atol,
                 what=f"graph after pass {pass_name!r}")

  return verify
