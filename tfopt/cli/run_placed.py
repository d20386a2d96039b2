"""The main job: a zoo model's training step optimized, placed and run for real.

    tfopt-run-placed --model=small_cnn --devices=4 \
        --memory_fraction=0.15 --out_dir=.demo

Builds the model, captures and profiles its training step, runs the pass
pipeline prune,identity,fold,fuse,coarsen,place,control (each rewrite
verified by running the step before and after it), places it on --devices logical CPU
devices capped at --memory_fraction of the step's total memory, prints the
comparison of every placer (single device included), runs --steps placed
training steps and checks the loss and variables equal the unplaced step's
and that every op ran where the plan put it; with --processes also across
that many TensorFlow server processes on loopback. Then the XLA report,
the Gantt chart of the chosen schedule, the prediction against the clock
(measured vs simulated step time, and one traced step beside its
simulation) and a SavedModel of the model trained by the placed
steps, checked with saved_model_cli, reloaded and asked a PredictRequest.

Expected on the command above (2-core CPU VM, under a minute): the pipeline
fuses the dense head into one _FusedMatMul and folds about 30 nodes; one
device (22 MB liveness peak) is over the 16.9 MB cap, the portfolio's
m-topo-live/coarse plan fits on 4 devices (predicted 21-24 ms vs 14 ms on
one unbounded device, with the default PCIe-like link); the placed losses
and variables equal the unplaced step's to 1e-5 and all 514 ops ran where
planned, in-process and across 4 processes; XLA compiles about 480 ops in
per-device clusters (not the fused op); measured / simulated step time
about 0.7-0.8 (the logical devices share memory, so their copies cost less
than the PCIe-like link the plan assumed; `--calibration` with a file from
`tfopt-calibrate` gives the simulator this machine's link and core
sharing, `--select=measured` lets the clock choose the plan). Files in
--out_dir: gantt.png, plan.json, saved_model/.
"""

from __future__ import annotations

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402
from tfopt.cli._main import run_main  # noqa: E402

from tfopt.cli._config import (apply_config, define_config_flag,
                              load_calibration_flag)  # noqa: E402

from tfopt import zoo  # noqa: E402
from tfopt.placement import PLACERS  # noqa: E402

FLAGS = flags.FLAGS
define_config_flag()
flags.DEFINE_enum("model", "small_cnn", sorted(zoo.BUILDERS), "Zoo model.")
flags.DEFINE_integer("batch_size", 32, "Batch size of the traced step.")
flags.DEFINE_integer("devices", 4, "Logical CPU devices to place on.")
flags.DEFINE_float("memory_fraction", 0.15, "Cap per device as a fraction of "
                   "the step's total memory (persistent + temp + outputs).")
flags.DEFINE_enum("placer", "auto", ["auto", "exact", *PLACERS],
                  "Placer of the place pass.")
flags.DEFINE_string("pipeline",
                    "prune,identity,fold,fuse,coarsen,place,control",
                    "Pass pipeline.")
flags.DEFINE_string("calibration", None, "A calibration file of logical "
                    "devices (tfopt-calibrate "
                    "--devices=logical:N): the placer's simulator uses its "
                    "link and core sharing.")
flags.DEFINE_enum("select", "simulated", ["simulated", "measured"],
                  "Keep the portfolio's fastest predicted plan, or run the "
                  "best few and one device and keep the fastest measured.")
flags.DEFINE_integer("measure_steps", 5, "Timed steps per candidate and "
                     "round with --select=measured.")
flags.DEFINE_integer("steps", 3, "Placed training steps to run and compare.")
flags.DEFINE_integer("processes", 0, "Also run the placed step across this "
                     "many server processes on loopback (0: skip).")
flags.DEFINE_string("out_dir", ".demo", "Directory for the chart, the plan "
                    "and the SavedModel.")
flags.DEFINE_bool("overwrite", False, "Replace existing outputs in --out_dir.")
flags.DEFINE_string("model_kwargs", "{}", "JSON dict of zoo overrides.")


def main(argv):
  del argv
  apply_config()
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)  # TF's SavedModel INFO lines
  outputs, kwargs = _checked_flags()
  model, batches, step, costs = _captured(kwargs)
  placed, plan, ctx, cluster = _placed(step, batches, costs)
  reference, ran = _run_for_real(step, batches, placed, plan, costs,
                                 cluster.memory_caps[0])
  _xla_report(step, batches, placed, reference)
  _prediction_report(step, placed, costs, cluster, batches[0], ctx)
  _write_outputs(outputs, model, step, plan, ran)


