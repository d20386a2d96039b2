"""Writes the published numbers from the committed benchmark results.

    .venv/bin/python tools/benchmark_pages.py          # write the pages
    .venv/bin/python tools/benchmark_pages.py --check  # exit 1 if stale

Every figure in `docs/benchmarks.md` and in README's headline table (between
its `benchmarks` markers) is computed here from `benchmarks/results/*.json`;
none is typed by hand. `tests/test_benchmark_pages.py` fails when a committed
page is not this script's rendering of the JSON beside it, so a benchmark
rerun lands together with the pages it changes. The Baechi reference
implementation's rows are the one exception to "measured by a committed
command": they are constants in `tfopt/placement/reference.py`, from running
the reference's own code elsewhere, and the page says so.
"""

from __future__ import annotations

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GUIDE = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
BEGIN = "<!-- benchmarks:begin (tools/benchmark_pages.py) -->"
END = "<!-- benchmarks:end -->"

WORKLOADS = {
    "msr_bert_l3_training_ops": "BERT-L3 training ops",
    "msr_gnmt_training_layers": "GNMT training layers",
    "msr_inceptionv3_training_layers": "Inception-V3 training layers",
    "msr_resnet50_training_ops": "ResNet-50 training ops",
}
MODELS = {"mlp": "MLP", "cnn": "CNN", "transformer": "Transformer LM",
          "transformer_lm": "Transformer LM", "gnmt": "GNMT",
          "towers": "towers", "demo": "demonstration",
          "resnet50": "ResNet-50", "inception_v3": "Inception-V3",
          "branchy_cnn": "branchy CNN", "mobilenet": "MobileNet (alpha 0.25)",
          "lstm": "LSTM classifier"}
TWINS = ("adamw", "lion", "muon")  # ours against the Keras optimizer
METHODS = (("magnitude", "magnitude"), ("wanda", "Wanda (routed)"),
           ("moe_pruner", "MoE-Pruner"), ("sparsegpt", "SparseGPT"),
           ("sparsegpt_refit", "SparseGPT + refit"),
           ("router_obs_no_refit", "router-OBS without refit"),
           ("router_obs", "router-OBS"))


def load(name: str) -> dict:
  """One results file of benchmarks/results, by its stem."""
  return json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------- helpers

def _f(value, digits: int = 2, unit: str = "") -> str:
  if value is None:
    return "--"
  return f"{value:,.{digits}f}{unit}"


def _span(values, digits: int = 2, unit: str = "") -> str:
  """`lo-hi` of the values (one value when they agree at that precision)."""
  lo, hi = _f(min(values), digits), _f(max(values), digits)
  return (lo if lo == hi else f"{lo}-{hi}") + unit


def _table(header: list[str], rows: list[list[str]],
           right: set[int] = frozenset()) -> str:
  align = ["---:" if i in right else "---" for i in range(len(header))]
  lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def _model(name: str) -> str:
  return MODELS.get(name, name)


# ------------------------------------------------------------- sections

def capture_section() -> str:
  d = load("capture")
  rows = [[_model(r["model"]), f"{r['ops']:,}", _f(r["capture_s"], 1),
           _f(r["keras_first_step_s"], 1),
           _f(r["capture_vs_keras_first_step"]),
           _f(r["profile_s_per_step"], 1), _f(r["keras_step_s"], 1),
           _f(r["profiled_step_vs_keras_step"]),
           _f(r["analytic_vs_profiled"])] for r in d["rows"]]
  return "\n\n".join([
      "## Capture and profiling",
      f"`python -m benchmarks.capture` ({d['machine']}, TensorFlow "
      f"{d['tensorflow']}, batch {d['rows'][0]['batch_size']}; "
      "`benchmarks/results/capture.json`). Ours: `capture_train_step`, then "
      "`profile_step`. Baseline in the same process: Keras' own route to a "
      "traced step (its first `train_on_batch`) and its steady-state step.",
      _table(["model", "ops captured", "capture s", "Keras first step s",
              "ratio", "profiled step s", "Keras step s", "ratio",
              "analytic / profiled compute"], rows, set(range(1, 9))),
      "A profiled step costs more than a normal one because ops run one at "
      "a time under full tracing, so each op's time is its own."])


def _placement_rows(d: dict) -> list[dict]:
  return [r for r in d["rows"] if r["workload"] in WORKLOADS]


def _plan(r: dict) -> str:
  if not r["feasible"]:
    return ("no plan can exist (live-memory bound)"
            if r.get("proven_infeasible") else "no plan found")
  return f"{r['makespan_us'] / 1e3:,.1f} ms ({r['placer']})"


def _bound(r: dict) -> str:
  """The proven lower bound and the term that gave it."""
  if not r.get("lower_bound_us"):
    return "--"
  term = r.get("lower_bound_term")
  return (f"{r['lower_bound_us'] / 1e3:,.1f} ms"
          + (f" ({term})" if term else ""))


def _one_device(r: dict) -> str:
  return (_f(r["single_device_us"] / 1e3, 1, " ms")
          if r["single_device_fits"] else "does not fit")


def placement_section() -> str:
  d = load("placement")
  ref_rows = [r for r in _placement_rows(d) if "reference_placer" in r]
  rows = []
  for r in ref_rows:
    best = r.get("reference_best_ms")
    rows.append([
        WORKLOADS[r["workload"]], r["memory_fraction"], _plan(r),
        _one_device(r),
        (f"{best:,.1f} ms ({r['reference_placer']})" if best
         else r["reference_placer"]),
        _f(r.get("vs_reference")),
        _bound(r),
        _f(r.get("vs_lower_bound")),
        f"{r['placement_seconds']:.2f} / "
        f"{_f(r.get('reference_seconds'))}"])
  others = []
  for r in _placement_rows(d):
    if r["devices"] == 4:
      continue
    others.append([WORKLOADS[r["workload"]], r["devices"],
                   r["memory_fraction"], _plan(r),
                   _f(r.get("vs_lower_bound")),
                   _f(r["live_bound_fraction"], 3),
                   _f(r.get("placement_seconds"))])
  synth = []
  for r in d["rows"]:
    if not r["workload"].startswith("synthetic_"):
      continue
    synth.append([f"{r['ops']:,}", r["devices"], r["memory_fraction"],
                  _plan(r), _one_device(r),
                  _f(r["m_topo_us"] / 1e3 if r["m_topo_us"] else None, 1,
                     " ms"),
                  _f(r["placement_seconds"]),
                  _f(r.get("reference_seconds"))])
  return "\n\n".join([
      "## Placement",
      f"`python -m benchmarks.placement` ({d['machine']}; link model "
      f"{d['comm']}; caps as a fraction of the graph's total memory per "
      "device; `benchmarks/results/placement.json`). `bound` is the "
      "makespan's proven lower bound for those devices and caps "
      "(`tfopt.placement.bound`: the largest of the critical path, work "
      "over devices and the memory LP; the term that gave it in "
      "parentheses): no plan simulates faster. `/ bound` is the plan's "
      "makespan over it, at most how far the plan is from optimal.",
      "### Against the Baechi reference implementation (4 devices)",
      "The reference columns are constants in "
      "`tfopt/placement/reference.py`: the reference's own m-TOPO, m-ETF and "
      "m-SCT (beomyeol/baechi, with and without its fusion pass) run "
      "elsewhere on the same workloads and link model, each plan re-scored "
      "by a liveness simulator. They are not re-run by the benchmark; "
      "everything else is.",
      _table(["workload", "cap", "tfopt `auto`", "one device",
              "reference's best valid plan", "ours / reference", "bound",
              "/ bound", "`auto` s / reference m-ETF s"], rows,
             {5, 6, 7, 8}),
      "### Other device counts",
      "`live at once` is the live-memory bound as a fraction of the graph's "
      "memory: where it exceeds devices x cap, no plan exists.",
      _table(["workload", "devices", "cap", "tfopt `auto`", "/ bound",
              "live at once", "`auto` s"], others, {1, 2, 4, 5, 6}),
      "### Synthetic layered DAGs",
      "On the 4-device rows, placement time against the reference's m-ETF "
      "on its own generator's graphs of the same size (a constant of "
      "`tfopt/placement/reference.py`).",
      _table(["ops", "devices", "cap", "tfopt `auto`", "one device",
              "plain m-TOPO", "`auto` s", "reference m-ETF s"], synth,
             {0, 1, 2, 4, 5, 6, 7})])


