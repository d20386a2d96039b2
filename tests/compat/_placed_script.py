"""The placed, spread and mirrored cells of the compatibility matrix, in a
process with 2 logical CPUs (they exist only if configured before
TensorFlow starts). Prints one JSON line: {family: {"placed": ...,
"spread": ..., "mirrored": ...}}: the hook's histories (the caller
compares the placed and spread ones with plain Keras on one device), and
plain Keras' beside the hook's under the MirroredStrategy.

    python -m tests.compat._placed_script [FAMILY ...]
"""

import json
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 2)

import importlib.util  # noqa: E402

import tfopt  # noqa: E402
from tests.compat import families as fam  # noqa: E402

DEVICES = ["/device:CPU:0", "/device:CPU:1"]
FIT = dict(epochs=2, shuffle=False, verbose=0)
# The spread cap, as a share of the step's one-device peak (analytic, as
# tfopt.compile's own fits-one-device test; profiled peaks are higher):
# the first share at which the placers find a plan. Below the bound a
# step's largest op needs with its inputs (an LSTM's gradient loop) there
# is none; the placers' packing is not under test here.
CAP_SHARES = (0.6, 0.75, 0.9)


def _one_device_peak(family) -> int:
  """The step's analytic liveness peak on one device, from the first
  batch as `fit` feeds it."""
  from tfopt.compile_placement import one_device_peak  # pylint: disable=g-import-not-at-top
  from tfopt.graph.capture import capture_train_step  # pylint: disable=g-import-not-at-top
  model = family.build()
  model.compile(**family.compile_kwargs())
  batch = next(iter(_first_batches(model, family.data())))
  return one_device_peak(capture_train_step(model, data=batch))


def _first_batches(model, data):
  """fit's own batches: Keras' data adapter over `data`, or, for a task
  model with a preprocessor, the preprocessor's output (as its fit maps
  it)."""
  from keras.src.trainers.epoch_iterator import EpochIterator  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  pre = getattr(model, "preprocessor", None)
  if pre is not None:
    x = data["x"][:data["batch_size"]]
    batches = [pre(x) if "y" not in data else
               pre(x, data["y"][:data["batch_size"]])]
  else:
    batches = (batch[0] for _, _, batch in EpochIterator(shuffle=False,
                                                         **data))
  for batch in batches:
    parts = keras.utils.unpack_x_y_sample_weight(batch)
    parts = tuple(None if p is None else tf.nest.map_structure(
        keras.ops.convert_to_numpy, p) for p in parts)
    while parts and parts[-1] is None:
      parts = parts[:-1]
    yield parts


def _hooked(family, **kwargs):
  model = family.build()
  tfopt.compile(model, verbose=False, devices=DEVICES,
                **family.compile_kwargs(), **kwargs)
  history = model.fit(**family.data(), **FIT).history
  reports = list(model.train_function.reports.values())
  return dict(history=history,
              devices=sorted({d for r in reports for d in r.devices_used}),
              verified=min(r.ops_verified for r in reports),
              peaks=[max(p) for p in zip(*(r.peak_bytes for r in reports))],
              placers=[r.placer for r in reports])


_STRATEGY = []


def _mirrored(family) -> dict:
  """Plain Keras and the hook under one MirroredStrategy over the 2
  logical CPUs. One strategy for the whole process: a second one starts
  its collectives' instance keys again, and TensorFlow's collective
  executor, which remembers each instance's shape, aborts the next family's
  all-reduce (seen: plain Keras' own step failed with "Shape mismatch in
  the collective instance 100")."""
  if not _STRATEGY:
    _STRATEGY.append(tf.distribute.MirroredStrategy(DEVICES))
  strategy = _STRATEGY[0]
  runs, errors = [], {}
  for hooked in (False, True):
    with strategy.scope():
      model = family.build()
      if hooked:
        tfopt.compile(model, verbose=False, **family.compile_kwargs())
      else:
        model.compile(**family.compile_kwargs())
    try:
      runs.append(model.fit(**family.data(), **FIT).history)
    except Exception as err:  # pylint: disable=broad-except
      # Where plain Keras itself fails, the hook's run says whether tfopt
      # fails the same way (the cell's "Keras fails").
      errors["hook" if hooked else "plain"] = f"{type(err).__name__}: {err}"
  if errors:
    return {"error": "; ".join(f"{k}: {v}" for k, v in errors.items()),
            "plain_error": errors.get("plain"),
            "hook_error": errors.get("hook")}
  reports = list(model.train_function.reports.values())
  return dict(history=runs[1], plain=runs[0],
              replicas=[r.replicas for r in reports],
              verified=min(r.ops_verified for r in reports))


def _spread(family, peak: int) -> dict:
  """The spread cell at the first of CAP_SHARES that places."""
  for share in CAP_SHARES:
    cap = int(share * peak)
    cell = _cell(lambda: dict(_hooked(family, placement="auto",  # pylint: disable=cell-var-from-loop
                                      memory_per_device=cap),
                              cap=cap, one_device_peak=peak, share=share))
    if "error" not in cell or "InfeasiblePlacement" not in cell["error"]:
      return cell
  return cell


def _cell(run):
  try:
    return run()
  except Exception as err:  # pylint: disable=broad-except
    return {"error": f"{type(err).__name__}: {err}",
            "traceback": traceback.format_exc()[-3000:]}


def main(names):
  out = {}
  for family in fam.FAMILIES:
    if names and family.name not in names:
      continue
    if any(importlib.util.find_spec(m) is None for m in family.needs):
      continue
    placed = _cell(lambda: _hooked(family, placement="m-etf"))
    peak = _cell(lambda: _one_device_peak(family))
    spread = peak if isinstance(peak, dict) else _spread(family, peak)
    mirrored = _cell(lambda: _mirrored(family))
    out[family.name] = {"placed": placed, "spread": spread,
                        "mirrored": mirrored}
    print(family.name, {k: v.get("error", "ok") for k, v in
                        out[family.name].items()}, file=sys.stderr,
          flush=True)
  print(json.dumps(out, default=float))


if __name__ == "__main__":
  main(sys.argv[1:])
