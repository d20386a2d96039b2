"""ParameterServerTrainer on an in-process cluster (2 workers, 1 parameter
server, the chief; tests/scale/ps_cluster.py in a fresh process): linear
regression converges to the known optimum, every scheduled step runs and
returns its loss, the variables live on the PS."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfopt.scale.ps import ParameterServerTrainer

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
def test_converges_to_the_known_optimum_on_a_ps_cluster():
  done = subprocess.run([sys.executable, os.path.join(HERE, "ps_cluster.py")],
                        capture_output=True, text=True, timeout=300,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  assert out["steps"] == out["losses"] == 120
  assert 0 < out["iterations"] <= 120  # Keras' counter races across workers
  assert out["last_loss"] < 1e-3 < out["first_loss"]
  np.testing.assert_allclose(out["weights"], [2.0, -1.0, 0.5], atol=2e-2)
  assert "/job:ps" in out["device"]


def test_bad_input():
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
  with pytest.raises(ValueError, match="Argument `strategy` must be a "
                     "tf.distribute.ParameterServerStrategy"):
    ParameterServerTrainer(tf.distribute.get_strategy(), model,
                           keras.optimizers.SGD(), "mse")