def optimizers_section() -> str:
  d = load("optimizers")
  over = {}
  twins = [r for r in d["overhead"] if r["optimizer"] in TWINS]
  for r in twins:
    over.setdefault(r["model"], {})[r["optimizer"]] = r
  names = [o for o in TWINS if any(r["optimizer"] == o for r in twins)]
  routing = [r for r in d["overhead"] if r["optimizer"] not in TWINS]
  rows = []
  for model, by in over.items():
    row = [model]
    for o in names:
      r = by.get(o)
      row.append(f"{r['ours_ms']:.2f} / {r['keras_ms']:.2f} ms = "
                 f"{r['ratio']:.2f}x" if r else "--")
    rows.append(row)
  ns = [["x".join(map(str, r["shape"])), _f(r["ours_ms"]), _f(r["keras_ms"]),
         _f(r["ratio"])] for r in d["newton_schulz"]]
  conv = d["convergence"]
  crows = [[r["optimizer"], r["weight_decay"], _f(r["cwd_loss"], 3),
            _f(r["plain_loss"], 3), _f(r["loss_ratio"], 3),
            r["cwd_lower_loss_seeds"],
            f"{r['cwd_accuracy']:.3f} / {r['plain_accuracy']:.3f}",
            f"{r['cwd_weight_norm']:.1f} / {r['plain_weight_norm']:.1f}"]
           for r in conv["summary"]]
  return "\n\n".join([
      "## Cautious Weight Decay optimizers",
      f"`python -m benchmarks.optimizers` ({d['machine']}, {d['cpus']} cpus, "
      f"TensorFlow {d['tensorflow']}, Keras {d['keras']}; "
      "`benchmarks/results/optimizers.json`).",
      "Step time of `apply_gradients` under XLA with fixed gradients, ours "
      "(CWD on) against the Keras twin in the same process, steps "
      "interleaved, median; ours / Keras:",
      _table(["model"] + [n for n in names], rows),
      "Not a twin: " + "; ".join(
          f"{r['optimizer']} on {r['model']}: {r['ours_ms']:.0f} / "
          f"{r['keras_ms']:.0f} ms = {r['ratio']:.2f}x (tfopt's routing "
          "orthogonalizes the attention kernels Keras' leaves to AdamW: "
          "more work, by design)" for r in routing) + ".",
      "Newton-Schulz orthogonalization per matrix, ours vs Keras' Muon (ms):",
      _table(["shape", "ours", "Keras", "ratio"], ns, {1, 2, 3}),
      f"Convergence: {conv['task']}, {conv['steps']} steps; final training "
      "loss (nats per character), mean over seeds, CWD against decoupled "
      "decay at equal weight decay:",
      _table(["optimizer", "weight decay", "CWD loss", "decoupled loss",
              "ratio", "CWD lower", "accuracy CWD / decoupled",
              "weight norm CWD / decoupled"], crows, {1, 2, 3, 4}),
      "![final loss vs weight decay]"
      "(../benchmarks/results/optimizers_convergence.png)"])


def _moe_table(d: dict) -> str:
  """Perplexity / dense per pattern and method (4 decimals: the goals sit
  at 1.02 and 1.04), with the paired seed counts."""
  rows = []
  for pattern, s in d["summary"].items():
    rows.append([pattern] + [_f(s[k]["mean_ratio"], 4) for k, _ in METHODS]
                + [f"{s['moe_pruner_beats_wanda_seeds']} / {d['seeds']}",
                   f"{s['router_obs_beats_sparsegpt_seeds']} / "
                   f"{d['seeds']}"])
  return _table(["pattern"] + [n for _, n in METHODS]
                + ["MoE-Pruner better than Wanda",
                   "router-OBS better than SparseGPT"], rows,
                set(range(1, len(METHODS) + 3)))


def moe_section() -> str:
  d, ref = load("moe_pruning"), load("moe_reference")
  more = load("moe_pruning_128")
  m = d["model"]
  dist = d["distillation"]
  drows = [["dense (the bar)", _f(dist["dense_finetuned"]["ppl_before"], 3),
            _f(dist["dense_finetuned"]["ppl_after"], 3), "-"]]
  for key, name in (("pruned_finetuned", "pruned, plain fine-tuning"),
                    ("pruned_distilled", "pruned, `ExpertDistiller`"),
                    ("router_obs_distilled",
                     "router-OBS, `ExpertDistiller`")):
    r = dist[key]
    drows.append([name, _f(r["ppl_before"], 3), _f(r["ppl_after"], 3),
                  _f(100 * r["gap_closed"], 1, " %")])
  return "\n\n".join([
      "## MoE pruning",
      "`python -m benchmarks.moe_pruning` (`benchmarks/results/"
      "moe_pruning.json`) on the reference model of `python -m "
      f"benchmarks.moe_reference` (`tfopt.zoo.moe_lm`: {m['num_experts']} "
      f"experts, top-{m['top_k']}, {m['num_layers']} blocks, d_model "
      f"{m['d_model']}; {ref['steps']:,} steps, held-out perplexity "
      f"{ref['eval_perplexity']:.3f} on {ref['eval_tokens']:,} bytes). "
      f"Expert kernels pruned, calibration {d['calibration_windows']} "
      f"windows, {d['seeds']} calibration seeds; perplexity / dense, mean "
      "over the seeds:",
      _moe_table(d),
      f"Sparse export at 50 %: {d['export_ratio_50']:.3f}x the dense fp32 "
      "expert bytes.",
      "Router-OBS against SparseGPT is paired by seed (the same "
      "calibration windows and held-out text); its `prior_tokens` "
      "default and its refit were chosen on held-out windows this table "
      "does not use. \"+ refit\": the kept weights solved exactly for "
      "the chosen mask (`prune_moe(refit=True)`, router-OBS's default); "
      "\"router-OBS without refit\" is the method as first shipped.",
      f"The same with {more['calibration_windows']} calibration windows "
      f"({more['calibration_windows'] * 128:,} tokens; `python -m "
      f"benchmarks.moe_pruning --parts=prune --calibration_windows="
      f"{more['calibration_windows']} --out=benchmarks/results/"
      f"moe_pruning_128.json`), the calibration size chosen on those "
      "held-out windows (32, 64 and 128 tried with router-OBS):",
      _moe_table(more),
      f"Fine-tuning after pruning at 50 % (seed 0), {d['finetune_steps']} "
      f"steps of batch {d['finetune_batch']}, the same data for every row; "
      "gap closed = (pruned - tuned) / (pruned - dense tuned), from each "
      "row's own pruned perplexity:",
      _table(["model", "perplexity before", "after", "gap closed"], drows,
             {1, 2, 3}),
      _experts_section(d["experts"])])


