"""Runtime benchmark: fusion speed-up, placement judged by the clock (the
simulator before and after calibration, plans chosen by measurement, a real
speed-up), pass-pipeline time on large training graphs.

    python -m benchmarks.runtime

1. Fusion: inference and training steps of an MLP and a CNN (conv layers with
   bias and ReLU), the fused graph (pass "fuse") against the unfused one, in
   the same process, interleaved in rounds; the speed-up is the median of the
   per-round ratios unfused / fused.
2. Calibration: 2 and 4 logical CPU devices and 2 server tasks pinned to a
   core each, fitted once (`tfopt.runtime.calibrate`).
3. Placed steps: the MLP, the CNN, a Transformer LM, GNMT and the towers
   model (parallel branches), each on 2 and 4 logical devices and 2 pinned
   tasks, each profiled where and when it is measured: the plan
   `select="simulated"` picks on the calibrated cluster (placed, then the
   control pass), checked (losses and updates equal to one device, every op
   where planned) and timed against one device in interleaved rounds -- one
   logical device using every core, or one pinned task (one core) -- with
   the profile's own untraced step timed in the same rounds, to bring the
   profile to the machine's speed of those rounds (the level); its step
   simulated before calibration (Baechi's PCIe-like link, devices computing
   apart) and after, and after at the profile's own level; the plan
   `select="measured"` picks and its time against one device; a traced step
   beside its simulation (`tfopt.runtime.timeline`).
4. Speed-up: the towers model on 2 pinned tasks against one, with tfopt's
   plan, and against one process using every core
   (`tfopt.runtime.speedup`).
5. Pipeline: prune,identity,fold,fuse,coarsen,place (auto, 4 devices) on the
   ResNet-50 and Inception-V3 training graphs (analytic costs), per pass.

Each section (and each model's placed runs) runs in its own process (see
`_section_in_subprocess`). Writes benchmarks/results/runtime.json. Timings
on a shared 2-core VM drift between rounds; the ratios are measured side by
side to cancel that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

import tfopt  # noqa: E402,F401  (OR-Tools before TensorFlow)

FLAGS = flags.FLAGS
PLACED_MODELS_NAMES = ("mlp", "cnn", "transformer_lm", "gnmt", "towers")
flags.DEFINE_integer("rounds", 7, "Interleaved timing rounds.")
flags.DEFINE_integer("steps_per_round", 10, "Steps timed per round.")
flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "results",
                                        "runtime.json"), "Results JSON.")
flags.DEFINE_string("section", None, "Internal: run one section and write "
                    "its JSON to --section_out.")
flags.DEFINE_string("section_out", None, "Internal: see --section.")
flags.DEFINE_bool("large_graphs", True, "Run the pipeline section "
                  "(ResNet-50, Inception-V3 capture takes a few minutes).")
flags.DEFINE_list("models", list(PLACED_MODELS_NAMES), "Models of the "
                  "placed sections.")
flags.DEFINE_string("calibration_dir", None, "Internal: where the calibrate "
                    "section leaves its files.")


def _cnn():
  import keras
  L = keras.layers
  inp = keras.Input((32, 32, 3))
  x = L.Conv2D(32, 3, padding="same", activation="relu")(inp)
  x = L.Conv2D(32, 3, padding="same", activation="relu")(x)
  x = L.MaxPooling2D()(x)
  x = L.Conv2D(64, 3, padding="same", activation="relu")(x)
  x = L.GlobalAveragePooling2D()(x)
  x = L.Dense(64, activation="relu")(x)
  model = keras.Model(inp, L.Dense(10)(x), name="cnn")
  model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  return model


def _mlp():
  from tfopt import zoo
  return zoo.mlp().model


def _batch(model, batch_size, seed=0):
  import numpy as np
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((batch_size,) + tuple(model.inputs[0].shape[1:]))
  y = rng.integers(0, 10, batch_size).astype("int32")
  return x.astype("float32"), y


def _interleaved(sessions, inputs, rounds, steps):
  """Median per-round time of each session, and per-round ratios to [0]."""
  from keras.utils import Progbar
  times = [[] for _ in sessions]
  bar = Progbar(rounds, unit_name="round")
  for r in range(rounds):
    for i, session in enumerate(sessions):
      start = time.perf_counter()
      for _ in range(steps):
        session.run(inputs)
      times[i].append((time.perf_counter() - start) / steps)
    bar.update(r + 1)
  return times


def fusion_section(rounds, steps):
  import tensorflow as tf
  from tfopt.graph import capture_function, capture_train_step
  from tfopt.passes import PassContext, PassManager, op_counts
  from tfopt.runtime import StepSession, compare_runs, run_steps
  rows = []
  for name, build, batch_size in (("mlp", _mlp, 64), ("cnn", _cnn, 32)):
    model = build()
    x, y = _batch(model, batch_size)
    for kind in ("inference", "training"):
      if kind == "training":
        step = capture_train_step(model, x=x, y=y)
        inputs = [x, y]
      else:
        spec = tf.TensorSpec((batch_size,) + x.shape[1:], tf.float32)
        fn = tf.function(lambda t: model(t, training=False))
        step = capture_function(fn.get_concrete_function(spec),
                                batch_size=batch_size)
        inputs = [x]
      fused = PassManager("fuse").run(step.graph_def,
                                      PassContext.for_step(step)).graph
      compare_runs(run_steps(step, [inputs] * 2),
                   run_steps(step, [inputs] * 2, graph_def=fused),
                   rtol=1e-4, atol=1e-5, what="fused step")
      sessions = [StepSession(step), StepSession(step, graph_def=fused)]
      for s in sessions:
        s.run(inputs)
      times = _interleaved(sessions, inputs, rounds, steps)
      for s in sessions:
        s.close()
      ratios = [u / f for u, f in zip(*times)]
      counts = op_counts(fused)
      rows.append({"model": name, "step": kind,
                   "unfused_ms": statistics.median(times[0]) * 1e3,
                   "fused_ms": statistics.median(times[1]) * 1e3,
                   "speedup": statistics.median(ratios),
                   "fused_ops": counts["_FusedMatMul"] +
                                counts["_FusedConv2D"]})
      print(f"  {name} {kind}: {rows[-1]}")
  return rows


# Per model: (zoo name or None for _cnn, zoo overrides, batch size).
PLACED_MODELS = {
    "mlp": ("mlp", {}, 64),
    "cnn": (None, {}, 32),
    "transformer_lm": ("transformer_lm", dict(
        vocab_size=2000, seq_len=64, num_layers=2, d_model=128, num_heads=4,
        d_ff=512), 16),
    "gnmt": ("gnmt", dict(vocab_size=2000, seq_len=16, units=256), 16),
    "towers": ("towers", {}, 256),
}
CONFIGS = (("logical", 2), ("logical", 4), ("pinned", 2))


def calibrate_section(out_dir):
  """Each configuration's kind calibrated once (tfopt.runtime.calibrate),
  saved under `out_dir`; the placed sections read the files."""
  from tfopt.runtime.calibrate import fit_cluster
  paths, described = {}, {}
  for kind, n in CONFIGS:
    calibration = fit_cluster(kind, n, progress=False)
    path = os.path.join(out_dir, f"calibration_{kind}_{n}.json")
    calibration.save(path, overwrite=True)
    paths[f"{kind}:{n}"] = path
    described[f"{kind}:{n}"] = calibration.describe()
    print(f"  {described[f'{kind}:{n}']}")
  return paths, described


def _prepared(model_name):
  """The model's captured step, its graph after the rewrites before
  placement (prune,identity,fold,fuse) and one batch."""
  import tensorflow as tf
  from tfopt import zoo
  from tfopt.graph import capture_train_step
  from tfopt.passes import PassContext, PassManager
  name, kwargs, batch_size = PLACED_MODELS[model_name]
  if name is None:
    model = _cnn()
    x, y = _batch(model, batch_size)
  else:
    zm = zoo.build(name, **kwargs)
    model, (x, y) = zm.model, zm.batch(batch_size)
  step = capture_train_step(model, x=x, y=y)
  graph_def = PassManager("prune,identity,fold,fuse").run(
      step.graph_def, PassContext.for_step(step)).graph
  return step, graph_def, [*tf.nest.flatten(x), *tf.nest.flatten(y)]


@contextlib.contextmanager
def _devices(kind, n, step, graph_def, inputs):
  """(device names, target, session config, the one-device graph, its
  target, the costs, the profile's clock) for one configuration, profiled
  there and then (this VM's speed changes by up to 1.6x within minutes: a
  profile taken at the process's start described another machine by the
  last configuration). The clock is a StepSession of the step the profile
  timed untraced (its graph, one inter-op thread), for `_config_row` to
  time again beside the placed step.
  Logical devices: this process, one device = the graph unplaced. Pinned:
  n tasks pinned to a core each, and the one-device graph on a task of its
  own (one core, one thread each pool), where the step is profiled."""
  from tfopt.cost.profile import profile_step
  from tfopt.runtime import StepSession, session_config
  from tfopt.runtime.placed import LOCAL_PREFIX
  from tfopt.runtime.session import local_device_count
  from tfopt.runtime.speedup import on_one_task, pinned_devices
  if kind == "logical":
    costs = profile_step(step, inputs=inputs, graph_def=graph_def, steps=5,
                         warmup=2)
    clock = StepSession(step, graph_def=graph_def, config=session_config(
        inter_op_threads=1, device_count=local_device_count(graph_def)))
    with clock:
      yield ([f"{LOCAL_PREFIX}{i}" for i in range(n)], "",
             session_config(device_count={"CPU": n}), graph_def, "", costs,
             clock)
    return
  with pinned_devices(n) as (one, many):
    alone = on_one_task(graph_def, one)
    costs = profile_step(step, inputs=inputs, graph_def=alone,
                         target=one.target, steps=5, warmup=2)
    with StepSession(step, graph_def=alone, target=one.target,
                     config=session_config(inter_op_threads=1)) as clock:
      yield (many.device_names, many.target, session_config(), alone,
             one.target, costs, clock)


def placed_section(model_name, calibration_paths, rounds, steps):
  """Per configuration: the plan select="simulated" picks on the calibrated
  cluster, checked and timed against one device, simulated before (the
  default model: PCIe-like link, devices computing apart) and after
  calibration; the plan select="measured" picks; a traced step beside its
  simulation (`_config_row`)."""
  from tfopt.calibration import load_calibration
  from tfopt.runtime import run_steps
  step, graph_def, inputs = _prepared(model_name)
  reference = run_steps(step, [inputs] * 2)
  rows = []
  for kind, n in CONFIGS:
    calibration = load_calibration(calibration_paths[f"{kind}:{n}"])
    with _devices(kind, n, step, graph_def, inputs) as where:
      row = _config_row(step, graph_def, inputs, reference, calibration,
                        where, rounds, steps)
    row = {"model": model_name, "config": f"{n} {kind}", **row}
    rows.append(row)
    print(f"  {model_name}, {row['config']}: " + json.dumps(
        {k: v for k, v in row.items() if k not in ("selection", "timeline")}))
  return rows


def _config_row(step, graph_def, inputs, reference, calibration, where,
                rounds, steps):
  """One configuration's row (see `placed_section`); `where` is what
  `_devices` yields."""
  from tfopt.runtime import StepSession, compare_timeline, measure_timeline
  from tfopt.runtime.select import select_measured
  from tfopt.runtime.speedup import interleaved
  names, target, config, alone, alone_target, costs, clock = where
  after = calibration.cluster(names)
  pre, plan, placed, place_s = _placed(step, graph_def, inputs, reference,
                                       costs, after, target, config)
  sessions = [StepSession(step, graph_def=alone, target=alone_target,
                          config=None if not alone_target else config),
              StepSession(step, graph_def=placed, target=target,
                          config=config)]
  try:
    one_us, placed_us, clock_us = interleaved([*sessions, clock], inputs,
                                              steps, rounds)
  finally:
    for session in sessions:
      session.close()
  placement, sim = _simulated(step, placed, names, costs, clock_us, after)
  timeline = compare_timeline(sim["after"], measure_timeline(
      step, placed, inputs, names, target=target, config=config,
      cores_per_device=calibration.cores_per_device))
  selection = select_measured(step, pre, plan, names, inputs, target=target,
                              config=config, steps=steps, rounds=rounds)
  # The pick against one device of the same rounds (where one device was a
  # candidate: its cap held), else against the one-device timing above.
  alone_in_rounds = next((c.measured_us for c in selection.candidates
                          if c.placer == "single" and c.measured_us), None)
  return {
      "placer": plan.placer, "place_s": place_s,
      "devices_used": len(set(placement.values())),
      "one_device_ms": one_us / 1e3, "placed_ms": placed_us / 1e3,
      "placed_over_one": placed_us / one_us,
      "one_device_simulated_ms": sim["one"] / 1e3,
      "profile_level": clock_us / costs.total_compute_us(),
      "simulated_before_ms": sim["before"].makespan_us / 1e3,
      "simulated_after_ms": sim["after"].makespan_us / 1e3,
      "simulated_after_unleveled_ms": sim["unleveled"] / 1e3,
      "measured_over_simulated_before":
          placed_us / sim["before"].makespan_us,
      "measured_over_simulated_after": placed_us / sim["after"].makespan_us,
      "measured_over_simulated_unleveled": placed_us / sim["unleveled"],
      "measured_select": selection.best.placer,
      "measured_select_ms": selection.best.measured_us / 1e3,
      "measured_select_over_one": selection.best.measured_us / (
          alone_in_rounds or one_us),
      "selection": selection.table(), "timeline": timeline.table()}


def _placed(step, graph_def, inputs, reference, costs, cluster, target,
            config):
  """(graph before the control pass, plan, placed graph, seconds placing):
  `auto` on the calibrated `cluster`, then the control pass, the placed
  step checked against `reference`."""
  from tfopt.passes import PassContext, PassManager, merge_control_inputs
  from tfopt.runtime import check_rewritten
  ctx = PassContext.for_step(step, costs=costs, cluster=cluster,
                             placer="auto")
  started = time.perf_counter()
  pre = PassManager("place").run(graph_def, ctx).graph
  place_s = time.perf_counter() - started
  placed = merge_control_inputs(pre)[0]
  check_rewritten(step, [inputs] * 2, placed, reference=reference,
                  target=target, config=config, what="placed step")
  return pre, ctx.results["placement"], placed, place_s


def _simulated(step, placed, names, costs, clock_us, after):
  """(placement, simulations) of the placed step: "after" and "before"
  calibration (Baechi's PCIe-like link, devices computing apart) and "one"
  device (us) with the profile brought to the machine's speed of the
  measured rounds, "unleveled" (us) at the profile's own level.

  The level: the profile's clock (the step it timed untraced) timed again
  beside the placed step. This VM's speed drifts by up to 1.6x within
  minutes, which moved rows by +-25 % between runs while the model stayed
  the same."""
  from tfopt import Cluster
  from tfopt.graph.capture import opgraph_from_graphdef
  from tfopt.passes import PassContext
  from tfopt.passes.place import step_costs
  from tfopt.runtime.prediction import placement_of
  from tfopt.simulate import simulate
  graph = opgraph_from_graphdef(placed, inline=False,
                                batch_size=step.batch_size)
  placement = placement_of(placed, names)
  before = Cluster.uniform(len(names), device_type="CPU", names=names)
  costed = step_costs(graph, PassContext(costs=costs.scaled_to(
      clock_us, why="to the profile's step timed beside the placed one")))
  unleveled = step_costs(graph, PassContext(costs=costs))
  return placement, {
      "after": simulate(graph, placement, costed, after),
      "before": simulate(graph, placement, costed, before),
      "one": simulate(graph, dict.fromkeys(placement, 0), costed,
                      after).makespan_us,
      "unleveled": simulate(graph, placement, unleveled, after).makespan_us}


def speedup_section(rounds, steps):
  """The branchy model on 2 pinned tasks against one (tfopt chooses)."""
  from tfopt.runtime.speedup import measure_pinned_speedup
  step, graph_def, inputs = _prepared("towers")
  result = measure_pinned_speedup(step, graph_def, inputs, steps=steps,
                                  rounds=rounds)
  print("  " + result.summary())
  return dict(dataclasses.asdict(result), speedup=result.speedup,
              versus_both_cores=result.versus_both_cores)


def pipeline_section():
  from tfopt import zoo
  from tfopt.cluster import Cluster
  from tfopt.cost import analytic
  from tfopt.graph import capture_train_step
  from tfopt.passes import PassContext, PassManager
  rows = []
  for name in ("resnet50", "inception_v3"):
    start = time.perf_counter()
    model = zoo.build(name, image_size=75, classes=10)
    x, y = model.batch(2)
    step = capture_train_step(model.model, x=x, y=y)
    captured = time.perf_counter() - start
    costs = analytic.estimate_costs(step.graph)
    ctx = PassContext.for_step(step, costs=costs, cluster=Cluster.uniform(4))
    result = PassManager("prune,identity,fold,fuse,coarsen,place").run(
        step.graph_def, ctx)
    print(f"  {name}: {len(step.graph_def.node)} nodes, capture "
          f"{captured:.1f} s\n" + result.table())
    rows.append({"model": name, "nodes": len(step.graph_def.node),
                 "capture_s": captured,
                 "passes": [{"pass": r.name, "seconds": r.seconds,
                             "nodes_after": r.nodes_after, "note": r.note}
                            for r in result.reports],
                 "pipeline_s": sum(r.seconds for r in result.reports),
                 "placer": ctx.results["placement"].placer})
  return rows


def _section_in_subprocess(section: str, calibration_dir: str) -> dict:
  """Runs one section in a fresh process. Traced profiling in a process that
  already built and profiled other models reports inflated op times (the
  same CNN profiled four times in one process: 12.1, 15.0, 16.7, 18.8 ms),
  so each model's costs are measured where nothing ran before."""
  import subprocess
  import sys
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "section.json")
    subprocess.run([sys.executable, "-m", "benchmarks.runtime",
                    f"--section={section}", f"--section_out={out}",
                    f"--calibration_dir={calibration_dir}",
                    f"--rounds={FLAGS.rounds}",
                    f"--steps_per_round={FLAGS.steps_per_round}"],
                   check=True, cwd=os.path.dirname(os.path.dirname(
                       os.path.abspath(__file__))))
    with open(out, encoding="utf-8") as f:
      return json.load(f)


def _run_section(section: str) -> dict:
  rounds, steps = FLAGS.rounds, FLAGS.steps_per_round
  if section == "fusion":
    return {"fusion": fusion_section(rounds, steps)}
  if section == "calibrate":
    paths, described = calibrate_section(FLAGS.calibration_dir)
    return {"calibration_files": paths, "calibrations": described}
  if section.startswith("placed:") and section[7:] in PLACED_MODELS:
    with open(os.path.join(FLAGS.calibration_dir, "files.json"),
              encoding="utf-8") as f:
      paths = json.load(f)
    return {"placed": placed_section(section[7:], paths, rounds, steps)}
  if section == "speedup":
    return {"speedup": speedup_section(rounds, steps)}
  if section == "pipeline":
    return {"pipeline": pipeline_section()}
  raise app.UsageError(f"--section must be fusion, calibrate, placed:<model> "
                       f"({', '.join(PLACED_MODELS)}), speedup or pipeline. "
                       f"Received: {section}")


def _print_tables(results) -> None:
  print("\nfusion speed-up (unfused / fused step time, median of rounds)")
  print(f"{'model':<6}{'step':<11}{'unfused ms':>11}{'fused ms':>10}"
        f"{'speed-up':>10}{'fused ops':>10}")
  for r in results["fusion"]:
    print(f"{r['model']:<6}{r['step']:<11}{r['unfused_ms']:>11.2f}"
          f"{r['fused_ms']:>10.2f}{r['speedup']:>9.2f}x{r['fused_ops']:>10}")
  for where, line in results["calibrations"].items():
    print(f"calibration {where}: {line}")
  print("\nplaced training steps (select=simulated on the calibrated "
        "cluster) vs one device; measured / simulated before and after "
        "calibration; select=measured")
  print(f"{'model':<15}{'config':<11}{'placer':<20}{'one ms':>8}"
        f"{'placed ms':>10}{'/one':>6}{'sim before':>11}{'m/s':>6}"
        f"{'sim after':>10}{'m/s':>6}{'level':>7}{'unlev.':>7}  "
        f"{'measured pick':<20}{'/one':>6}")
  for r in results["placed"]:
    print(f"{r['model']:<15}{r['config']:<11}{r['placer']:<20}"
          f"{r['one_device_ms']:>8.1f}{r['placed_ms']:>10.1f}"
          f"{r['placed_over_one']:>6.2f}{r['simulated_before_ms']:>11.1f}"
          f"{r['measured_over_simulated_before']:>6.2f}"
          f"{r['simulated_after_ms']:>10.1f}"
          f"{r['measured_over_simulated_after']:>6.2f}"
          f"{r['profile_level']:>7.2f}"
          f"{r['measured_over_simulated_unleveled']:>7.2f}  "
          f"{r['measured_select']:<20}{r['measured_select_over_one']:>6.2f}")
  within = [r for r in results["placed"]
            if abs(r["measured_over_simulated_after"] - 1) <= 0.25]
  print(f"rows within 25 % after calibration: {len(within)} of "
        f"{len(results['placed'])} (before: "
        f"{sum(abs(r['measured_over_simulated_before'] - 1) <= 0.25 for r in results['placed'])}"
        f"; after, at the profile's own level: "
        f"{sum(abs(r['measured_over_simulated_unleveled'] - 1) <= 0.25 for r in results['placed'])})")
  s = results["speedup"]
  print(f"\nspeed-up on 2 pinned tasks (towers): {s['speedup']:.2f}x over "
        f"one pinned task (goal 1.3x); {s['versus_both_cores']:.2f}x one "
        f"process on every core; placer {s['placer']}")
  for r in results.get("pipeline", ()):
    print(f"pipeline on {r['model']} ({r['nodes']} nodes): "
          f"{r['pipeline_s']:.1f} s; " + ", ".join(
              f"{p['pass']} {p['seconds']:.2f} s" for p in r["passes"]))


def main(argv):
  del argv
  if FLAGS.section:
    result = _run_section(FLAGS.section)
    with open(FLAGS.section_out, "w", encoding="utf-8") as f:
      json.dump(result, f)
    return
  import tensorflow as tf
  results = {"benchmark": "runtime", "tensorflow": tf.__version__,
             "cpu_count": os.cpu_count(), "rounds": FLAGS.rounds,
             "steps_per_round": FLAGS.steps_per_round, "placed": []}
  sections = (["fusion", "calibrate"] +
              [f"placed:{m}" for m in FLAGS.models] + ["speedup"] +
              (["pipeline"] if FLAGS.large_graphs else []))
  with tempfile.TemporaryDirectory() as calibration_dir:
    for section in sections:
      print(f"== {section} (own process)")
      part = _section_in_subprocess(section, calibration_dir)
      if "calibration_files" in part:
        with open(os.path.join(calibration_dir, "files.json"), "w",
                  encoding="utf-8") as f:
          json.dump(part.pop("calibration_files"), f)
      results["placed"] += part.pop("placed", [])
      results.update(part)
  _print_tables(results)
  from tfopt._io import atomic_write_text
  atomic_write_text(FLAGS.out, json.dumps(results, indent=1), overwrite=True)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
