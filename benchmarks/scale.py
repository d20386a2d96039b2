"""Training-at-scale measurements (issue 8), side by side in one run.

    python -m benchmarks.scale          # ~12 min on 2 CPUs
    python -m benchmarks.scale --parts=faults   # one part, merged into the
                                                # committed JSON

- checkpoint: time the training loop is blocked by a two-stage checkpoint
  (`TwoStageCheckpointer.save`: the host snapshot) vs a synchronous save of
  the same state (snapshot + write + fsync: what a plain save costs), and
  vs Keras' `model.save_weights` of the weights alone; a model of
  `--params` parameters with its Adam state, `--repeats` saves each,
  medians. Goal: at least 5x less blocking than the synchronous save.
- monitoring: `fit` step time without callbacks, with `MFUMonitor`, and
  with all of tfopt's per-batch callbacks (MFU, straggler recorder with
  its exchange, heartbeats, step log: what `tfopt.scale.worker.fit` and
  the straggler monitor add), 300-step fits interleaved in rounds (order
  rotated), overhead = the median of the per-round ratios; and, immune to
  the machine's drift, the time spent inside the callbacks' batch hooks as
  a fraction of the step. Goal: at most 2 % overhead.
- faults: the fault matrix. experiments/scale_train.py (2 workers,
  MultiWorkerMirroredStrategy, 60 steps, checkpoints every 5) under the
  launcher with its default watch settings; for each fault (kill -9,
  SIGSTOP, alive-but-stuck, SIGTERM) on each worker at step 25: which
  failure was detected and on whom, detection latency (from the injection;
  for a stuck worker from the moment it stopped stepping), teardown,
  restart to the first step of the next attempt, steps lost or repeated in
  the stitched trajectory (goal 0), steps recomputed since the checkpoint,
  and whether the final model is bit for bit the unfaulted run's.
- network_faults: the same job on 2 hosts x 1 worker
  (`tfopt.scale.hosts.LocalHosts`, 1 Gbit/s, needs root): worker 1's host
  partitioned (link down 8 s) and lost (its worker killed, link down as
  long) at step 25; the same columns, against a clean run on those hosts.
- network_stragglers: on 2 hosts x 1 worker at 1 Gbit/s (needs root), an
  800-step run of a wider MLP (--width=256) with worker 1's host's link
  throttled to 100 and to 20 Mbit/s once it reached step 300, for 5 s,
  then restored (one run each), and WATCH_ROUNDS runs without a
  throttle: whether the launcher's watch
  (`tfopt.scale.network.NetworkWatch`) named that host during the
  attempt, how long after the throttle and the restore its slow period
  began and ended (the end: a probe measured the link back), the link
  rate measured then, the probes (the baseline once training starts
  included), the false alarms (probes on a rise that named nobody), the
  longest probe (the launcher's loop waits for it), and what the probe
  after the attempt named (nobody: the link is back). The watch's cost:
  the median step time of the runs without a throttle with the watch and
  without it (`link_probe_s=None`), alternating, minimums compared.
- stragglers: the same job (120 steps, phases exchanged every 10 steps)
  with no delay, +10 ms, +30 % and +100 ms of host time per step on
  worker 1, and +10 %, +30 % and +100 % of the healthy step time as real
  compute inside worker 1's step (named from the step's own timestamps):
  the fraction of exchanges that name worker 1 (detection rate), that name
  worker 0 (false alarms), and the first naming (latency).

Prints a table and writes benchmarks/results/scale.json.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

from absl import app, flags

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from benchmarks._timing import step_clock

FLAGS = flags.FLAGS
flags.DEFINE_integer("params", 8_000_000, "Model parameters (float32).")
flags.DEFINE_integer("repeats", 5, "Saves per method.")
flags.DEFINE_integer("monitor_runs", 11, "Interleaved fit runs per arm.")
flags.DEFINE_string("out", None, "JSON path (default: results/scale.json).")
flags.DEFINE_list("parts", ["checkpoint", "monitoring", "faults",
                            "network_faults", "network_stragglers",
                            "stragglers"], "Parts to run; the others are "
                  "kept from the existing JSON.")

# How long a partition keeps a host cut off: past the heartbeat timeout
# (5 s) of the fault matrix's watch.
PARTITION_S = 8.0
# network_stragglers: the run's length, and when and how long host 1's
# link is throttled (a few NetworkWatch samples, a second apart, fall in it).
THROTTLE_RUN_STEPS = 800
THROTTLE_AT_STEP = 300
THROTTLE_S = 5.0
WATCH_ROUNDS = 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "experiments", "scale_train.py")

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def _big_model(params):
  import keras  # pylint: disable=import-outside-toplevel
  width = int((params / 4) ** 0.5)
  model = keras.Sequential([keras.Input((width,))] + [
      keras.layers.Dense(width) for _ in range(4)])
  model.compile(keras.optimizers.Adam(1e-3), "mse")
  import numpy as np  # pylint: disable=import-outside-toplevel
  x = np.zeros((8, width), "float32")
  model.train_on_batch(x, x)  # builds the optimizer state
  return model


def checkpoint_part():
  from tfopt.scale.checkpoint import TwoStageCheckpointer  # pylint: disable=import-outside-toplevel
  model = _big_model(FLAGS.params)
  n = model.count_params()
  state_bytes = 4 * (n + sum(int(v.numpy().size)
                             for v in model.optimizer.variables))
  rows = {"two_stage_blocking_s": [], "synchronous_s": [],
          "keras_save_weights_s": [], "two_stage_persist_s": []}
  with tempfile.TemporaryDirectory() as tmp:
    ckpt = TwoStageCheckpointer(os.path.join(tmp, "async"), model)
    sync = TwoStageCheckpointer(os.path.join(tmp, "sync"), model)
    for i in range(FLAGS.repeats):
      start = time.perf_counter()
      ckpt.save(step=i)                     # blocking part only
      rows["two_stage_blocking_s"].append(time.perf_counter() - start)
      start = time.perf_counter()
      ckpt.wait()
      rows["two_stage_persist_s"].append(time.perf_counter() - start)
      start = time.perf_counter()
      sync.persist(sync.snapshot(step=i))   # the same state, synchronously
      rows["synchronous_s"].append(time.perf_counter() - start)
      path = os.path.join(tmp, f"k{i}.weights.h5")
      start = time.perf_counter()
      model.save_weights(path)
      rows["keras_save_weights_s"].append(time.perf_counter() - start)
  med = {k: statistics.median(v) for k, v in rows.items()}
  return {"params": n, "state_bytes": state_bytes, "repeats": FLAGS.repeats,
          "runs": rows, "median_s": med,
          "blocking_ratio": med["synchronous_s"] / med["two_stage_blocking_s"]}


def monitoring_part():
  import keras  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from tfopt.scale.mfu import MFUMonitor  # pylint: disable=import-outside-toplevel
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(512),
                            keras.layers.Dense(512), keras.layers.Dense(10)])
  model.compile(keras.optimizers.Adam(1e-3), "mse")
  x = np.random.default_rng(0).normal(size=(64 * 300, 256)).astype("float32")
  y = np.zeros((len(x), 10), "float32")
  model.fit(x[:640], y[:640], batch_size=64, verbose=0)  # trace

  arms = {"without": [], "with_mfu_monitor": [], "with_all_callbacks": []}
  in_hooks = {"with_mfu_monitor": [], "with_all_callbacks": []}
  scratch = tempfile.mkdtemp(prefix="tfopt-bench-monitor-")
  names = list(arms)
  for run in range(FLAGS.monitor_runs):
    # rotate the order: whichever arm runs first in a round pays for it
    for arm in names[run % 3:] + names[:run % 3]:
      clock = step_clock()  # the same clock for every arm
      callbacks = [clock]
      if arm != "without":
        callbacks.append(MFUMonitor((x[:64], y[:64]), peak_flops=1e12))
      if arm == "with_all_callbacks":
        callbacks += _tfopt_callbacks(os.path.join(scratch, f"{run}"))
      timed = [_timed(c) for c in callbacks[1:]]
      model.fit(x, y, batch_size=64, epochs=1, verbose=0,
                callbacks=callbacks)
      for callback in callbacks:
        if hasattr(callback, "beat") and callback.beat:
          callback.beat.stop()
      # batch end to batch end: the first step (from its begin) left out
      steps = clock.times[1:]
      arms[arm].append(statistics.median(steps))
      if timed:
        in_hooks[arm].append(sum(t[0] for t in timed) / len(steps) /
                             statistics.median(steps))
  med = {k: statistics.median(v) for k, v in arms.items()}

  def paired(arm):
    # the median of per-round ratios: the machine's drift between rounds
    # cancels within a round
    return statistics.median(a / b for a, b in zip(arms[arm],
                                                   arms["without"])) - 1

  return {"step_s": arms, "median_step_s": med,
          "overhead": paired("with_mfu_monitor"),
          "overhead_all": paired("with_all_callbacks"),
          # the time spent inside the callbacks' batch hooks per step over
          # the step time: what they add, without the machine's drift
          "in_hooks_fraction": {k: statistics.median(v)
                                for k, v in in_hooks.items()}}


def _timed(callback):
  """Wraps `callback`'s batch hooks with a clock; returns [seconds]."""
  spent = [0.0]
  for name in ("on_train_batch_begin", "on_train_batch_end"):
    hook = getattr(callback, name)

    def timed_hook(*args, _hook=hook, **kwargs):
      start = time.perf_counter()
      try:
        return _hook(*args, **kwargs)
      finally:
        spent[0] += time.perf_counter() - start

    setattr(callback, name, timed_hook)
  return spent


