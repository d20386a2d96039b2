"""select="measured": the candidates run on the real devices and the clock
picks; a plan the simulator likes but the machine does not is dropped."""

import pytest

from tfopt import CommModel, zoo
from tfopt.cost import estimate_costs
from tfopt.graph import capture_train_step
from tfopt.graph.capture import opgraph_from_graphdef
from tfopt.passes import PassContext, PassManager, apply_placement
from tfopt.placement import make_problem, place
from tfopt.placement.api import Candidate, PlacementResult
from tfopt.placement.placement import Placement
from tfopt.runtime import check_rewritten, local_cluster
from tfopt.runtime.select import candidate_plans, select_measured
from tfopt.simulate import simulate


@pytest.fixture(scope="module")
def mlp():
  model = zoo.mlp(input_dim=32, hidden=(64, 64), classes=10)
  x, y = model.batch(32)
  step = capture_train_step(model.model, x=x, y=y)
  graph_def = PassManager("prune,identity").run(
      step.graph_def, PassContext.for_step(step)).graph
  return step, graph_def, [x, y]


@pytest.mark.serial
def test_a_deliberately_bad_plan_loses_to_one_device_on_the_clock(mlp):
  step, graph_def, inputs = mlp
  graph = opgraph_from_graphdef(graph_def, inline=False, batch_size=32)
  # Free transfers: the simulator thinks spreading every other op is
  # faster than one device. On two logical CPUs it is not: each of the
  # hundreds of hand-overs costs the executors a synchronisation.
  cluster = local_cluster(2, comm=CommModel.uniform(0.0, 1e9))
  costs = estimate_costs(graph)
  problem = make_problem(graph, cluster, costs)
  bad = Placement({n: i % 2 for i, gid in enumerate(problem.members)
                   for n in problem.members[gid]}, 2)
  one = Placement.single_device(graph, 2)
  bad_s, one_s = (simulate(graph, p, costs, cluster) for p in (bad, one))
  assert bad_s.makespan_us < one_s.makespan_us  # the simulator is fooled
  result = PlacementResult(
      "bad", bad, bad_s, 0.0, (Candidate("single", 0.0, one, one_s),
                               Candidate("bad", 0.0, bad, bad_s)),
      0.0, one_s.makespan_us)
  names = [d.name for d in cluster.devices]
  placed = apply_placement(graph_def, bad, names, graph=graph)
  selection = select_measured(step, placed, result, names, inputs, steps=5,
                              rounds=2, warmup=2)
  by_name = {c.placer: c for c in selection.candidates}
  assert selection.best.placer == "single", selection.table()
  assert by_name["bad"].measured_us > by_name["single"].measured_us
  assert by_name["bad"].predicted_us == bad_s.makespan_us
  table = selection.table()
  assert "single" in table.splitlines()[2] and "<- chosen" in table
  # The chosen graph computes what the original does, ops where planned.
  check_rewritten(step, [inputs], selection.best.graph_def)


def test_candidates_are_distinct_plans_one_device_first(mlp):
  _, graph_def, _ = mlp
  graph = opgraph_from_graphdef(graph_def, inline=False, batch_size=32)
  result = place(graph, local_cluster(2), estimate_costs(graph), "auto",
                 coarsen=False)
  plans = candidate_plans(result, 2)
  assert plans[0].placer == "single"
  assert len(plans) <= 3
  keys = {tuple(sorted(p.placement.items())) for p in plans}
  assert len(keys) == len(plans)
  with pytest.raises(ValueError, match="Argument `steps`"):
    select_measured(None, graph_def, result, ["a", "b"], [], steps=0)


def test_the_place_pass_lets_the_clock_choose(mlp):
  from tfopt.runtime.select import measured_chooser
  step, graph_def, inputs = mlp
  cluster = local_cluster(2)
  ctx = PassContext.for_step(step, costs=estimate_costs(
      opgraph_from_graphdef(graph_def, inline=False, batch_size=32)),
                             cluster=cluster, placer="auto")
  ctx.choose = measured_chooser(step, inputs,
                                [d.name for d in cluster.devices], steps=3,
                                rounds=1)
  result = PassManager("place,control").run(graph_def, ctx)
  selection = ctx.results["selection"]
  plan = ctx.results["placement"]
  assert plan.placer == selection.best.placer
  assert dict(plan.placement) == dict(selection.best.placement)
  check_rewritten(step, [inputs], result.graph)
