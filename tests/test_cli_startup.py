"""NAS commands that need no model answer without importing TensorFlow:
steering a run (the analyst's loop: edit, look again) and the refusal of
bad input take well under a second instead of TensorFlow's import (7 s or
so here). Checked by the interpreter's own import log (-X importtime), in
a fresh process as a user runs them. (tfopt.pruning stays eager: importing
it registers the MoE layer for `keras.models.load_model`.)"""

import json
import subprocess
import sys

from tfopt.nas.run import RunDir
from tfopt.nas.space import tiny64

HEAVY = ("tensorflow", "keras")


def _run(module: str, *args: str):
  """(process, top-level packages it imported) of `python -m module`."""
  done = subprocess.run([sys.executable, "-X", "importtime", "-m", module,
                         *args], capture_output=True, text=True, timeout=300)
  imported = {line.rsplit("|", 1)[1].strip().split(".")[0]
              for line in done.stderr.splitlines()
              if line.startswith("import time:") and "|" in line}
  return done, imported


def _run_dir(tmp_path, seed: int = 7) -> str:
  run = RunDir(str(tmp_path / "run"))
  run.create(tiny64(filters=4), {"seed": seed})
  return run.path


def test_steering_a_nas_run_does_not_import_tensorflow(tmp_path):
  path = _run_dir(tmp_path)
  done, imported = _run("tfopt.cli.nas", "--mode=steer", f"--run_dir={path}",
                        "--remove=layer0:skip", "--max_params=50000")
  assert done.returncode == 0, done.stderr[-3000:]
  assert "tfopt" in imported  # the log was read
  assert not imported & set(HEAVY), imported & set(HEAVY)
  doc = json.loads((tmp_path / "run" / "constraints.json").read_text())
  assert doc["version"] == 2 and doc["remove"] == {"layer0": ["skip"]}
  assert doc["limits"]["max_params"] == 50000


def test_refusals_come_before_tensorflow(tmp_path):
  path = _run_dir(tmp_path)
  cases = [
      ("tfopt.cli.nas", ["--mode=rank", f"--run_dir={path}", "--seed=0"],
       "started with seed 7"),
      ("tfopt.cli.nas", ["--mode=search", f"--run_dir={path}"], "--resume"),
      ("tfopt.cli.nas", ["--mode=steer", f"--run_dir={path}",
                         "--remove=layer0:conv9"], "ops of that layer"),
  ]
  for module, args, message in cases:
    done, imported = _run(module, *args)
    assert done.returncode != 0 and message in done.stderr, (
        args, done.stderr[-2000:])
    assert "tfopt" in imported
    assert not imported & set(HEAVY), (args, imported & set(HEAVY))
