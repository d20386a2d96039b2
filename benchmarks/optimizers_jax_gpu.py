"""apply_gradients step time on Keras' JAX backend (for a GPU machine).

    KERAS_BACKEND=jax python -m benchmarks.optimizers_jax_gpu   # < 5 min on a GPU

Needs only Keras, JAX and NumPy (no TensorFlow, no OR-Tools, no absl), so it
runs on a JAX-only accelerator machine. The same comparison as
`benchmarks.optimizers --parts=overhead`: each Cautious optimizer (CWD on)
against its Keras twin, with fixed gradients, through
`optimizer.stateless_apply` under `jax.jit`, steps interleaved in blocks,
median per-step time (`block_until_ready`). Prints a table and writes
benchmarks/results/optimizers_jax_<platform>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")


def _stepper(model, make):
  import jax
  import numpy as np
  variables = model.trainable_variables
  opt = make()
  opt.build(variables)
  rng = np.random.default_rng(0)
  grads = [jax.numpy.asarray(rng.normal(scale=1e-3, size=v.shape)
                             .astype("float32")) for v in variables]
  state = {"t": [v.value for v in variables],
           "o": [v.value for v in opt.variables]}

  @jax.jit
  def apply(o, g, t):
    return opt.stateless_apply(o, g, t)

  def step():
    state["t"], state["o"] = apply(state["o"], grads, state["t"])
    jax.block_until_ready(state["t"])

  return step


def _time(steppers, steps, block=10):
  for s in steppers:
    for _ in range(3):
      s()
  times = [[] for _ in steppers]
  for _ in range(max(1, steps // block)):
    for i, s in enumerate(steppers):
      for _ in range(block):
        t0 = time.perf_counter()
        s()
        times[i].append(time.perf_counter() - t0)
  return [statistics.median(t) for t in times]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)
  import jax
  import keras
  from benchmarks._models import MODELS, optimizer_pairs
  if keras.backend.backend() != "jax":
    sys.exit("Run with KERAS_BACKEND=jax.")
  platform = jax.devices()[0].platform
  rows = []
  for model_name, build in MODELS.items():
    keras.utils.set_random_seed(0)
    model = build()
    for name, ours, theirs in optimizer_pairs():
      t_ours, t_keras = _time([_stepper(model, ours), _stepper(model, theirs)],
                              args.steps)
      rows.append({"model": model_name, "optimizer": name,
                   "ours_ms": t_ours * 1e3, "keras_ms": t_keras * 1e3,
                   "ratio": t_ours / t_keras})
      print(f"{model_name:18s} {name:6s} ours {t_ours * 1e3:8.3f} ms  "
            f"keras {t_keras * 1e3:8.3f} ms  x{t_ours / t_keras:.3f}",
            flush=True)
  out = args.out or os.path.join(os.path.dirname(__file__), "results",
                                 f"optimizers_jax_{platform}.json")
  os.makedirs(os.path.dirname(out), exist_ok=True)
  with open(out + ".tmp", "w", encoding="utf-8") as f:
    json.dump({"platform": platform, "device": str(jax.devices()[0]),
               "jax": jax.__version__, "keras": keras.__version__,
               "steps": args.steps, "overhead": rows}, f, indent=1)
  os.replace(out + ".tmp", out)
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