def _checked_flags() -> tuple[dict, dict]:
  """The output paths (refusing to replace files unless --overwrite) and
  the zoo overrides; usage errors name the flag."""
  if not FLAGS.memory_fraction > 0:
    raise app.UsageError(f"--memory_fraction must be > 0. Received: "
                         f"{FLAGS.memory_fraction}")
  for name, value in (("devices", FLAGS.devices), ("steps", FLAGS.steps),
                      ("batch_size", FLAGS.batch_size),
                      ("measure_steps", FLAGS.measure_steps)):
    if value <= 0:
      raise app.UsageError(f"--{name} must be positive. Received: {value}")
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  outputs = {k: os.path.join(FLAGS.out_dir, v) for k, v in (
      ("gantt", "gantt.png"), ("plan", "plan.json"),
      ("saved_model", "saved_model"))}
  existing = [p for p in outputs.values() if os.path.exists(p)]
  if existing and not FLAGS.overwrite:
    raise app.UsageError(f"{existing} exist; pass --overwrite to replace "
                         f"them.")
  try:
    kwargs = json.loads(FLAGS.model_kwargs)
  except json.JSONDecodeError as err:
    raise app.UsageError(f"--model_kwargs is not JSON: {err}") from None
  return outputs, kwargs


def _captured(kwargs):
  """The zoo model, --steps batches, its captured step and its profile."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfopt.cost.profile import profile_step  # pylint: disable=g-import-not-at-top
  from tfopt.graph import capture_train_step  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(0)
  model = zoo.build(FLAGS.model, **kwargs)
  batches = [[*tf.nest.flatten(b)] for b in
             (model.batch(FLAGS.batch_size, seed=s) for s in range(FLAGS.steps))]
  step = capture_train_step(model.model, x=model.batch(FLAGS.batch_size)[0],
                            y=model.batch(FLAGS.batch_size)[1])
  print(f"captured {model.name}: {len(step.graph)} ops")
  costs = profile_step(step, inputs=batches[0], steps=3, warmup=1,
                       progress=True)
  return model, batches, step, costs


def _placed(step, batches, costs):
  """The pass pipeline on --devices logical CPUs (each changing pass
  verified), the placement table and, with --select=measured, the
  candidates' times. Returns (graph, plan, context, cluster)."""
  from tfopt.graph.synthetic import total_memory  # pylint: disable=g-import-not-at-top
  from tfopt.passes import PassContext, PassError, PassManager  # pylint: disable=g-import-not-at-top
  from tfopt.runtime import local_cluster, run_and_compare  # pylint: disable=g-import-not-at-top
  total = total_memory(step.graph, costs)
  cap = int(total * FLAGS.memory_fraction)
  cluster = local_cluster(FLAGS.devices, cap)
  if FLAGS.calibration:
    calibration = load_calibration_flag(FLAGS.calibration)
    cluster = calibration.applied_to(cluster)
    print(calibration.describe())
  ctx = PassContext.for_step(step, costs=costs, cluster=cluster,
                             placer=FLAGS.placer)
  if FLAGS.select == "measured":
    from tfopt.runtime.select import measured_chooser  # pylint: disable=g-import-not-at-top
    ctx.choose = measured_chooser(step, batches[0],
                                  [d.name for d in cluster.devices],
                                  steps=FLAGS.measure_steps)
  started = time.perf_counter()
  try:
    result = PassManager(FLAGS.pipeline,
                         verify=run_and_compare(step, batches[:1])).run(
                             step.graph_def, ctx)
  except PassError as err:
    raise SystemExit(f"error: {err}") from None
  print(f"\npass pipeline ({time.perf_counter() - started:.1f} s, every "
        f"changing pass verified by running the step before and after):")
  print(result.table())
  plan = ctx.results.get("placement")
  if plan is not None:
    print(f"\nplacement on {FLAGS.devices} devices, cap {cap / 1e6:.1f} MB "
          f"each ({FLAGS.memory_fraction:g} of {total / 1e6:.1f} MB):")
    print(plan.table())
    print(f"chosen {plan.placer}: predicted {plan.makespan_us / 1e3:.2f} ms "
          f"vs single device {plan.single_device_us / 1e3:.2f} ms")
    print(plan.describe_bound())
    if "selection" in ctx.results:
      print(ctx.results["selection"].table())
  return result.graph, plan, ctx, cluster


