#!/usr/bin/env bash
# The wheel as users get it: build it, install it (non-editable, the wheel
# alone, with its cpu extra) into a fresh virtual environment, and run
# README's placement and optimizer quickstarts from an empty directory, far
# from the repository. Called by `make wheel-check` and .ci/run.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$ROOT/.venv/bin/python" -m pip wheel --quiet --no-deps --no-build-isolation \
    -w "$WORK/dist" "$ROOT"
WHEEL="$(ls "$WORK"/dist/tfopt-*.whl)"
"$ROOT/.venv/bin/python" "$ROOT/tools/wheel_contents.py" "$WHEEL"

"$PYTHON" -m venv "$WORK/venv"
if [ -n "${PINS:-}" ]; then  # tools/check_oldest.sh: exact versions instead
  # shellcheck disable=SC2086
  "$WORK/venv/bin/python" -m pip install --quiet "$WHEEL" $PINS
else
  "$WORK/venv/bin/python" -m pip install --quiet "${WHEEL}[cpu]"
fi
"$WORK/venv/bin/python" -m pip list 2>/dev/null | grep -E -i \
    '^(tensorflow|tensorflow-cpu|keras|ortools|numpy|networkx|absl-py|matplotlib) '


mkdir "$WORK/empty"
cd "$WORK/empty"
export TF_CPP_MIN_LOG_LEVEL=2
# The placement quickstart's command, on a shipped workload by name.
"$WORK/venv/bin/tfopt-place" --costgraph=msr_gnmt_training_layers \
    --devices=4 --memory_fraction=0.35 --json > place.json
"$WORK/venv/bin/python" - <<'PY'
import json
result = json.load(open("place.json"))
assert result["feasible"] and result["makespan_us"] < result["single_device_us"], result
print(f"tfopt-place: {result['placer']}, {result['makespan_us'] / 1e3:.1f} ms "
      f"(one device {result['single_device_us'] / 1e3:.1f} ms)")
PY
"$WORK/venv/bin/tfopt-place" --devices=0 2> usage.txt && exit 1
grep -q "see tfopt-place --help" usage.txt
# README's placement and optimizer quickstarts, as Python.
"$WORK/venv/bin/python" - <<'PY'
import numpy as np
import tfopt
from tfopt import Cluster
from tfopt.graph import load_workload
from tfopt.placement import place
import tfopt.graph, tfopt.placement

assert "site-packages" in tfopt.__file__, tfopt.__file__
cg = load_workload("msr_gnmt_training_layers")
result = place(cg.graph, Cluster.uniform(4, memory_bytes=4_430_000_000),
               cg.costs)
assert result.schedule.feasible
print(f"place(): {result.placer}, {result.makespan_us / 1e3:.1f} ms")

import keras
from tfopt.optimizers import CautiousAdamW
w = keras.Variable(np.array([1.0, -2.0], "float32"))
opt = CautiousAdamW(learning_rate=0.1, weight_decay=0.5)
opt.apply([keras.ops.convert_to_tensor(np.array([0.3, 0.4], "float32"))], [w])
# Adam's first step moves each weight by lr * sign(g) = 0.1 down; cautious
# decay (lr * wd * w) acts only where that update and the weight have the
# same sign: the first weight (1 > 0, update > 0), not the second.
expected = np.array([1.0 - 0.1 - 0.1 * 0.5 * 1.0, -2.0 - 0.1], "float32")
np.testing.assert_allclose(keras.ops.convert_to_numpy(w), expected, rtol=1e-5)
print("CautiousAdamW step:", keras.ops.convert_to_numpy(w))
PY
echo "wheel check passed: $(basename "$WHEEL")"