def _tfopt_callbacks(run_dir):
  """What `tfopt.scale.worker.fit` adds per batch (step counter,
  heartbeat, step log, preemption check; no checkpoint) plus the
  straggler monitor exchanging every 50 steps."""
  from tfopt.scale import heartbeat, worker  # pylint: disable=import-outside-toplevel
  from tfopt.scale.stragglers import StragglerMonitor  # pylint: disable=import-outside-toplevel
  env = worker.WorkerEnv(run_dir=run_dir)
  beat = heartbeat.HeartbeatWriter(os.path.join(run_dir, "heartbeats"), 0)
  beat.start()
  os.makedirs(os.path.join(run_dir, "steps"), exist_ok=True)
  log = open(os.path.join(run_dir, "steps", "worker-0.jsonl"), "a",  # pylint: disable=consider-using-with
             encoding="utf-8")
  progress = worker._Progress(env, beat, None, worker._Preemption(env), 50,  # pylint: disable=protected-access
                              log)
  return [progress, StragglerMonitor(os.path.join(run_dir, "phases"), 0, 2,
                                     exchange_every=50),
          worker._StepBegin(beat)]  # pylint: disable=protected-access


def _final(run_dir):
  with open(os.path.join(run_dir, "final-worker-0.json"),
            encoding="utf-8") as f:
    return json.load(f)


