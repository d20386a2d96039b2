"""Calibrate two server processes, each pinned to a core of its own (one
intra-op thread, two inter-op threads): devices that really compute apart.

    tfopt-calibrate \
        --config=experiments/configs/calibrate_pinned_2.py \
        --out=/tmp/calibration_pinned_2.json

Expected (2-core VM, about 10 s): latency about 400-800 us + bytes / ~1
GB/s (relative rms 10-25 %), an overhead of 20-60 us (transfers overlap),
"own cores each", and the file written.
"""

CONFIG = {
    "devices": "pinned:2",
    "repeats": 5,
}
