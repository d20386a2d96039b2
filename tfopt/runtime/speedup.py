"""A real speed-up: a step placed on server tasks pinned to their own cores,
against one such task, side by side.

Logical CPU devices of one process share its cores, and so do unpinned
server processes of one host: placing a step on them cannot make it
faster than one device using every core. Devices that really compute apart
are tasks each pinned to a core of its own, one intra-op thread each
(`LoopbackServers(cpus=pinned_cpus(n), ...)`). `measure_pinned_speedup`:

1. profiles the step on one pinned task (one core, one intra-op and one
   inter-op thread: each op's time is its own) -- the device of the same
   kind the placed step is compared with;
2. calibrates the pinned tasks (`calibrate_devices`: link, overlap, control
   messages) and places the step with tfopt's portfolio on the calibrated
   cluster, then the control pass;
3. checks the placed step (same losses and updates, every op where
   planned) and times it, the one-task step, and the honest baseline a user
   would compare with -- one process using every core -- in interleaved
   rounds (medians).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time

from tfopt._errors import check_positive_int
from tfopt.passes import PassContext, PassManager, apply_placement
from tfopt.runtime.placed import check_rewritten
from tfopt.runtime.session import StepSession, session_config


@dataclasses.dataclass(frozen=True)
class PinnedSpeedup:
  """What `measure_pinned_speedup` measured (microseconds, medians)."""
  placer: str
  devices_used: int
  predicted_us: float  # the placed step, simulated on the calibrated cluster
  predicted_one_us: float  # one device, simulated
  one_task_us: float  # the step on one pinned task (one core)
  placed_us: float  # the placed step on the pinned tasks
  both_cores_us: float  # one process using every core (in-process)
  calibration: str  # the fitted link, as described

  @property
  def speedup(self) -> float:
    """One pinned task's step time over the placed step's."""
    return self.one_task_us / self.placed_us

  @property
  def versus_both_cores(self) -> float:
    """The in-process step's time over the placed step's (>1: faster)."""
    return self.both_cores_us / self.placed_us

  def summary(self) -> str:
    return (f"{self.placer} on {self.devices_used} pinned tasks: "
            f"{self.placed_us / 1e3:.1f} ms (predicted "
            f"{self.predicted_us / 1e3:.1f}) vs one pinned task "
            f"{self.one_task_us / 1e3:.1f} ms (predicted "
            f"{self.predicted_one_us / 1e3:.1f}): {self.speedup:.2f}x; one "
            f"process on every core: {self.both_cores_us / 1e3:.1f} ms "
            f"({self.versus_both_cores:.2f}x)")


@contextlib.contextmanager
def pinned_devices(num_devices: int = 2):
  """(one, many): a server task pinned to the first core with one intra-op
  and one inter-op thread (the device of the same kind, where a step is
  profiled and timed alone), and `num_devices` tasks pinned to a core each
  (one intra-op thread, two inter-op threads: a Send is not queued behind
  the op running)."""
  from tfopt.runtime.calibrate import (PINNED_INTER_OP_THREADS,  # pylint: disable=g-import-not-at-top
                                         PINNED_INTRA_OP_THREADS)
  from tfopt.runtime.processes import LoopbackServers, pinned_cpus  # pylint: disable=g-import-not-at-top
  cores = pinned_cpus(num_devices)
  with LoopbackServers(1, cpus=cores[:1], intra_op_threads=1,
                       inter_op_threads=1) as one, LoopbackServers(
                           num_devices, cpus=cores,
                           intra_op_threads=PINNED_INTRA_OP_THREADS,
                           inter_op_threads=PINNED_INTER_OP_THREADS) as many:
    yield one, many


def on_one_task(graph_def, one):
  """`graph_def` with every node on the task of `one` (LoopbackServers)."""
  return apply_placement(graph_def, {n.name: 0 for n in graph_def.node},
                         one.device_names)


def measure_pinned_speedup(step, graph_def, inputs, *, num_devices: int = 2,
                           placer: str = "auto", steps: int = 5,
                           rounds: int = 3, repeats: int = 5
                           ) -> PinnedSpeedup:
  """Measures the placed step on `num_devices` pinned tasks against one
  (module doc). `graph_def` is the step's graph after the rewrites that
  come before placement (e.g. prune,identity,fold,fuse)."""
  from tfopt.cost.profile import profile_step  # pylint: disable=g-import-not-at-top
  from tfopt.runtime.calibrate import (PINNED_INTER_OP_THREADS,  # pylint: disable=g-import-not-at-top
                                         PINNED_INTRA_OP_THREADS,
                                         calibrate_devices)
  for name, value in (("steps", steps), ("rounds", rounds)):
    check_positive_int(name, value)
  with pinned_devices(num_devices) as (one, many):
    alone = on_one_task(graph_def, one)
    costs = profile_step(step, inputs=inputs, graph_def=alone,
                         target=one.target, steps=5, warmup=2)
    calibration = calibrate_devices(
        "pinned", many.device_names, target=many.target, repeats=repeats,
        threads=(PINNED_INTRA_OP_THREADS, PINNED_INTER_OP_THREADS))
    ctx = PassContext.for_step(step, costs=costs, placer=placer,
                               cluster=calibration.cluster(many.device_names))
    placed = PassManager("place,control").run(graph_def, ctx).graph
    plan = ctx.results["placement"]
    check_rewritten(step, [inputs], placed, target=many.target,
                    config=session_config(), what="placed step")
    sessions = [StepSession(step, graph_def=alone, target=one.target,
                            config=session_config()),
                StepSession(step, graph_def=placed, target=many.target,
                            config=session_config()),
                StepSession(step, graph_def=graph_def)]
    try:
      times = interleaved(sessions, inputs, steps, rounds)
    finally:
      for session in sessions:
        session.close()
  used = len({n.device for n in placed.node if n.device})
  return PinnedSpeedup(plan.placer, used, plan.makespan_us,
                       plan.single_device_us, *times,
                       calibration.describe())


def interleaved(sessions, inputs, steps: int, rounds: int) -> list[float]:
  """Median step microseconds of each session, timed in turn per round
  (after two warm-up steps each)."""
  for session in sessions:
    for _ in range(2):
      session.run(inputs)
  samples = [[] for _ in sessions]
  for _ in range(rounds):
    for i, session in enumerate(sessions):
      for _ in range(steps):
        began = time.perf_counter()
        session.run(inputs)
        samples[i].append((time.perf_counter() - began) * 1e6)
  return [statistics.median(s) for s in samples]