def _experts_section(ex: dict) -> str:
  """prune_experts: perplexity per method, then the exported models."""
  rows = [[name, _f(v["mean_ratio"], 3), _span([v["min"], v["max"]], 3)]
          for name, v in ex["summary"].items()]
  params = {"reference LM": {}, "keras-hub Mixtral (random weights)": {}}
  for r in ex["runs"]:
    if r["method"] == "reap" and not r["merge"] and r["seed"] == 0:
      params["reference LM"][f"removed_{round(r['removed'] * 100)}"] = \
          r["params"]
      params["reference LM"]["dense"] = r["params_dense"]
  for name, r in ex["mixtral"]["rows"].items():
    params["keras-hub Mixtral (random weights)"][name] = r["params"]
    params["keras-hub Mixtral (random weights)"]["dense"] = r["params_dense"]
  exported = []
  for where, models in (("reference LM", ex["saved_models"]),
                        ("keras-hub Mixtral (random weights)",
                         ex["mixtral"]["saved_models"])):
    dense = models["dense"]
    for name, m in models.items():
      count = params[where].get(name)
      exported.append([
          where, name.replace("_", " ") + (" %" if name != "dense" else ""),
          f"{m['saved_model_bytes'] / 1e6:.2f} MB "
          f"({m['saved_model_bytes'] / dense['saved_model_bytes']:.2f}x)",
          f"{m['latency_min_ms']:.2f} ms "
          f"({m['latency_min_ms'] / dense['latency_min_ms']:.2f}x)",
          f"{count:,}" if count else "-"])
  mix = ex["mixtral"]["rows"]
  change = ", ".join(f"{k.split('_')[1]} %: {v['relative_output_change']:.3f}"
                     for k, v in mix.items())
  return "\n\n".join([
      "### Removing whole experts (`prune_experts`)",
      f"Experts removed from every layer of the reference LM (dense "
      f"perplexity {ex['dense_ppl']:.3f}), no fine-tuning after; "
      "perplexity / dense over 5 calibration seeds (REAP's saliency "
      "ranks the experts the same on every seed):",
      _table(["removed, method", "perplexity / dense", "seeds' range"], rows,
             {1, 2}),
      "The exported SavedModels (REAP, seed 0), `serve` on 8 sequences, "
      "the models timed in alternating rounds, minimum per model:",
      _table(["model", "experts removed", "SavedModel", "latency",
              "parameters"], exported, {2, 3, 4}),
      f"On the random-weight Mixtral backbone perplexity means nothing; "
      f"its output changes relative to dense by {change}."])


NAS_RUNS = (("nas", "accuracy"), ("nas_log_likelihood", "log-likelihood"),
            ("nas_log_likelihood_fair", "log-likelihood, fair sampler"))


def nas_section() -> str:
  rows = []
  for name, label in NAS_RUNS:
    for s in load(name)["seeds"]:
      rows.append([s["seed"], label, _f(s["kendall_tau"], 3),
                   _f(s["compute_ratio"], 4), _f(s["best_test"], 4),
                   _f(s["top3_best_test"], 4), _f(s["top1_test"], 4),
                   _f(s["exhaustive_pick_test"], 4),
                   _f(s["retrained_pick_test"], 4),
                   _f(s["random_search"]["mean"], 4),
                   _f(s["steering"]["top1_test"], 4)])
  d = load("nas")
  return "\n\n".join([
      "## One-shot NAS",
      "`python -m benchmarks.nas`, `--score=log_likelihood` and "
      "`--schedule=fair` (results `benchmarks/results/nas*.json`): the "
      f"`{d['space']}` space on sklearn's digits, every sub-graph trained "
      f"stand-alone for {d['epochs']} epochs, the super-network for "
      f"1/{d['fraction']} of that compute; test accuracies. `random "
      "search` is the mean test accuracy of random search's pick at the "
      "same compute as one-shot plus the top-3 retraining.",
      _table(["seed", "one-shot score", "Kendall tau", "compute",
              "best in space", "best of top-3", "top-1", "exhaustive pick",
              "top-3 retrained pick", "random search", "steered top-1"],
             rows, set(range(2, 11))),
      "One-shot score against stand-alone test accuracy, per scoring "
      "(accuracy, log-likelihood, log-likelihood with the fair sampler):",
      "![accuracy score](../benchmarks/results/nas.png)",
      "![log-likelihood score](../benchmarks/results/"
      "nas_log_likelihood.png)",
      "![log-likelihood, fair sampler](../benchmarks/results/"
      "nas_log_likelihood_fair.png)",
      nas_ranking_section()])


def nas_ranking_section() -> str:
  d = load("nas_ranking")
  seeds = [r["seed"] for r in d["seeds"]]
  rows, ll_rows = [], []
  for name, m in d["summary"].items():
    score, multiple = name.split("@")
    rows.append([score.replace("_", "-"), multiple,
                 *[_f(t, 3) for t in m["tau"]],
                 _span(m["tau_single"], 3), _f(m["time_ratio"], 2) + "x"])
    ll_rows.append([score.replace("_", "-"), multiple,
                    *[_f(t, 3) for t in m["tau_ll"]],
                    _span(m["tau_single_ll"], 3)])
  repeat = _span(d["repeatability"], 3)
  goals = "; ".join(f"{k}: {'met' if ok else 'NOT met'}"
                    for k, ok in d["goals"].items())
  return "\n\n".join([
      "### Ranking methods on a held-out space",
      "`python -m benchmarks.nas --part=ranking` (results "
      "`benchmarks/results/nas_ranking.json`): the stage x block space on "
      f"the digits ({d['space']['name']}, two stages of one block: "
      f"{len(d['seeds'][0]['methods'][d['baseline']]['scores'])} "
      "sub-graphs), never used to choose a method. "
      f"{len(d['held_out_archs'])} sub-graphs drawn uniformly once, per "
      f"seed each trained stand-alone {d['repeats']} times ({d['epochs']} "
      "epochs, other initializations); super-networks trained for 1x and 2x the one-shot "
      f"steps (1/{d['fraction']} of the space's exhaustive steps) rank all "
      "of them. Kendall tau-b against the mean test accuracy of the "
      "trainings; `vs one training` against the first alone; `time` the "
      f"search's wall time (training and ranking) over `{d['baseline']}`'s, "
      "the largest over seeds.",
      _table(["score", "steps", *[f"tau, seed {s}" for s in seeds],
              "vs one training", "time"], rows,
             set(range(2, 4 + len(seeds)))),
      f"Repeatability (one stand-alone training against the other, per "
      f"seed; compare with `vs one training`): {repeat}. The same "
      "rankings against the stand-alone trainings' mean test "
      "log-likelihood (the mean log-probability of the true class on the "
      "same test images: continuous, where the accuracy of a few hundred "
      "images moves in steps of a fraction of a point); repeatability "
      f"{_span(d['repeatability_ll'], 3)}:",
      _table(["score", "steps", *[f"tau, seed {s}" for s in seeds],
              "vs one training"], ll_rows, set(range(2, 3 + len(seeds)))),
      f"The method chosen on tiny64 before this run, `{d['method']}`: "
      f"{goals}."])


def _fault_rows(d: dict) -> list[list]:
  rows = []
  network = (d.get("network_faults") or {}).get("records", [])
  for r in d["faults"]["records"] + network:
    where = " (2 hosts)" if r in network else ""
    rows.append([r["fault"] + where, r["worker"],
                 f"{r['detected']} ({r['detected_worker']})",
                 _f(r["detected_s"], 2, " s"), _f(r["teardown_s"], 2, " s"),
                 _f(r["restart_s"], 1, " s"), r["steps_lost"],
                 r["steps_recomputed"],
                 "yes" if r["final_loss_matches"] else "NO"])
  return rows


