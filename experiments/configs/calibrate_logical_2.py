"""Calibrate two logical CPU devices of one process.

    tfopt-calibrate \
        --config=experiments/configs/calibrate_logical_2.py \
        --out=/tmp/calibration_logical_2.json

Expected (2-core VM, about 10 s): a hand-over of about 5-20 us with no
bandwidth term ("hand-over (time does not grow with size)"), an overhead of
a few us, shared cores with a capacity of 1.1-1.7, and the file written.
"""

CONFIG = {
    "devices": "logical:2",
    "repeats": 5,
}
