"""tfopt.compile's default calibration ("auto"): measured once per machine,
TensorFlow, kind and count of devices, kept in a cache and read back
(tfopt.calibration_cache); TFOPT_CALIBRATION=none or calibration=None opt
out.
A fake measurement stands in for fit_cluster where only the cache is under
test; the end-to-end test measures for real."""

import datetime
import json
import os
import platform
import subprocess
import sys

import pytest
import tensorflow as tf

from tfopt.calibration import Calibration
from tfopt.calibration_cache import (auto_calibration, cache_directory,
                                     cache_path, cached_calibration,
                                     default_mode)
from tfopt.cost.comm import Link


def _fake(calls):
  def measure(kind, num_devices):
    calls.append((kind, num_devices))
    return Calibration(kind=kind, num_devices=num_devices,
                       link=Link(24.0 + len(calls), 1e6, 0.0),
                       control_messages=True, capacity=1.05, shared=True)
  return measure


def test_measured_once_then_read_back(tmp_path):
  calls = []
  first = cached_calibration("logical", 2, directory=tmp_path,
                             measure=_fake(calls))
  again = cached_calibration("logical", 2, directory=tmp_path,
                             measure=_fake(calls))
  assert calls == [("logical", 2)]  # the second call read the file
  assert again.link == first.link and again.path == first.path
  path = cache_path("logical", 2, tmp_path)
  assert first.path == str(path) and path.is_file()
  # Keyed by host, TensorFlow version, kind and count.
  for part in ("logicalx2", platform.node().replace(" ", "_")[:8],
               f"tf{tf.__version__}"):
    assert part in path.name, (part, path.name)
  cached_calibration("logical", 4, directory=tmp_path, measure=_fake(calls))
  assert calls[-1] == ("logical", 4) and len(calls) == 2


@pytest.mark.parametrize("spoil", ["other_tf", "stale", "broken"])
def test_a_cached_file_that_no_longer_fits_is_measured_again(tmp_path,
                                                             spoil):
  calls = []
  cached_calibration("logical", 2, directory=tmp_path, measure=_fake(calls))
  path = cache_path("logical", 2, tmp_path)
  if spoil == "broken":
    path.write_text("{not json")
  else:
    doc = json.loads(path.read_text())
    if spoil == "other_tf":
      doc["tensorflow"] = "2.0.0"
    else:
      doc["created"] = (datetime.datetime.now(datetime.timezone.utc) -
                        datetime.timedelta(days=45)).isoformat()
    path.write_text(json.dumps(doc))
  fresh = cached_calibration("logical", 2, directory=tmp_path,
                             measure=_fake(calls))
  assert len(calls) == 2 and fresh.link.latency_us == 26.0
  assert json.loads(path.read_text())["tensorflow"] == tf.__version__


def test_cache_directory_argument_env_and_default(tmp_path, monkeypatch):
  monkeypatch.delenv("TFOPT_CACHE_DIR", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert cache_directory() == tmp_path / "xdg" / "tfopt"
  monkeypatch.setenv("TFOPT_CACHE_DIR", str(tmp_path / "env"))
  assert cache_directory() == tmp_path / "env"
  assert cache_directory(tmp_path / "arg") == tmp_path / "arg"
  with pytest.raises(ValueError, match="Argument `kind`"):
    cache_path("gpu", 2)


def test_default_mode_is_auto_unless_the_environment_says_none(monkeypatch):
  monkeypatch.delenv("TFOPT_CALIBRATION", raising=False)
  assert default_mode() == "auto"
  monkeypatch.setenv("TFOPT_CALIBRATION", " None ")
  assert default_mode() == "none"
  monkeypatch.setenv("TFOPT_CALIBRATION", "off")
  with pytest.raises(ValueError, match=r"`TFOPT_CALIBRATION` must be one of "
                     r"\['auto', 'none'\].*Received: TFOPT_CALIBRATION='off'"):
    default_mode()


def test_the_default_without_placement_is_not_refused(monkeypatch):
  import keras  # pylint: disable=g-import-not-at-top
  import tfopt  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("TFOPT_CALIBRATION", "off")  # never read without it
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  tfopt.compile(model, optimizer="sgd", loss="mse", verbose=False)
  with pytest.raises(ValueError, match="Argument `calibration` must be "
                     "given only with `placement`"):
    tfopt.compile(model, optimizer="sgd", loss="mse", calibration="auto")


def test_auto_calibrates_only_this_process_cpus(tmp_path):
  calls = []
  kw = dict(directory=tmp_path, measure=_fake(calls))
  assert auto_calibration(["/job:worker/task:0/device:CPU:0",
                           "/job:worker/task:1/device:CPU:0"], **kw) is None
  assert auto_calibration(["/device:CPU:0"], **kw) is None  # no link
  got = auto_calibration(["/device:CPU:0", "/device:CPU:1"], **kw)
  assert calls == [("logical", 2)] and got.kind == "logical"


_SCRIPT = r"""
import os, sys
import tensorflow as tf
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, numpy as np, tfopt
def fitted(**calibration):
  model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32),
                            keras.layers.Dense(4)])
  tfopt.compile(model, optimizer="adam", loss="mse", placement="auto",
                devices=["/device:CPU:0", "/device:CPU:1"], verbose=False,
                **calibration)
  x = np.random.rand(32, 16).astype("float32")
  model.fit(x, np.random.rand(32, 4).astype("float32"), batch_size=8,
            verbose=0)
  (report,) = model.train_function.reports.values()
  return report.cluster_source
print("FIRST", fitted())
print("MTIME", os.path.getmtime(sys.argv[1]))
print("SECOND", fitted())
print("MTIME", os.path.getmtime(sys.argv[1]))
print("NONE", fitted(calibration=None))
os.environ["TFOPT_CALIBRATION"] = "none"
print("ENVNONE", fitted())
"""


@pytest.mark.slow
def test_compile_by_default_measures_this_machine_once_and_reports_it(
    tmp_path):
  # No `calibration` argument and no TFOPT_CALIBRATION (the suite sets it
  # to "none"): what a user gets.
  env = dict(os.environ, TFOPT_CACHE_DIR=str(tmp_path))
  env.pop("TFOPT_CALIBRATION", None)
  path = cache_path("logical", 2, tmp_path)
  done = subprocess.run([sys.executable, "-c", _SCRIPT, str(path)], env=env,
                        capture_output=True, text=True, timeout=600,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = dict(line.split(" ", 1) for line in done.stdout.splitlines()
               if line.split(" ", 1)[0] in ("FIRST", "SECOND", "NONE",
                                            "ENVNONE"))
  out = done.stdout
  # Measured here (a file now in the cache), and the report says which
  # calibration it used and how old it is.
  assert path.is_file()
  assert f"calibrated logical x2 ({path}, " in lines["FIRST"]
  assert " min old)" in lines["FIRST"], lines["FIRST"]
  # The second compile read it: the file was not written again.
  mtimes = [line for line in out.splitlines() if line.startswith("MTIME")]
  assert len(mtimes) == 2 and mtimes[0] == mtimes[1]
  # The same calibration, older by the time between (its age aside).
  assert lines["SECOND"].split(" min old")[1] == \
      lines["FIRST"].split(" min old")[1]
  doc = json.loads(path.read_text())
  assert doc["kind"] == "logical" and doc["num_devices"] == 2
  # Opted out, by the argument or the environment: Baechi's model.
  assert lines["NONE"].startswith("not calibrated"), lines["NONE"]
  assert lines["ENVNONE"].startswith("not calibrated"), lines["ENVNONE"]
