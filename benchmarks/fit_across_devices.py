"""Models trained through `tfopt.compile` on capped devices: feasibility,
placement time, predicted beside measured per-device peaks and step
times, and each device's share of the parameters.

    python -m benchmarks.fit_across_devices

For the zoo MLP, a small Transformer LM and the demonstration model (16 x
Dense(1024), experiments/configs/fit_across_devices.py), on 2 and 4
devices -- logical CPUs of one process, and server processes each under an
OS memory cap (a cgroup of cap + --server_allowance_mib for the runtime's
own memory) -- at caps of 1.0, 0.5 and 0.3 of the step's one-device
liveness peak (the simulator's, analytic costs). Each configuration runs in
its own process (tfopt/cli/_across.py) against plain Keras in one
uncapped process on the same data; "losses equal" is rtol 1e-5 on every
epoch. Measured peaks: TensorFlow's allocation records per device (on
server processes, the step stats each task sends back), compared with the
prediction; on server processes also each server's cgroup peak over the
whole fit (profiling and the check included), the runtime's own memory
with it: what an OS cap must hold. Prints the table and writes
benchmarks/results/fit_across_devices.json.
"""

from __future__ import annotations

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from tfopt.cli import _across  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["mlp", "transformer_lm", "demo"], "Models.")
flags.DEFINE_list("kinds", ["logical", "processes"], "Device kinds.")
flags.DEFINE_list("devices", ["2", "4"], "Device counts.")
flags.DEFINE_list("fractions", ["1.0", "0.5", "0.3"],
                  "Caps as fractions of the one-device peak.")
flags.DEFINE_float("server_allowance_mib", 128.0, "OS cap per server process "
                   "above memory_per_device, MiB.")
flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "results",
                                        "fit_across_devices.json"),
                    "Results JSON.")

MODELS = {
    "mlp": {"model": "mlp", "model_kwargs": {}, "batch_size": 64},
    "transformer_lm": {"model": "transformer_lm", "model_kwargs": {
        "vocab_size": 2000, "seq_len": 64, "num_layers": 2, "d_model": 128,
        "num_heads": 4, "d_ff": 512}, "batch_size": 16},
    "demo": {"model": "mlp", "model_kwargs": {
        "input_dim": 1024, "hidden": [1024] * 16}, "batch_size": 64},
}


def _row(name, kind, devices, fraction, r):
  row = {"model": name, "kind": kind, "devices": devices,
         "cap_fraction": fraction, "cap_mb": r["cap"] / 1e6,
         "one_device_peak_mb": (r["one_device_peak"] or 0) / 1e6,
         "state_mb": r["state_bytes"] / 1e6}
  if "error" in r:
    row.update(feasible=False, why=r["error"])
    return row
  import numpy as np  # pylint: disable=g-import-not-at-top
  total = sum(r["variable_bytes"].values()) or 1
  row.update(
      feasible=True, placer=r["placer"], placement_s=r["placement_s"],
      predicted_peak_mb=[p / 1e6 for p in r["predicted_peaks"]],
      measured_peak_mb=[p / 1e6 for p in r["measured_peaks"]],
      measured_by=r["measured_by"],
      os_peak_mb=([p / 1e6 for p in r["os_peaks"]] if "os_peaks" in r
                  else None),
      peak_ratio=max(r["measured_peaks"]) / max(r["predicted_peaks"]),
      predicted_step_ms=r["predicted_step_s"] * 1e3,
      step_ms=r["step_s"] * 1e3, plain_step_ms=r["plain_step_s"] * 1e3,
      param_share={d: b / total for d, b in r["variable_bytes"].items()},
      losses_equal=bool(np.allclose(r["placed"], r["plain"], rtol=1e-5)),
      server_limit_mb=(r["server_limit"] or 0) / 1e6 if kind == "processes"
      else None)
  return row


def _print(rows):
  head = (f"{'model':<15}{'kind':<10}{'dev':>4}{'cap':>5}{'cap MB':>8}"
          f"{'ok':>4}{'placer':>10}{'place s':>8}{'pred MB':>9}{'meas MB':>9}"
          f"{'meas/pred':>10}{'OS MB':>8}{'pred ms':>9}{'meas ms':>9}{'plain ms':>9}"
          f"  params %")
  print(head)
  for r in rows:
    start = (f"{r['model']:<15}{r['kind']:<10}{r['devices']:>4}"
             f"{r['cap_fraction']:>5.1f}{r['cap_mb']:>8.1f}")
    if not r["feasible"]:
      print(start + f"{'no':>4}  {r['why'][:110]}")
      continue
    shares = "/".join(f"{100 * v:.0f}" for _, v in sorted(
        r["param_share"].items()))
    print(start + f"{'yes' if r['losses_equal'] else 'DIF':>4}"
          f"{r['placer']:>10}{r['placement_s']:>8.2f}"
          f"{max(r['predicted_peak_mb']):>9.1f}"
          f"{max(r['measured_peak_mb']):>9.1f}{r['peak_ratio']:>10.2f}"
          f"{max(r['os_peak_mb']) if r.get('os_peak_mb') else 0:>8.1f}"
          f"{r['predicted_step_ms']:>9.1f}{r['step_ms']:>9.1f}"
          f"{r['plain_step_ms']:>9.1f}  {shares}", flush=True)


def main(argv):
  del argv
  rows = []
  started = time.perf_counter()
  for name in FLAGS.models:
    for kind in FLAGS.kinds:
      for devices in map(int, FLAGS.devices):
        for fraction in map(float, FLAGS.fractions):
          spec = dict(MODELS[name], part=kind, devices=devices, steps=3,
                      epochs=2, cap_fraction=fraction,
                      server_allowance_bytes=int(
                          FLAGS.server_allowance_mib * (1 << 20)))
          rows.append(_row(name, kind, devices, fraction,
                           _across.run_in_subprocess(spec)))
          _print(rows[-1:])
  print()
  _print(rows)
  from tfopt._io import atomic_write_text  # pylint: disable=g-import-not-at-top
  atomic_write_text(FLAGS.out, json.dumps(
      {"rows": rows, "seconds": time.perf_counter() - started,
       "server_allowance_mib": FLAGS.server_allowance_mib}, indent=1),
                    overwrite=True)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
