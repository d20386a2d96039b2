"""A model's variables after `tfopt.compile` connected this process to
server tasks: weights loaded afterwards are the ones it trains from."""

import json
import subprocess
import sys

import numpy as np
import pytest


@pytest.mark.slow
def test_weights_loaded_after_connecting_are_trained_from(tmp_path):
  done = subprocess.run(
      [sys.executable, "-m", "tests._remote_restore_script", str(tmp_path)],
      capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  # Why tfopt renews the model's variables: TensorFlow drops an eager
  # assign to a variable made before connecting, silently. If it stops
  # doing so, the renewal is harmless (and this tells us).
  assert out["tf_ignores_assign_before_connect"]
  assert out["loaded"]
  # Plain Keras from the same loaded weights.
  np.testing.assert_allclose(out["placed"], out["plain"], rtol=1e-5)
  assert any("/job:worker/" in d for d in out["devices"])
