"""How tight a cap each placer still places under: the packing table.

    python -m benchmarks.packing
    python -m benchmarks.packing --workloads=msr_gnmt_training_layers

For the shipped workloads and three Keras models of our own choosing (an
8 x Dense(1024) MLP trained with CautiousAdamW and weight decay, a 2-layer
Transformer LM with AdamW, keras.applications' MobileNetV2 at alpha 0.35
with SGD + momentum; each step captured at a fixed batch and rewritten by
tfopt.compile's prune and identity passes, as it is placed there; analytic
costs),
on 4 devices, each device's cap is set to f x (bytes live at once in any
schedule) / 4 for f from --fractions, loosest first. For each placer the
table shows the tightest f at which it still returned a plan whose
liveness peaks fit (scanning down, stopping at its first failure), and how
long `auto` took there. Below f = 1 no plan exists on any device count of
that total (the live-memory bound); `floor` is the f below which the
largest colocation group alone exceeds one device's cap. The goal (issue
34): `auto` feasible at 1.15 on every row where the floor allows it.
Writes benchmarks/results/packing.json.
"""

from __future__ import annotations

import json
import os
import platform
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from tfopt import Cluster  # noqa: E402
from tfopt.graph import load_workload, workload_names  # noqa: E402
from tfopt.graph.analysis import live_memory_bound  # noqa: E402
from tfopt.placement import InfeasiblePlacement, make_problem, place  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("workloads", list(workload_names()) + [
    "keras_mlp_cautious_adamw", "keras_transformer_lm", "keras_mobilenet_v2"],
                  "Shipped workload names and Keras models (keras_*).")
flags.DEFINE_list("placers", ["m-topo", "m-etf", "m-sct", "m-stage",
                              "m-pack", "auto"], "Placers, `auto` last.")
flags.DEFINE_list("fractions", ["3.0", "2.0", "1.5", "1.3", "1.2", "1.15",
                                "1.1"],
                  "Caps as multiples of the live-memory bound, loosest "
                  "first.")
flags.DEFINE_integer("devices", 4, "Devices.")
flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "results",
                                        "packing.json"), "Results JSON.")


