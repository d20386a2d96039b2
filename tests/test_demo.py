"""`make demo`'s command with `--quick` end to end, each stage's figures
checked against evidence the report did not compute: the exported models
themselves, the launcher's own records, the weights, a SavedModel loaded
by TensorFlow. (tests/test_readme.py leaves `make demo` to this test.)"""

import json
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest

from tfopt.runtime import caps

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    caps.unavailable_reason() is not None,
    reason=f"memory caps unavailable: {caps.unavailable_reason()}")]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _make_demo_argv(out) -> list:
  """`make demo`'s own command (the Makefile's recipe), with --quick and
  the output moved to `out`."""
  recipe = subprocess.run(["make", "-n", "demo"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
  (line,) = [l for l in recipe.splitlines() if "tfopt-demo" in l]
  argv = [a for a in shlex.split(line) if "=" not in a or
          not a.split("=")[0].isupper()]  # drop VAR=value prefixes
  assert os.path.basename(argv[0]) == "tfopt-demo", line
  argv = [sys.executable, "-m", "tfopt.cli.demo"] + [
      f"--out_dir={out}" if a.startswith("--out_dir=") else a
      for a in argv[1:]]
  assert f"--out_dir={out}" in argv and "--overwrite" in argv, line
  return argv + ["--quick"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
  out = tmp_path_factory.mktemp("demo")
  done = subprocess.run(_make_demo_argv(out), cwd=ROOT, capture_output=True,
                        text=True, timeout=1500, check=False)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  with open(out / "report.json", encoding="utf-8") as f:
    report = json.load(f)
  return out, report, done.stdout


def test_progress_per_stage_and_the_page(demo):
  out, report, stdout = demo
  for stage in ("search:", "train:", "prune:", "export:"):
    assert stage in stdout
  assert stdout.strip().splitlines()[-1].endswith(
      str(out / "report.html"))
  page = (out / "report.html").read_text()
  # Self-contained: the four pictures inlined, nothing fetched.
  assert page.count("data:image/png;base64,") == 4
  assert "http" not in page.replace("charset", "")
  assert set(report) >= {"search", "train", "prune", "export"}


def test_search_exports_an_admitted_keras_hub_model(demo):
  import keras  # pylint: disable=g-import-not-at-top
  import keras_hub  # pylint: disable=g-import-not-at-top
  _, report, _ = demo
  search = report["search"]
  assert len(search["ranking"]) == search["sub_networks"] == 16
  model = keras.saving.load_model(search["exported"])
  assert isinstance(model, keras_hub.models.Qwen3MoeCausalLM)
  config = model.backbone.get_config()
  # The analyst removed top-1 routing: the chosen model routes to two.
  assert search["constraint"] == {**search["constraint"], "action":
                                  "remove", "layer": "top_k", "op": "k1"}
  assert config["top_k"] == 2
  assert model.count_params() == search["chosen"]["params"]
  for key in ("num_layers", "num_experts", "moe_intermediate_dim"):
    assert config[key] == search["chosen"]["config"][key]
  assert search["export_max_abs_diff"] < 1e-5


def test_training_survived_the_fault_with_nothing_lost(demo):
  from tfopt.scale.launch import LaunchResult  # pylint: disable=g-import-not-at-top
  out, report, _ = demo
  runs = {}
  for name in ("clean", "faulted"):
    run_dir = out / "train" / name
    with open(run_dir / "launch.json", encoding="utf-8") as f:
      record = json.load(f)
    runs[name] = (record, LaunchResult(True, str(run_dir),
                                       record["attempts"]).trajectory())
  record, faulted = runs["faulted"]
  _, clean = runs["clean"]
  kinds = [(a.get("failure") or {}).get("kind") for a in record["attempts"]]
  assert kinds == ["task lost", None]
  (fault,) = record["attempts"][0]["faults"]
  assert fault["kind"] == "kill_task" and "server task" in fault["target"]
  assert faulted["lost"] == [] and faulted["repeated"] == []
  job = report["config"]["train"]["job"]
  assert faulted["steps"] == clean["steps"] == \
      job["epochs"] * job["steps_per_epoch"]
  for step, loss in clean["loss"].items():
    assert faulted["loss"][step] == pytest.approx(loss, rel=1e-4), step
  # Restarted from the checkpoint before the kill: those steps recomputed.
  killed = report["config"]["train"]["kill_after_step"]
  assert faulted["recomputed"] == killed % job["checkpoint_every"]
  # The weights each run ended with, read from the files they wrote.
  import keras  # pylint: disable=g-import-not-at-top
  import keras_hub  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  ends = []
  for name in ("clean", "faulted"):
    model = keras.saving.load_model(report["search"]["exported"],
                                    compile=False)
    model.load_weights(out / "train" / name / "out" / "final.weights.h5")
    ends.append(model.get_weights())
  # Each attempt places the step afresh (float sums in another order);
  # Adam's normalised steps carry that into the last digits of a few
  # weights (a rarely seen token's row): compared tensor by tensor.
  for a, b in zip(*ends):
    assert np.linalg.norm(a - b) <= 1e-3 * np.linalg.norm(b)
  # Each attempt's step was spread over the server tasks, each within
  # the cap by the plan and within the OS limit by the kernel.
  for attempt in (0, 1):
    with open(out / "train" / "faulted" / "out" / f"attempt-{attempt}.json",
              encoding="utf-8") as f:
      hook = json.load(f)
    assert len(hook["devices_used"]) >= 2
    assert all("/job:worker/" in d for d in hook["devices_used"])
  # The state really exceeded each device's cap (weights + 2 slots).
  with open(out / "train" / "faulted" / "spec.json", encoding="utf-8") as f:
    spec = json.load(f)
  params = report["search"]["chosen"]["params"]
  assert 3 * 4 * params > spec["cap_bytes"]
  sizes = report["train"]["sizes"]
  assert sizes["state_bytes"] == 12 * params
  assert report["train"]["faulted"]["failures"] == ["task lost"]


def test_pruned_weights_are_half_zero_and_perplexities_recomputed(demo):
  import keras  # pylint: disable=g-import-not-at-top
  from tfopt.demo import text  # pylint: disable=g-import-not-at-top
  from tfopt.nas.moe_lm import token_perplexity  # pylint: disable=g-import-not-at-top
  _, report, _ = demo
  prune = report["prune"]
  model = keras.saving.load_model(prune["model"])
  zeros = []
  for decoder in model.backbone.transformer_layers:
    bank = decoder.mlp.expert_bank
    for kernel in (bank._expert_feedforward_gate_dense,
                   bank._expert_feedforward_output_dense):
      value = keras.ops.convert_to_numpy(kernel)
      zeros.append((value == 0).mean())
  assert all(abs(z - 0.5) < 0.01 for z in zeros), zeros
  assert abs(prune["sparsity"] - 0.5) < 0.01
  cfg = report["config"]["text"]
  splits = text.demo_splits(cfg["examples"], cfg["sequence_length"],
                            cfg["merges"], cfg["held_out"])
  held = splits.held_out
  assert token_perplexity(model, held.x, held.y, held.sample_weight) == \
      pytest.approx(prune["perplexity"]["distilled"], rel=1e-4)
  # Distillation recovers part of what pruning cost.
  p = prune["perplexity"]
  assert p["dense"] < p["pruned"] and p["distilled"] < p["pruned"]


def test_served_logits_equal_predict(demo):
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfopt.demo import text  # pylint: disable=g-import-not-at-top
  _, report, _ = demo
  model = keras.saving.load_model(report["prune"]["model"])
  loaded = tf.saved_model.load(report["export"]["path"])
  cfg = report["config"]["text"]
  splits = text.demo_splits(cfg["examples"], cfg["sequence_length"],
                            cfg["merges"], cfg["held_out"])
  batch = {k: v[:5] for k, v in splits.held_out.x.items()}
  served = loaded.signatures["serving_default"](
      **{k: tf.constant(v) for k, v in batch.items()})
  (logits,) = served.values()
  np.testing.assert_allclose(logits.numpy(),
                             model.predict(batch, verbose=0), atol=1e-5)
  assert report["export"]["served_max_abs_diff"] < 1e-5