def _network_straggler_parts(d: dict) -> list[str]:
  """The text and table of scale.json's network_stragglers part (none
  where the JSON has no such part)."""
  n = d.get("network_stragglers")
  if not n:
    return []
  rows = []
  longest = max((r["longest_probe_s"] for r in n["rows"]
                 if r.get("longest_probe_s") is not None), default=None)
  for r in n["rows"]:
    found = "from_step" in r
    rows.append([
        r["throttle"], ", ".join(r["named"]) or "nobody",
        f"step {r['from_step']} ({_f(r['detected_s'], 1, ' s')})"
        if found else "--",
        f"step {r['to_step']} ({_f(r['ended_s'], 1, ' s')})"
        if found else "--",
        _f(r.get("measured_mbit"), 1, " Mbit/s"), r["probes"],
        r["false_alarms"],
        ", ".join(r["after_attempt_named"] or ()) or "nobody"])
  steps = n["median_step_s"]
  return [
      f"A link slow for a while: the job on 2 hosts at 1 Gbit/s "
      f"(`--width=256`, {n['steps']} steps), worker 1's host's link "
      f"throttled once it reached step {n['throttle_at_step']}, for "
      f"{n['throttle_s']:g} s, then restored; the launcher's watch "
      "(`tfopt.scale.network.NetworkWatch`: each host's TCP round-trip "
      "time and the step time, sampled every second; the links probed "
      "once when training starts, when they rise, and again once they "
      "fall; a false alarm is a probe on a rise that named nobody):",
      _table(["throttle", "named during the attempt",
              "slow from (after the throttle)", "to (after the restore)",
              "its link then", "probes", "false alarms",
              "named after the attempt"], rows, {5, 6}),
      f"The watch's cost: median step {1e3 * min(steps['watched']):.2f} ms "
      f"with it, {1e3 * min(steps['unwatched']):.2f} ms without "
      f"(`link_probe_s=None`; the minimum of {len(steps['watched'])} "
      f"alternating runs each): {n['watch_step_ratio']:.3f}x; the runs' "
      f"medians spread {_span([1e3 * v for v in steps['watched']])} ms "
      f"with it and {_span([1e3 * v for v in steps['unwatched']])} ms "
      f"without. The longest probe took {_f(longest, 2, ' s')} (the "
      "launcher's loop waits for it)."]


def scale_section() -> str:
  d = load("scale")
  ck, mon = d["checkpoint"], d["monitoring"]
  med = ck["median_s"]
  steps = mon["median_step_s"]
  hooks = mon["in_hooks_fraction"]
  watch = d["faults"]["watch"]
  st = d["stragglers"]
  srows = []
  for r in st["rows"]:
    srows.append([r["delay"], r["side"],
                  _f(100 * r["detection_rate"], 0, " %"),
                  _f(100 * r["false_alarm_rate"], 0, " %"),
                  ("never" if r["first_detection_step"] is None else
                   f"step {r['first_detection_step']} "
                   f"({r['first_detection_s']:.2f} s)"),
                  _f(r["median_late_ms"], 1, " ms")])
  return "\n\n".join([
      "## Training at scale",
      "`python -m benchmarks.scale` (`benchmarks/results/scale.json`).",
      _table(["measurement", "tfopt", "baseline", "ratio"], [
          [f"training blocked by a checkpoint of {ck['params'] / 1e6:.1f} M "
           f"parameters + Adam state, median of {ck['repeats']}",
           f"{1e3 * med['two_stage_blocking_s']:.0f} ms (two-stage)",
           f"{1e3 * med['synchronous_s']:.0f} ms (synchronous: write, hash, "
           "fsync)", f"{ck['blocking_ratio']:.1f}x less"],
          ["the same against Keras' `save_weights` (no fsync, no hash)",
           f"{1e3 * med['two_stage_blocking_s']:.0f} ms",
           f"{1e3 * med['keras_save_weights_s']:.0f} ms",
           f"{med['keras_save_weights_s'] / med['two_stage_blocking_s']:.1f}"
           "x less"],
          ["step time with `MFUMonitor` (median step; ratio: median of "
           "per-round ratios)",
           f"{1e3 * steps['with_mfu_monitor']:.2f} ms",
           f"{1e3 * steps['without']:.2f} ms without",
           f"{100 * mon['overhead']:+.1f} %"],
          ["step time with all per-batch callbacks (the same)",
           f"{1e3 * steps['with_all_callbacks']:.2f} ms",
           f"{1e3 * steps['without']:.2f} ms without",
           f"{100 * mon['overhead_all']:+.1f} %"],
          ["time inside the callbacks' batch hooks, per step (immune to the "
           "machine's drift between rounds)",
           f"{100 * hooks['with_all_callbacks']:.2f} % (all), "
           f"{100 * hooks['with_mfu_monitor']:.2f} % (`MFUMonitor`)", "",
           ""]], {1, 2, 3}),
      "Fault matrix: `experiments/scale_train.py` on 2 workers under the "
      f"launcher's watch (heartbeat timeout {watch['heartbeat_timeout_s']} "
      f"s, stuck after {watch['stuck_factor']:.0f} median step times but at "
      f"least {watch['min_stuck_s']} s); the rows on 2 hosts run the same "
      "job on `LocalHosts` (2 x 1 worker, 1 Gbit/s), a partition keeping "
      "worker 1's host cut off "
      f"{(d.get('network_faults') or {}).get('watch', {}).get('partition_s', '-')}"
      " s:",
      _table(["fault", "worker", "detected as", "detection", "teardown",
              "restart to first step", "steps lost or repeated",
              "steps recomputed", "final loss = unfaulted"],
             _fault_rows(d), {1, 3, 4, 5, 6, 7}),
      *_network_straggler_parts(d),
      f"Stragglers: the same job, {st['steps']} steps, phases exchanged "
      f"every {st['exchange_every']} steps, a delay on worker 1 (healthy "
      f"step {st['healthy_step_ms']:.1f} ms):",
      _table(["worker 1 delay", "scored on", "exchanges naming worker 1",
              "naming worker 0", "first named", "measured lateness"], srows,
             {2, 3, 5})])


def fit_section() -> str:
  d = load("fit_across_devices")
  rows, refused = [], []
  for r in d["rows"]:
    label = [_model(r["model"]), r["kind"], r["devices"], r["cap_fraction"]]
    if not r["feasible"]:
      refused.append(label)
      continue
    rows.append(label + [
        r["placer"], _f(r["state_mb"], 1), _f(r["cap_mb"], 1),
        _f(max(r["predicted_peak_mb"]), 1), _f(max(r["measured_peak_mb"]), 1),
        _f(r["peak_ratio"]),
        _f(max(r["os_peak_mb"]), 0) if r.get("os_peak_mb") else "",
        f"{r['step_ms']:.1f} ({r['predicted_step_ms']:.1f}), "
        f"{r['plain_step_ms']:.1f}",
        "equal" if r["losses_equal"] else "DIFFER"])
  return "\n\n".join([
      "## Fitting across devices",
      "`python -m benchmarks.fit_across_devices` "
      "(`benchmarks/results/fit_across_devices.json`): each model trained "
      "placed on logical CPUs and on capped server processes (OS cap: "
      f"the plan's cap + {d['server_allowance_mib']:.0f} MiB), at caps that "
      "are fractions of its one-device peak, each against plain Keras. "
      "Memory is TensorFlow's allocation records per device (max over "
      "devices); `OS MB` is a server's cgroup peak over the whole fit.",
      _table(["model", "kind", "devices", "cap", "placer", "state MB",
              "cap MB", "predicted MB", "measured MB", "meas / pred",
              "OS MB", "step ms: measured (predicted), plain Keras",
              "losses vs plain Keras"], rows, {2, 3, 5, 6, 7, 8, 9, 10}),
      "Refused before training (the live-memory bound or no plan found; "
      "the message names the bound and the fewest devices that would do): "
      + "; ".join(f"{m} {k} x{n} at {c}" for m, k, n, c in refused) + "."])


