"""Weights loaded after `tfopt.compile` connected this process to server
tasks: prints one JSON line for tests/runtime/test_remote_variables.py.
One cluster per process (connecting again would invalidate the first).

    python -m tests._remote_restore_script OUT_DIR
"""

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import tfopt
from tfopt.runtime import LoopbackServers, remote


def build():
  keras.utils.set_random_seed(1)
  return keras.Sequential([keras.Input((16,)),
                           keras.layers.Dense(32, activation="relu"),
                           keras.layers.Dense(4)])


def compile_kwargs():
  return dict(optimizer=keras.optimizers.Adam(1e-2), loss="mse")


def main(out_dir: str) -> None:
  rng = np.random.default_rng(0)
  x = rng.standard_normal((64, 16)).astype(np.float32)
  y = rng.standard_normal((64, 4)).astype(np.float32)
  fit = dict(batch_size=16, epochs=1, shuffle=False, verbose=0)
  # Plain Keras: trained weights saved; a fresh model loads them and
  # trains on (the oracle).
  trained = build()
  trained.compile(**compile_kwargs())
  trained.fit(x, y, **fit)
  path = os.path.join(out_dir, "trained.weights.h5")
  trained.save_weights(path)
  plain = build()
  plain.compile(**compile_kwargs())
  plain.load_weights(path)
  out = {"plain": plain.fit(x, y, **fit).history["loss"]}
  with LoopbackServers(2) as servers:
    before = tf.Variable(np.zeros(3, np.float32))  # TensorFlow's behaviour
    model = build()
    tfopt.compile(model, placement="auto", devices=servers.device_names,
                  cluster=servers.spec, verbose=False, **compile_kwargs())
    assert remote.connected_spec() == servers.spec
    before.assign(np.ones(3, np.float32))
    out["tf_ignores_assign_before_connect"] = bool(
        (before.numpy() == 0).all())
    model.load_weights(path)
    out["loaded"] = all(np.array_equal(a, b) for a, b in
                        zip(model.get_weights(), trained.get_weights()))
    out["placed"] = model.fit(x, y, **fit).history["loss"]
    out["devices"] = sorted({v.value.device for v in model.variables})
  print(json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1])
