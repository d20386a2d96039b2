"""MoE pruning side by side: magnitude, Wanda (routed), MoE-Pruner, SparseGPT,
router-weighted OBS (and each OBS method with and without the exact refit of
the kept weights, to show what the refit and the router weighting each
give); then expert-wise distillation against plain
fine-tuning.

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
  seed). Also the pruning time and the sparse export size. Router-OBS
  against SparseGPT is counted seed by seed (paired: the same calibration
  windows, the same held-out text).
- distill: MoE-Pruner at 50 % (seed 0), then the same fine-tuning budget
  three ways (AdamW, learning rate 1e-4 decaying to 0 along a cosine,
  batch 16): the pruned model with ExpertDistiller, the pruned model
  plainly, and the dense model (the bar): the gap closed is
  (ppl_pruned - ppl_tuned) / (ppl_pruned - ppl_dense_tuned); and
  router-OBS at 50 % with ExpertDistiller, its gap measured from its own
  pruned perplexity to the same bar.
- experts: whole experts removed (`prune_experts`) at 25 % and 50 % of
  them, by REAP saliency, by routing frequency and at random (seeds 0-4,
  paired calibration windows), and REAP with merging: perplexity / dense,
  parameters, SavedModel bytes and the exported model's CPU latency
  (batch 8 x 128 tokens, the SavedModels' `serve` called in alternating
  rounds, minimum per model) against the dense SavedModel. The same on a
  tiny random-weight keras-hub Mixtral backbone (4 experts, top-2), where
  perplexity means nothing: its output change relative to dense instead.

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
flags.DEFINE_list("parts", ["prune", "distill", "experts"],
                  "prune, distill and/or experts.")
flags.DEFINE_integer("latency_rounds", 7, "Alternating timing rounds of "
                     "the exported SavedModels.")
flags.DEFINE_integer("seeds", 5, "Calibration seeds.")
flags.DEFINE_integer("calibration_windows", 32, "Windows of 128 bytes.")
flags.DEFINE_integer("finetune_steps", 300, "Fine-tuning budget (steps).")
flags.DEFINE_float("finetune_lr", 1e-4, "Fine-tuning learning rate (the "
                   "reference run ended its cosine schedule at 1.5e-4).")
flags.DEFINE_integer("finetune_batch", 16, "Fine-tuning batch (as trained).")
flags.DEFINE_string("out", None, "JSON path (default: results/).")

RESULTS = os.path.join(os.path.dirname(__file__), "results")
CHECKPOINT = os.path.join(RESULTS, "moe_lm_reference.weights.h5")
METHODS = ("magnitude", "wanda", "moe_pruner", "sparsegpt", "sparsegpt_refit",
           "router_obs_no_refit", "router_obs")
# The ablation rows: a method of prune_moe with its refit switched.
VARIANTS = {"sparsegpt_refit": dict(method="sparsegpt", refit=True),
            "router_obs_no_refit": dict(method="router_obs", refit=False)}
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
      report = prune_moe(model, calib, verbose=0, **_pattern_args(pattern),
                         **VARIANTS.get(method, {"method": method}))
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
    obs, gpt = by_seed("router_obs"), by_seed("sparsegpt")
    entry["router_obs_beats_sparsegpt_seeds"] = sum(
        obs[s] < gpt[s] for s in range(seeds))
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

  def tune(name, prune, distill, method="moe_pruner"):
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
      pruner = MoEPruner(calib, method=method, sparsity=0.5)
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
  tune("router_obs_distilled", prune=True, distill=True, method="router_obs")
  strip_pruning(model)
  model.set_weights(dense_weights)
  bar = results["dense_finetuned"]["ppl_after"]
  for name in ("pruned_finetuned", "pruned_distilled",
               "router_obs_distilled"):
    pruned = results[name]["ppl_before"]
    results[name]["gap_closed"] = ((pruned - results[name]["ppl_after"])
                                   / (pruned - bar))
  return results


def _saved_model_stats(models: dict, x, rounds: int) -> dict:
  """name -> SavedModel bytes and its `serve` latency (min over rounds,
  the models alternating round by round)."""
  import tensorflow as tf
  out, loaded = {}, {}
  with tempfile.TemporaryDirectory() as tmp:
    for name, model in models.items():
      path = os.path.join(tmp, name)
      model.export(path, format="tf_saved_model", verbose=False)
      size = sum(os.path.getsize(os.path.join(d, f))
                 for d, _, files in os.walk(path) for f in files)
      loaded[name] = tf.saved_model.load(path)
      out[name] = {"saved_model_bytes": size, "latency_ms": []}
    for _ in range(rounds):
      for name, served in loaded.items():
        served.serve(x)  # warm
        start = time.perf_counter()
        for _ in range(5):
          served.serve(x)
        out[name]["latency_ms"].append(
            (time.perf_counter() - start) / 5 * 1e3)
  for entry in out.values():
    entry["latency_min_ms"] = min(entry["latency_ms"])
  return out


def experts_part(model, data, dense_weights, seeds):
  import keras
  import numpy as np
  from tfopt.pruning import prune_experts, reference_lm
  x_eval, y_eval = data.eval_windows()
  model.set_weights(dense_weights)
  dense_ppl = reference_lm.perplexity(model, x_eval, y_eval)
  configs = [(m, False) for m in ("reap", "frequency", "random")] + \
      [("reap", True)]
  runs = [(frac, m, merge, s) for frac in (0.25, 0.5)
          for m, merge in configs for s in range(seeds)]
  bar = keras.utils.Progbar(len(runs), unit_name="run")
  rows, shrunk = [], {}
  for i, (frac, method, merge, seed) in enumerate(runs):
    calib, _ = data.windows(FLAGS.calibration_windows, seed=1000 + seed)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      new, report = prune_experts(model, calib, keep=1 - frac,
                                  method=method, merge=merge, seed=seed,
                                  min_tokens=0)
    ppl = reference_lm.perplexity(new, x_eval, y_eval)
    rows.append({"removed": frac, "method": method, "merge": merge,
                 "seed": seed, "ppl_ratio": ppl / dense_ppl,
                 "params": report.params_after,
                 "params_dense": report.params_before})
    if seed == 0 and method == "reap" and not merge:
      shrunk[f"removed_{round(frac * 100)}"] = new
    bar.update(i + 1)
  summary = {}
  for frac in (0.25, 0.5):
    for method, merge in configs:
      r = [row["ppl_ratio"] for row in rows if row["removed"] == frac and
           row["method"] == method and row["merge"] == merge]
      summary[f"{round(frac * 100)}% {method}{' + merge' if merge else ''}"] \
          = {"mean_ratio": statistics.mean(r), "min": min(r), "max": max(r)}
  x = np.asarray(x_eval[:8])
  exported = _saved_model_stats({"dense": model, **shrunk}, x,
                                FLAGS.latency_rounds)
  mixtral = _mixtral_rows()
  return {"dense_ppl": dense_ppl, "runs": rows, "summary": summary,
          "saved_models": exported, "mixtral": mixtral}


def _mixtral_rows():
  """A tiny random-weight keras-hub Mixtral backbone with 25 % / 50 % of
  its experts removed by REAP: parameters, SavedModel bytes, latency, and
  the output's change relative to dense."""
  import keras
  import numpy as np
  from keras_hub.src.models.mixtral.mixtral_backbone import MixtralBackbone
  from tfopt.pruning import prune_experts
  keras.utils.set_random_seed(0)
  backbone = MixtralBackbone(vocabulary_size=256, num_layers=2,
                             num_query_heads=4, num_key_value_heads=2,
                             hidden_dim=128, intermediate_dim=256,
                             num_experts=8, top_k=2)
  rng = np.random.default_rng(0)
  data = {"token_ids": rng.integers(1, 256, (32, 64)).astype("int32"),
          "padding_mask": np.ones((32, 64), "int32")}
  probe = {k: v[:8] for k, v in data.items()}
  dense_out = backbone.predict(probe, verbose=0)
  models, rows = {"dense": backbone}, {}
  for frac in (0.25, 0.5):
    new, report = prune_experts(backbone, data, keep=1 - frac, min_tokens=0)
    out = new.predict(probe, verbose=0)
    name = f"removed_{round(frac * 100)}"
    models[name] = new
    rows[name] = {"params": report.params_after,
                  "params_dense": report.params_before,
                  "relative_output_change": float(
                      np.linalg.norm(out - dense_out) /
                      np.linalg.norm(dense_out))}
  exported = _saved_model_stats(models, probe, FLAGS.latency_rounds)
  return {"rows": rows, "saved_models": exported}


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
                         "finetune_batch", "experts")})
  if "prune" in FLAGS.parts:
    dense_ppl, rows, export_ratio = prune_part(model, data, dense_weights,
                                               FLAGS.seeds)
    out.update(dense_ppl=dense_ppl, runs=rows,
               summary=summarize(rows, FLAGS.seeds),
               export_ratio_50=export_ratio)
    print(f"\ndense perplexity {dense_ppl:.3f}; perplexity / dense "
          f"(mean of {FLAGS.seeds} seeds; min-max)")
    print(f"{'pattern':8s}" + "".join(f"{m:>22s}" for m in METHODS)
          + "   MoE-Pruner < Wanda   router-OBS < SparseGPT")
    for pattern, entry in out["summary"].items():
      cells = "".join(
          f"{entry[m]['mean_ratio']:8.3f} ({entry[m]['min']:.3f}-"
          f"{entry[m]['max']:.3f})" for m in METHODS)
      print(f"{pattern:8s}{cells}   {entry['moe_pruner_beats_wanda_seeds']}"
            f"/{FLAGS.seeds} seeds"
            f"   {entry['router_obs_beats_sparsegpt_seeds']}/{FLAGS.seeds}")
    print(f"sparse export at 50 %: {export_ratio:.3f}x the dense fp32 "
          "expert bytes")
  if "experts" in FLAGS.parts:
    out["experts"] = experts_part(model, data, dense_weights, FLAGS.seeds)
    for name, entry in out["experts"]["summary"].items():
      print(f"experts {name:18s} perplexity / dense "
            f"{entry['mean_ratio']:.3f} ({entry['min']:.3f}-"
            f"{entry['max']:.3f})")
    for where, exported in (("reference LM", out["experts"]["saved_models"]),
                            ("Mixtral", out["experts"]["mixtral"][
                                "saved_models"])):
      dense = exported["dense"]
      for name, entry in exported.items():
        print(f"{where:12s} {name:11s} SavedModel "
              f"{entry['saved_model_bytes'] / 1e6:6.2f} MB "
              f"({entry['saved_model_bytes'] / dense['saved_model_bytes']:.2f}"
              f"x)  latency {entry['latency_min_ms']:7.2f} ms "
              f"({entry['latency_min_ms'] / dense['latency_min_ms']:.2f}x)")
  if "distill" in FLAGS.parts:
    out["distillation"] = distill_part(model, data, dense_weights)
    out["finetune_steps"] = FLAGS.finetune_steps
    out["finetune_lr"] = FLAGS.finetune_lr
    out["finetune_batch"] = FLAGS.finetune_batch
    for name in ("pruned_finetuned", "pruned_distilled",
                 "router_obs_distilled"):
      print(f"{name}: gap closed {out['distillation'][name]['gap_closed']:.1%}")
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1)
  os.replace(path + ".tmp", path)
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
