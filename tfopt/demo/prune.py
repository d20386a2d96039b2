"""Stage 3 of the demo: MoE-Pruner at 50 %, then expert-wise distillation.

The trained model (stage 2's final weights) is the dense teacher. A copy
is pruned one-shot by MoE-Pruner's |W| x |X| x router-gate metric on
calibration tokens from the training text (`tfopt.pruning.prune_moe`,
masks installed so the zeros stay), then fine-tuned a few steps with
`ExpertDistiller`: each expert of the pruned model pulled toward the same
expert of the dense one on the tokens routed to it. Perplexities of the
dense, pruned and distilled models on held-out text; sparsity per expert
counted from the weights.
"""

from __future__ import annotations

import os
import time

import keras
import numpy as np

from tfopt.demo.text import Splits


def load_trained(model_path: str, weights_path: str):
  """The chosen architecture with stage 2's trained weights."""
  import keras_hub  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  model = keras.saving.load_model(model_path, compile=False)
  model.load_weights(weights_path)
  return model


def run(splits: Splits, model_path: str, weights_path: str, cfg: dict,
        out_dir: str, say) -> dict:
  """Runs the stage; returns its report entry and the distilled model."""
  from tfopt.nas.moe_lm import token_perplexity  # pylint: disable=g-import-not-at-top
  from tfopt.pruning import ExpertDistiller, prune_moe, strip_pruning  # pylint: disable=g-import-not-at-top
  start = time.time()
  os.makedirs(out_dir, exist_ok=True)
  held = splits.held_out

  def ppl(model):
    return token_perplexity(model, held.x, held.y, held.sample_weight)

  dense = load_trained(model_path, weights_path)
  student = load_trained(model_path, weights_path)
  calibration = splits.train.take(slice(0, cfg["calibration_examples"]))
  say(f"prune: MoE-Pruner at {100 * cfg['sparsity']:g} % on "
      f"{calibration.tokens:,} calibration tokens")
  report = prune_moe(student, calibration.x, sparsity=cfg["sparsity"],
                     method="moe_pruner", install=True)
  pruned_ppl = ppl(student)
  say(f"prune: expert-wise distillation from the dense model, "
      f"{cfg['distill_epochs']} epochs")
  student.compile(optimizer=keras.optimizers.Adam(cfg["learning_rate"]),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
  distiller = ExpertDistiller(dense)
  history = student.fit(**splits.train.fit_kwargs(),
                        batch_size=cfg["batch_size"],
                        epochs=cfg["distill_epochs"], callbacks=[distiller],
                        shuffle=False, verbose=0).history
  figures = {
      "method": "moe_pruner", "target_sparsity": cfg["sparsity"],
      "calibration_tokens": calibration.tokens,
      "perplexity": {"dense": ppl(dense), "pruned": pruned_ppl,
                     "distilled": ppl(student)},
      "distill_lambda": distiller.lambda_value,
      "distill_loss": [float(v) for v in history["loss"]],
      "sparsity_per_expert": expert_sparsity(student),
      "prune_seconds": report.seconds,
  }
  p = figures["perplexity"]
  figures["gap_closed"] = ((p["pruned"] - p["distilled"]) /
                           (p["pruned"] - p["dense"])
                           if p["pruned"] > p["dense"] else None)
  figures["sparsity"] = float(np.mean([v for layer in
                                       figures["sparsity_per_expert"].values()
                                       for v in layer]))
  say(f"prune: perplexity dense {p['dense']:.2f}, pruned {p['pruned']:.2f}, "
      f"distilled {p['distilled']:.2f}; expert weights "
      f"{100 * figures['sparsity']:.1f} % zero")
  figures["model"] = os.path.join(out_dir, "pruned.keras")
  strip_pruning(student)  # the zeros stay; the masks' constraints go
  student.save(figures["model"])
  figures["seconds"] = time.time() - start
  return figures, student


def expert_sparsity(model) -> dict:
  """{MoE block: [share of zeros in expert e's kernels, ...]}, counted
  from the weights themselves."""
  from tfopt.pruning.adapters import adapter_for, find_moe_layers  # pylint: disable=g-import-not-at-top
  out = {}
  for layer in find_moe_layers(model):
    kernels = [keras.ops.convert_to_numpy(k.variable)
               for k in adapter_for(layer).kernels(layer)]
    experts = kernels[0].shape[0]
    out[layer.path] = [
        float(sum((k[e] == 0).sum() for k in kernels) /
              sum(k[e].size for k in kernels)) for e in range(experts)]
  return out
