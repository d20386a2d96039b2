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


def _place(*args):
  return subprocess.run([sys.executable, "-m", "experiments.place", *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_place_script_json_plan_and_gantt(tmp_path):
  import json

  from tfopt.graph import save_costgraph
  from tfopt.graph.synthetic import layered_dag

  graph, costs = layered_dag(120, seed=4)
  path = tmp_path / "g.json"
  save_costgraph(path, graph, costs)
  plan, png = tmp_path / "plan.json", tmp_path / "gantt.png"
  done = _place(f"--costgraph={path}", "--devices=3", "--memory_fraction=0.5",
                "--json", f"--out={plan}", f"--gantt={png}")
  assert done.returncode == 0, done.stderr[-2000:]
  summary = json.loads(done.stdout)
  assert set(summary) == {"placer", "placement_seconds", "makespan_us",
                          "single_device_us", "lower_bound_us", "peak_bytes",
                          "feasible"}
  assert summary["feasible"] and len(summary["peak_bytes"]) == 3
  written = json.loads(plan.read_text())
  assert set(written["placement"]) == {op.name for op in graph.ops}
  assert png.read_bytes()[:4] == b"\x89PNG"
  again = _place(f"--costgraph={path}", "--devices=3", f"--out={plan}")
  assert again.returncode != 0 and "overwrite" in again.stderr
  tiny = _place(f"--costgraph={path}", "--devices=2",
                "--memory_per_device=1000", "--json")
  assert tiny.returncode == 1
  assert json.loads(tiny.stdout)["feasible"] is False
  assert "needs" in json.loads(tiny.stdout)["error"]
