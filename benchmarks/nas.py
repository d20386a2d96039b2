"""One-shot NAS vs exhaustive stand-alone training vs random search, on
`tiny64` with scikit-learn's bundled digits (1000 / 400 / 397 stratified).

    python -m benchmarks.nas                     # 3 seeds, ~45 min on 2 CPUs
    python -m benchmarks.nas --seeds=0 --reuse   # one-shot part only, reusing
                                                 # the committed stand-alone table

Per seed (see `tfopt.nas.benchmark`): all 64 sub-graphs trained
stand-alone (15 epochs, Adam 3e-3 with cosine decay, batch 32); a
super-network trained for 1/16 of those steps with uniform single-path
sampling and ranked with inherited weights after BatchNorm recalibration;
Kendall tau-b against stand-alone test accuracy; the one-shot top-3
retrained; random search at the same compute; the steering check.
Prints a table and writes benchmarks/results/nas.json and nas.png.

    python -m benchmarks.nas --part=ranking      # ~20 min on 2 CPUs

The ranking part judges one-shot ranking methods on a space no method was
tuned on (`held_out_space`: the stage x block template on the digits, 81
sub-graphs): `RANKING_ARCHS` sub-graphs drawn uniformly once (the same on
every seed), per seed each trained stand-alone twice
(`tfopt.nas.rank_quality`); super-networks
trained for 1x and 2x the one-shot steps (1/16 of the space's exhaustive
steps) rank all 81 by validation accuracy and by log-likelihood; Kendall
tau against the mean of the two trainings, against one, and the
repeatability (one training against the other), with each method's search
time. Writes benchmarks/results/nas_ranking.json.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)

FLAGS = flags.FLAGS
flags.DEFINE_list("seeds", ["0", "1", "2"], "Data / training seeds.")
flags.DEFINE_integer("epochs", 15, "Stand-alone epochs per sub-graph.")
flags.DEFINE_integer("fraction", 16, "One-shot steps = exhaustive / this.")
flags.DEFINE_enum("score", "accuracy", ["accuracy", "log_likelihood"],
                  "One-shot score of a sub-graph on the validation data.")
flags.DEFINE_enum("schedule", "uniform", ["uniform", "fair"],
                  "Path sampling schedule of the super-network.")
flags.DEFINE_bool("reuse", False, "Reuse the stand-alone tables of the "
                  "existing results file (same epochs) instead of training "
                  "the 64 sub-graphs again.")
flags.DEFINE_string("out", None, "JSON path (default: results/nas.json).")
flags.DEFINE_bool("replot", False, "Only redraw the plot of --out.")
flags.DEFINE_enum("part", "search", ["search", "ranking"],
                  "search: one-shot vs exhaustive on tiny64; ranking: tau "
                  "per ranking method on the held-out space.")

RANKING_ARCHS = 16
RANKING_REPEATS = 2
# The method the ranking part recommends (chosen on tiny64, judged here).
RANKING_METHOD = "log_likelihood@2x"
RANKING_BASELINE = "accuracy@1x"

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def _plot(results, path):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4.4),
                           squeeze=False)
  for ax, r in zip(axes[0], results):
    test = {tuple(row["arch"]): row["test"] for row in r["standalone"]}
    xs = [o["score"] for o in r["oneshot"]]
    ys = [test[tuple(o["arch"])] for o in r["oneshot"]]
    band = r["random_search"]
    ax.axhspan(band["p10"], band["p90"], color="tab:orange", alpha=0.2,
               label=f"random search (k={band['k']}) 10-90 %")
    ax.axhline(band["mean"], color="tab:orange", lw=1)
    ax.scatter(xs, ys, s=18, color="tab:blue", label="sub-graphs")
    top = r["oneshot"][:3]
    ax.scatter([o["score"] for o in top], [test[tuple(o["arch"])]
                                           for o in top],
               s=80, facecolors="none", edgecolors="tab:red", lw=2,
               label="one-shot top-3")
    ax.set_title(f"seed {r['seed']}: Kendall tau {r['kendall_tau']:.2f}, "
                 f"compute {r['compute_ratio']:.3f}")
    metric = r.get("score", "accuracy").replace("_", "-")
    ax.set_xlabel(f"one-shot validation {metric} (inherited weights)")
    ax.set_ylabel("stand-alone test accuracy")
    ax.legend(loc="lower right", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def held_out_space():
  """The ranking part's space, never used to choose a method: the stage x
  block template on the 8x8 digits, two stages of one block each."""
  from tfopt.nas import stage_block  # pylint: disable=import-outside-toplevel
  return stage_block(input_shape=(8, 8, 1), num_classes=10, stages=2,
                     blocks=1, filters=(16, 32))


def ranking_part(seeds, epochs, fraction, out):
  """The ranking part (module doc): prints the tau table, writes `out`."""
  import math  # pylint: disable=import-outside-toplevel
  from tfopt.nas.data import digits  # pylint: disable=import-outside-toplevel
  from tfopt.nas.rank_quality import (judge, rank_methods, repeatability,  # pylint: disable=import-outside-toplevel
                                      sample_archs, truth_table)
  space = held_out_space()
  archs = sample_archs(space, RANKING_ARCHS, seed=0)
  per_seed = []
  for seed in seeds:
    split = digits(seed)
    print(f"seed {seed}: {RANKING_ARCHS} sub-graphs x {RANKING_REPEATS} "
          "stand-alone trainings")
    rows = truth_table(space, archs, split, epochs=epochs, seed=seed,
                       repeats=RANKING_REPEATS)
    steps = math.ceil(space.size * rows[0]["steps"] / fraction)
    print(f"seed {seed}: super-networks of {steps} and {2 * steps} steps")
    methods = rank_methods(space, split, steps, seed=seed)
    per_seed.append({
        "seed": seed, "truth": rows, "oneshot_steps": steps,
        "repeatability": repeatability(rows),
        "repeatability_ll": repeatability(rows, truth="test_ll"),
        "methods": {name: {**judge(m["scores"], rows),
                           **{f"{k}_ll": v for k, v in judge(
                               m["scores"], rows, truth="test_ll").items()},
                           **{k: m[k] for k in ("steps", "train_s",
                                                "rank_s", "search_s")},
                           "scores": [{"arch": list(a), "score": v}
                                      for a, v in m["scores"].items()]}
                    for name, m in methods.items()}})
  names = list(per_seed[0]["methods"])
  base_s = {r["seed"]: r["methods"][RANKING_BASELINE]["search_s"]
            for r in per_seed}
  print(f"\n{'method':<20} " + " ".join(f"{'tau s' + str(r['seed']):>8}"
                                         for r in per_seed)
        + f" {'single':>7} {'repeat':>7} {'time x':>7}")
  summary = {}
  for name in names:
    rows = [r["methods"][name] for r in per_seed]
    summary[name] = {
        "tau": [m["tau"] for m in rows],
        "tau_single": [m["tau_single"] for m in rows],
        "tau_ll": [m["tau_ll"] for m in rows],
        "tau_single_ll": [m["tau_single_ll"] for m in rows],
        "time_ratio": max(m["search_s"] / base_s[r["seed"]]
                          for m, r in zip(rows, per_seed))}
    s = summary[name]
    print(f"{name:<20} " + " ".join(f"{t:8.3f}" for t in s["tau"])
          + f" {min(s['tau_single']):7.3f}"
          f" {max(r['repeatability'] for r in per_seed):7.3f}"
          f" {s['time_ratio']:7.2f}")
  print("(tau: Kendall tau-b vs the mean test accuracy of the stand-alone "
        "trainings; single: the lowest vs one training; repeat: the highest "
        "of one training vs the other; time x: the largest search time over "
        f"the {RANKING_BASELINE} baseline's)")
  print(f"\nagainst the test log-likelihood\n{'method':<20} "
        + " ".join(f"{'tau s' + str(r['seed']):>8}" for r in per_seed)
        + f" {'single':>7} {'repeat':>7}")
  for name, s in summary.items():
    print(f"{name:<20} " + " ".join(f"{t:8.3f}" for t in s["tau_ll"])
          + f" {min(s['tau_single_ll']):7.3f}"
          f" {max(r['repeatability_ll'] for r in per_seed):7.3f}")
  goal = summary[RANKING_METHOD]
  goals = {"tau>=0.8 on every seed": min(goal["tau"]) >= 0.8,
           "tau>=0.8 on every seed vs the test log-likelihood": min(
               goal["tau_ll"]) >= 0.8,
           "search time <= 2x": goal["time_ratio"] <= 2.0,
           "beats the baseline on every seed": all(
               a > b for a, b in zip(goal["tau"],
                                     summary[RANKING_BASELINE]["tau"]))}
  print(f"{RANKING_METHOD}: " + ", ".join(
      f"{k}: {'met' if ok else 'NOT met'}" for k, ok in goals.items()))
  with open(out, "w", encoding="utf-8") as f:
    json.dump({"benchmark": "nas_ranking", "space": space.to_dict(),
               "held_out_archs": [list(a) for a in archs],
               "repeats": RANKING_REPEATS, "epochs": epochs,
               "fraction": fraction, "method": RANKING_METHOD,
               "baseline": RANKING_BASELINE, "summary": summary,
               "repeatability": [r["repeatability"] for r in per_seed],
               "repeatability_ll": [r["repeatability_ll"]
                                    for r in per_seed],
               "goals": goals, "seeds": per_seed}, f, indent=1)
  print(f"wrote {out}")


def main(argv):
  del argv
  if FLAGS.part == "ranking":
    ranking_part([int(s) for s in FLAGS.seeds], FLAGS.epochs, FLAGS.fraction,
                 FLAGS.out or os.path.join(RESULTS, "nas_ranking.json"))
    return
  from tfopt.nas import tiny64  # pylint: disable=import-outside-toplevel
  from tfopt.nas.benchmark import goals, run_seed  # pylint: disable=import-outside-toplevel
  out = FLAGS.out or os.path.join(RESULTS, "nas.json")
  if FLAGS.replot:
    with open(out, encoding="utf-8") as f:
      _plot(json.load(f)["seeds"], os.path.splitext(out)[0] + ".png")
    return
  previous = {}
  if FLAGS.reuse and os.path.exists(out):
    with open(out, encoding="utf-8") as f:
      old = json.load(f)
    if old.get("epochs") == FLAGS.epochs:
      previous = {r["seed"]: r["standalone"] for r in old["seeds"]}
  space = tiny64()
  results = []
  for seed in [int(s) for s in FLAGS.seeds]:
    print(f"seed {seed}: "
          + ("reusing the stand-alone table" if seed in previous else
             "training all 64 sub-graphs stand-alone"))
    r = run_seed(space, seed, epochs=FLAGS.epochs, fraction=FLAGS.fraction,
                 table=previous.get(seed), score=FLAGS.score,
                 schedule=FLAGS.schedule)
    r["goals"] = goals(r)
    results.append(r)
  print()
  header = (f"{'seed':>4} {'tau':>6} {'compute':>8} {'best':>7} {'top3':>7} "
            f"{'top1':>7} {'exh.pick':>8} {'retrained':>9} {'random':>7} "
            f"{'steered':>7}")
  print(header)
  for r in results:
    print(f"{r['seed']:>4} {r['kendall_tau']:6.3f} {r['compute_ratio']:8.4f} "
          f"{r['best_test']:7.4f} {r['top3_best_test']:7.4f} "
          f"{r['top1_test']:7.4f} {r['exhaustive_pick_test']:8.4f} "
          f"{r['retrained_pick_test']:9.4f} "
          f"{r['random_search']['mean']:7.4f} "
          f"{r['steering']['top1_test']:7.4f}")
  print("(test accuracies; random = mean over draws at the compute of "
        "one-shot + top-3 retraining)")
  for r in results:
    failed = [k for k, ok in r["goals"].items() if not ok]
    print(f"seed {r['seed']}: goals met {sum(r['goals'].values())}/"
          f"{len(r['goals'])}" + (f"; missed: {failed}" if failed else ""))
  with open(out, "w", encoding="utf-8") as f:
    json.dump({"benchmark": "nas", "space": "tiny64", "epochs": FLAGS.epochs,
               "score": FLAGS.score, "schedule": FLAGS.schedule,
               "fraction": FLAGS.fraction, "seeds": results}, f, indent=1)
  _plot(results, os.path.splitext(out)[0] + ".png")
  print(f"wrote {out}")


if __name__ == "__main__":
  app.run(main)
