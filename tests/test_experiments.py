"""The profiling script, run as a user runs it."""

import json
import subprocess
import sys
import pathlib

import pytest

from tfopt.graph import load_costgraph

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(*args):
  return subprocess.run([sys.executable, "-m", "tfopt.cli.profile", *args],
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
  return subprocess.run([sys.executable, "-m", "tfopt.cli.place", *args],
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
                          "single_device_us", "lower_bound_us",
                          "lower_bound_term", "lower_bound_terms",
                          "plan_over_bound", "peak_bytes", "feasible"}
  assert summary["feasible"] and len(summary["peak_bytes"]) == 3
  # The bound is the largest of its terms, named, and below the plan.
  terms = summary["lower_bound_terms"]
  assert summary["lower_bound_us"] == max(terms.values())
  assert terms[summary["lower_bound_term"]] == summary["lower_bound_us"]
  assert 0 < summary["lower_bound_us"] <= summary["makespan_us"]
  assert summary["plan_over_bound"] == pytest.approx(
      summary["makespan_us"] / summary["lower_bound_us"])
  written = json.loads(plan.read_text())
  assert set(written["placement"]) == {op.name for op in graph.ops}
  # Not the script's word for it: the plan, re-simulated against the cap
  # computed here, fits, and has the makespan and peaks it printed.
  from tfopt import Cluster
  from tfopt.graph.synthetic import total_memory
  from tfopt.simulate import simulate
  cap = int(total_memory(graph, costs) * 0.5)
  assert written["memory_per_device"] == cap and written["devices"] == 3
  again = simulate(graph, written["placement"], costs, Cluster.uniform(3, cap))
  assert all(peak <= cap for peak in again.peak_bytes), again.over_cap()
  assert list(again.peak_bytes) == summary["peak_bytes"]
  assert again.makespan_us == pytest.approx(summary["makespan_us"])
  # The whole graph on one device would not fit under that cap.
  one = simulate(graph, {op.name: 0 for op in graph.ops}, costs,
                 Cluster.uniform(1, cap))
  assert not one.feasible
  assert summary["makespan_us"] < summary["single_device_us"]
  assert png.read_bytes()[:4] == b"\x89PNG"
  again = _place(f"--costgraph={path}", "--devices=3", f"--out={plan}")
  assert again.returncode != 0 and "overwrite" in again.stderr
  tiny = _place(f"--costgraph={path}", "--devices=2",
                "--memory_per_device=1000", "--json")
  assert tiny.returncode == 1
  assert json.loads(tiny.stdout)["feasible"] is False
  assert "needs" in json.loads(tiny.stdout)["error"]


def _prune_moe(*args):
  return subprocess.run([sys.executable, "-m", "tfopt.cli.prune_moe", *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_prune_moe_script_reports_and_exports(tmp_path):
  import json

  export = tmp_path / "sparse"
  done = _prune_moe("--methods=magnitude,moe_pruner", "--sparsity=0.5",
                    "--calibration_windows=4", "--eval_windows=8", "--json",
                    f"--export_dir={export}")
  assert done.returncode == 0, done.stderr[-2000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  # The committed reference model is trained: low perplexity on bytes.
  assert 1.5 < out["dense_ppl"] < 8
  ratios = {r["method"]: r["ppl_ratio"] for r in out["runs"]}
  assert set(ratios) == {"magnitude", "moe_pruner"}
  assert all(r["sparsity"] == 0.5 for r in out["runs"])
  assert 1.0 < ratios["moe_pruner"] < ratios["magnitude"]
  assert out["export_ratio"] <= 0.54
  assert (export / "manifest.json").exists()
  again = _prune_moe("--methods=moe_pruner", "--calibration_windows=4",
                     "--eval_windows=8", f"--export_dir={export}")
  assert again.returncode != 0 and "--overwrite" in again.stderr


def test_prune_moe_script_bad_flags(tmp_path):
  for args, message in [
      (["--sparsity=1.5"], "--sparsity must be in [0, 1). Received: 1.5"),
      (["--methods=random"], "--methods must be a non-empty list"),
      (["--pattern=half"], '--pattern must be N:M such as "2:4"'),
      ([f"--checkpoint={tmp_path}/none.weights.h5"], "pass --train")]:
    done = _prune_moe(*args)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr[-1000:]


@pytest.mark.slow
def test_run_placed_script_end_to_end(tmp_path):
  out = tmp_path / "demo"
  args = [sys.executable, "-m", "tfopt.cli.run_placed",
          "--config=experiments/configs/run_placed_mlp.py", f"--out_dir={out}"]
  done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  for line in ("pass pipeline", "_FusedMatMul +3", "<- chosen",
               "equal the unplaced step's", "ran where planned",
               "across 2 server processes", "prediction: measured",
               "PredictRequest over gRPC"):
    assert line in done.stdout, (line, done.stdout[-3000:])
  plan = json.loads((out / "plan.json").read_text())
  assert plan["placement"] and (out / "gantt.png").stat().st_size > 1000
  assert (out / "saved_model" / "saved_model.pb").exists()
  again = subprocess.run(args, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
  assert again.returncode != 0 and "--overwrite" in again.stderr


def _train(*args):
  return subprocess.run([sys.executable, "-m", "tfopt.cli.train", *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_train_script_configs(tmp_path):
  out = tmp_path / "run.json"
  png = tmp_path / "mfu.png"
  done = _train("--config=experiments/configs/train_digits_mlp.py",
                "--epochs=4", f"--out={out}", f"--mfu_png={png}")
  assert done.returncode == 0, done.stderr[-3000:]
  assert png.read_bytes()[:4] == b"\x89PNG"
  result = json.loads(out.read_text())
  assert result["final"]["val_accuracy"] >= 0.9
  assert result["config"]["optimizer"] == "cautious_adamw"
  assert "_FusedMatMul +3" in result["reports"][0]
  assert "MFU" in done.stdout
  again = _train("--config=experiments/configs/train_digits_mlp.py",
                 "--epochs=1", f"--out={out}")
  assert again.returncode != 0 and "--overwrite" in again.stderr
  # The placed config runs in tests/test_readme.py (README's commands).


def test_train_script_bad_configs(tmp_path):
  missing = _train(f"--config={tmp_path / 'nope.py'}")
  assert missing.returncode != 0 and "does not exist" in missing.stderr
  bad = tmp_path / "bad.py"
  bad.write_text('CONFIG = {"modle": "mlp"}\n')
  unknown = _train(f"--config={bad}")
  assert unknown.returncode != 0 and "unknown keys ['modle']" in \
      unknown.stderr
  bad.write_text('CONFIG = {"optimizer": "sgdd"}\n')
  wrong = _train(f"--config={bad}")
  assert wrong.returncode != 0 and "optimizer must be one of" in wrong.stderr



def test_config_sets_flags_and_the_command_line_wins(tmp_path):
  config = "--config=experiments/configs/place_gnmt_4dev.py"
  done = _place(config, "--json")
  assert done.returncode == 0, done.stderr[-2000:]
  assert len(json.loads(done.stdout)["peak_bytes"]) == 4
  override = _place(config, "--devices=2", "--memory_fraction=0.6", "--json")
  assert override.returncode == 0, override.stderr[-2000:]
  assert len(json.loads(override.stdout)["peak_bytes"]) == 2
  bad = tmp_path / "bad.py"
  for text, message in [
      ('CONFIG = {"devicez": 2}', "unknown keys ['devicez']"),
      ('CONFIG = {"placer": "greedy"}', "placer='greedy' is not a valid "
       "--placer"),
      ('CONFIG = {"devices": "two"}', "devices='two' is not a valid"),
      ("X = 1", "must define CONFIG")]:
    bad.write_text(text + "\n")
    wrong = _place(f"--config={bad}", "--costgraph=x.json")
    assert wrong.returncode != 0 and message in wrong.stderr, (
        text, wrong.stderr[-1500:])
  missing = _place("--devices=2")
  assert missing.returncode != 0 and "--costgraph is required" in \
      missing.stderr
  no_time = _place(config, "--time_limit_s=0")
  assert no_time.returncode != 0 and "--time_limit_s=0" in no_time.stderr
  # A tiny limit still returns a plan; the table says what was not run.
  quick = _place(config, "--time_limit_s=0.001")
  assert quick.returncode == 0, quick.stderr[-2000:]
  assert "skipped: not run: time limit reached" in quick.stdout


def test_launch_script_bad_input():
  def launch(*args):
    return subprocess.run([sys.executable, "-m", "tfopt.cli.launch", *args],
                          cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
  no_command = launch("--workers=2")
  assert no_command.returncode != 0
  assert "Give the worker command" in no_command.stderr
  zero = launch("--workers=0", "--", "experiments/scale_train.py")
  assert zero.returncode != 0 and "--workers must be a positive integer. " \
      "Received: 0" in zero.stderr
  absent = launch("--", "experiments/no_such_script.py")
  assert absent.returncode == 2 and "no_such_script.py" in absent.stderr