def faults_part():
  """The eight faults of the module doc on 2 loopback workers."""
  cases = [(kind, w) for kind in ("kill", "stop", "stuck", "term")
           for w in (0, 1)]
  return _fault_matrix(cases, "fault matrix")


def network_faults_part():
  """A partition (worker 1's host cut off for `PARTITION_S`, longer than
  the heartbeat timeout) and a host lost (its workers killed, its link down
  as long), on 2 LocalHosts x 1 worker at 1 Gbit/s (needs root)."""
  from tfopt.scale.hosts import LocalHosts  # pylint: disable=import-outside-toplevel
  with LocalHosts(2, 0, link_rate="1gbit") as hosts:
    return _fault_matrix([("partition", 1), ("kill_host", 1)],
                         "network faults", hosts=hosts,
                         partition_s=PARTITION_S)


def network_stragglers_part():
  """See the module doc: a link slow for a while, found during the
  attempt; one run per throttle (None: no throttle)."""
  from tfopt.scale.hosts import LocalHosts  # pylint: disable=import-outside-toplevel
  root = tempfile.mkdtemp(prefix="tfopt-bench-network-")
  rows = []
  step_s = {"watched": [], "unwatched": []}
  runs = [(None, arm) for _ in range(WATCH_ROUNDS)
          for arm in ("unwatched", "watched")] + [("100mbit", "watched"),
                                                  ("20mbit", "watched")]
  with LocalHosts(2, 0, link_rate="1gbit") as hosts:
    for i, (rate, arm) in enumerate(_progress(runs, "network stragglers")):
      row = _throttled_run(hosts, rate, os.path.join(root, str(i)),
                           watched=arm == "watched")
      if rate is None:
        step_s[arm].append(row.pop("median_step_s"))
        if arm == "watched":  # its false alarms: a row per run
          rows.append(dict(row, throttle=f"none, run {len(step_s[arm])}"))
      else:
        row.pop("median_step_s")
        rows.append(row)
  return {"rows": rows, "steps": THROTTLE_RUN_STEPS,
          "throttle_at_step": THROTTLE_AT_STEP,
          "throttle_s": THROTTLE_S, "link_rate": "1gbit",
          "median_step_s": step_s,
          "watch_step_ratio": min(step_s["watched"]) /
                              min(step_s["unwatched"])}


