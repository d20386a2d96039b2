"""The client side of benchmarks/hosts.py's placement rows, run in
LocalHosts' client place: plain Keras' losses, then the same model through
`tfopt.compile` across the hosts' tasks; the step measured against the
prediction, timed by `benchmarks._timing` (per step, and by the difference
of two fits: here its minimum over rounds, the measure before). Prints
one JSON line.

    python -m benchmarks._hosts_client SPEC DEVICES CAP CALIBRATION ROUNDS
"""

from __future__ import annotations

import json
import statistics
import sys

from benchmarks._timing import summary, timed_fits

BATCH, SHORT, LONG = 32, 4, 24


def _build():
  import keras  # pylint: disable=import-outside-toplevel
  from tfopt import zoo  # pylint: disable=import-outside-toplevel
  keras.utils.set_random_seed(0)
  return zoo.mlp(input_dim=256, hidden=(512,) * 4).model


def _compile_kwargs():
  import keras  # pylint: disable=import-outside-toplevel
  return dict(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))


def main(spec, devices, cap, calibration, rounds):
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tfopt  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  x = rng.standard_normal((BATCH * LONG, 256)).astype(np.float32)
  y = rng.integers(0, 10, BATCH * LONG).astype(np.int32)
  fit = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
  plain = _build()
  plain.compile(**_compile_kwargs())
  out = {"plain_losses": plain.fit(x[:128], y[:128], **fit).history["loss"]}
  model = _build()
  tfopt.compile(model, placement="auto", devices=json.loads(devices),
                cluster=json.loads(spec), memory_per_device=int(cap),
                calibration=calibration, verbose=False, **_compile_kwargs())
  out["losses"] = model.fit(x[:128], y[:128], **fit).history["loss"]
  (report,) = model.train_function.reports.values()

  timed = summary(timed_fits(model, x, y, batch=BATCH, short=SHORT,
                             long=LONG, rounds=int(rounds)))
  from tfopt.runtime.remote import task_hosts  # pylint: disable=import-outside-toplevel
  host = task_hosts(json.loads(spec), json.loads(devices))
  schedule = report.plan.schedule
  across = [t for t in schedule.transfers
            if host[t.src_device] != host[t.dst_device]]
  out.update(
      placer=report.placer, devices_used=len(report.devices_used),
      predicted_ms=report.predicted_us / 1e3,
      # The plan's ops and transfers: its makespan less the dispatch it
      # holds (Cluster.step_overhead); dispatch_ms: that and the feed.
      simulated_ms=(report.predicted_us - report.step_overhead_us) / 1e3,
      dispatch_ms=report.step_overhead_us / 1e3, **timed,
      steps=[SHORT, LONG],
      difference_ms=min(timed["per_step_ms"]),
      difference_median_ms=statistics.median(timed["per_step_ms"]),
      tensors_across_hosts=sum(1 for t in across if t.bytes > 0),
      bytes_across_hosts=sum(t.bytes for t in across),
      control_messages_across_hosts=sum(1 for t in across if t.bytes == 0),
      cluster=report.cluster_source)
  print(json.dumps(out))


if __name__ == "__main__":
  main(*sys.argv[1:6])
