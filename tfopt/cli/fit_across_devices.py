"""A model whose state does not fit one device trains with an unchanged
`model.fit` through `tfopt.compile`, on capped devices.

    tfopt-fit-across-devices \
        --config=experiments/configs/fit_across_devices.py

Three parts, each in its own process, against plain Keras in one uncapped
process on the same data: `logical` (the model placed on --devices logical
CPUs of --cap_mib each; measured per device from TensorFlow's allocation
records), `processes` (on --devices server processes, each under an OS
memory cap of --server_limit_mib: a memory cgroup; measured from the
allocation records each task sends back, and as each server's cgroup
peak, the runtime's own memory included) and `refused` (the same model on one device of the
cap: refused before training, naming the bytes needed, the cap and the
fewest devices that hold it). Prints the loss trajectories, predicted
beside measured peaks per device, the share of the parameters each device
holds, and the step times; --out writes it all as JSON.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402
from tfopt.cli._main import run_main  # noqa: E402

from tfopt.cli import _across  # noqa: E402
from tfopt.cli._config import apply_config, define_config_flag  # noqa: E402

FLAGS = flags.FLAGS
define_config_flag()
flags.DEFINE_integer("layers", 16, "Hidden Dense layers of the MLP.")
flags.DEFINE_integer("width", 1024, "Units per layer (and input features).")
flags.DEFINE_integer("batch_size", 64, "Batch size.")
flags.DEFINE_integer("steps", 4, "Batches per epoch.")
flags.DEFINE_integer("epochs", 2, "Epochs compared with plain Keras.")
flags.DEFINE_integer("devices", 4, "Devices (logical CPUs, server processes).")
flags.DEFINE_float("cap_mib", 88.0, "memory_per_device, MiB.")
flags.DEFINE_float("server_limit_mib", 300.0, "OS memory cap per server "
                   "process, MiB: the plan's tensors plus the runtime's own "
                   "memory (thread pools, kernels, the allocator's pool).")
flags.DEFINE_list("parts", ["logical", "processes", "refused"],
                  "Parts to run.")
flags.DEFINE_string("out", None, "Write the results as JSON here.")
flags.DEFINE_bool("overwrite", False, "Replace --out if it exists.")

PARTS = ("logical", "processes", "refused")


def _spec(part: str) -> dict:
  return {"part": part, "model": "mlp",
          "model_kwargs": {"input_dim": FLAGS.width,
                           "hidden": [FLAGS.width] * FLAGS.layers},
          "batch_size": FLAGS.batch_size, "steps": FLAGS.steps,
          "epochs": FLAGS.epochs, "devices": FLAGS.devices,
          "cap_bytes": int(FLAGS.cap_mib * (1 << 20)),
          "server_limit_bytes": int(FLAGS.server_limit_mib * (1 << 20))}


def _mb(nbytes) -> str:
  return f"{nbytes / 1e6:.1f}"


def report(result: dict) -> str:
  """A part's result as text."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  lines = [f"== {result['part']}: state {_mb(result['state_bytes'])} MB, "
           f"cap {_mb(result['cap'])} MB per device "
           f"({result['state_bytes'] / result['cap']:.2f}x)"]
  if result["part"] == "refused":
    lines.append(result["refusal"] or "NOT REFUSED")
    lines.append(f"model's variables unchanged: {result['intact']}")
    return "\n".join(lines)
  if "error" in result:
    lines.append(f"failed: {result['error']} {result.get('exited', '')}")
    return "\n".join(lines)
  equal = np.allclose(result["placed"], result["plain"], rtol=1e-5)
  lines.append(f"losses tfopt {['%.6f' % v for v in result['placed']]} vs "
               f"plain Keras {['%.6f' % v for v in result['plain']]}: "
               f"{'equal (rtol 1e-5)' if equal else 'DIFFERENT'}")
  total = sum(result["variable_bytes"].values()) or 1
  lines.append(f"placer {result['placer']} ({result['placement_s']:.1f} s), "
               f"costs measured for {result['profiled']} ops; measured: "
               f"{result['measured_by']}")
  os_peaks = result.get("os_peaks")
  lines.append(f"{'device':<40}{'params %':>9}{'predicted MB':>14}"
               f"{'measured MB':>13}"
               + (f"{'process peak MB':>17}" if os_peaks else ""))
  for i, device in enumerate(result["devices"]):
    share = sum(b for d, b in result["variable_bytes"].items()
                if d.endswith(device.split("/")[-1]) and (
                    "job:" not in device or device.split("/device")[0] in d))
    lines.append(f"{device:<40}{100 * share / total:>9.0f}"
                 f"{_mb(result['predicted_peaks'][i]):>14}"
                 f"{_mb(result['measured_peaks'][i]):>13}"
                 + (f"{_mb(os_peaks[i]):>17}" if os_peaks else ""))
  if os_peaks:
    lines.append(f"process peak: {result['os_measured_by']}")
  lines.append(f"step: measured {result['step_s'] * 1e3:.1f} ms, predicted "
               f"{result['predicted_step_s'] * 1e3:.1f} ms; plain Keras on "
               f"one uncapped device {result['plain_step_s'] * 1e3:.1f} ms")
  return "\n".join(lines)


def main(argv):
  del argv
  apply_config()
  unknown = sorted(set(FLAGS.parts) - set(PARTS))
  if unknown:
    raise app.UsageError(f"--parts must name parts of {PARTS}; received "
                         f"{unknown}.")
  if FLAGS.out and os.path.exists(FLAGS.out) and not FLAGS.overwrite:
    raise app.UsageError(f"--out={FLAGS.out} exists; pass --overwrite to "
                         f"replace it.")
  results = []
  for part in FLAGS.parts:
    result = _across.run_in_subprocess(_spec(part))
    results.append(result)
    print(report(result), flush=True)
  if FLAGS.out:
    from tfopt._io import atomic_write_text  # pylint: disable=g-import-not-at-top
    atomic_write_text(FLAGS.out, json.dumps(results, indent=1),
                      overwrite=FLAGS.overwrite)
    print(f"wrote {FLAGS.out}")


def run() -> None:
  """The console script's entry point."""
  run_main(main, __doc__)


if __name__ == "__main__":
  run()