def _throttled_run(hosts, rate, run_dir, watched=True) -> dict:
  """One run on `hosts` with host 1's link at `rate` for THROTTLE_S from
  worker 0's heartbeat at THROTTLE_AT_STEP (None: untouched); without
  `watched`, no link probes at all (link_probe_s=None)."""
  import threading  # pylint: disable=import-outside-toplevel
  from tfopt.scale import heartbeat  # pylint: disable=import-outside-toplevel
  from tfopt.scale.launch import launch  # pylint: disable=import-outside-toplevel
  marks = {}

  def throttle():
    beats = os.path.join(run_dir, "heartbeats")
    while not marks.get("stop"):
      beat = heartbeat.read(beats, 0)
      if beat and beat["step"] >= THROTTLE_AT_STEP:
        hosts.set_link_rate(1, rate)
        marks["from"] = (time.time(), beat["step"])
        time.sleep(THROTTLE_S)
        hosts.set_link_rate(1, "1gbit")
        marks["to"] = (time.time(), heartbeat.read(beats, 0)["step"])
        return
      time.sleep(0.05)

  thread = threading.Thread(target=throttle, daemon=True)
  if rate is not None:
    thread.start()
  began = time.time()
  result = launch([SCRIPT, "--dropout=0", "--epochs=1",
                   f"--steps_per_epoch={THROTTLE_RUN_STEPS}", "--width=256"],
                  workers=2, hosts=hosts, run_dir=run_dir, max_restarts=0,
                  link_probe_s=0.25 if watched else None)
  marks["stop"] = True
  if rate is not None:
    thread.join(THROTTLE_S + 5)
  (attempt,) = result.attempts
  if not watched:
    return {"median_step_s": attempt["median_step_s"]}
  watch = attempt["network_watch"]
  slow = watch["slow"]
  start = attempt["started"]
  row = {"throttle": rate or "none", "wall_s": time.time() - began,
         "median_step_s": attempt["median_step_s"],
         "named": [p["address"] for p in slow],
         "probes": sum(watch["probe_counts"][kind] for kind in
                       ("baseline", "alarm", "confirming")),
         "probe_counts": watch["probe_counts"],
         "probed": [{"step": p["step"], "kind": p["kind"],
                     "rtt_ms": p["rtt_ms"], "step_s": p["step_s"],
                     "named": p["named"],
                     "slowest_mbit": [None if "error" in (link or {"error": 0})
                                      else min(link["down_bits"],
                                               link["up_bits"]) / 1e6
                                      for link in p["links"]]}
                    for p in watch["probes"]],
         "false_alarms": watch["probe_counts"]["false_alarm"],
         "longest_probe_s": max((p["took_s"] for p in watch["probes"]),
                                default=None),
         "after_attempt_named": attempt.get("network_stragglers"),
         "throttled_at_step": marks.get("from", (None, None))[1],
         "restored_at_step": marks.get("to", (None, None))[1]}
  if slow and "from" in marks:
    first = slow[0]
    row.update(
        from_step=first["from_step"], to_step=first["to_step"],
        detected_s=first["from_s"] - (marks["from"][0] - start),
        ended_s=(None if first["to_s"] is None else
                 first["to_s"] - (marks["to"][0] - start)),
        measured_mbit=min(first["down_bits"], first["up_bits"]) / 1e6,
        down_mbit=first["down_bits"] / 1e6, up_mbit=first["up_bits"] / 1e6)
  return row