def _keras_step(name: str):
  """(graph, costs) of one of the three Keras models' training steps."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import keras  # pylint: disable=import-outside-toplevel
  from benchmarks import _models  # pylint: disable=import-outside-toplevel
  from tfopt.cost.analytic import estimate_costs  # pylint: disable=import-outside-toplevel
  from tfopt.graph import capture_train_step  # pylint: disable=import-outside-toplevel
  from tfopt.graph.capture import opgraph_from_graphdef  # pylint: disable=import-outside-toplevel
  from tfopt.passes import PassContext, PassManager  # pylint: disable=import-outside-toplevel
  from tfopt.optimizers import CautiousAdamW  # pylint: disable=import-outside-toplevel
  keras.utils.set_random_seed(0)
  sparse = "sparse_categorical_crossentropy"
  if name == "keras_mlp_cautious_adamw":
    model = keras.Sequential(
        [keras.Input((1024,))] +
        [keras.layers.Dense(1024, activation="relu") for _ in range(8)] +
        [keras.layers.Dense(10)])
    model.compile(CautiousAdamW(weight_decay=0.1), sparse)
    x, y = np.zeros((64, 1024), "float32"), np.zeros((64,), "int32")
  elif name == "keras_transformer_lm":
    model = _models.transformer(layers=2, d=256, heads=4, vocab=2000, seq=32)
    model.compile(keras.optimizers.AdamW(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    x, y = np.zeros((8, 32), "int32"), np.zeros((8, 32), "int32")
  elif name == "keras_mobilenet_v2":
    model = keras.applications.MobileNetV2(
        input_shape=(64, 64, 3), alpha=0.35, weights=None, classes=10)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), sparse)
    x, y = np.zeros((8, 64, 64, 3), "float32"), np.zeros((8,), "int32")
  else:
    raise ValueError(f"Argument `workloads` must name shipped workloads or "
                     f"keras_mlp_cautious_adamw, keras_transformer_lm, "
                     f"keras_mobilenet_v2. Received: {name!r}")
  step = capture_train_step(model, x=x, y=y)
  # What tfopt.compile places: the step after its prune and identity passes
  # (which, among others, split the IdentityN in which Keras' optimizers
  # gather every gradient: placed whole, it copies them all to one device).
  keep = tuple(step.input_names) + tuple(
      t.split(":")[0] for t in step.output_names) + tuple(step.target_names)
  rewritten = PassManager("prune,identity").run(
      step.graph_def, PassContext(keep=keep, batch_size=step.batch_size))
  graph = opgraph_from_graphdef(rewritten.graph, batch_size=step.batch_size,
                                inline=False)
  return graph, estimate_costs(graph)


def _load(name: str):
  if name.startswith("keras_"):
    return _keras_step(name)
  workload = load_workload(name)
  return workload.graph, workload.costs


def _floor(graph, costs, bound: int, devices: int) -> float:
  """The fraction below which the largest colocation group alone is over
  one device's cap (make_problem's own check)."""
  problem = make_problem(graph, Cluster.uniform(devices), costs)
  largest = max(problem.group_memory.values())
  return largest * devices / bound


def _tightest(graph, costs, bound: int, placer: str, fractions):
  """(tightest fraction placed, seconds there, placer that won), scanning
  down to the first failure."""
  found = (None, None, None)
  for fraction in fractions:
    cluster = Cluster.uniform(FLAGS.devices,
                              int(bound * fraction / FLAGS.devices))
    start = time.perf_counter()
    try:
      result = place(graph, cluster, costs, placer)
    except InfeasiblePlacement:
      break
    if not result.schedule.feasible:
      break
    found = (fraction, time.perf_counter() - start, result.placer)
  return found


def _row(name: str, fractions) -> dict:
  graph, costs = _load(name)
  bound = live_memory_bound(graph, costs).bytes
  row = {"workload": name, "ops": len(graph), "devices": FLAGS.devices,
         "live_bound_bytes": bound,
         "floor": _floor(graph, costs, bound, FLAGS.devices),
         "tightest": {}, "seconds_at_tightest": {}, "winner": {}}
  for placer in FLAGS.placers:
    fraction, seconds, winner = _tightest(graph, costs, bound, placer,
                                          fractions)
    row["tightest"][placer] = fraction
    row["seconds_at_tightest"][placer] = seconds
    row["winner"][placer] = winner
    print(f"  {name} {placer}: {fraction} ({winner}, "
          f"{seconds if seconds is None else round(seconds, 2)} s)",
          flush=True)
  return row


def _fmt(value) -> str:
  return "-" if value is None else f"{value:.2f}"


def main(argv):
  del argv
  fractions = sorted((float(f) for f in FLAGS.fractions), reverse=True)
  rows = [_row(name, fractions) for name in FLAGS.workloads]
  print(f"\n{'workload':<34}{'ops':>6}{'floor':>7}" +
        "".join(f"{p:>9}" for p in FLAGS.placers) + f"{'auto s':>8}  winner")
  for r in rows:
    print(f"{r['workload']:<34}{r['ops']:>6}{r['floor']:>7.2f}" +
          "".join(f"{_fmt(r['tightest'][p]):>9}" for p in FLAGS.placers) +
          f"{_fmt(r['seconds_at_tightest'].get('auto')):>8}  "
          f"{r['winner'].get('auto')}")
  print("(tightest cap at which each placer placed, as a multiple of the "
        "live-memory bound / devices; '-': none down to "
        f"{fractions[0]})")
  os.makedirs(os.path.dirname(FLAGS.out), exist_ok=True)
  with open(FLAGS.out + ".tmp", "w") as f:
    json.dump({"benchmark": "packing",
               "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
               "fractions": fractions, "rows": rows}, f, indent=1)
  os.replace(FLAGS.out + ".tmp", FLAGS.out)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
