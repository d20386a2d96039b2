"""The simulator's predicted step time against the measured one.

`check_prediction` runs a placed step for real (in-process logical devices
or server processes), takes the median wall time of a `session.run` after a
warm-up, and simulates the same placement with the given costs and cluster
(whose link and core sharing may come from a calibration of the same
devices, `tfopt.calibration`). The ratio measured / predicted is what the
simulator is worth on this machine; it is reported as measured, whatever it
is.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from tfopt._errors import check_positive_int
from tfopt.graph.capture import opgraph_from_graphdef
from tfopt.passes.place import step_costs
from tfopt.passes.base import PassContext
from tfopt.runtime.placed import run_steps
from tfopt.simulate.simulator import simulate


@dataclasses.dataclass(frozen=True)
class Prediction:
  """Predicted vs measured time of one placed step."""
  predicted_us: float
  measured_us: float
  devices_used: int
  schedule: object = dataclasses.field(default=None, repr=False,
                                       compare=False)  # the simulated step

  @property
  def ratio(self) -> float:
    """measured / predicted."""
    return self.measured_us / self.predicted_us if self.predicted_us else \
        float("inf")


def placement_of(graph_def, device_names: Sequence[str]) -> dict[str, int]:
  """Node -> device index, read back from the device strings of a placed
  graph (nodes without a device count as device 0)."""
  index = {name: i for i, name in enumerate(device_names)}
  return {n.name: index.get(n.device, 0) for n in graph_def.node}


def check_prediction(step, placed_graph_def, costs, cluster,
              inputs: Sequence[np.ndarray], *, repeats: int = 10,
              warmup: int = 3, fused=None, target: str = "",
              config=None) -> Prediction:
  """Measures the placed step and simulates it (see module doc).

  `fused` is the PassContext.fused map when the graph was fused, so fused
  ops cost the sum of the ops they replaced.
  """
  check_positive_int("repeats", repeats)
  check_positive_int("warmup", warmup)
  names = [d.name for d in cluster.devices]
  placement = placement_of(placed_graph_def, names)
  graph = opgraph_from_graphdef(placed_graph_def, inline=False,
                                batch_size=step.batch_size)
  ctx = PassContext(costs=costs, fused=dict(fused or {}))
  schedule = simulate(graph, placement, step_costs(graph, ctx), cluster)
  run = run_steps(step, [inputs] * repeats, graph_def=placed_graph_def,
                  warmup=warmup, target=target, config=config)
  return Prediction(schedule.makespan_us, run.median_step_seconds * 1e6,
                    len(set(placement.values())), schedule)
