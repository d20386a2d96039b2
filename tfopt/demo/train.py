"""Stage 2 of the demo: the chosen model trained placed and fault-tolerant.

The job (`tfopt.demo.train_worker`) runs twice under `tfopt.scale.launch`:
once as is, once with a `kill_task` fault (the launcher asks the worker
to kill one of its server tasks after a step). The faulted job's worker
sees the task die, exits, is restarted from the last checkpoint, starts
new tasks, places the step again and trains on. Its stitched trajectory
(the launcher's step log: lost, repeated and recomputed steps) is compared
with the unfaulted run's, step by step.

Sizes: the cap per device is `cap_share` (below 1) of the training state
(weights and CautiousAdamW's two slots), so no single task can hold the
model's state, let alone its step (the step's one-device peak, the
analytic liveness peak `tfopt.compile` computes, is reported beside it);
each task's OS limit is the cap plus TensorFlow's own footprint in a
server process (`server_allowance_bytes`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import numpy as np

from tfopt.demo.text import Splits


def run(splits: Splits, model_path: str, cfg: dict, out_dir: str,
        say) -> dict:
  """Runs the stage; returns its report entry."""
  from tfopt.scale.launch import launch  # pylint: disable=g-import-not-at-top
  start = time.time()
  os.makedirs(out_dir, exist_ok=True)
  data = os.path.join(out_dir, "train.npz")
  train = splits.train
  np.savez(data, token_ids=train.x["token_ids"],
           padding_mask=train.x["padding_mask"], y=train.y,
           sample_weight=train.sample_weight)
  sizes = step_sizes(model_path, splits, cfg)
  if not 0 < cfg["cap_share"] < 1:
    raise ValueError(
        f"Argument `cap_share` must be in (0, 1): a device's cap is that "
        f"share of the model's training state. Received: "
        f"cap_share={cfg['cap_share']}")
  runs = {}
  for name, faults in (("clean", []),
                       ("faulted", [f"kill_task:0:{cfg['kill_after_step']}"])):
    run_dir = os.path.join(out_dir, name)
    if os.path.exists(run_dir):
      shutil.rmtree(run_dir)  # the demo's own output from an earlier run
    spec = dict(cfg["job"], model=os.path.abspath(model_path),
                data=os.path.abspath(data),
                out_dir=os.path.join(run_dir, "out"),
                cap_bytes=sizes["cap_bytes"],
                os_limit_bytes=sizes["cap_bytes"] +
                cfg["server_allowance_bytes"])
    os.makedirs(spec["out_dir"])
    spec_path = os.path.join(run_dir, "spec.json")
    with open(spec_path, "w", encoding="utf-8") as f:
      json.dump(spec, f, indent=1)
    say(f"train: {name} run on {spec['tasks']} capped server tasks "
        f"({sizes['cap_bytes'] / 1e6:.2f} MB cap each; state "
        f"{sizes['state_bytes'] / 1e6:.2f} MB)" +
        (f", server task killed after step {cfg['kill_after_step']}"
         if faults else ""))
    result = launch([sys.executable, "-m", "tfopt.demo.train_worker",
                     spec_path], workers=1, run_dir=run_dir, faults=faults,
                    **cfg["launch"])
    runs[name] = _summarize(result, spec)
    seconds = runs[name]["step_seconds"]
    runs[name]["mfu"] = {step: sizes["flops_per_step"] / t /
                         sizes["peak_flops"]
                         for step, t in seconds.items() if t > 0}
  clean, faulted = runs["clean"], runs["faulted"]
  steps = sorted(clean["loss"])
  diff = max(abs(faulted["loss"][s] - clean["loss"][s]) /
             max(abs(clean["loss"][s]), 1e-12) for s in steps)
  say(f"train: fault survived ({faulted['failures']}); steps lost "
      f"{faulted['lost']}, repeated {faulted['repeated']}; losses vs the "
      f"run without the fault: max relative difference {diff:.2g}")
  return {"sizes": sizes, "clean": clean, "faulted": faulted,
          "loss_max_rel_diff": diff, "final_weights":
              os.path.join(out_dir, "faulted", "out", "final.weights.h5"),
          "seconds": time.time() - start}


def step_sizes(model_path: str, splits: Splits, cfg: dict) -> dict:
  """The training state, the step's one-device peak and the cap."""
  import keras  # pylint: disable=g-import-not-at-top
  import keras_hub  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from tfopt.compile_placement import one_device_peak  # pylint: disable=g-import-not-at-top
  from tfopt.graph.capture import capture_train_step  # pylint: disable=g-import-not-at-top
  from tfopt.optimizers import CautiousAdamW  # pylint: disable=g-import-not-at-top
  from tfopt.scale.flops import train_step_flops  # pylint: disable=g-import-not-at-top
  from tfopt.scale.mfu import cpu_peak_flops  # pylint: disable=g-import-not-at-top
  model = keras.saving.load_model(model_path, compile=False)
  model.compile(optimizer=CautiousAdamW(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  batch = cfg["job"]["batch_size"]
  train = splits.train.take(slice(0, batch))
  step = capture_train_step(model, data=(train.x, train.y,
                                         train.sample_weight))
  weights = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                for v in model.trainable_variables)
  state = 3 * weights  # weights + CautiousAdamW's m and v
  peak_flops, peak_source = cpu_peak_flops()
  return {"params": model.count_params(), "weights_bytes": weights,
          "flops_per_step": train_step_flops(
              model, train.x, train.y, train.sample_weight).total,
          "peak_flops": peak_flops, "peak_source": peak_source,
          "state_bytes": state,
          "one_device_peak_bytes": one_device_peak(step),
          "cap_bytes": int(cfg["cap_share"] * state),
          "tasks": cfg["job"]["tasks"]}


def _summarize(result, spec: dict) -> dict:
  """The launch's trajectory, failures, goodput, MFU per step and what the
  hook did in each attempt."""
  trajectory = result.trajectory()
  out = spec["out_dir"]
  attempts = []
  for a in result.attempts:
    path = os.path.join(out, f"attempt-{a['attempt']}.json")
    hook = None
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        hook = json.load(f)
    attempts.append({"attempt": a["attempt"],
                     "resumed_from": a.get("resumed_from"),
                     "last_step": a.get("last_step"),
                     "failure": (a.get("failure") or {}).get("kind"),
                     "failure_detail": (a.get("failure") or {}).get("detail"),
                     "faults": a.get("faults", []), "hook": hook})
  return {"ok": result.ok, "steps": trajectory["steps"],
          "loss": {int(k): v for k, v in trajectory["loss"].items()},
          "lost": trajectory["lost"], "repeated": trajectory["repeated"],
          "recomputed": trajectory["recomputed"],
          "failures": [a["failure"] for a in attempts if a["failure"]],
          "attempts": attempts, "goodput": result.goodput(),
          "step_seconds": _step_seconds(result, out)}


def _step_seconds(result, out: str) -> dict:
  """Global step -> seconds of the attempt that made it into the
  trajectory: the n-th timing of an attempt is its n-th logged step."""
  logged: dict = {}
  with open(os.path.join(result.run_dir, "steps", "worker-0.jsonl"),
            encoding="utf-8") as f:
    for line in f:
      try:
        rec = json.loads(line)
      except ValueError:
        continue
      logged.setdefault(rec["attempt"], []).append(rec["step"])
  seconds = {}
  for attempt, steps in logged.items():
    path = os.path.join(out, f"steps-{attempt}.jsonl")
    if not os.path.exists(path):
      continue
    with open(path, encoding="utf-8") as f:
      times = [json.loads(line)["seconds"] for line in f if line.strip()]
    for step, t in zip(steps, times):
      if t is not None:
        seconds[step] = t  # a later attempt's recomputation wins
  return seconds
