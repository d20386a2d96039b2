"""Models that do not fit one device, through `tfopt.compile`: variables
follow the plan, checkpoints restore into the placed model, a refusal
names what would hold the step and changes nothing; bad input."""

import json
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfopt
from tfopt.runtime import variables as moving
from tfopt.scale.compat import KerasCompatError


# The tests reading `across` share one run of the script: one xdist group.
_ACROSS = pytest.mark.xdist_group("fit across devices")


@pytest.fixture(scope="module")
def across(tmp_path_factory):
  out = tmp_path_factory.mktemp("across")
  done = subprocess.run(
      [sys.executable, "-m", "tests._fit_across_devices_script", str(out)],
      capture_output=True, text=True, timeout=900, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@_ACROSS
def test_state_twice_a_device_trains_with_fit_on_four_devices(across):
  # 8 x Dense(1024) with CautiousAdamW: 101 MB of weights and moments, a
  # cap of half that per device.
  assert across["cap"] * 2 <= across["state"]
  np.testing.assert_allclose(across["placed"], across["plain"], rtol=1e-5)
  np.testing.assert_allclose(across["placed_eval"], across["plain_eval"],
                             rtol=1e-5)
  devices = set(across["variable_devices"].values())
  planned = across["planned"]
  # Every variable lives on a device of the plan, and they are spread.
  assert all(any(d.endswith(p.lstrip("/")) for p in planned)
             for d in devices)
  assert len(devices) >= 3
  assert len(across["slot_devices"]) >= 3  # optimizer slots move too
  assert max(across["peaks"]) <= across["cap"]
  # The user's pin: the head on device 0 (the plan's last stage otherwise).
  assert across["variable_devices"]["logits/kernel"].endswith("CPU:0")
  assert across["variable_devices"]["dense_7/kernel"].endswith("CPU:3")
  assert "moved to the plan's devices" in across["report"]
  assert "measured" in across["report"]
  # Logical CPUs' caps are the plan's, not the allocator's: the step was
  # profiled whole on one of them (no first plan needed to profile it).
  assert "profiled on this machine (one device)" in across["report"]


@pytest.mark.slow
@_ACROSS
def test_checkpoints_round_trip_on_the_placed_model(across):
  assert across["weights_round_trip"] and across["predict_after_load"]
  assert across["devices_after_load"] == across["variable_devices"]
  assert across["saved_model_predicts"]


@pytest.mark.slow
@_ACROSS
def test_one_capped_device_is_refused_before_training(across):
  message = across["refused"]
  assert message is not None
  # The bytes needed (the live-memory bound: weights, moments and what is
  # live beside them), the cap, and where a plan exists.
  needed = re.search(r"it needs (1\d\d) MB live at once", message)
  assert needed, message
  assert "of 50.4 MB each" in message
  # No fewer devices than the live bytes over the cap; no more than the 4
  # the model trained on above (m-pack may pack it onto 3).
  fewest = re.search(r"the fewest devices of this cap on which a plan was "
                     r"found: (\d+)", message)
  assert fewest, message
  assert -(-int(needed.group(1)) // 50.4) <= int(fewest.group(1)) <= 4
  assert "variables were not changed" in message
  assert across["intact"]


def _mlp():
  keras.utils.set_random_seed(0)
  inp = keras.Input((4,))
  out = keras.layers.Dense(2, name="head")(keras.layers.Dense(
      3, name="hidden")(inp))
  return keras.Model(inp, out)


def test_bad_pins_devices_and_clusters_are_named():
  cpu = ["/device:CPU:0"]
  with pytest.raises(ValueError, match=r"pins\['hidden'\].*device index"):
    tfopt.compile(_mlp(), optimizer="adam", loss="mse", placement="auto",
                  devices=cpu, pins={"hidden": 3})
  with pytest.raises(ValueError, match=r"pins\['hidden'\]"):
    tfopt.compile(_mlp(), optimizer="adam", loss="mse", placement="auto",
                  devices=cpu, pins={"hidden": "/device:CPU:7"})
  with pytest.raises(ValueError, match="`pins` must be given only with"):
    tfopt.compile(_mlp(), optimizer="adam", loss="mse", pins={"hidden": 0})
  with pytest.raises(ValueError, match="`cluster` must be given only when"):
    tfopt.compile(_mlp(), optimizer="adam", loss="mse", placement="auto",
                  devices=cpu, cluster={"worker": ["localhost:1"]})
  with pytest.raises(ValueError, match="`cluster` must be a JSON cluster"):
    tfopt.compile(_mlp(), optimizer="adam", loss="mse", placement="auto",
                  devices=["/job:worker/task:0/device:CPU:0"],
                  cluster="{not json")
  with pytest.raises(ValueError, match="`cluster` must be a mapping"):
    tfopt.compile(_mlp(), optimizer="adam", loss="mse", placement="auto",
                  devices=["/job:worker/task:0/device:CPU:0"],
                  cluster={"worker": []})


def test_devices_naming_tasks_that_are_not_running(monkeypatch):
  from tfopt._net import free_ports  # pylint: disable=import-outside-toplevel
  from tfopt.runtime import remote  # pylint: disable=import-outside-toplevel
  (port,) = free_ports(1)
  monkeypatch.delenv("TF_CONFIG", raising=False)
  with pytest.raises(ValueError, match="TF_CONFIG"):
    tfopt.compile(_mlp(), optimizer="adam", loss="mse", placement="auto",
                  devices=["/job:worker/task:0/device:CPU:0"])
  with pytest.raises(ValueError, match=r"tasks that are running \(task "
                     r"/job:worker/task:0 at localhost:\d+ does not answer"):
    remote._check_reachable({"worker": [f"localhost:{port}"]}, 0.5)  # pylint: disable=protected-access
  # TF_CONFIG is read when no cluster is given (parsed, not connected).
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"worker": [f"localhost:{port}"]},
      "task": {"type": "worker", "index": 0}}))
  assert remote.parse_cluster(None) == {"worker": [f"localhost:{port}"]}