def _fault_matrix(cases, title, **launch_kwargs):
  """Each (fault, worker) of `cases` against a clean run of the same job
  under the same launcher settings."""
  from tfopt.scale.launch import launch  # pylint: disable=import-outside-toplevel
  root = tempfile.mkdtemp(prefix="tfopt-bench-faults-")
  watch = {"backoff_s": 1.0, "heartbeat_timeout_s": 5.0, "min_stuck_s": 10.0,
           "stuck_factor": 10.0}
  flags_ = ["--epochs=3", "--steps_per_epoch=20", "--checkpoint_every=5"]
  clean = launch([SCRIPT, *flags_], workers=2,
                 run_dir=os.path.join(root, "clean"), **watch,
                 **launch_kwargs)
  reference = _final(clean.run_dir)
  records = []
  for kind, w in _progress(cases, title):
    run_dir = os.path.join(root, f"{kind}-{w}")
    extra = [f"--stuck={w}:25"] if kind == "stuck" else []
    faults = [] if kind == "stuck" else [f"{kind}:{w}:25"]
    result = launch([SCRIPT, *flags_, *extra], workers=2, run_dir=run_dir,
                    faults=faults, **watch, **launch_kwargs)
    records.append(_fault_record(kind, w, result, _final(run_dir),
                                 reference))
  return {"watch": dict(watch, **{k: v for k, v in launch_kwargs.items()
                                  if k != "hosts"}),
          "script_flags": flags_,
          "reference_final_loss": reference["final_loss"],
          "records": records}


def _fault_record(kind, w, result, final, reference) -> dict:
  first, second = result.attempts[0], result.attempts[1]
  failure = first["failure"]
  if kind == "stuck":
    since = (failure.get("last_beat") or {}).get("phase_since")
  else:
    since = first["faults"][0]["time"]
  trajectory = result.trajectory()
  return {
      "fault": kind, "worker": w, "detected": failure["kind"],
      "detected_worker": failure["worker"],
      "detected_s": failure["detected_at"] - since if since else None,
      "teardown_s": first["teardown_s"],
      "restart_s": (second["started"] + second["first_step_s"] -
                    failure["detected_at"]),
      "steps_lost": len(trajectory["lost"]) + len(trajectory["repeated"]),
      # the step log is flushed at checkpoints, so after a kill -9 the
      # steps since the last one are known from the heartbeats only
      "steps_recomputed": max(trajectory["recomputed"],
                              first["last_step"] -
                              (second["resumed_from"] or 0)),
      "resumed_from": second["resumed_from"],
      "final_loss": final["final_loss"],
      "final_loss_matches": (final["final_loss"] == reference["final_loss"]
                             and final["weights_sha256"] ==
                             reference["weights_sha256"]),
      "attempts": len(result.attempts)}


