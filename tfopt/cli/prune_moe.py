"""Prune the reference MoE language model with each method, distil, report.

    tfopt-prune-moe --methods=magnitude,wanda,moe_pruner,sparsegpt \
        --sparsity=0.5 --distill_steps=300 --export_dir=/tmp/moe_sparse

loads the reference model (benchmarks/results/moe_lm_reference.weights.h5,
committed; trained with `--train_steps` when the file is missing and
`--train` is given), prunes a copy with each method on calibration windows
of the training text, and prints held-out perplexity and its ratio to the
dense model. Expected on that command (seed 0): dense 3.823, magnitude
1.087x, wanda 1.062x, moe_pruner 1.053x, sparsegpt 1.027x; with
`--distill_steps=300` the MoE-Pruner model is fine-tuned with expert-wise
distillation (AdamW 1e-4, cosine to 0, batch 16) to about 3.86, as in
benchmarks/results/moe_pruning.json.
`--pattern=2:4` prunes N:M instead. `--export_dir` writes the MoE-Pruner
result as a sparse export, `--saved_model` as a SavedModel for serving.
`--json` prints one JSON object.
"""

from __future__ import annotations

import json
import os
import re
import warnings

from absl import app, flags
from tfopt.cli._main import run_main

from tfopt.cli._config import apply_config, define_config_flag

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.pruning.methods import METHODS

# The committed reference model, relative to a clone's root (where README's
# commands run); elsewhere give --checkpoint, or --train to make one.
DEFAULT_CHECKPOINT = os.path.join("benchmarks", "results",
                                  "moe_lm_reference.weights.h5")

FLAGS = flags.FLAGS
define_config_flag()
flags.DEFINE_string("checkpoint", DEFAULT_CHECKPOINT,
                    "Reference model weights (.weights.h5).")
flags.DEFINE_bool("train", False, "Train the reference model when "
                  "--checkpoint does not exist (and save it there).")
flags.DEFINE_integer("train_steps", 3000, "Steps when training.")
flags.DEFINE_list("methods", list(METHODS), f"Any of {', '.join(METHODS)}.")
flags.DEFINE_float("sparsity", 0.5, "Unstructured sparsity in [0, 1).")
flags.DEFINE_string("pattern", None, 'N:M pattern such as "2:4" (instead '
                    "of --sparsity).")
flags.DEFINE_integer("calibration_windows", 32, "Calibration windows.")
flags.DEFINE_integer("eval_windows", 128, "Held-out windows for perplexity.")
flags.DEFINE_integer("seed", 0, "Calibration seed.")
flags.DEFINE_integer("distill_steps", 0, "Expert-wise distillation steps for "
                     "the moe_pruner model (0: none).")
flags.DEFINE_string("export_dir", None, "Sparse export of the moe_pruner "
                    "model.")
flags.DEFINE_string("saved_model", None, "SavedModel of the moe_pruner model.")
flags.DEFINE_bool("overwrite", False, "Replace existing exports.")
flags.DEFINE_bool("json", False, "Print one JSON object.")


def _check_flags():
  unknown = [m for m in FLAGS.methods if m not in METHODS]
  if unknown or not FLAGS.methods:
    raise app.UsageError(f"--methods must be a non-empty list of "
                         f"{', '.join(METHODS)}. Received: {unknown or '[]'}")
  if FLAGS.pattern is None and not 0.0 <= FLAGS.sparsity < 1.0:
    raise app.UsageError(f"--sparsity must be in [0, 1). Received: "
                         f"{FLAGS.sparsity}")
  if FLAGS.pattern is not None and not re.fullmatch(r"\d+:\d+",
                                                    FLAGS.pattern):
    raise app.UsageError(f'--pattern must be N:M such as "2:4". Received: '
                         f"{FLAGS.pattern}")
  for name in ("calibration_windows", "eval_windows"):
    if getattr(FLAGS, name) <= 0:
      raise app.UsageError(f"--{name} must be a positive integer. "
                           f"Received: {getattr(FLAGS, name)}")
  if not os.path.exists(FLAGS.checkpoint) and not FLAGS.train:
    raise app.UsageError(f"--checkpoint {FLAGS.checkpoint} does not exist; "
                         "pass --train to train the reference model there "
                         f"({FLAGS.train_steps} steps, ~10 min on 2 CPUs).")
  for name in ("export_dir", "saved_model"):
    path = getattr(FLAGS, name)
    if path and os.path.exists(path) and not FLAGS.overwrite:
      raise app.UsageError(f"--{name} {path} exists; pass --overwrite to "
                           "replace it.")


