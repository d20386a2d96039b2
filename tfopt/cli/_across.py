"""One run of a model trained through `tfopt.compile` across capped
devices, measured; shared by experiments/fit_across_devices.py and
benchmarks/fit_across_devices.py.

Each run is one process (logical CPU devices exist only if configured
before TensorFlow starts, and a process connects to one cluster): `run`
does one part, `run_in_subprocess` runs it in a fresh interpreter and reads
its JSON line back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

# A part's JSON line on stdout starts with this.
TAG = "ACROSS_RESULT "


def _model(spec: dict):
  import keras  # pylint: disable=g-import-not-at-top
  from tfopt import zoo  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(spec.get("seed", 0))
  return zoo.build(spec["model"], **spec.get("model_kwargs", {}))


def _compile_kwargs(spec: dict):
  import keras  # pylint: disable=g-import-not-at-top
  from tfopt.optimizers import CautiousAdamW  # pylint: disable=g-import-not-at-top
  return dict(optimizer=CautiousAdamW(spec.get("learning_rate", 1e-3)),
              loss=keras.losses.SparseCategoricalCrossentropy(
                  from_logits=True))


def _data(spec: dict, zoo_model):
  batches = spec["batch_size"] * spec["steps"]
  return zoo_model.batch(batches, seed=spec.get("seed", 0))


def _fit(model, x, y, spec) -> tuple[list[float], float]:
  """Losses over `epochs`, then the median step time of one more epoch."""
  fit = dict(batch_size=spec["batch_size"], shuffle=False, verbose=0)
  losses = model.fit(x, y, epochs=spec["epochs"], **fit).history["loss"]
  times = []
  import keras  # pylint: disable=g-import-not-at-top

  class StepClock(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
      self.t = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
      times.append(time.perf_counter() - self.t)

  model.fit(x, y, epochs=1, callbacks=[StepClock()], **fit)
  return losses, float(np.median(times))


def _plain(spec, x, y):
  """The uncapped one-process reference: plain Keras."""
  model = _model(spec).model
  model.compile(**_compile_kwargs(spec))
  losses, step_s = _fit(model, x, y, spec)
  return model, losses, step_s


def state_bytes(model) -> int:
  """Weights and the two moments of (Cautious)Adam."""
  return 3 * sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                 for v in model.trainable_variables)


def run(spec: dict) -> dict[str, Any]:
  """One part: spec["part"] is "logical" (spec["devices"] logical CPUs),
  "processes" (that many capped server processes) or "refused" (one
  capped device)."""
  part = spec["part"]
  if part == "logical":
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * spec["devices"])
  import tfopt  # pylint: disable=g-import-not-at-top
  from tfopt.placement import InfeasiblePlacement  # pylint: disable=g-import-not-at-top
  zoo_model = _model(spec)
  x, y = _data(spec, zoo_model)
  plain, plain_losses, plain_step_s = _plain(spec, x, y)
  if "cap_fraction" in spec:  # of the step's one-device liveness peak
    spec = dict(spec, one_device_peak=_one_device_peak(plain, x, y, spec))
    spec["cap_bytes"] = int(spec["cap_fraction"] * spec["one_device_peak"])
    if "server_allowance_bytes" in spec:
      spec["server_limit_bytes"] = (spec["cap_bytes"] +
                                    spec["server_allowance_bytes"])
  out: dict[str, Any] = {"part": part, "plain": plain_losses,
                         "plain_step_s": plain_step_s,
                         "state_bytes": state_bytes(plain),
                         "cap": spec["cap_bytes"],
                         "one_device_peak": spec.get("one_device_peak"),
                         "server_limit": spec.get("server_limit_bytes")}
  model = _model(spec).model
  if part == "refused":
    before = [v.numpy().copy() for v in model.variables]
    tfopt.compile(model, placement="auto", devices=["/device:CPU:0"],
                  memory_per_device=spec["cap_bytes"], verbose=False,
                  **_compile_kwargs(spec))
    started = time.perf_counter()
    try:
      model.fit(x, y, batch_size=spec["batch_size"], epochs=1, verbose=0)
      out["refusal"] = None
    except InfeasiblePlacement as err:
      out["refusal"] = (err.refusal.message(model.name)
                        if hasattr(err, "refusal") else str(err))
    out["refusal_s"] = time.perf_counter() - started
    out["intact"] = all(np.array_equal(a, v.numpy())
                        for a, v in zip(before, model.variables))
    return out
  if part == "logical":
    devices = [f"/device:CPU:{i}" for i in range(spec["devices"])]
    return _placed(out, model, x, y, spec, devices, None)
  from tfopt.runtime import LoopbackServers  # pylint: disable=g-import-not-at-top
  with LoopbackServers(spec["devices"],
                       memory_limit_bytes=spec.get("server_limit_bytes")
                       ) as servers:
    return _placed(out, model, x, y, spec, servers.device_names, servers)


def _one_device_peak(model, x, y, spec) -> int:
  """The simulator's one-device liveness peak of the model's step with
  the analytic estimate (what `tfopt.compile` judges first)."""
  from tfopt.compile_placement import one_device_peak  # pylint: disable=g-import-not-at-top
  from tfopt.graph.capture import capture_train_step  # pylint: disable=g-import-not-at-top
  bs = spec["batch_size"]
  return one_device_peak(capture_train_step(model, x=x[:bs], y=y[:bs]))


def _placed(out, model, x, y, spec, devices, servers):
  import tfopt  # pylint: disable=g-import-not-at-top
  from tfopt.placement import InfeasiblePlacement  # pylint: disable=g-import-not-at-top
  tfopt.compile(model, placement="auto", devices=devices,
                memory_per_device=spec["cap_bytes"], verbose=False,
                cluster=None if servers is None else servers.spec,
                **_compile_kwargs(spec))
  if servers is not None:
    servers.reset_peaks()
  started = time.perf_counter()
  try:
    losses, step_s = _fit(model, x, y, spec)
  except (InfeasiblePlacement, RuntimeError) as err:
    out["error"] = (err.refusal.message(model.name)
                    if hasattr(err, "refusal") else str(err))
    if servers is not None:
      out["exited"] = servers.exited()
    return out
  out["fit_s"] = time.perf_counter() - started
  out["placed"] = losses
  out["step_s"] = step_s
  hook = model.train_function
  (key,) = hook.reports
  report = hook.reports[key]
  out["placer"] = report.placer
  out["placement_s"] = _place_seconds(report)
  out["predicted_step_s"] = report.predicted_us / 1e6
  out["predicted_peaks"] = list(report.peak_bytes)
  out["variable_bytes"] = report.variable_bytes
  out["devices"] = list(devices)
  out["profiled"] = f"{report.profiled_ops} of {report.costed_ops}"
  if servers is not None:  # before the measuring session adds its own
    out["os_peaks"] = servers.peak_bytes()
  out["measured_peaks"] = _measured_allocations(
      model, x, y, spec, hook.graph_defs[key], devices,
      "" if servers is None else servers.target)
  out["measured_by"] = "TensorFlow's allocation records per device"
  if servers is not None:
    out["os_measured_by"] = ("each server's memory cgroup peak over the "
                             "whole fit (profiling and check sessions "
                             "included)")
    out["exited"] = servers.exited()
  return out


def _place_seconds(report) -> float | None:
  for line in report.pipeline_table.splitlines():
    if line.startswith("place "):
      return float(line.split()[1]) / 1e3
  return None


def _measured_allocations(model, x, y, spec, graph_def, devices,
                          target: str) -> list[int]:
  """Each device's peak while the placed step runs, from TensorFlow's
  allocation records (on server processes: through a session on
  `target`, the step stats every task sends back)."""
  from tfopt.graph.capture import capture_train_step  # pylint: disable=g-import-not-at-top
  from tfopt.runtime.memory import measure_peak_bytes  # pylint: disable=g-import-not-at-top
  bs = spec["batch_size"]
  step = capture_train_step(model, x=x[:bs], y=y[:bs])
  full = devices if target else [
      f"/job:localhost/replica:0/task:0{d}" for d in devices]
  return list(measure_peak_bytes(step, [x[:bs], y[:bs]], graph_def=graph_def,
                                 devices=full, target=target).peak_bytes)


def run_in_subprocess(spec: dict, timeout_s: float = 1800) -> dict:
  """`run(spec)` in a fresh interpreter; its result."""
  code = ("import json, sys; from tfopt.cli import _across; "
          "print(_across.TAG + json.dumps(_across.run(json.loads("
          "sys.argv[1]))), flush=True)")
  env = dict(os.environ)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  done = subprocess.run([sys.executable, "-c", code, json.dumps(spec)],
                        capture_output=True, text=True, timeout=timeout_s,
                        check=False, env=env)
  for line in done.stdout.splitlines():
    if line.startswith(TAG):
      return json.loads(line[len(TAG):])
  raise RuntimeError(f"The {spec['part']} run failed (exit "
                     f"{done.returncode}): {done.stderr[-2000:]}")
