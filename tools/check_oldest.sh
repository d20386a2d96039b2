#!/usr/bin/env bash
# The oldest versions pyproject.toml declares, verified together: the wheel
# installed into a fresh virtual environment with exactly these, then the
# same smoke test as `make wheel-check` (a placement from the CLI on a
# shipped workload, README's placement quickstart, one CautiousAdamW step).
#
#     bash tools/check_oldest.sh
#
# TensorFlow below 2.18 cannot be installed with OR-Tools 9.10 (TF 2.16 and
# 2.17 require protobuf < 5, OR-Tools 9.10 requires >= 5.26.1), so 2.18 is
# the oldest TensorFlow tfopt supports; Keras 3.10 is the first with Muon.
set -euo pipefail
export PINS="tensorflow-cpu==2.18.1 keras==3.10.0 ortools==9.10.4067 \
numpy==1.26.4 networkx==3.1 absl-py==2.0.0 matplotlib==3.7.5"
exec bash "$(dirname "$0")/wheel_check.sh"