def runtime_section() -> str:
  d = load("runtime")
  fusion = [[_model(r["model"]), r["step"], _f(r["unfused_ms"]),
             _f(r["fused_ms"]), _f(r["speedup"], 2, "x"), r["fused_ops"]]
            for r in d["fusion"]]
  placed = []
  for r in d["placed"]:
    placed.append([
        _model(r["model"]), r["config"], r["placer"],
        _f(r["one_device_ms"], 1), _f(r["placed_ms"], 1),
        _f(r["placed_over_one"]), _f(r["simulated_before_ms"], 1),
        _f(r["measured_over_simulated_before"]),
        _f(r["simulated_after_ms"], 1),
        f"**{r['measured_over_simulated_after']:.2f}**",
        _f(r["profile_level"]), r["measured_select"],
        _f(r["measured_select_over_one"])])
  sp = d["speedup"]
  pipe = []
  for r in d["pipeline"]:
    by = {p["pass"]: p for p in r["passes"]}
    pipe.append([_model(r["model"]), f"{r['nodes']:,}",
                 _f(r["pipeline_s"], 1), _f(by["fold"]["seconds"], 1),
                 by["fuse"]["note"], _f(by["coarsen"]["seconds"], 1),
                 _f(by["place"]["seconds"], 1), r["placer"]])
  within = _within_25(d["placed"], "measured_over_simulated_after")
  return "\n\n".join([
      "## Running placed graphs",
      f"`python -m benchmarks.runtime` (TensorFlow {d['tensorflow']}, "
      f"{d['cpu_count']} cpus; `benchmarks/results/runtime.json`; "
      "each placed configuration checked first: losses and variables equal "
      "to one device, every op where planned).",
      f"Fusion, fused vs unfused graph in the same process, median of "
      f"{d['rounds']} rounds:",
      _table(["model", "step", "unfused ms", "fused ms", "speed-up",
              "fused ops"], fusion, {2, 3, 4, 5}),
      "The calibrations the simulator used (`tfopt-calibrate`), one per "
      "kind of cluster:",
      "\n".join(f"- {k}: {v}" for k, v in d["calibrations"].items()),
      "Per model and configuration: the plan `select=\"simulated\"` picks "
      "on the calibrated cluster, timed against one device in interleaved "
      "rounds; its step simulated before calibration (Baechi's link model) "
      "and after; `level` is the measured clock over the profile's; and the "
      "plan `select=\"measured\"` picks.",
      _table(["model", "config", "plan (simulated)", "one ms", "placed ms",
              "/one", "sim before ms", "meas/sim", "sim after ms",
              "meas/sim", "level", "plan (measured)", "/one"], placed,
             {3, 4, 5, 6, 7, 8, 9, 10, 12}),
      f"Within 25 % of the clock after calibration: {within} of "
      f"{len(d['placed'])} rows.",
      f"The real speed-up (`tfopt.runtime.speedup`, the towers model on 2 "
      f"tasks pinned to a core each, placer {sp['placer']}): "
      f"**{sp['speedup']:.2f}x** over one pinned task "
      f"({sp['placed_us'] / 1e3:.1f} ms against "
      f"{sp['one_task_us'] / 1e3:.1f} ms; predicted "
      f"{sp['predicted_us'] / 1e3:.1f} and "
      f"{sp['predicted_one_us'] / 1e3:.1f} ms). Against one process using "
      f"both cores ({sp['both_cores_us'] / 1e3:.1f} ms) the placed step runs "
      f"at {sp['versus_both_cores']:.2f}x its speed: on this machine, "
      "placing across processes buys a speed-up only against a one-core "
      "device.",
      "Pass pipeline `prune,identity,fold,fuse,coarsen,place` on Keras "
      "applications' training graphs (placement on 4 devices, analytic "
      "costs):",
      _table(["model", "nodes", "pipeline s", "fold s", "fuse", "coarsen s",
              "place s", "placer"], pipe, {1, 2, 3, 5, 6})])


CALIBRATION_MODES = {"none": "None (Baechi's model)",
                     "default": "default (auto)"}


def auto_calibration_section() -> str:
  """Predicted vs measured steps with tfopt.compile's default calibration
  (this machine's, cached) and with Baechi's model."""
  d = load("auto_calibration")
  rows = [[_model(r["model"]), CALIBRATION_MODES[r["mode"]], r["placer"],
           r["devices_used"],
           _f(r["predicted_ms"]), _f(r["measured_ms"]), _f(r["in_hooks_ms"]),
           f"**{r['measured_over_predicted']:.2f}**",
           ", ".join(f"{v:.2f}" for v in r["runs"]),
           ", ".join(f"{v:.2f}" for v in r["difference_runs"]),
           _f(r["first_fit_s"], 1)] for r in d["rows"]]
  runs = _runs_within_25(d["rows"])
  differences = _runs_within_25(d["rows"], "difference_runs")
  return "\n\n".join([
      "## Predictions with the default calibration",
      f"`python -m benchmarks.auto_calibration` (TensorFlow "
      f"{d['tensorflow']}, {d['cpu_count']} cpus; "
      "`benchmarks/results/auto_calibration.json`): models outside the "
      "runtime benchmark, each through `tfopt.compile(placement=\"auto\", "
      "devices=<2 logical CPUs>)` in a fresh process, the hook's predicted "
      "step against the step `fit` takes (the median of every step's "
      "time from the previous step's end to its own, in "
      f"{d['rounds']} fits of {d['steps'][1]} steps with a step clock, "
      f"batch {d['batch_size']}, the first {d['warmup']} of each "
      "left out; "
      f"{d['repeats']} processes per model and "
      "mode, the modes alternating, the row the median one), with "
      "Baechi's machine model (`calibration=None`) and with the default "
      "(no `calibration` argument: this machine's calibration, measured "
      "once and cached). `in step ms` is the median of the same steps "
      "from their batch begin to their batch end (the step function's "
      "call; the rest of `measured ms` is what fit does between steps). "
      "`first fit s` is the first `fit` of a few steps: "
      "capture, profile, placement, the check and, for the first default "
      "run, the calibration.",
      _table(["model", "calibration", "plan", "devices used",
              "predicted ms", "measured ms", "in step ms", "meas / pred",
              "meas / pred of each process",
              "by fit differences, each process", "first fit s"],
             rows, {3, 4, 5, 6, 7, 10}),
      "Processes within 25 % of their prediction: "
      + "; ".join(f"{CALIBRATION_MODES[mode]} {k} of {n}"
                  for mode, (k, n) in runs.items())
      + ". By the earlier measure, the median over rounds of (fit of "
      f"{d['steps'][1]} steps - fit of {d['steps'][0]}) / "
      f"{d['steps'][1] - d['steps'][0]}, both fits without callbacks: "
      + "; ".join(f"{CALIBRATION_MODES[mode]} {k} of {n}"
                  for mode, (k, n) in differences.items())
      + " (two whole fits' noise lands on "
      f"{d['steps'][1] - d['steps'][0]} steps, and it also charges "
      "whatever of fit's time outside the steps grows with the fit: "
      "`outside_steps_ms` in the JSON). One process's ratio moves "
      "with this VM's speed jumps (a profile "
      "taken before a jump mispredicts the step after it by the jump), "
      "which is why each row shows every process."])


