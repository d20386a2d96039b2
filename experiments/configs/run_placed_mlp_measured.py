"""A small MLP placed on 2 logical CPU devices of a calibrated machine, the
plan chosen by the clock (select="measured").

    tfopt-run-placed \
        --config=experiments/configs/run_placed_mlp_measured.py \
        --calibration=/tmp/calibration_logical_2.json \
        --out_dir=/tmp/placed_mlp_measured

(the calibration file from `tfopt-calibrate
--config=experiments/configs/calibrate_logical_2.py
--out=/tmp/calibration_logical_2.json`). Expected (2-core CPU, about 30 s):
the calibration described, the portfolio's table, then "chosen by
measurement" with one device and the best distinct plans, predicted and
measured side by side (on this machine one device or a plan within a few
percent of it wins: logical devices share the cores), 2 placed steps equal
to the unplaced step with every op where planned, the prediction against
the clock and one traced step beside its simulation.
"""

CONFIG = {
    "model": "mlp",
    "model_kwargs": {"hidden": [256, 256], "input_dim": 64},
    "batch_size": 32,
    "devices": 2,
    "memory_fraction": 1.0,
    "steps": 2,
    "select": "measured",
    "measure_steps": 3,
}