def main(argv):
  del argv
  apply_config()
  _check_flags()
  import keras  # pylint: disable=import-outside-toplevel
  from tfopt.pruning import (ExpertDistiller, export_saved_model,  # pylint: disable=import-outside-toplevel
                             export_sparse, install_masks, prune_moe,
                             reference_lm, strip_pruning)
  model, _ = reference_lm.load_or_train(FLAGS.checkpoint,
                                        steps=FLAGS.train_steps,
                                        train_if_missing=FLAGS.train)
  data = reference_lm.corpus()
  dense = model.get_weights()
  x_eval, y_eval = data.eval_windows(FLAGS.eval_windows)
  calib, _ = data.windows(FLAGS.calibration_windows, seed=1000 + FLAGS.seed)
  dense_ppl = reference_lm.perplexity(model, x_eval, y_eval)
  rows = []
  kept = None
  for method in FLAGS.methods:
    model.set_weights(dense)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      report = prune_moe(model, calib, method=method,
                         sparsity=None if FLAGS.pattern else FLAGS.sparsity,
                         pattern=FLAGS.pattern, verbose=0)
    ppl = reference_lm.perplexity(model, x_eval, y_eval)
    rows.append({"method": method, "pattern": str(report.pattern),
                 "ppl": ppl, "ppl_ratio": ppl / dense_ppl,
                 "prune_seconds": report.seconds,
                 "sparsity": report.sparsity})
    if method == "moe_pruner":
      kept = (model.get_weights(), report.masks)
  out = {"dense_ppl": dense_ppl, "runs": rows}
  if kept is not None and (FLAGS.distill_steps or FLAGS.export_dir
                           or FLAGS.saved_model):
    model.set_weights(kept[0])
    install_masks(model, kept[1])
    if FLAGS.distill_steps:
      teacher = reference_lm.build(steps=1)
      teacher.set_weights(dense)
      lr = keras.optimizers.schedules.CosineDecay(1e-4, FLAGS.distill_steps)
      model.compile(keras.optimizers.AdamW(lr, weight_decay=0.0),
                    keras.losses.SparseCategoricalCrossentropy(
                        from_logits=True), jit_compile=True)
      distiller = ExpertDistiller(teacher)
      reference_lm.train(model, data, FLAGS.distill_steps, batch_size=16,
                         seed=7,
                         verbose=0 if FLAGS.json else 1,
                         callbacks=[distiller])
      out["distilled_ppl"] = reference_lm.perplexity(model, x_eval, y_eval)
      out["distill_lambda"] = distiller.lambda_value
    if FLAGS.export_dir:
      out["export_ratio"] = export_sparse(model, kept[1], FLAGS.export_dir,
                                          overwrite=FLAGS.overwrite)["ratio"]
    if FLAGS.saved_model:
      if FLAGS.overwrite and os.path.exists(FLAGS.saved_model):
        import shutil  # pylint: disable=import-outside-toplevel
        shutil.rmtree(FLAGS.saved_model)
      export_saved_model(model, FLAGS.saved_model)
      out["saved_model"] = FLAGS.saved_model
    strip_pruning(model)
  if FLAGS.json:
    print(json.dumps(out))
    return 0
  print(f"dense perplexity {dense_ppl:.3f} on {y_eval.size} held-out bytes")
  print(f"{'method':12s} {'pattern':8s} {'perplexity':>10s} {'/ dense':>8s} "
        f"{'seconds':>8s}")
  for r in rows:
    print(f"{r['method']:12s} {r['pattern']:8s} {r['ppl']:10.3f} "
          f"{r['ppl_ratio']:8.3f} {r['prune_seconds']:8.2f}")
  if "distilled_ppl" in out:
    print(f"moe_pruner after {FLAGS.distill_steps} distillation steps: "
          f"{out['distilled_ppl']:.3f} (lambda {out['distill_lambda']:.3g})")
  if "export_ratio" in out:
    print(f"sparse export: {FLAGS.export_dir} ({out['export_ratio']:.3f}x "
          "the dense fp32 expert bytes)")
  if "saved_model" in out:
    print(f"SavedModel: {FLAGS.saved_model}")
  return 0


def run() -> None:
  """The console script's entry point."""
  run_main(main, __doc__)


if __name__ == "__main__":
  run()
