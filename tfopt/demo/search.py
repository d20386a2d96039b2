"""Stage 1 of the demo: one-shot NAS over the LM's shape, steered.

A `tfopt.nas.moe_lm` super-network (every Qwen3-MoE shape of the space
sharing one set of weights) trains once, a random sub-network per step,
under the analyst's constraint; every sub-network is then ranked by its
held-out perplexity under the shared weights. The choice: the smallest
admitted sub-network whose perplexity is within `tolerance` of the best
admitted one (a team wants the cheapest model that is about as good). It
is exported as a standalone keras-hub `Qwen3MoeCausalLM` (`.keras`) and
checked to compute what the super-network's path computes.
"""

from __future__ import annotations

import math
import os
import time

import keras
import numpy as np

from tfopt.demo.text import Splits


def run(splits: Splits, cfg: dict, out_dir: str, say) -> dict:
  """Runs the stage; returns its report entry (figures, file names)."""
  from tfopt.nas import Constraints, PathSampler, views  # pylint: disable=g-import-not-at-top
  from tfopt.nas import moe_lm  # pylint: disable=g-import-not-at-top
  start = time.time()
  os.makedirs(out_dir, exist_ok=True)
  space = moe_lm.moe_lm_space(
      len(splits.vocabulary), sequence_length=cfg["sequence_length"],
      **cfg["model"], **cfg["space"])
  constraints = Constraints()
  action, layer, op = cfg["constraint"]
  getattr(constraints, f"{action}_op" if action == "remove" else
          "lock_layer")(space, layer, op)
  net = moe_lm.MoELMSuperNet(space, seed=cfg["seed"])
  net.compile(optimizer=keras.optimizers.Adam(cfg["learning_rate"]),
              loss=keras.losses.SparseCategoricalCrossentropy(
                  from_logits=True))
  sampler = PathSampler(constraints=constraints, seed=cfg["seed"])
  say(f"search: training the super-network ({space.size} sub-networks "
      f"share its weights; {constraints_text(cfg['constraint'])}) for "
      f"{cfg['epochs']} epochs")
  history = net.fit(**splits.train.fit_kwargs(), batch_size=cfg["batch_size"],
                    epochs=cfg["epochs"], callbacks=[sampler],
                    verbose=2 if cfg.get("verbose") else 0).history
  say("search: ranking every sub-network by held-out perplexity")
  val = splits.validation
  ranking = moe_lm.rank_lm(net, val.x, val.y, val.sample_weight,
                           constraints=constraints)
  chosen = choose(ranking, cfg["tolerance"])
  child = net.subnet(chosen)
  net.set_arch(chosen)
  probe = {k: v[:4] for k, v in val.x.items()}
  agree = float(np.max(np.abs(net.predict(probe, verbose=0) -
                              child.predict(probe, verbose=0))))
  path = os.path.join(out_dir, "chosen.keras")
  child.save(path)
  archs = [a for a, _ in ranking.perplexity]
  scores = [-math.log(p) for _, p in ranking.perplexity]
  status = views.statuses(space, archs, constraints)
  coords = views.hamming_mds(space, archs)
  plot = os.path.join(out_dir, "nas_scatter.png")
  views.scatter_png(plot, space, archs, coords, scores, status,
                    title="one-shot NAS: Qwen3-MoE LM shapes",
                    overwrite=True, metric="log-likelihood per token")
  best = ranking.perplexity[0]
  perplexity = dict(ranking.perplexity)
  say(f"search: chose {space.describe(chosen)} "
      f"({ranking.params[chosen]:,} parameters, perplexity "
      f"{perplexity[chosen]:.2f}; best admitted "
      f"{perplexity[ranking.top()[0]]:.2f})")
  return {
      "space": {layer.name: layer.op_names for layer in space.layers},
      "sub_networks": space.size,
      "constraint": {"action": action, "layer": layer, "op": op,
                     "why": cfg["constraint_why"],
                     "excluded": len(ranking.excluded)},
      "supernet_epochs": cfg["epochs"],
      "supernet_loss": [float(v) for v in history["loss"]],
      "sampled": {space.describe(a): n for a, n in sampler.counts.items()},
      "ranking": [{"arch": space.describe(a), "perplexity": p,
                   "params": ranking.params[a],
                   "excluded": a in ranking.excluded}
                  for a, p in ranking.perplexity],
      "best_overall": {"arch": space.describe(best[0]),
                       "perplexity": best[1]},
      "rule": f"the smallest admitted sub-network within "
              f"{100 * cfg['tolerance']:g} % of the best admitted "
              f"perplexity",
      "chosen": {"arch": space.describe(chosen),
                 "config": moe_lm.backbone_config(space, chosen),
                 "params": ranking.params[chosen],
                 "perplexity": perplexity[chosen]},
      "exported": path,
      "export_max_abs_diff": agree,
      "scatter_png": plot,
      "seconds": time.time() - start,
  }


def constraints_text(constraint) -> str:
  action, layer, op = constraint
  return (f"the analyst removed {layer}={op}" if action == "remove" else
          f"the analyst locked {layer}={op}")


def choose(ranking, tolerance: float):
  """The smallest admitted architecture whose perplexity is within
  `tolerance` (a fraction) of the best admitted one; ties by perplexity."""
  admitted = [(a, p) for a, p in ranking.perplexity
              if a not in ranking.excluded]
  if not admitted:
    raise ValueError("The constraints exclude every sub-network.")
  best = admitted[0][1]
  near = [(ranking.params[a], p, a) for a, p in admitted
          if p <= best * (1 + tolerance)]
  return min(near)[2]
