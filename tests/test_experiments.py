"""The profiling script, run as a user runs it."""

import subprocess
import sys
import pathlib

from tfopt.graph import load_costgraph

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(*args):
  return subprocess.run([sys.executable, "-m", "experiments.profile", *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_profile_script_writes_a_costgraph_and_never_overwrites(tmp_path):
  out = tmp_path / "mlp.json"
  done = _run("--model=mlp", "--batch_size=8", f"--out={out}", "--steps=1",
              "--warmup=0")
  assert done.returncode == 0, done.stderr[-2000:]
  for line in ("ops", "total compute", "critical path", "lower bound",
               "memory"):
    assert line in done.stdout
  cg = load_costgraph(out)
  assert len(cg.graph) > 100 and cg.costs.num_profiled() > 100
  before = out.read_bytes()
  again = _run("--model=mlp", f"--out={out}", "--analytic")
  assert again.returncode != 0 and "--overwrite" in again.stderr
  assert out.read_bytes() == before
  analytic = _run("--model=mlp", f"--out={out}", "--analytic", "--overwrite")
  assert analytic.returncode == 0, analytic.stderr[-2000:]
  assert load_costgraph(out).costs.num_profiled() == 0
