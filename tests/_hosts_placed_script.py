"""A model that does not fit one host's tasks, trained through
`tfopt.compile` across LocalHosts' tasks (run in their client's place);
prints one JSON line for tests/scale/test_hosts.py.

    python -m tests._hosts_placed_script SPEC_JSON DEVICES_JSON CAP CALIBRATION
"""

import json
import sys

import keras
import numpy as np

import tfopt
from tfopt import zoo


def build():
  keras.utils.set_random_seed(0)
  return zoo.mlp(input_dim=256, hidden=(512,) * 4).model


def compile_kwargs():
  return dict(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))


def main(spec, devices, cap, calibration):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((128, 256)).astype(np.float32)
  y = rng.integers(0, 10, 128).astype(np.int32)
  fit = dict(batch_size=32, epochs=2, shuffle=False, verbose=0)
  plain = build()
  plain.compile(**compile_kwargs())
  out = {"plain": plain.fit(x, y, **fit).history["loss"]}
  model = build()
  tfopt.compile(model, placement="auto", devices=json.loads(devices),
                cluster=json.loads(spec), memory_per_device=int(cap),
                calibration=calibration, verbose=False, **compile_kwargs())
  out["placed"] = model.fit(x, y, **fit).history["loss"]
  (report,) = model.train_function.reports.values()
  out["cluster"] = report.cluster_source
  out["predicted_us"] = report.predicted_us
  out["makespan_us"] = report.plan.makespan_us
  out["step_overhead_us"] = report.step_overhead_us
  out["devices_used"] = list(report.devices_used)
  out["table"] = report.table()
  out["devices"] = sorted({v.value.device for v in model.variables})
  print(json.dumps(out))


if __name__ == "__main__":
  main(*sys.argv[1:5])
