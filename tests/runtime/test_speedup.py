"""A real speed-up: the branchy zoo model placed by tfopt on two server
tasks pinned to a core each runs faster than on one such task (the ratio
itself is in benchmarks/runtime.py; here a loose bound)."""

import pytest

from tfopt import zoo
from tfopt.graph import capture_train_step
from tfopt.passes import PassContext, PassManager
from tfopt.runtime.speedup import measure_pinned_speedup


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.usefixtures("two_pinned_cores")
def test_towers_on_two_pinned_tasks_beat_one():
  model = zoo.towers(depth=6, width=1024)
  x, y = model.batch(256)
  step = capture_train_step(model.model, x=x, y=y)
  graph_def = PassManager("prune,identity,fold,fuse").run(
      step.graph_def, PassContext.for_step(step)).graph
  result = measure_pinned_speedup(step, graph_def, [x, y], steps=3,
                                  rounds=3, repeats=3)
  # tfopt found the branches (the greedy list schedulers do not).
  assert result.placer.startswith("m-branch"), result.summary()
  assert result.devices_used == 2
  assert result.speedup > 1.0, result.summary()
  assert result.predicted_us < result.predicted_one_us
