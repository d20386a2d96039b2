"""Run as a script with KERAS_BACKEND=jax: the Cautious optimizers on Keras'
JAX backend against the float64 NumPy references (x64 enabled) and inside a
jitted `model.fit`. Prints a JSON summary.

TensorFlow and OR-Tools are made unimportable first, as on a JAX-only GPU
machine. Nothing happens on import (pytest's doctest collection imports
every module): all of that is done in `__main__`, before Keras is imported.
"""

import json
import sys

import numpy as np

LR, WD, B1, B2, EPS = 2.0 ** -4, 2.0 ** -1, 0.5, 0.75, 2.0 ** -10


def run(opt, ref, **kw):
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(6, 4)), rng.normal(size=(4,))]
  variables = [keras.Variable(x, dtype="float64", name=n)
               for x, n in zip(xs, ("w", "bias"))]
  for step in range(5):
    grads = [np.random.default_rng(100 + step).normal(size=x.shape)
             for x in xs]
    opt.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    result = ref.step(xs, grads, **kw)
    xs = result[0] if isinstance(result, tuple) else result
  return max(float(np.abs(np.asarray(v) - x).max())
             for v, x in zip(variables, xs))


def fit_ok(opt):
  rng = np.random.default_rng(1)
  x = rng.normal(size=(64, 8)).astype("float32")
  y = (x @ rng.normal(size=(8, 3))).astype("float32")
  model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                            keras.layers.Dense(3)])
  model.compile(optimizer=opt, loss="mse", jit_compile=True)
  h = model.fit(x, y, epochs=3, verbose=0).history["loss"]
  return bool(h[-1] < h[0])


def main():
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_enable_x64", True)
  assert keras.backend.backend() == "jax"
  out = {
      "adamw": run(CautiousAdamW(learning_rate=LR, weight_decay=WD,
                                 beta_1=B1, beta_2=B2, epsilon=EPS),
                   reference.AdamRef(LR, B1, B2, EPS, WD)),
      "lion": run(CautiousLion(learning_rate=LR, weight_decay=WD, beta_1=B1,
                               beta_2=B2), reference.LionRef(LR, B1, B2, WD)),
      "muon": run(CautiousMuon(learning_rate=LR, weight_decay=WD,
                               adam_weight_decay=WD, adam_beta_1=B1,
                               adam_beta_2=B2, epsilon=EPS, momentum=0.75),
                  reference.MuonRef(LR, 0.75, WD, WD, B1, B2, EPS),
                  matrix_shapes=[(6, 4), None]),
      "fit": [fit_ok(CautiousAdamW(weight_decay=0.1)),
              fit_ok(CautiousLion(learning_rate=3e-4, weight_decay=0.3)),
              fit_ok(CautiousMuon(learning_rate=0.01))],
  }
  json.dump(out, sys.stdout)


class _Unavailable:
  """Import hook: makes TensorFlow and OR-Tools unimportable, as on a
  JAX-only GPU machine."""

  def find_spec(self, name, path=None, target=None):
    del path, target
    if name.split(".")[0] in ("tensorflow", "ortools"):
      raise ImportError(f"{name} is hidden: the optimizers must not need it")


if __name__ == "__main__":
  import os
  os.environ["KERAS_BACKEND"] = "jax"
  sys.meta_path.insert(0, _Unavailable())
  import keras  # pylint: disable=g-import-not-at-top
  from tests.optimizers import reference
  from tfopt.optimizers import CautiousAdamW, CautiousLion, CautiousMuon
  main()
