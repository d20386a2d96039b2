"""Trains the reference MoE language model of `benchmarks.moe_pruning`.

    python -m benchmarks.moe_reference [--steps=3000] [--out=DIR]   # ~10 min, 2 CPUs

Backend-agnostic Keras 3 (needs only Keras, NumPy and a backend: no
TensorFlow, OR-Tools or absl), so it also runs on a JAX-only accelerator
machine (`KERAS_BACKEND=jax`). Writes DIR/moe_lm_reference.weights.h5 (the
checkpoint the pruning benchmark loads) and DIR/moe_reference.json (loss
curve, held-out perplexity, seconds, backend and device). DIR defaults to
benchmarks/results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=3000)
  parser.add_argument("--batch_size", type=int, default=16)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__),
                                                    "results"))
  args = parser.parse_args(argv)
  import keras
  from tfopt.pruning import reference_lm
  data = reference_lm.corpus()
  model = reference_lm.build(seed=args.seed, steps=args.steps)
  x, y = data.eval_windows()
  curve = []  # (step, held-out perplexity on 32 windows): the plateau

  class Curve(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      if (batch + 1) % max(args.steps // 10, 1) == 0:
        curve.append((batch + 1, reference_lm.perplexity(
            self.model, x[:32], y[:32])))

  start = time.perf_counter()
  history = reference_lm.train(model, data, args.steps, args.batch_size,
                               seed=args.seed, verbose=2,
                               callbacks=[Curve()])
  seconds = time.perf_counter() - start
  ppl = reference_lm.perplexity(model, x, y)
  weights = os.path.join(args.out, "moe_lm_reference.weights.h5")
  reference_lm.save_weights(model, weights)
  device = "cpu"
  if keras.backend.backend() == "jax":
    import jax
    device = str(jax.devices()[0])
  summary = {"steps": args.steps, "batch_size": args.batch_size,
             "seed": args.seed, "seconds": seconds,
             "final_loss": float(history.history["loss"][-1]),
             "eval_perplexity": ppl, "eval_tokens": int(y.size),
             "eval_curve_32_windows": curve,
             "backend": keras.backend.backend(), "device": device,
             "keras": keras.__version__, "model": reference_lm.MODEL_KWARGS}
  with open(os.path.join(args.out, "moe_reference.json"), "w",
            encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
  print(json.dumps(summary), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