def _runs_within_25(rows: list[dict],
                    key: str = "runs") -> dict[str, tuple[int, int]]:
  """Per calibration mode: (processes within 25 %, processes), by each
  row's per-process ratios under `key` (a row without them is an error:
  counting its median ratio instead would report another measure)."""
  out = {}
  for r in rows:
    ratios = r[key]
    k, n = out.get(r["mode"], (0, 0))
    out[r["mode"]] = (k + sum(abs(v - 1) <= 0.25 for v in ratios),
                      n + len(ratios))
  return out


def confinement_section() -> str:
  """What confining the server tasks costs (benchmarks/confinement.py)."""
  d = load("confinement")
  t, tr = d["transfer"], d["training"]
  best = t["best"]
  rows = [["1 KiB round trip", f"{best['relay']['ping_us']:.1f} us",
           f"{best['direct']['ping_us']:.1f} us", f"{t['ping_ratio']:.2f}"],
          ["64 MiB stream", f"{best['relay']['stream_mb_s']:,.0f} MB/s",
           f"{best['direct']['stream_mb_s']:,.0f} MB/s",
           f"{t['stream_ratio']:.2f}"]]
  runs = [[r["mode"], r["devices_used"], f"{r['step_ms']:.2f}",
           "-" if r["relayed_connections"] is None
           else r["relayed_connections"]]
          for mode in ("confined", "exposed") for r in tr["runs"][mode]]
  return "\n\n".join([
      "## Confined server tasks",
      "`python -m benchmarks.confinement` (`benchmarks/results/"
      "confinement.json`): the relay into the job's network namespace "
      "against a connection made inside it, alternated round by round "
      "(best of the rounds):",
      _table(["transfer", "through the relay", "inside", "ratio"], rows,
             {1, 2, 3}),
      f"An MLP placed by `tfopt.compile` on 2 `LoopbackServers` tasks "
      f"(batch {tr['batch_size']}), confined against exposed, each a fresh "
      "process, the modes alternating; the step is each process's median "
      "of (long fit - short fit) differences; `relayed` counts the "
      "connections this process held through the relay:",
      _table(["mode", "devices", "step ms", "relayed"], runs, {1, 2, 3}),
      f"Fastest process: confined {tr['fastest_step_ms']['confined']:.2f} "
      f"ms, exposed {tr['fastest_step_ms']['exposed']:.2f} ms, ratio "
      f"**{tr['ratio']:.2f}**."])


def _confinement_claims() -> list[list[str]]:
  d = load("confinement")
  relayed = max(r["relayed_connections"]
                for r in d["training"]["runs"]["confined"])
  return [["placed step on confined vs exposed server tasks (2 tasks, "
           "fastest process of each)",
           f"{d['training']['ratio']:.2f}x, {relayed} of the step's "
           "connections through the relay; the relay's 1 KiB round trip "
           f"{d['transfer']['ping_ratio']:.2f}x a connection inside",
           "`python -m benchmarks.confinement`"]]


def packing_section() -> str:
  """How tight a cap each placer places under (benchmarks/packing.py)."""
  d = load("packing")
  placers = list(d["rows"][0]["tightest"])
  names = dict(WORKLOADS, keras_mlp_cautious_adamw="MLP 8 x 1024, "
               "CautiousAdamW", keras_transformer_lm="Transformer LM 2 x 256",
               keras_mobilenet_v2="MobileNetV2 (alpha 0.35)")
  rows = [[names.get(r["workload"], r["workload"]), r["ops"],
           _f(r["floor"])] +
          [_f(r["tightest"][p]) for p in placers] +
          [_f(r["seconds_at_tightest"].get("auto"), 1),
           r["winner"].get("auto") or "--"] for r in d["rows"]]
  return "\n\n".join([
      "### Packing: how tight a cap each placer places under",
      f"`python -m benchmarks.packing` (`benchmarks/results/packing.json`, "
      f"{d['machine']}): on {d['rows'][0]['devices']} devices, each capped "
      "at f x (the bytes live at once in any schedule) / devices, f from "
      f"{_f(max(d['fractions']))} down to {_f(min(d['fractions']))}; the "
      "tightest f at which each placer still returned a plan whose liveness "
      "peaks fit ('--': none at any f tried). Below 1 no plan exists; "
      "`floor`: below it one colocation group alone is over a device's cap. "
      "The Keras models are captured training steps with analytic costs.",
      _table(["workload", "ops", "floor"] + placers + ["auto s", "auto's plan"],
             rows, set(range(1, len(placers) + 4)))])


def hosts_section() -> str:
  """Placement across LocalHosts and the placer's cost as hosts grow
  (benchmarks/hosts.py)."""
  d = load("hosts")
  # the fits' lengths as the rows recorded them (no default: a number the
  # benchmark did not write would be published as if it had)
  short, long = d["placement"][0]["steps"]
  placed = [[r["rate"], r["placer"], _f(r["link_between"]["bandwidth_gbps"]
                                         * 1e3, 1),
             _f(r["simulated_ms"], 1), _f(r["dispatch_ms"], 1),
             _f(r["predicted_ms"], 1), _f(r["measured_ms"], 1),
             _f(r["measured_over_predicted"]),
             _f(r["difference_over_predicted"]),
             r["tensors_across_hosts"],
             _f(r["bytes_across_hosts"] / 1e3, 0),
             f"{r['max_loss_diff']:.1e}"] for r in d["placement"]]
  scaled = [[WORKLOADS.get(r["workload"], r["workload"]), r["hosts"],
             r["per_host"]] + (
                 [_f(r["placement_seconds"]), _f(r["vs_lower_bound"]),
                  _f(r["vs_single"]), r["devices_used"], r["hosts_used"],
                  _f(r["bytes_across_hosts"] / 1e6, 1)]
                 if r["feasible"] else ["--"] * 6)
            for r in d.get("scaling", [])]
  return "\n\n".join([
      "### Several hosts (LocalHosts)",
      f"`python -m benchmarks.hosts` (`benchmarks/results/hosts.json`, "
      f"{d['machine']}). Placement: 2 hosts x 2 server tasks in network "
      "namespaces, each host's tasks pinned to one core of its own, links "
      "between hosts shaped at the rate; `tfopt-calibrate --cluster=SPEC` "
      "measured both levels; a 256-512x4-10 MLP + Adam whose state does not "
      "fit one host's two tasks of 6 MB trained through `tfopt.compile("
      "placement=\"auto\")` from the client's place. Measured: the median "
      "of every step's time (from the previous step's end) in clocked fits "
      f"of {long} steps; by fit differences: the measure before, the "
      f"minimum over rounds of (fit of {long} steps - fit of {short}) / "
      f"{long - short}, fits without callbacks; x: between hosts, in "
      "the plan's predicted schedule; loss diff: the largest difference "
      "from plain Keras' losses; predicted: the simulated plan plus what "
      "the calibration measured a step to cost the client beyond its ops "
      "(the dispatch to the tasks used and the batch's feed, "
      "`tfopt.runtime.dispatch`).",
      _table(["rate", "placer", "MB/s between (fit)", "simulated ms",
              "dispatch + feed ms", "predicted ms",
              "measured ms", "measured / predicted",
              "by fit differences / predicted", "tensors x", "kB x",
              "loss diff"], placed, set(range(2, 11))),
      "Scaling (simulation): `auto` on the shipped workloads, inside a host "
      "Baechi's PCIe-like link, between hosts 1 Gbit/s + 200 us, each "
      "device capped at a quarter of the graph's memory; its placement "
      "time, its plan against the proven lower bound and against one "
      "(uncapped) device, the devices and hosts it used, and the MB it sends "
      "between hosts per step.",
      _table(["workload", "hosts", "devices per host", "place s",
              "plan / bound", "plan / one device", "devices used",
              "hosts used", "MB x"], scaled, set(range(1, 9)))])


