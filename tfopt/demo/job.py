"""The demo's four stages in order, and their built-in settings.

`run(cfg, out_dir, say)` runs search, train, prune and export with `cfg`
(`DEFAULTS`, or `QUICK` for the test-sized job) and writes the report;
`say` prints a progress line (the CLI adds the elapsed time).
"""

from __future__ import annotations

import copy
import os
import platform
import time

from tfopt.demo import prune as prune_stage
from tfopt.demo import report as report_io
from tfopt.demo import search as search_stage
from tfopt.demo import serve as serve_stage
from tfopt.demo import text
from tfopt.demo import train as train_stage

# What `make demo` runs (2-core CPU: about 4 minutes).
DEFAULTS = {
    "seed": 0,
    "text": {"examples": 640, "held_out": 64, "sequence_length": 32,
             "merges": 200},
    "search": {
        "model": {"hidden_dim": 128, "num_query_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 32},
        "space": {"layers": (1, 2), "experts": (2, 4), "top_k": (1, 2),
                  "expert_width": (64, 128)},
        # The analyst's domain knowledge: with top-1 routing a token gets
        # one expert's view and the router no gradient from the others'.
        "constraint": ("remove", "top_k", "k1"),
        "constraint_why": "top-1 routing trains the router on one "
                          "expert's output only",
        "epochs": 6, "batch_size": 16, "learning_rate": 3e-3,
        "tolerance": 0.03,
    },
    "train": {
        "cap_share": 0.8,
        "server_allowance_bytes": 320 << 20,
        "kill_after_step": 230,
        # 3 epochs of the 640 paragraphs in batches of 4.
        "job": {"tasks": 3, "epochs": 3, "steps_per_epoch": 160,
                "batch_size": 4, "learning_rate": 2e-3,
                "weight_decay": 0.05, "checkpoint_every": 50, "seed": 0},
        "launch": {"max_restarts": 2, "backoff_s": 0.5,
                   "heartbeat_timeout_s": 30.0, "min_stuck_s": 120.0,
                   "startup_timeout_s": 600.0},
    },
    "prune": {"sparsity": 0.5, "calibration_examples": 128,
              "distill_epochs": 2, "batch_size": 16, "learning_rate": 1e-3},
    "export": {"requests": 4},
}

# The test's job: the same stages, smaller (a few minutes).
QUICK = {
    "text": {"examples": 192, "held_out": 32},
    "search": {"epochs": 3},
    "train": {"kill_after_step": 30,
              "job": {"epochs": 2, "steps_per_epoch": 24,
                      "checkpoint_every": 20}},
    "prune": {"calibration_examples": 64, "distill_epochs": 1},
}


def merged(base: dict, override: dict) -> dict:
  """`base` with `override`'s entries, nested dicts merged key by key."""
  out = copy.deepcopy(base)
  for key, value in override.items():
    if isinstance(value, dict) and isinstance(out.get(key), dict):
      out[key] = merged(out[key], value)
    else:
      out[key] = copy.deepcopy(value)
  return out


def run(cfg: dict, out_dir: str, say) -> tuple[dict, str]:
  """The four stages; returns the report and the HTML page's path."""
  start = time.time()
  t = cfg["text"]
  say(f"data: pydoc topics, a byte-level BPE of {t['merges']} merges, "
      f"{t['examples']} training paragraphs")
  splits = text.demo_splits(t["examples"], t["sequence_length"], t["merges"],
                            t["held_out"])
  search_cfg = dict(cfg["search"], seed=cfg["seed"],
                    sequence_length=t["sequence_length"])
  report = {"machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "config": cfg,
            "data": {"vocabulary": len(splits.vocabulary),
                     "train_tokens": splits.train.tokens,
                     "held_out_tokens": splits.held_out.tokens}}
  report["search"] = search_stage.run(splits, search_cfg,
                                      os.path.join(out_dir, "search"), say)
  model_path = report["search"]["exported"]
  train = train_stage.run(splits, model_path, cfg["train"],
                          os.path.join(out_dir, "train"), say)
  train["curves_png"] = os.path.join(out_dir, "train", "curves.png")
  report_io.curves_png(train["curves_png"], train)
  report["train"] = train
  prune, pruned = prune_stage.run(splits, model_path, train["final_weights"],
                                  cfg["prune"],
                                  os.path.join(out_dir, "prune"), say)
  prune["sparsity_png"] = os.path.join(out_dir, "prune", "sparsity.png")
  report_io.sparsity_png(prune["sparsity_png"], prune)
  report["prune"] = prune
  report["export"] = serve_stage.run(splits, pruned, cfg["export"],
                                     os.path.join(out_dir, "export"), say)
  report["seconds"] = time.time() - start
  _, page = report_io.write(report, out_dir)
  return report, page
