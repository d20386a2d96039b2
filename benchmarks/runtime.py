"""Runtime benchmark: fusion speed-up, placed-step times, simulator calibration,
pass-pipeline time on large training graphs.

    python -m benchmarks.runtime

1. Fusion: inference and training steps of an MLP and a CNN (conv layers with
   bias and ReLU), the fused graph (pass "fuse") against the unfused one, in
   the same process, interleaved in rounds; the speed-up is the median of the
   per-round ratios unfused / fused.
2. Placed steps: the CNN's and the MLP's training steps placed by m-ETF on
   1, 2 and 4 logical CPU devices and on 2 and 4 server processes on
   loopback, each timed
   against the unplaced one-device step in the same run, and each checked
   (loss equal to one device, every op where planned).
3. Calibration: each placed step's simulated makespan against its measured
   time, as is ("meas/sim") and with one scale factor fitted on the
   one-device step ("scaled": the simulator's relative accuracy). Logical
   devices share memory, so their link is a latency measured between two of
   them (no size dependence); the processes' link is fitted on transfers
   measured between the same server tasks (`measure_comm_model`).
4. Pipeline: prune,identity,fold,fuse,coarsen,place (auto, 4 devices) on the
   ResNet-50 and Inception-V3 training graphs (analytic costs), per pass.

Each section (and each model's placed runs) runs in its own process (see
`_section_in_subprocess`). Writes benchmarks/results/runtime.json. Timings on a shared 2-core VM drift
between rounds; the ratios are measured side by side to cancel that.
"""

from __future__ import annotations

import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

import tfopt  # noqa: E402,F401  (OR-Tools before TensorFlow)

FLAGS = flags.FLAGS
flags.DEFINE_integer("rounds", 7, "Interleaved timing rounds.")
flags.DEFINE_integer("steps_per_round", 10, "Steps timed per round.")
flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "results",
                                        "runtime.json"), "Results JSON.")
flags.DEFINE_string("section", None, "Internal: run one section and write "
                    "its JSON to --section_out.")
flags.DEFINE_string("section_out", None, "Internal: see --section.")
flags.DEFINE_bool("large_graphs", True, "Run section 4 (ResNet-50, "
                  "Inception-V3 capture takes a few minutes).")


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


def placed_section(rounds, steps, models=("cnn", "mlp")):
  import tensorflow as tf
  from tfopt.cost.comm import CommModel
  from tfopt.cost.comm_measure import measure_comm_model, measure_transfer_times
  from tfopt.cost.profile import profile_step
  from tfopt.graph import capture_train_step
  from tfopt.passes import PassContext, PassManager
  from tfopt.runtime import (LoopbackServers, StepSession, calibrate,
                             check_rewritten, local_cluster, run_steps,
                             session_config)
  from tfopt.runtime.placed import LOCAL_PREFIX
  from tfopt.runtime.session import local_device_count
  rows, comm_fits = [], {}
  builders = {"cnn": (_cnn, 32), "mlp": (_mlp, 64)}
  for model_name in models:
    build, batch_size = builders[model_name]
    model = build()
    x, y = _batch(model, batch_size)
    inputs = [x, y]
    step = capture_train_step(model, x=x, y=y)
    # Profiled first: nothing else has run in this process yet.
    costs = profile_step(step, inputs=inputs, steps=3, warmup=1,
                         progress=True)
    reference = run_steps(step, [inputs] * 2)
    # Logical CPU devices share memory: a "copy" costs a size-independent
    # hand-over between executors. Its median over sizes is the latency.
    local = measure_transfer_times(
        src_device=f"{LOCAL_PREFIX}1", dst_device=f"{LOCAL_PREFIX}0",
        config=tf.compat.v1.ConfigProto(device_count={"CPU": 2}))
    hand_over_us = statistics.median(t for _, t in local)
    comm_fits[f"{model_name}, logical devices"] = (
        f"latency {hand_over_us:.1f} us, no bandwidth term (shared memory)")
    shared_memory = CommModel.uniform(hand_over_us, 1e6)
    first = len(rows)

    def measure(label, graph, cluster, ctx, target="", config=None):
      check_rewritten(step, [inputs] * 2, graph, reference=reference,
                      target=target, config=config, what=label)
      one = StepSession(step)
      placed = StepSession(step, graph_def=graph, target=target,
                           config=config or session_config(
                               device_count=local_device_count(graph)))
      one.run(inputs)
      placed.run(inputs)
      times = _interleaved([one, placed], inputs, rounds, steps)
      one.close()
      placed.close()
      cal = calibrate(step, graph, costs, cluster, inputs, repeats=steps,
                      warmup=2, fused=ctx.fused, target=target, config=config)
      rows.append({"model": model_name, "config": label,
                   "devices_used": cal.devices_used,
                   "single_ms": statistics.median(times[0]) * 1e3,
                   "placed_ms": statistics.median(times[1]) * 1e3,
                   "placed_over_single": statistics.median(
                       [p / s for s, p in zip(*times)]),
                   "simulated_ms": cal.predicted_us / 1e3,
                   "measured_over_simulated": cal.ratio})
      print(f"  {model_name}, {label}: {rows[-1]}")

    for n in (1, 2, 4):
      cluster = local_cluster(n, comm=shared_memory)
      ctx = PassContext.for_step(step, costs=costs, cluster=cluster,
                                 placer="m-etf")
      graph = PassManager("fuse,place").run(step.graph_def, ctx).graph
      measure(f"{n} logical device{'s' if n > 1 else ''}", graph, cluster,
              ctx)
    for n in (2, 4):
      with LoopbackServers(n) as servers:
        fit, _ = measure_comm_model(src_device=servers.device_names[1],
                                    dst_device=servers.device_names[0],
                                    target=servers.target)
        comm_fits[f"{model_name}, {n} processes"] = str(fit)
        cluster = servers.cluster(comm=CommModel(fit.link))
        ctx = PassContext.for_step(step, costs=costs, cluster=cluster,
                                   placer="m-etf")
        graph = PassManager("fuse,place").run(step.graph_def, ctx).graph
        measure(f"{n} processes", graph, cluster, ctx,
                target=servers.target, config=session_config())
    # One scale factor fitted on the one-device step predicts the others:
    # how well the simulator ranks plans, apart from its absolute level.
    scale = rows[first]["measured_over_simulated"]
    for r in rows[first:]:
      r["measured_over_scaled_simulated"] = (r["measured_over_simulated"] /
                                             scale)
  return rows, comm_fits


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


