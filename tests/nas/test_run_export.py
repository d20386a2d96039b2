"""Run directory round trips and corrupt-file errors; sub-graph export
reloads (.keras and SavedModel) with identical outputs and BatchNorm
recalibrated on the path, the super-network untouched."""

import json
import os

import keras
import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.nas.export import export_subgraph
from tfopt.nas.ranking import Ranking, recalibrate_batchnorm
from tfopt.nas.run import RunDir
from tfopt.nas.space import tiny64
from tfopt.nas.steering import Constraints
from tfopt.nas.supernet import SuperNet


def _data(n, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(n, 8, 8, 1)).astype("float32") + 0.3,
          rng.integers(0, 10, size=n).astype("int32"))


@pytest.fixture(scope="module")
def net():
  keras.utils.set_random_seed(0)
  net = SuperNet(tiny64(filters=4))
  net.compile("adam", keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  x, y = _data(64)
  net.fit(x, y, epochs=1, batch_size=16, verbose=0)
  return net


def test_run_dir_round_trip(tmp_path, net):
  run = RunDir(str(tmp_path / "run"))
  space = net.space
  run.create(space, {"steps": 3})
  with pytest.raises(FileExistsError, match="overwrite=True"):
    run.create(space)
  assert run.space() == space
  assert run.constraints(space) == Constraints()
  run.save_supernet(net)
  again = run.load_supernet()
  for a, b in zip(net.weights, again.weights):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  archs = list(space.enumerate())[:5]
  ranking = Ranking([(a, 0.1 * i) for i, a in enumerate(archs)][::-1],
                    {("layer0", "conv3"): (0.2, 5)}, score="accuracy")
  run.write_ranking(ranking, space)
  read = run.ranking(space)
  assert read.scores == ranking.scores
  assert read.components == ranking.components
  run.write_history({"loss": [2.0, 1.5], "accuracy": [0.1, 0.3]})
  assert run.history() == {"accuracy": [0.1, 0.3], "loss": [2.0, 1.5]}
  rows = (tmp_path / "run" / "subgraphs.csv").read_text().splitlines()
  assert len(rows) == 65  # header + every sub-graph; 59 unevaluated
  assert sum(r.endswith(",") for r in rows) == 59


def test_corrupt_run_dirs_name_the_file(tmp_path, net):
  empty = RunDir(str(tmp_path / "empty"))
  with pytest.raises(FileNotFoundError, match="run.json; is it a run "
                     "directory"):
    empty.space()
  run = RunDir(str(tmp_path / "run"))
  run.create(net.space)
  (tmp_path / "run" / "space.json").write_text("{broken")
  with pytest.raises(ValueError, match="Argument `space.json` must be "
                     "valid JSON"):
    run.space()
  run.create(net.space, overwrite=True)
  space = dict(json.loads((tmp_path / "run" / "space.json").read_text()))
  space["layers"][0]["ops"]["conv3"]["type"] = "conv9"
  (tmp_path / "run" / "space.json").write_text(json.dumps(space))
  with pytest.raises(ValueError, match="space.json.*op 'conv3'"):
    run.space()
  run.create(net.space, overwrite=True)
  with pytest.raises(FileNotFoundError, match="supernet.weights.h5; run "
                     "--mode=search first"):
    run.load_supernet()
  (tmp_path / "run" / "supernet.weights.h5").write_bytes(b"not hdf5")
  with pytest.raises(ValueError, match="supernet.weights.h5"):
    run.load_supernet()
  (tmp_path / "run" / "subgraphs.csv").write_text("a,b\n1,2\n")
  (tmp_path / "run" / "components.csv").write_text(
      "layer,op,fitness,frequency\n")
  with pytest.raises(ValueError, match="subgraphs.csv.*columns"):
    run.ranking()
  (tmp_path / "run" / "constraints.json").write_text(json.dumps(
      {"format": "tfopt.nas.constraints/1", "lock": {"layer9": "skip"}}))
  with pytest.raises(ValueError, match="keyed by choice layers"):
    run.constraints()


def test_export_reloads_identically(tmp_path, net):
  arch = ("conv5", "maxpool", "conv3")
  x_cal, _ = _data(96, 1)
  probe, _ = _data(16, 2)
  before = [v.numpy().copy() for v in net.weights]
  path_before = net.arch()
  result = export_subgraph(net, arch, str(tmp_path / "exp"), x_cal=x_cal,
                           probe=probe)
  # The super-network is as it was.
  assert net.arch() == path_before
  for v, b in zip(net.weights, before):
    np.testing.assert_array_equal(v.numpy(), b)
  model = keras.saving.load_model(result.keras_path)
  import tensorflow as tf
  served = tf.saved_model.load(result.saved_model_path)
  np.testing.assert_allclose(np.asarray(served.serve(probe)),
                             np.asarray(model(probe)), atol=1e-5)
  # The export carries the recalibrated statistics: the oracle is the
  # super-network's path after the same recalibration.
  net.set_arch(arch)
  recalibrate_batchnorm(net, x_cal)
  np.testing.assert_allclose(np.asarray(model(probe)),
                             np.asarray(net(probe, training=False)),
                             atol=1e-5)
  for v, b in zip(net.weights, before):
    v.assign(b)
  net.set_arch(path_before)
  with pytest.raises(FileExistsError, match="overwrite=True"):
    export_subgraph(net, arch, str(tmp_path / "exp"), x_cal=x_cal)
  export_subgraph(net, ("skip",) * 3, str(tmp_path / "exp"), x_cal=x_cal,
                  overwrite=True)
  assert sorted(os.listdir(tmp_path / "exp")) == ["model.keras",
                                                   "saved_model"]
  assert keras.saving.load_model(result.keras_path).name.startswith(
      "subnet_skip")