def _straggler_run(root, label, extra):
  """One 2-worker run of the straggler job; (reports, start time, median
  in-step seconds of worker 0)."""
  from tfopt.scale.launch import launch  # pylint: disable=import-outside-toplevel
  run_dir = os.path.join(root, label.replace(" ", "_").replace("%", "pct"))
  launch([SCRIPT, "--epochs=3", "--steps_per_epoch=40", "--stragglers",
          "--exchange_every=10", *extra], workers=2, run_dir=run_dir)
  with open(os.path.join(run_dir, "phases", "reports.jsonl"),
            encoding="utf-8") as f:
    reports = [json.loads(line) for line in f]
  with open(os.path.join(run_dir, "phases", "worker-0.jsonl"),
            encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  return (reports, records[0]["begin"],
          statistics.median(r["in_step"] for r in records))


def _straggler_row(label, side, reports, start):
  """Detection of worker 1 by the host-gap (`side` "host") or the in-step
  compute (`side` "compute") scores; false alarms on worker 0 by either."""
  field = "stragglers" if side == "host" else "compute_stragglers"
  late = "late_ms" if side == "host" else "compute_late_ms"
  named = [r for r in reports if r[field] == [1]]
  return {
      "delay": label, "side": side, "exchanges": len(reports),
      "detection_rate": len(named) / len(reports),
      "false_alarm_rate": sum(0 in r["stragglers"] or
                              0 in r.get("compute_stragglers", [])
                              for r in reports) / len(reports),
      "first_detection_step": named[0]["step"] + 1 if named else None,
      "first_detection_s": named[0]["time"] - start if named else None,
      "median_late_ms": statistics.median(r[late][1] for r in reports)}


def stragglers_part():
  """Host-side rows (a delay before worker 1's steps) and compute-side rows
  (extra real compute inside worker 1's step, as a share of the healthy
  step time measured in the first run)."""
  root = tempfile.mkdtemp(prefix="tfopt-bench-stragglers-")
  reports, start, healthy_s = _straggler_run(root, "none", [])
  rows = [_straggler_row("none", "host", reports, start),
          _straggler_row("none", "compute", reports, start)]
  runs = [("+10 ms host", "host", ["--delay_ms=1:10"]),
          ("+30 % host", "host", ["--delay_ms=1:30%"]),
          ("+100 ms host", "host", ["--delay_ms=1:100"])]
  for pct in (10, 30, 100):
    ms = pct / 100 * healthy_s * 1e3
    runs.append((f"+{pct} % compute", "compute",
                 [f"--extra_compute=1:{ms:.2f}"]))
  for label, side, extra in _progress(runs, "stragglers"):
    reports, start, _ = _straggler_run(root, label, extra)
    rows.append(_straggler_row(label, side, reports, start))
  return {"rows": rows, "exchange_every": 10, "steps": 120,
          "healthy_step_ms": healthy_s * 1e3}


def _progress(items, title):
  import keras  # pylint: disable=import-outside-toplevel
  bar = keras.utils.Progbar(len(items), unit_name=title)
  for i, item in enumerate(items):
    yield item
    bar.update(i + 1)


def main(argv):
  del argv
  out = FLAGS.out or os.path.join(RESULTS, "scale.json")
  parts = {"checkpoint": checkpoint_part, "monitoring": monitoring_part,
           "faults": faults_part, "network_faults": network_faults_part,
           "network_stragglers": network_stragglers_part,
           "stragglers": stragglers_part}
  unknown = sorted(set(FLAGS.parts) - set(parts))
  if unknown:
    raise app.UsageError(f"--parts must be among {sorted(parts)}; "
                         f"received {unknown}")
  result = {"benchmark": "scale"}
  if os.path.exists(out):
    with open(out, encoding="utf-8") as f:
      result.update(json.load(f))
  for name in FLAGS.parts:
    result[name] = parts[name]()
  _print(result)
  with open(out, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  print(f"wrote {out}")


def _print(result):
  c, m = result.get("checkpoint"), result.get("monitoring")
  if c:
    print(f"checkpoint of {c['params'] / 1e6:.1f} M parameters + Adam state "
          f"({c['state_bytes'] / 2**20:.0f} MiB), median of {c['repeats']}:")
    for key, value in c["median_s"].items():
      print(f"  {key:24s} {value * 1e3:9.1f} ms")
    print(f"  blocking: synchronous / two-stage = {c['blocking_ratio']:.1f}x "
          "(goal >= 5x)")
  if m:
    print("monitoring, median step time:")
    for key, value in m["median_step_s"].items():
      print(f"  {key:24s} {value * 1e3:9.3f} ms")
    print(f"  overhead MFUMonitor {m['overhead'] * 100:+.2f} %, all tfopt "
          f"callbacks {m.get('overhead_all', float('nan')) * 100:+.2f} % "
          "(goal <= 2 %)")
    for key, value in m.get("in_hooks_fraction", {}).items():
      print(f"  time inside the hooks, {key}: {value * 100:.2f} % of a step")
  if result.get("faults"):
    print("fault matrix (2 workers, 60 steps; fault once the heartbeat says "
          "step 25):")
    print(f"  {'fault':6s} {'worker':>6s} {'detected as':16s} "
          f"{'detect s':>9s} {'teardown s':>10s} {'restart s':>9s} "
          f"{'lost':>4s} {'redone':>6s} final=clean")
    for r in (result["faults"]["records"] +
              (result.get("network_faults") or {}).get("records", [])):
      named = f"{r['detected']} ({r['detected_worker']})"
      detected = ("-" if r["detected_s"] is None else
                  f"{r['detected_s']:.2f}")
      print(f"  {r['fault']:9s} {r['worker']:3d} {named:16s} "
            f"{detected:>9s} {r['teardown_s']:10.2f} {r['restart_s']:9.2f} "
            f"{r['steps_lost']:4d} {r['steps_recomputed']:6d} "
            f"{r['final_loss_matches']}")
  if result.get("network_stragglers"):
    n = result["network_stragglers"]
    print(f"a link slow for a while ({n['steps']} steps on 2 hosts at 1 "
          f"Gbit/s; host 2 throttled at step {n['throttle_at_step']} for "
          f"{n['throttle_s']} s):")
    for r in n["rows"]:
      found = (f"named {r['named']} at step {r['from_step']} "
               f"({r['detected_s']:.1f} s after), over at step "
               f"{r['to_step']} ({_f1(r['ended_s'])} s after the restore), "
               f"measured {r['measured_mbit']:.1f} Mbit/s"
               if "from_step" in r else f"named {r['named']}")
      print(f"  {r['throttle']:>8s}: {found}; {r['probes']} probes, "
            f"{r['false_alarms']} false alarm(s); after the attempt: "
            f"{r['after_attempt_named']}")
    watched, unwatched = (min(n["median_step_s"][arm])
                          for arm in ("watched", "unwatched"))
    spread = {arm: f"{min(v) * 1e3:.2f}-{max(v) * 1e3:.2f}"
              for arm, v in n["median_step_s"].items()}
    print(f"  median steps per run: {spread['watched']} ms watched, "
          f"{spread['unwatched']} ms not")
    print(f"  the watch's cost: median step {watched * 1e3:.2f} ms watched, "
          f"{unwatched * 1e3:.2f} ms not "
          f"(minimum of {len(n['median_step_s']['watched'])} runs each): "
          f"{n['watch_step_ratio']:.3f}x")
  if result.get("stragglers"):
    print("straggler detection (worker 1 slowed, exchange every 10 of 120 "
          f"steps; healthy step "
          f"{result['stragglers'].get('healthy_step_ms', 0):.1f} ms):")
    for r in result["stragglers"]["rows"]:
      first = ("never" if r["first_detection_step"] is None else
               f"step {r['first_detection_step']} "
               f"({r['first_detection_s']:.2f} s)")
      print(f"  {r['delay']:>15s} ({r.get('side', 'host')} scores): rate "
            f"{r['detection_rate']:.2f}, false "
            f"alarms {r['false_alarm_rate']:.2f}, first {first}, median "
            f"{r['median_late_ms']:.1f} ms late")


def _f1(value) -> str:
  return "-" if value is None else f"{value:.1f}"


if __name__ == "__main__":
  app.run(main)
