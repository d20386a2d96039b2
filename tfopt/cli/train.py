"""Train a zoo model with tfopt: optimizer choice (the cautious ones
included), the tfopt.compile hook (fusion, placement), MFU monitor.

    tfopt-train --config=experiments/configs/train_digits_mlp.py

The knobs are in the config file (see experiments/configs/, each with its
command and expected result); flags: --config, --epochs (override),
--out (history JSON), --mfu_png (timeline picture), --overwrite.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402
from tfopt.cli._main import run_main  # noqa: E402

from tfopt.cli._config import load_config  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("config", None, "Config file (the repository's "
                    "experiments/configs/*.py); without one, DEFAULTS: an MLP "
                    "on the bundled digits with CautiousAdamW.")
flags.DEFINE_integer("epochs", None, "Override the config's epochs.")
flags.DEFINE_string("out", None, "Write the history and reports as JSON.")
flags.DEFINE_string("mfu_png", None, "Draw the MFU / step-time timeline "
                    "here (needs mfu in the config).")
flags.DEFINE_bool("overwrite", False, "Replace --out / --mfu_png if they "
                  "exist.")

DEFAULTS = {
    "model": "mlp", "model_kwargs": {"input_dim": 64, "hidden": [128, 128]},
    "data": "digits",
    "optimizer": "cautious_adamw", "learning_rate": 1e-3,
    "weight_decay": 0.01, "batch_size": 50, "epochs": 5, "fusion": True,
    "placement": None, "logical_devices": 1, "memory_per_device": None,
    "jit_compile": False,
    "mfu": True, "seed": 0,
}
OPTIMIZERS = ("adam", "adamw", "lion", "muon", "cautious_adamw",
              "cautious_lion", "cautious_muon")


def _optimizer(name, lr, wd):
  import keras
  from tfopt.optimizers import CautiousAdamW, CautiousLion, CautiousMuon
  return {
      "adam": lambda: keras.optimizers.Adam(lr),
      "adamw": lambda: keras.optimizers.AdamW(lr, weight_decay=wd),
      "lion": lambda: keras.optimizers.Lion(lr, weight_decay=wd),
      "muon": lambda: keras.optimizers.Muon(lr, weight_decay=wd),
      "cautious_adamw": lambda: CautiousAdamW(lr, weight_decay=wd),
      "cautious_lion": lambda: CautiousLion(lr, weight_decay=wd),
      "cautious_muon": lambda: CautiousMuon(lr, weight_decay=wd),
  }[name]()


def _data(config, model):
  """(x_train, y_train, x_val, y_val) shaped for the model's input."""
  import numpy as np
  if config["data"] == "synthetic":
    x, y = model.batch(config["batch_size"] * 20, seed=config["seed"])
    xv, yv = model.batch(config["batch_size"] * 4, seed=config["seed"] + 1)
    return x, y, xv, yv
  from tfopt.nas.data import digits
  split = digits(seed=config["seed"])
  shape = tuple(model.model.inputs[0].shape[1:])

  def fit_shape(x):
    if shape == (64,):
      return x.reshape(len(x), 64)
    if len(shape) == 3 and shape[:2] == (8, 8):
      return np.repeat(x, shape[2], axis=-1)
    raise app.UsageError(f"data 'digits' (8x8 images) does not fit the "
                         f"model's input shape {shape}; use model_kwargs "
                         f"input_dim=64 (mlp) or image_size=8 (small_cnn), or "
                         f"data 'synthetic'.")

  return fit_shape(split.x_train), split.y_train, fit_shape(split.x_val), \
      split.y_val


def main(argv):
  del argv
  config = load_config(FLAGS.config, DEFAULTS)
  if FLAGS.epochs is not None:
    config["epochs"] = FLAGS.epochs
  if config["optimizer"] not in OPTIMIZERS:
    raise app.UsageError(f"optimizer must be one of {OPTIMIZERS}. "
                         f"Received: {config['optimizer']!r}")
  if config["data"] not in ("digits", "synthetic"):
    raise app.UsageError(f"data must be 'digits' or 'synthetic'. Received: "
                         f"{config['data']!r}")
  for name in ("out", "mfu_png"):
    path = getattr(FLAGS, name)
    if path and os.path.exists(path) and not FLAGS.overwrite:
      raise app.UsageError(f"--{name}={path} exists; pass --overwrite to "
                           f"replace it.")
  if FLAGS.mfu_png and not config["mfu"]:
    raise app.UsageError("--mfu_png needs mfu: True in the config.")
  import tensorflow as tf
  # Logical devices must exist before TensorFlow starts its runtime.
  if config["logical_devices"] > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] *
        config["logical_devices"])
  import keras
  import tfopt
  from tfopt import zoo
  from tfopt.scale.mfu import MFUMonitor

  keras.utils.set_random_seed(config["seed"])
  model = zoo.build(config["model"], **config["model_kwargs"])
  x, y, xv, yv = _data(config, model)
  devices = ([f"/device:CPU:{i}" for i in range(config["logical_devices"])]
             if config["placement"] else None)
  compiled = tfopt.compile(
      model.model, optimizer=_optimizer(config["optimizer"],
                                        config["learning_rate"],
                                        config["weight_decay"]),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=["accuracy"], fusion=config["fusion"],
      placement=config["placement"], devices=devices,
      memory_per_device=config["memory_per_device"],
      jit_compile=config["jit_compile"])
  bs = config["batch_size"]
  # Whole batches only: each new input signature is a new captured step.
  n = len(x) // bs * bs
  callbacks = []
  if config["mfu"]:
    callbacks.append(MFUMonitor((x[:bs], y[:bs]), measure_achievable=True))
  history = compiled.fit(x[:n], y[:n], batch_size=bs,
                         epochs=config["epochs"], validation_data=(xv, yv),
                         callbacks=callbacks, shuffle=True, verbose=2)
  final = {k: float(v[-1]) for k, v in history.history.items()}
  print("final: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(
      final.items())))
  if callbacks:
    summary = callbacks[0].summary()
    print(f"MFU {summary['mfu']:.4f} of {summary['peak_flops']:.3g} FLOP/s "
          f"({summary['peak_source']}); {summary['mfu_of_achievable']:.4f} "
          f"of the {summary['achievable_flops']:.3g} FLOP/s measured here; "
          f"{summary['samples_per_s']:.0f} samples/s (median step "
          f"{summary['step_s'] * 1e3:.2f} ms)")
    if FLAGS.mfu_png:
      callbacks[0].timeline_png(FLAGS.mfu_png, overwrite=FLAGS.overwrite)
      print(f"wrote {FLAGS.mfu_png}")
  if FLAGS.out:
    from tfopt._io import atomic_write_text
    reports = [r.table() for r in getattr(compiled.train_function, "reports",
                                          {}).values()]
    atomic_write_text(FLAGS.out, json.dumps(
        {"config": config, "history": history.history, "final": final,
         "reports": reports}, indent=1, default=float),
                      overwrite=FLAGS.overwrite)
    print(f"wrote {FLAGS.out}")


def run() -> None:
  """The console script's entry point."""
  run_main(main, __doc__)


if __name__ == "__main__":
  run()
