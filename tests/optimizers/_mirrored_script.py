"""Run as a script: trains with each Cautious optimizer under a
MirroredStrategy over 2 logical CPUs and on one device; prints the largest
weight difference per optimizer as JSON. A subprocess, because the logical
devices must be configured before TensorFlow initializes (in `__main__`;
nothing happens on import, which pytest's doctest collection does)."""

import json
import sys

# tfopt first: it loads OR-Tools before TensorFlow (see tfopt/_native.py).
from tfopt.optimizers import CautiousAdamW, CautiousLion, CautiousMuon

import keras
import numpy as np
import tensorflow as tf

MAKERS = {
    "adamw": lambda: CautiousAdamW(learning_rate=0.01, weight_decay=0.3,
                                   track_decay_fraction=True),
    "lion": lambda: CautiousLion(learning_rate=0.003, weight_decay=1.0),
    "muon": lambda: CautiousMuon(learning_rate=0.01, weight_decay=0.3),
}


def train(make, strategy):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(64, 8)).astype("float32")
  y = (x @ rng.normal(size=(8, 3))).astype("float32")
  with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)),
                              keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(3)])
    model.compile(optimizer=make(), loss="mse")
  model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
  return [np.asarray(w) for w in model.weights], model


def main():
  out = {}
  for name, make in MAKERS.items():
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert mirrored.num_replicas_in_sync == 2
    many, model = train(make, mirrored)
    one, _ = train(make, tf.distribute.get_strategy())
    out[name] = {
        "max_diff": max(float(np.abs(a - b).max())
                        for a, b in zip(many, one)),
        "replicas": mirrored.num_replicas_in_sync,
    }
    if name == "adamw":
      out[name]["decay_fraction"] = float(model.optimizer.decay_fraction())
  json.dump(out, sys.stdout)


if __name__ == "__main__":
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices("CPU")[0],
      [tf.config.LogicalDeviceConfiguration()] * 2)
  main()
