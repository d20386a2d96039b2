"""Cautious Weight Decay optimizers: step-time overhead and convergence.

    python -m benchmarks.optimizers                      # everything, ~10 min
    python -m benchmarks.optimizers --parts=overhead --steps=50

Three parts, each ours vs Keras measured side by side in one process:

overhead       `apply_gradients` time under XLA with fixed gradients, for a
               3.7M-parameter MLP and a 4-layer d=512 Transformer (Keras
               layers, so MultiHeadAttention's 3-D kernels are in): each
               Cautious optimizer (CWD on) against its Keras twin, steps
               interleaved in blocks, median per-step time. Muon is compared
               with routing="keras" (the same work as Keras' Muon); tfopt's
               routing, which orthogonalizes the attention kernels too, is
               reported on its own line.
newton_schulz  time of tfopt's `newton_schulz` vs Keras'
               `Muon.zeropower_via_newtonschulz5` per matrix size (XLA).
convergence    a character-level language model on the Python documentation
               that ships with Python (`pydoc_data.topics`), trained from the
               same initialization with CWD and with plain decoupled decay,
               at several weight decays, 3 seeds each: final training loss
               and accuracy on a fixed set of training batches, weight norm.
               Plot: benchmarks/results/optimizers_convergence.png.

Writes benchmarks/results/optimizers.json. No GPU part here: the JAX-backend
step-time script for a GPU machine is benchmarks/optimizers_jax_gpu.py
(Keras' JAX backend, no TensorFlow needed).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("parts", ["overhead", "newton_schulz", "convergence"],
                  "Which parts to run.")
flags.DEFINE_integer("steps", 200, "Timed apply_gradients steps per optimizer.")
flags.DEFINE_integer("muon_steps", 30, "Timed steps for Muon (~0.7 s each "
                     "on 2 CPU cores; its median is stable well before 200).")
flags.DEFINE_integer("train_steps", 600, "Convergence: training steps per run.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Convergence seeds.")
flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "results",
                                        "optimizers.json"), "Results JSON.")
flags.DEFINE_string("plot", os.path.join(
    os.path.dirname(__file__), "results", "optimizers_convergence.png"),
                    "Convergence plot (PNG).")

# --------------------------------------------------------------------------
# overhead


def _stepper(model, make):
  import numpy as np
  import tensorflow as tf
  variables = model.trainable_variables
  rng = np.random.default_rng(0)
  grads = [tf.constant(rng.normal(scale=1e-3, size=v.shape).astype("float32"))
           for v in variables]
  opt = make()
  opt.build(variables)

  @tf.function(jit_compile=True)
  def step():
    opt.apply(grads, variables)
    return opt.iterations

  return step


def _time_side_by_side(steppers, steps, block=10):
  """Median seconds per step of each stepper, interleaved in blocks.

  Interleaving puts both sides under the same background load, and the
  order flips every round (ABBA); slow steps (Muon, Newton-Schulz) alternate
  one by one (block=1).
  """
  for s in steppers:
    for _ in range(5):
      s().numpy()  # compile + warm up
  times = [[] for _ in steppers]
  order = list(range(len(steppers)))
  for _ in range(max(1, steps // block)):
    for i in order:
      for _ in range(block):
        t0 = time.perf_counter()
        steppers[i]().numpy()
        times[i].append(time.perf_counter() - t0)
    order.reverse()  # ABBA: neither side always runs first
  return [statistics.median(t) for t in times]


def overhead(steps, muon_steps):
  import keras
  from tfopt.optimizers import CautiousMuon
  rows = []
  from benchmarks._models import MODELS, optimizer_pairs
  for model_name, build in MODELS.items():
    keras.utils.set_random_seed(0)
    model = build()
    params = sum(int(v.numpy().size) for v in model.trainable_variables)
    for name, ours, theirs in optimizer_pairs():
      t_ours, t_keras = _time_side_by_side(
          [_stepper(model, ours), _stepper(model, theirs)],
          muon_steps if name == "muon" else steps,
          block=1 if name == "muon" else 10)
      rows.append({"model": model_name, "params": params, "optimizer": name,
                   "ours_ms": t_ours * 1e3, "keras_ms": t_keras * 1e3,
                   "ratio": t_ours / t_keras})
      print(f"  {model_name:18s} {name:6s} ours {t_ours * 1e3:8.2f} ms  "
            f"keras {t_keras * 1e3:8.2f} ms  x{t_ours / t_keras:.3f}",
            flush=True)
    if model_name.startswith("transformer"):
      t_tfopt, t_keras_rule = _time_side_by_side(
          [_stepper(model, lambda: CautiousMuon(weight_decay=0.1)),
           _stepper(model, lambda: CautiousMuon(weight_decay=0.1,
                                                routing="keras"))],
          muon_steps, block=1)
      rows.append({"model": model_name, "params": params,
                   "optimizer": "muon tfopt-routing vs keras-routing",
                   "ours_ms": t_tfopt * 1e3, "keras_ms": t_keras_rule * 1e3,
                   "ratio": t_tfopt / t_keras_rule})
  return rows


def newton_schulz_times(steps):
  import keras
  import numpy as np
  import tensorflow as tf
  from tfopt.optimizers import newton_schulz
  keras_muon = keras.optimizers.Muon()
  rows = []
  for shape in ((128, 128), (256, 256), (512, 512), (512, 2048), (1024, 1024)):
    g = tf.constant(np.random.default_rng(0).normal(size=shape)
                    .astype("float32"))
    ours = tf.function(lambda: newton_schulz(g), jit_compile=True)
    theirs = tf.function(
        lambda: keras_muon.zeropower_via_newtonschulz5(g, 5), jit_compile=True)
    t_ours, t_keras = _time_side_by_side([ours, theirs], max(20, steps // 4),
                                         block=1)
    rows.append({"shape": list(shape), "ours_ms": t_ours * 1e3,
                 "keras_ms": t_keras * 1e3, "ratio": t_ours / t_keras})
    print(f"  NS {shape[0]:5d}x{shape[1]:<5d} ours {t_ours * 1e3:8.3f} ms  "
          f"keras {t_keras * 1e3:8.3f} ms  x{t_ours / t_keras:.3f}",
          flush=True)
  return rows


# --------------------------------------------------------------------------
# convergence

CONTEXT = 16
GRID = {  # lr, weight decays (Lion: ~10x smaller lr, larger wd, as published)
    "adamw": (3e-3, (0.1, 0.3, 1.0)),
    "lion": (3e-4, (1.0, 3.0, 10.0)),
    "muon": (3e-3, (0.1, 0.3, 1.0)),
}


def _corpus(max_chars=400_000):
  from pydoc_data import topics
  text = "\n".join(topics.topics[k] for k in sorted(topics.topics))
  return text[:max_chars]


def _char_data(text):
  import numpy as np
  chars = np.array(sorted(set(text)))
  ids = np.searchsorted(chars, np.array(list(text)))
  return ids.astype("int32"), len(chars)


def _lm(vocab, seed):
  import keras
  keras.utils.set_random_seed(seed)
  return keras.Sequential([
      keras.Input((CONTEXT,), dtype="int32"),
      keras.layers.Embedding(vocab, 32),
      keras.layers.Flatten(),
      keras.layers.Dense(512, activation="gelu"),
      keras.layers.Dense(512, activation="gelu"),
      keras.layers.Dense(vocab, name="logits")])


def _make(name, lr, wd, cautious, steps):
  import keras
  from tfopt.optimizers import CautiousAdamW, CautiousLion, CautiousMuon
  schedule = keras.optimizers.schedules.CosineDecay(
      0.0, decay_steps=steps - steps // 10, warmup_target=lr,
      warmup_steps=steps // 10)
  if name == "adamw":
    return CautiousAdamW(learning_rate=schedule, weight_decay=wd,
                         cautious_weight_decay=cautious)
  if name == "lion":
    return CautiousLion(learning_rate=schedule, weight_decay=wd,
                        cautious_weight_decay=cautious)
  # Muon: the output layer and the embedding to AdamW, as recommended.
  return CautiousMuon(learning_rate=schedule, weight_decay=wd,
                      adam_weight_decay=wd, exclude_layers=[r"^logits/"],
                      cautious_weight_decay=cautious)


def _train(ids, vocab, name, lr, wd, cautious, seed, steps, batch=256):
  import keras
  import numpy as np
  model = _lm(vocab, seed)
  opt = _make(name, lr, wd, cautious, steps)
  model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(
      from_logits=True), metrics=["accuracy"], jit_compile=True)
  rng = np.random.default_rng(1000 + seed)
  starts = rng.integers(0, len(ids) - CONTEXT - 1, size=steps * batch)
  windows = starts[:, None] + np.arange(CONTEXT + 1)
  data = ids[windows]
  model.fit(data[:, :-1], data[:, -1], batch_size=batch, epochs=1,
            shuffle=False, verbose=0)
  # Final training loss on a fixed set of training windows (same for all).
  eval_starts = np.random.default_rng(7).integers(
      0, len(ids) - CONTEXT - 1, size=8192)
  ev = ids[eval_starts[:, None] + np.arange(CONTEXT + 1)]
  loss, acc = model.evaluate(ev[:, :-1], ev[:, -1], batch_size=1024,
                             verbose=0)
  norm = float(np.sqrt(sum(float(np.sum(np.square(np.asarray(w))))
                           for w in model.trainable_weights)))
  return {"loss": float(loss), "accuracy": float(acc), "weight_norm": norm}


def convergence(steps, seeds):
  import keras
  import numpy as np
  ids, vocab = _char_data(_corpus())
  runs = []
  total = sum(len(w) for _, w in GRID.values()) * 2 * len(seeds)
  bar = keras.utils.Progbar(total, unit_name="run")
  for name, (lr, wds) in GRID.items():
    for wd in wds:
      for cautious in (True, False):
        for seed in seeds:
          r = _train(ids, vocab, name, lr, wd, cautious, seed, steps)
          runs.append({"optimizer": name, "lr": lr, "weight_decay": wd,
                       "cautious": cautious, "seed": seed, **r})
          bar.add(1)
  summary = []
  for name, (lr, wds) in GRID.items():
    for wd in wds:
      row = {"optimizer": name, "weight_decay": wd}
      for cautious, key in ((True, "cwd"), (False, "plain")):
        sel = [r for r in runs if r["optimizer"] == name and
               r["weight_decay"] == wd and r["cautious"] == cautious]
        for metric in ("loss", "accuracy", "weight_norm"):
          vals = [r[metric] for r in sel]
          row[f"{key}_{metric}"] = float(np.mean(vals))
          row[f"{key}_{metric}_std"] = float(np.std(vals))
      paired = [a["loss"] < b["loss"] for a, b in zip(
          [r for r in runs if r["optimizer"] == name and
           r["weight_decay"] == wd and r["cautious"]],
          [r for r in runs if r["optimizer"] == name and
           r["weight_decay"] == wd and not r["cautious"]])]
      row["cwd_lower_loss_seeds"] = f"{sum(paired)}/{len(paired)}"
      row["loss_ratio"] = row["cwd_loss"] / row["plain_loss"]
      summary.append(row)
  return runs, summary, vocab, len(ids)


def _plot(summary, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from tfopt._io import atomic_write
  names = list(GRID)
  fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6))
  for ax, name in zip(axes, names):
    rows = [r for r in summary if r["optimizer"] == name]
    wds = [r["weight_decay"] for r in rows]
    for key, label, style in (("cwd", "cautious (CWD)", "o-"),
                              ("plain", "decoupled", "s--")):
      ax.errorbar(wds, [r[f"{key}_loss"] for r in rows],
                  yerr=[r[f"{key}_loss_std"] for r in rows], fmt=style,
                  label=label, capsize=3)
    ax.set_xscale("log")
    ax.set_xlabel("weight decay")
    ax.set_title(name)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("final training loss (nats/char)")
  axes[0].legend()
  fig.suptitle("Char-LM on pydoc topics: final loss vs weight decay "
               "(mean +- std, 3 seeds)")
  fig.tight_layout()
  atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110),
               overwrite=True)
  plt.close(fig)


def main(argv):
  del argv
  import keras
  import tensorflow as tf
  result = {"machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "tensorflow": tf.__version__,
            "keras": keras.__version__}
  if "overhead" in FLAGS.parts:
    print(f"apply_gradients under XLA, median of {FLAGS.steps} steps "
          f"(Muon: {FLAGS.muon_steps}):")
    result["overhead"] = overhead(FLAGS.steps, FLAGS.muon_steps)
  if "newton_schulz" in FLAGS.parts:
    print("Newton-Schulz (5 steps), XLA:")
    result["newton_schulz"] = newton_schulz_times(FLAGS.steps)
  if "convergence" in FLAGS.parts:
    print(f"convergence: char-LM, {FLAGS.train_steps} steps per run")
    runs, summary, vocab, chars = convergence(FLAGS.train_steps,
                                              [int(s) for s in FLAGS.seeds])
    result["convergence"] = {"task": f"char LM, context {CONTEXT}, vocab "
                                     f"{vocab}, {chars} chars of pydoc topics",
                             "steps": FLAGS.train_steps, "runs": runs,
                             "summary": summary}
    print(f"{'optimizer':8s} {'wd':>5s} {'loss CWD':>14s} {'loss plain':>14s}"
          f" {'ratio':>6s} {'CWD lower':>9s} {'acc CWD':>8s} {'acc plain':>9s}"
          f" {'|w| CWD':>8s} {'|w| plain':>9s}")
    for r in summary:
      print(f"{r['optimizer']:8s} {r['weight_decay']:5g} "
            f"{r['cwd_loss']:7.4f}+-{r['cwd_loss_std']:.3f} "
            f"{r['plain_loss']:7.4f}+-{r['plain_loss_std']:.3f} "
            f"{r['loss_ratio']:6.3f} {r['cwd_lower_loss_seeds']:>9s} "
            f"{r['cwd_accuracy']:8.3f} {r['plain_accuracy']:9.3f} "
            f"{r['cwd_weight_norm']:8.1f} {r['plain_weight_norm']:9.1f}")
    _plot(summary, FLAGS.plot)
    print(f"wrote {FLAGS.plot}")
  os.makedirs(os.path.dirname(FLAGS.out), exist_ok=True)
  previous = {}
  if os.path.exists(FLAGS.out):
    with open(FLAGS.out, encoding="utf-8") as f:
      previous = json.load(f)
  previous.update(result)  # parts not rerun keep their last results
  from tfopt._io import atomic_write_text
  atomic_write_text(FLAGS.out, json.dumps(previous, indent=1) + "\n",
                    overwrite=True)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