def _section_in_subprocess(section: str) -> dict:
  """Runs one section in a fresh process. Traced profiling in a process that
  already built and profiled other models reports inflated op times (the
  same CNN profiled four times in one process: 12.1, 15.0, 16.7, 18.8 ms),
  so each model's costs are measured where nothing ran before."""
  import subprocess
  import sys
  import tempfile
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "section.json")
    subprocess.run([sys.executable, "-m", "benchmarks.runtime",
                    f"--section={section}", f"--section_out={out}",
                    f"--rounds={FLAGS.rounds}",
                    f"--steps_per_round={FLAGS.steps_per_round}"],
                   check=True, cwd=os.path.dirname(os.path.dirname(
                       os.path.abspath(__file__))))
    with open(out, encoding="utf-8") as f:
      return json.load(f)


def _run_section(section: str) -> dict:
  if section == "fusion":
    return {"fusion": fusion_section(FLAGS.rounds, FLAGS.steps_per_round)}
  if section.startswith("placed:"):
    rows, fits = placed_section(FLAGS.rounds, FLAGS.steps_per_round,
                                (section.split(":", 1)[1],))
    return {"placed": rows, "comm_fits": fits}
  if section == "pipeline":
    return {"pipeline": pipeline_section()}
  raise app.UsageError(f"--section must be fusion, placed:cnn, placed:mlp "
                       f"or pipeline. Received: {section}")


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
             "steps_per_round": FLAGS.steps_per_round, "placed": [],
             "comm_fits": {}}
  sections = ["fusion", "placed:cnn", "placed:mlp"] + (
      ["pipeline"] if FLAGS.large_graphs else [])
  for section in sections:
    print(f"== {section} (own process)")
    part = _section_in_subprocess(section)
    results["placed"] += part.pop("placed", [])
    results["comm_fits"].update(part.pop("comm_fits", {}))
    results.update(part)
  print("\nfusion speed-up (unfused / fused step time, median of rounds)")
  print(f"{'model':<6}{'step':<11}{'unfused ms':>11}{'fused ms':>10}"
        f"{'speed-up':>10}{'fused ops':>10}")
  for r in results["fusion"]:
    print(f"{r['model']:<6}{r['step']:<11}{r['unfused_ms']:>11.2f}"
          f"{r['fused_ms']:>10.2f}{r['speedup']:>9.2f}x{r['fused_ops']:>10}")
  print("\nplaced training steps (m-ETF) vs one device; simulator ratio")
  print(f"{'model':<6}{'config':<19}{'used':>5}{'single ms':>10}{'placed ms':>10}"
        f"{'placed/1':>9}{'sim ms':>8}{'meas/sim':>9}{'scaled':>8}")
  for r in results["placed"]:
    print(f"{r['model']:<6}{r['config']:<19}{r['devices_used']:>5}{r['single_ms']:>10.2f}"
          f"{r['placed_ms']:>10.2f}{r['placed_over_single']:>9.2f}"
          f"{r['simulated_ms']:>8.2f}{r['measured_over_simulated']:>9.2f}"
          f"{r['measured_over_scaled_simulated']:>8.2f}")
  for where, fit in results["comm_fits"].items():
    print(f"comm fit ({where}): {fit}")
  for r in results.get("pipeline", ()):
    print(f"pipeline on {r['model']} ({r['nodes']} nodes): "
          f"{r['pipeline_s']:.1f} s; " + ", ".join(
              f"{p['pass']} {p['seconds']:.2f} s" for p in r["passes"]))
  from tfopt._io import atomic_write_text
  atomic_write_text(FLAGS.out, json.dumps(results, indent=1), overwrite=True)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