def _packing_claims() -> list[list[str]]:
  rows = load("packing")["rows"]
  reached = [r for r in rows if r["tightest"].get("auto") is not None]
  return [["memory-tight placement: tightest cap `auto` places under, as a "
           "multiple of the live-at-once bound (4 devices)",
           f"{_span([r['tightest']['auto'] for r in reached])}x on "
           f"{len(reached)} of {len(rows)} workloads",
           "`python -m benchmarks.packing`"]]


SECTIONS = (capture_section, placement_section, packing_section, runtime_section,
            auto_calibration_section,
            fit_section, optimizers_section, moe_section, nas_section,
            scale_section, hosts_section, confinement_section)


def guide() -> str:
  """docs/benchmarks.md, whole."""
  head = ("# Measured results\n\n"
          "Generated by `tools/benchmark_pages.py` from "
          "`benchmarks/results/*.json`; do not edit by hand. Each section "
          "names the command that measures it; rerun it, then the script. "
          "Every run is on the machine named in its section (CI's kind: a "
          "2-core x86_64 VM whose speed varies by up to ~1.7x within "
          "minutes, which is why the benchmarks alternate candidates and "
          "report ratios).")
  return "\n\n".join([head] + [s() for s in SECTIONS]) + "\n"


# ------------------------------------------------------------- headline
# README's table: one row per claim, ours against its anchor, with the
# command that measures it. Each builder returns its benchmark's rows.

def _within_25(rows: list[dict], key: str) -> int:
  """How many rows' measured / simulated ratio `key` is within 25 %."""
  return sum(abs(r[key] - 1) <= 0.25 for r in rows)


def _placement_claims() -> list[list[str]]:
  pl = load("placement")
  ref = [r for r in pl["rows"] if r.get("reference_best_ms")]
  ours_only = [r for r in pl["rows"]
               if "reference_placer" in r and r["workload"] in WORKLOADS
               and not r.get("reference_best_ms") and r["feasible"]]
  timed = [r for r in pl["rows"] if r.get("seconds_vs_reference")]
  shipped = [r["seconds_vs_reference"] for r in timed
             if r["workload"] in WORKLOADS]
  big = [r["seconds_vs_reference"] for r in timed
         if r["workload"] == "synthetic_20000"]
  command = "`python -m benchmarks.placement`"
  shipped_rows = [r for r in pl["rows"]
                  if r["workload"] in WORKLOADS and r["feasible"]]
  gaps = []
  for w, label in WORKLOADS.items():
    ratios = [r["vs_lower_bound"] for r in shipped_rows
              if r["workload"] == w]
    if ratios:
      gaps.append(f"{label.split(' ')[0]} {_span(ratios)}x")
  terms: dict[str, int] = {}
  for r in shipped_rows:
    term = r.get("lower_bound_term") or "unrecorded"
    terms[term] = terms.get(term, 0) + 1
  by_term = ", ".join(f"{term} on {n}" for term, n in sorted(
      terms.items(), key=lambda kv: -kv[1]))
  devices = sorted({r["devices"] for r in shipped_rows})
  fractions = sorted({r["memory_fraction"] for r in shipped_rows},
                     reverse=True)
  return [
      [f"plan / proven lower bound per shipped workload ("
       f"{', '.join(map(str, devices))} devices x caps "
       f"{', '.join(map(str, fractions))}; the bound: critical path, work / "
       "devices or memory LP, whichever is largest)",
       f"{', '.join(gaps)} (the bound: {by_term} of {len(shipped_rows)} "
       "rows)", command],
      ["placement quality: `auto` vs the Baechi reference's best valid plan "
       "(4 devices, shipped workloads; reference figures are constants, "
       "see the guide)",
       f"makespan {_span([r['vs_reference'] for r in ref])}x of the "
       f"reference's on its {len(ref)} rows; a plan on {len(ours_only)} "
       "more where it has none", command],
      ["placement time vs the reference's m-ETF (ours wall time, its CPU "
       "time from its own run)",
       f"{_span(shipped)}x on the shipped workloads; {_span(big)}x at "
       "20,000 ops", command]]


def _runtime_claims() -> list[list[str]]:
  rt = load("runtime")
  sp, rows, n = rt["speedup"], rt["placed"], len(rt["placed"])
  command = "`python -m benchmarks.runtime`"
  return [
      ["simulated vs measured placed step, calibrated (`tfopt-calibrate`)",
       f"within 25 % on {_within_25(rows, 'measured_over_simulated_after')}"
       f" of {n} rows with the profile leveled to the clock of the timed "
       f"rounds, {_within_25(rows, 'measured_over_simulated_unleveled')} of "
       f"{n} without", command],
      ["two-tower model on 2 pinned tasks vs 1",
       f"{sp['speedup']:.2f}x faster (vs one process on both cores: "
       f"{sp['versus_both_cores']:.2f}x)", command]]


def _auto_calibration_claims() -> list[list[str]]:
  rows = load("auto_calibration")["rows"]
  runs = _runs_within_25(rows)
  auto = [v for r in rows if r["mode"] == "default" for v in r["runs"]]
  return [["simulated vs measured step in `fit` on models outside the "
           "runtime benchmark, the default calibration (this machine's, "
           "cached) vs Baechi's model",
           f"within 25 % in {runs['default'][0]} of {runs['default'][1]} "
           f"processes (measured / predicted {_span(auto)}) vs "
           f"{runs['none'][0]} of {runs['none'][1]}",
           "`python -m benchmarks.auto_calibration`"]]


def _fit_claims() -> list[list[str]]:
  fit = [r for r in load("fit_across_devices")["rows"]
         if r["model"] == "demo" and r["kind"] == "processes"
         and r["feasible"]][0]
  return [[
      f"a model larger than one device: {fit['state_mb']:.1f} MB of state "
      f"(one-device peak {fit['one_device_peak_mb']:.1f} MB) on "
      f"{fit['devices']} server processes, planned under "
      f"{fit['cap_mb']:.1f} MB of TensorFlow allocations each (OS limit "
      f"{fit['server_limit_mb']:.1f} MB)",
      "losses equal to plain Keras'" if fit["losses_equal"] else "DIFFER",
      "`python -m benchmarks.fit_across_devices`"]]


def _optimizer_claims() -> list[list[str]]:
  opt = load("optimizers")
  conv = opt["convergence"]["summary"]
  lower = sum(int(r["cwd_lower_loss_seeds"].split("/")[0]) for r in conv)
  paired = sum(int(r["cwd_lower_loss_seeds"].split("/")[1]) for r in conv)
  twins = [r["ratio"] for r in opt["overhead"] if r["optimizer"] in TWINS]
  command = "`python -m benchmarks.optimizers`"
  return [
      ["CWD optimizers' step time vs Keras' AdamW / Lion / Muon (XLA)",
       f"{_span(twins)}x", command],
      ["CWD vs decoupled decay, final training loss",
       f"{_span([r['loss_ratio'] for r in conv], 3)}x; lower in {lower} "
       f"of {paired} paired runs", command]]