def test_a_cap_below_one_tensor_is_refused_with_no_device_count():
  model = _mlp()
  x = np.ones((8, 4), np.float32)
  y = np.zeros((8, 2), np.float32)
  before = [v.numpy().copy() for v in model.variables]
  tfopt.compile(model, optimizer="adam", loss="mse", placement="auto",
                devices=["/device:CPU:0"], memory_per_device=16,
                verbose=False)
  with pytest.raises(ValueError, match=r"needs .* B; the largest device cap "
                     r"it may use is 16 B\. No number of devices of this "
                     r"cap can hold it"):
    model.fit(x, y, batch_size=8, verbose=0)
  assert all(np.array_equal(a, v.numpy())
             for a, v in zip(before, model.variables))


def test_pins_name_layers_or_variables():
  from tfopt.compile_placement import resolve_pins  # pylint: disable=import-outside-toplevel
  model = _mlp()
  model.compile(optimizer="adam", loss="mse")
  pins = resolve_pins(model, {"hidden": 1, "head/bias": 0})
  by_id = {id(v): v.path for v in model.variables}
  assert sorted((by_id[k], d) for k, d in pins.items()) == [
      ("head/bias", 0), ("hidden/bias", 1), ("hidden/kernel", 1)]
  with pytest.raises(ValueError, match="keys naming layers"):
    resolve_pins(model, {"nope": 0})


def test_moving_a_keras_variable_keeps_its_value_keys_and_frees_the_old():
  import gc  # pylint: disable=import-outside-toplevel
  import weakref  # pylint: disable=import-outside-toplevel
  model = _mlp()
  model.compile(optimizer="adam", loss="mse")
  x = np.ones((8, 4), np.float32)
  y = np.zeros((8, 2), np.float32)
  model.fit(x, y, verbose=0)  # slots exist
  kernel = model.get_layer("hidden").kernel
  value = kernel.numpy().copy()
  key = model.optimizer._var_key(kernel)  # pylint: disable=protected-access
  old = weakref.ref(kernel.value)
  # A second CPU device does not exist in this process: move onto the
  # full name of the same one, so nothing moves, then onto a partial name.
  report = moving.move_variables([(kernel, "/device:CPU:0")],
                                 optimizer=model.optimizer)
  assert report.moved == 0
  # Force a real move: pretend it lives elsewhere by giving a new name.
  new = moving._moved_copy(kernel.value, "/job:localhost/device:CPU:0")  # pylint: disable=protected-access
  kernel._value = new  # pylint: disable=protected-access
  gc.collect()
  assert old() is None  # the old tf.Variable is gone
  np.testing.assert_array_equal(kernel.numpy(), value)
  assert model.optimizer._var_key(kernel) == key  # pylint: disable=protected-access
  model.fit(x, y, verbose=0)  # Keras' own step still finds its slots


def test_the_private_keras_paths_moving_relies_on_are_there():
  # Fails loudly when Keras changes what tfopt.runtime.variables relies on:
  # the TF-backend variable keeps its tf.Variable in `_value`, and the TF
  # optimizer keys variables by that tf.Variable's `_unique_id`.
  model = _mlp()
  model.compile(optimizer="adam", loss="mse")
  model.optimizer.build(model.trainable_variables)
  kernel = model.get_layer("hidden").kernel
  assert kernel._value is kernel.value  # pylint: disable=protected-access
  assert isinstance(kernel.value, tf.Variable)
  assert model.optimizer._var_key(kernel) == kernel.value._unique_id  # pylint: disable=protected-access


def test_moving_refuses_a_variable_it_does_not_understand():
  class Fake:
    path = "fake/kernel"
    value = tf.Variable(1.0)

  with pytest.raises(KerasCompatError, match="does not keep its tf.Variable"):
    moving.move_variables([(Fake(), "/device:CPU:0")])