def _run_for_real(step, batches, placed, plan, costs, cap):
  """The placed steps against the unplaced ones in this process and, with
  --processes, across server processes. Returns (reference run, placed
  run)."""
  from tfopt.passes import PassContext, PassError, PassManager  # pylint: disable=g-import-not-at-top
  from tfopt.runtime import (LoopbackServers, check_rewritten, run_steps,  # pylint: disable=g-import-not-at-top
                             session_config)
  reference = run_steps(step, batches)
  ran, check = check_rewritten(step, batches, placed, reference=reference,
                               what="placed step")
  losses = ", ".join(f"{float(o[0]):.5f}" for o in ran.outputs)
  print(f"\nplaced steps: losses {losses} equal the unplaced step's; "
        f"variables equal; {check.checked} ops ran where planned "
        f"({len(set(n.device for n in placed.node))} devices)")
  if not FLAGS.processes:
    return reference, ran
  # The same plan on server tasks when the counts match; otherwise a new
  # plan with the same total memory.
  same = FLAGS.processes == FLAGS.devices and plan is not None
  task_cap = cap if same else int(cap * FLAGS.devices / FLAGS.processes)
  with LoopbackServers(FLAGS.processes) as servers:
    pctx = PassContext.for_step(step, costs=costs,
                                cluster=servers.cluster(task_cap),
                                placer=FLAGS.placer,
                                placement=plan.placement if same else None)
    try:
      remote = PassManager(FLAGS.pipeline).run(step.graph_def, pctx).graph
    except PassError as err:
      raise SystemExit(f"error: {err}") from None
    _, pcheck = check_rewritten(step, batches, remote, reference=reference,
                                target=servers.target,
                                config=session_config(),
                                what="multi-process step")
    print(f"across {FLAGS.processes} server processes "
          f"({'the same plan' if same else 'its own plan'}): losses and "
          f"variables equal the unplaced step's; {pcheck.checked} ops ran "
          f"on their planned task")
  return reference, ran


def _xla_report(step, batches, placed, reference) -> None:
  """The placed step compiled by XLA per device, or why not."""
  from tfopt.runtime import compare_runs, compile_step  # pylint: disable=g-import-not-at-top
  xla = compile_step(step, batches, graph_def=placed)
  if xla.compiled:
    # XLA reorders reductions: Adam's first updates (about lr * sign(g))
    # flip where a gradient is near zero, so only the losses are compared.
    compare_runs(reference, xla.run, rtol=1e-4, atol=1e-5, what="XLA step",
                 variables=False)
  print("\n" + xla.summary() + (" (losses equal the unplaced step's to "
                                "1e-4)" if xla.compiled else ""))
  if not xla.compiled and FLAGS.devices > 1:
    single = compile_step(step, batches, graph_def=_unplaced(placed))
    print("on one device: " + single.summary())


def _prediction_report(step, placed, costs, cluster, inputs, ctx) -> None:
  """The placed step's simulated time against the clock, and one traced
  step beside its simulation."""
  from tfopt.runtime import (check_prediction, compare_timeline,  # pylint: disable=g-import-not-at-top
                             measure_timeline)
  prediction = check_prediction(step, placed, costs, cluster, inputs,
                                fused=ctx.fused)
  print(f"\nprediction: measured {prediction.measured_us / 1e3:.2f} ms vs "
        f"simulated {prediction.predicted_us / 1e3:.2f} ms per step "
        f"(ratio {prediction.ratio:.2f}); one traced step beside its "
        f"simulation:")
  print(compare_timeline(prediction.schedule, measure_timeline(
      step, placed, inputs, [d.name for d in cluster.devices])).table())


def _write_outputs(outputs, model, step, plan, ran) -> None:
  """The Gantt chart and plan (when placed) and a checked SavedModel of the
  model the placed steps trained."""
  from tfopt import export  # pylint: disable=g-import-not-at-top
  from tfopt._io import atomic_write_text  # pylint: disable=g-import-not-at-top
  from tfopt.simulate.gantt import draw_gantt  # pylint: disable=g-import-not-at-top
  if plan is not None:
    draw_gantt(plan.schedule, outputs["gantt"], title=(
        f"{model.name} on {FLAGS.devices} devices ({plan.placer})"),
               overwrite=FLAGS.overwrite)
    atomic_write_text(outputs["plan"], json.dumps(
        {"placer": plan.placer, "makespan_us": plan.makespan_us,
         "placement": dict(plan.placement)}, indent=1),
                      overwrite=FLAGS.overwrite)
  # The model exported is the one the placed steps trained.
  for name, variable in step.variables.items():
    variable.assign(ran.variables[name])
  report = export.saved_model(model.model, outputs["saved_model"],
                              overwrite=FLAGS.overwrite)
  print(report.summary())
  print(f"wrote {', '.join(outputs.values())}")


def _unplaced(graph_def):
  from tensorflow.core.framework import graph_pb2  # pylint: disable=g-import-not-at-top
  out = graph_pb2.GraphDef()
  out.CopyFrom(graph_def)
  for node in out.node:
    node.device = ""
  return out


def run() -> None:
  """The console script's entry point."""
  run_main(main, __doc__)


if __name__ == "__main__":
  run()