def _pruning_claims() -> list[list[str]]:
  moe, more = load("moe_pruning"), load("moe_pruning_128")
  s50, dist = moe["summary"]["50%"], moe["distillation"]
  ex = moe["experts"]["summary"]
  saved = moe["experts"]["saved_models"]
  command = "`python -m benchmarks.moe_pruning`"
  return [
      ["MoE-Pruner vs Wanda at 50 %, perplexity / dense",
       f"{s50['moe_pruner']['mean_ratio']:.3f} vs "
       f"{s50['wanda']['mean_ratio']:.3f} (SparseGPT "
       f"{s50['sparsegpt']['mean_ratio']:.3f})", command],
      ["expert-wise distillation vs plain fine-tuning after pruning, gap "
       "closed",
       f"{100 * dist['pruned_distilled']['gap_closed']:.1f} % vs "
       f"{100 * dist['pruned_finetuned']['gap_closed']:.1f} %", command],
      ["router-weighted OBS vs SparseGPT, perplexity / dense at 50 % and "
       f"2:4 (seeds won), calibration {moe['calibration_windows']} / "
       f"{more['calibration_windows']} windows",
       "; ".join(
           f"{d['summary'][p]['router_obs']['mean_ratio']:.4f} vs "
           f"{d['summary'][p]['sparsegpt']['mean_ratio']:.4f} "
           f"({d['summary'][p]['router_obs_beats_sparsegpt_seeds']}/"
           f"{d['seeds']})" for d in (moe, more) for p in ("50%", "2:4")),
       command],
      ["whole experts removed by REAP vs by routing frequency, perplexity "
       "/ dense with 25 % and 50 % removed; the exported reference LM's "
       "size",
       f"{ex['25% reap']['mean_ratio']:.2f} vs "
       f"{ex['25% frequency']['mean_ratio']:.2f} at 25 %, "
       f"{ex['50% reap']['mean_ratio']:.2f} vs "
       f"{ex['50% frequency']['mean_ratio']:.2f} at 50 %; SavedModel "
       f"{saved['removed_50']['saved_model_bytes'] / saved['dense']['saved_model_bytes']:.2f}x"
       f" at 50 %", command]]


def _nas_claims() -> list[list[str]]:
  taus = [s["kendall_tau"] for name, _ in NAS_RUNS[:2]
          for s in load(name)["seeds"]]
  return [["one-shot NAS: Kendall tau vs stand-alone training, at "
           f"1/{load('nas')['fraction']} of its compute",
           f"{_span(taus, 2)} over seeds and scores",
           "`python -m benchmarks.nas`"],
          _nas_ranking_claim()]


def _rank_default_score() -> str:
  """`tfopt.nas.ranking.DEFAULT_SCORE`, read from its source (importing it
  would load Keras)."""
  import ast  # pylint: disable=import-outside-toplevel
  tree = ast.parse((ROOT / "tfopt" / "nas" / "ranking.py").read_text(
      encoding="utf-8"))
  return next(ast.literal_eval(n.value) for n in tree.body
              if isinstance(n, ast.Assign) and [t.id for t in n.targets
                                                if isinstance(t, ast.Name)]
              == ["DEFAULT_SCORE"])


def _nas_ranking_claim() -> list[str]:
  d = load("nas_ranking")
  # `rank`'s default score on the baseline's super-network.
  default_score = _rank_default_score()
  default, base = (d["summary"][f"{default_score}@1x"],
                   d["summary"][d["baseline"]])
  repeat = d["repeatability"]
  return [f"NAS ranking on a held-out space ({len(d['held_out_archs'])} "
          f"sub-graphs, {len(d['seeds'])} seeds): Kendall tau vs the mean "
          f"of {d['repeats']} stand-alone trainings, the log-likelihood "
          "score (the default) vs accuracy",
          f"{_span(default['tau'], 2)} vs {_span(base['tau'], 2)}, "
          f"{default['time_ratio']:.2f}x the time (one training vs "
          f"another: {_span(repeat, 2)})",
          "`python -m benchmarks.nas --part=ranking`"]


# What each injected fault must be detected as.
EXPECTED_DETECTION = {"kill": "killed", "stop": "stopped", "stuck": "stuck",
                      "term": "preempted", "partition": "partition",
                      "kill_host": "host lost"}


def _scale_claims() -> list[list[str]]:
  sc = load("scale")
  faults = sc["faults"]["records"] + (sc.get("network_faults") or {}).get(
      "records", [])
  clean = sum(r["steps_lost"] == 0 and r["final_loss_matches"] and
              r["detected"] == EXPECTED_DETECTION[r["fault"]] for r in faults)
  hooks = sc["monitoring"]["in_hooks_fraction"]["with_all_callbacks"]
  command = "`python -m benchmarks.scale`"
  return [
      ["training blocked by a checkpoint vs a synchronous save",
       f"{sc['checkpoint']['blocking_ratio']:.1f}x less", command],
      ["time inside tfopt's per-batch callbacks (all of them), per step",
       f"{100 * hooks:.2f} % of a step", command],
      ["faults survived (kill, SIGSTOP, stuck, SIGTERM on each of 2 "
       "workers; a partition and a host lost on 2 hosts)",
       f"{clean} of {len(faults)}: named, 0 steps lost, final loss "
       "equal to the unfaulted run", command]]


def _capture_claims() -> list[list[str]]:
  cap = load("capture")["rows"]
  return [["step capture vs Keras' first traced step",
           f"{_span([r['capture_vs_keras_first_step'] for r in cap])}x its "
           "time", "`python -m benchmarks.capture`"]]


CLAIMS = (_placement_claims, _packing_claims, _runtime_claims, _auto_calibration_claims,
          _fit_claims, _optimizer_claims,
          _pruning_claims, _nas_claims, _scale_claims, _capture_claims,
          _confinement_claims)


def headline() -> str:
  """README's table (see CLAIMS)."""
  rows = [row for claims in CLAIMS for row in claims()]
  return _table(["claim", "measured", "command"], rows)


def readme_block() -> str:
  return (f"{BEGIN}\n{headline()}\n\nEvery table, with the machine and "
          "method of each: [docs/benchmarks.md](docs/benchmarks.md), written "
          "by `tools/benchmark_pages.py` from `benchmarks/results/*.json`."
          f"\n{END}")


def render_readme(text: str) -> str:
  """README with its benchmarks block replaced by the rendering."""
  if BEGIN not in text or END not in text:
    raise ValueError(f"README.md has no {BEGIN!r} ... {END!r} block")
  head, rest = text.split(BEGIN, 1)
  return head + readme_block() + rest.split(END, 1)[1]


def pages() -> dict[pathlib.Path, str]:
  """Each generated page's path and its text as it should be committed."""
  return {GUIDE: guide(),
          README: render_readme(README.read_text(encoding="utf-8"))}


def main(argv: list[str]) -> int:
  stale = [p for p, text in pages().items()
           if not p.exists() or p.read_text(encoding="utf-8") != text]
  if "--check" in argv:
    for p in stale:
      print(f"{p.relative_to(ROOT)} is not tools/benchmark_pages.py's "
            "rendering of benchmarks/results: run it")
    return 1 if stale else 0
  for p, text in pages().items():
    p.write_text(text, encoding="utf-8")
  print("wrote", ", ".join(str(p.relative_to(ROOT)) for p in pages()))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
