"""A model whose state does not fit one device, trained through
`tfopt.compile` on 4 logical CPUs; prints one JSON line of findings for
tests/test_compile_placement.py. Logical devices exist only if configured
before TensorFlow starts, hence a process of its own.

    python -m tests._fit_across_devices_script OUT_DIR
"""

import json
import os
import sys

import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 4)

import keras  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

import tfopt  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from tfopt import zoo  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from tfopt.optimizers import CautiousAdamW  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from tfopt.placement import InfeasiblePlacement  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

DEVICES = [f"/device:CPU:{i}" for i in range(4)]
LAYERS, WIDTH = (1024,) * 8, 1024


def build():
  keras.utils.set_random_seed(0)
  return zoo.mlp(input_dim=WIDTH, hidden=LAYERS).model


def compile_kwargs():
  return dict(optimizer=CautiousAdamW(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(
                  from_logits=True))


def state_bytes(model):
  # Weights and the two Adam moments.
  return 3 * sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)


def main(out_dir):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((128, WIDTH)).astype(np.float32)
  y = rng.integers(0, 10, 128).astype(np.int32)
  fit = dict(batch_size=32, epochs=2, shuffle=False, verbose=0)
  out = {}

  plain = build()
  plain.compile(**compile_kwargs())
  out["plain"] = plain.fit(x, y, **fit).history["loss"]
  out["plain_eval"] = plain.evaluate(x, y, verbose=0)
  cap = state_bytes(plain) // 2
  out["cap"] = cap
  out["state"] = state_bytes(plain)

  # Refused on one capped device; nothing of the model changes.
  one = build()
  tfopt.compile(one, placement="auto", devices=DEVICES[:1],
                memory_per_device=cap, verbose=False, **compile_kwargs())
  before = [v.numpy().copy() for v in one.variables]
  where = [v.value.device for v in one.variables]
  try:
    one.fit(x, y, **fit)
    out["refused"] = None
  except InfeasiblePlacement as err:
    out["refused"] = str(err)
  out["intact"] = all(np.array_equal(a, v.numpy())
                      for a, v in zip(before, one.variables)) and \
      where == [v.value.device for v in one.variables]

  # Placed on 4 devices with a cap of half the state.
  model = build()
  tfopt.compile(model, placement="auto", devices=DEVICES,
                memory_per_device=cap, verbose=False,
                pins={"logits": 0}, **compile_kwargs())
  out["placed"] = model.fit(x, y, **fit).history["loss"]
  (report,) = model.train_function.reports.values()
  out["report"] = report.table()
  out["planned"] = list(report.devices_used)
  out["variable_devices"] = {v.path: v.value.device for v in model.variables}
  out["slot_devices"] = sorted({v.value.device
                                for v in model.optimizer.variables})
  out["peaks"] = list(report.peak_bytes)
  out["placed_eval"] = model.evaluate(x, y, verbose=0)
  prediction = model.predict(x[:8], verbose=0)

  # Checkpoints restore into the placed model, onto the same devices.
  path = os.path.join(out_dir, "placed.weights.h5")
  model.save_weights(path)
  saved = [v.numpy().copy() for v in model.variables]
  for v in model.trainable_variables:
    v.assign(np.zeros(v.shape, np.float32))
  model.load_weights(path)
  out["weights_round_trip"] = all(np.array_equal(a, v.numpy())
                                  for a, v in zip(saved, model.variables))
  out["devices_after_load"] = {v.path: v.value.device for v in model.variables}
  out["predict_after_load"] = bool(np.array_equal(
      prediction, model.predict(x[:8], verbose=0)))
  keras_path = os.path.join(out_dir, "placed.keras")
  model.save(keras_path)
  reloaded = keras.models.load_model(keras_path, compile=False)
  out["saved_model_predicts"] = bool(np.allclose(
      prediction, reloaded.predict(x[:8], verbose=0), rtol=1e-6))
  print(json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1])
