"""MoE pruning side by side: magnitude, Wanda (routed), MoE-Pruner, SparseGPT;
then expert-wise distillation against plain fine-tuning.

    python -m benchmarks.moe_pruning            # ~15 min on 2 CPUs
    python -m benchmarks.moe_pruning --parts=prune --seeds=2   # quicker

The reference model is the byte-level MoE LM of `tfopt.pruning.reference_lm`
(8 experts, top-2, 2 blocks) trained to a plateau on CPython's pydoc topics
by `python -m benchmarks.moe_reference`; its checkpoint is committed
(benchmarks/results/moe_lm_reference.weights.h5) and trained anew when it
is missing. Perplexity is measured on 128 held-out windows (16,384 bytes).

- prune: each method at 50 %, 60 %, 70 % and 2:4, with 5 calibration seeds
  (32 random training windows each, 4,096 tokens); perplexity / dense,
  paired by seed (magnitude needs no data: one run, the same for every
  seed). Also the pruning time and the sparse export size.
- distill: MoE-Pruner at 50 % (seed 0), then the same fine-tuning budget
  three ways (AdamW, learning rate 1e-4 decaying to 0 along a cosine,
  batch 16): the pruned model with ExpertDistiller, the pruned model
  plainly, and the dense model (the bar): the gap closed is
  (ppl_pruned - ppl_tuned) / (ppl_pruned - ppl_dense_tuned).

Prints a table and writes benchmarks/results/moe_pruning.json.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import warnings

from absl import app, flags

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)

FLAGS = flags.FLAGS
flags.DEFINE_list("parts", ["prune", "distill"], "prune and/or distill.")
flags.DEFINE_integer("seeds", 5, "Calibration seeds.")
flags.DEFINE_integer("calibration_windows", 32, "Windows of 128 bytes.")
flags.DEFINE_integer("finetune_steps", 300, "Fine-tuning budget (steps).")
flags.DEFINE_float("finetune_lr", 1e-4, "Fine-tuning learning rate (the "
                   "reference run ended its cosine schedule at 1.5e-4).")
flags.DEFINE_integer("finetune_batch", 16, "Fine-tuning batch (as trained).")
flags.DEFINE_string("out", None, "JSON path (default: results/).")

RESULTS = os.path.join(os.path.dirname(__file__), "results")
CHECKPOINT = os.path.join(RESULTS, "moe_lm_reference.weights.h5")
METHODS = ("magnitude", "wanda", "moe_pruner", "sparsegpt")
PATTERNS = (0.5, 0.6, 0.7, "2:4")


def _pattern_args(p):
  return ({"sparsity": None, "pattern": p} if isinstance(p, str)
          else {"sparsity": p})


def _label(p):
  return p if isinstance(p, str) else f"{round(p * 100)}%"


def prune_part(model, data, dense_weights, seeds):
  from tfopt.pruning import export_sparse, prune_moe
  from tfopt.pruning import reference_lm
  import keras
  x_eval, y_eval = data.eval_windows()
  dense_ppl = reference_lm.perplexity(model, x_eval, y_eval)
  rows = []
  runs = [(m, p, s) for p in PATTERNS for m in METHODS for s in range(seeds)
          if not (m == "magnitude" and s > 0)]
  bar = keras.utils.Progbar(len(runs), unit_name="run")
  export_ratio = None
  for i, (method, pattern, seed) in enumerate(runs):
    model.set_weights(dense_weights)
    calib, _ = data.windows(FLAGS.calibration_windows, seed=1000 + seed)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      report = prune_moe(model, calib, method=method, verbose=0,
                         **_pattern_args(pattern))
    ppl = reference_lm.perplexity(model, x_eval, y_eval)
    seeds_here = range(seeds) if method == "magnitude" else [seed]
    for s in seeds_here:
      rows.append({"method": method, "pattern": _label(pattern), "seed": s,
                   "ppl": ppl, "ppl_ratio": ppl / dense_ppl,
                   "prune_seconds": report.seconds,
                   "sparsity": report.sparsity})
    if export_ratio is None and method == "moe_pruner" and pattern == 0.5:
      with tempfile.TemporaryDirectory() as tmp:
        export_ratio = export_sparse(model, report.masks,
                                     os.path.join(tmp, "sparse"))["ratio"]
    bar.update(i + 1)
  model.set_weights(dense_weights)
  return dense_ppl, rows, export_ratio


def summarize(rows, seeds):
  summary = {}
  for pattern in map(_label, PATTERNS):
    entry = {}
    for method in METHODS:
      r = [row["ppl_ratio"] for row in rows
           if row["method"] == method and row["pattern"] == pattern]
      entry[method] = {"mean_ratio": statistics.mean(r),
                       "min": min(r), "max": max(r),
                       "prune_seconds": statistics.mean(
                           row["prune_seconds"] for row in rows
                           if row["method"] == method
                           and row["pattern"] == pattern)}
    by_seed = lambda m: {row["seed"]: row["ppl"] for row in rows  # noqa: E731
                         if row["method"] == m and row["pattern"] == pattern}
    mp, wanda = by_seed("moe_pruner"), by_seed("wanda")
    entry["moe_pruner_beats_wanda_seeds"] = sum(
        mp[s] < wanda[s] for s in range(seeds))
    summary[pattern] = entry
  return summary


def distill_part(model, data, dense_weights):
  import keras
  from tfopt.pruning import (ExpertDistiller, MoEPruner, installed_masks,
                             reference_lm, strip_pruning)
  x_eval, y_eval = data.eval_windows()
  calib, _ = data.windows(FLAGS.calibration_windows, seed=1000)
  teacher = reference_lm.build(steps=1)
  teacher.set_weights(dense_weights)
  results = {}

  def tune(name, prune, distill):
    model.set_weights(dense_weights)
    strip_pruning(model)
    # Cosine to zero: the budget ends annealed, as the reference run did, so
    # the dense bar is not a model left mid-step by a constant rate.
    lr = keras.optimizers.schedules.CosineDecay(FLAGS.finetune_lr,
                                                FLAGS.finetune_steps)
    model.compile(keras.optimizers.AdamW(lr, weight_decay=0.0),
                  keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True), jit_compile=True)
    callbacks = []
    if prune:
      pruner = MoEPruner(calib, method="moe_pruner", sparsity=0.5)
      pruner.set_model(model)
      pruner.on_train_begin()  # prune now, to measure before tuning
    before = reference_lm.perplexity(model, x_eval, y_eval)
    distiller = ExpertDistiller(teacher) if distill else None
    if distiller:
      callbacks.append(distiller)
    start = time.perf_counter()
    reference_lm.train(model, data, FLAGS.finetune_steps,
                       batch_size=FLAGS.finetune_batch, seed=7, verbose=0,
                       callbacks=callbacks)
    seconds = time.perf_counter() - start
    after = reference_lm.perplexity(model, x_eval, y_eval)
    masks = installed_masks(model)
    exact = all(
        (v.numpy()[~masks[v.path]] == 0).all()
        for v in model.weights if v.path in masks)
    results[name] = {"ppl_before": before, "ppl_after": after,
                     "seconds": seconds, "masks_exact": bool(exact),
                     "lambda": distiller.lambda_value if distiller else None}
    print(f"{name:22s} ppl {before:7.3f} -> {after:7.3f} in {seconds:.0f} s",
          flush=True)

  tune("dense_finetuned", prune=False, distill=False)
  tune("pruned_finetuned", prune=True, distill=False)
  tune("pruned_distilled", prune=True, distill=True)
  strip_pruning(model)
  model.set_weights(dense_weights)
  pruned = results["pruned_finetuned"]["ppl_before"]
  bar = results["dense_finetuned"]["ppl_after"]
  for name in ("pruned_finetuned", "pruned_distilled"):
    results[name]["gap_closed"] = ((pruned - results[name]["ppl_after"])
                                   / (pruned - bar))
  return results


def main(argv):
  del argv
  from tfopt.pruning import reference_lm
  model, _ = reference_lm.load_or_train(CHECKPOINT, train_if_missing=True)
  data = reference_lm.corpus()
  dense_weights = model.get_weights()
  out = {"checkpoint": os.path.relpath(CHECKPOINT),
         "model": reference_lm.MODEL_KWARGS,
         "calibration_windows": FLAGS.calibration_windows,
         "seeds": FLAGS.seeds}
  path = FLAGS.out or os.path.join(RESULTS, "moe_pruning.json")
  if os.path.exists(path):  # keep the part not re-run this time
    with open(path, encoding="utf-8") as f:
      previous = json.load(f)
    out.update({k: v for k, v in previous.items()
                if k in ("dense_ppl", "runs", "summary", "export_ratio_50",
                         "distillation", "finetune_steps", "finetune_lr",
                         "finetune_batch")})
  if "prune" in FLAGS.parts:
    dense_ppl, rows, export_ratio = prune_part(model, data, dense_weights,
                                               FLAGS.seeds)
    out.update(dense_ppl=dense_ppl, runs=rows,
               summary=summarize(rows, FLAGS.seeds),
               export_ratio_50=export_ratio)
    print(f"\ndense perplexity {dense_ppl:.3f}; perplexity / dense "
          f"(mean of {FLAGS.seeds} seeds; min-max)")
    print(f"{'pattern':8s}" + "".join(f"{m:>22s}" for m in METHODS)
          + "   MoE-Pruner < Wanda")
    for pattern, entry in out["summary"].items():
      cells = "".join(
          f"{entry[m]['mean_ratio']:8.3f} ({entry[m]['min']:.3f}-"
          f"{entry[m]['max']:.3f})" for m in METHODS)
      print(f"{pattern:8s}{cells}   {entry['moe_pruner_beats_wanda_seeds']}"
            f"/{FLAGS.seeds} seeds")
    print(f"sparse export at 50 %: {export_ratio:.3f}x the dense fp32 "
          "expert bytes")
  if "distill" in FLAGS.parts:
    out["distillation"] = distill_part(model, data, dense_weights)
    out["finetune_steps"] = FLAGS.finetune_steps
    out["finetune_lr"] = FLAGS.finetune_lr
    out["finetune_batch"] = FLAGS.finetune_batch
    for name in ("pruned_finetuned", "pruned_distilled"):
      print(f"{name}: gap closed {out['distillation'][name]['gap_closed']:.1%}")
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1)
  os.replace(path + ".tmp", path)
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
