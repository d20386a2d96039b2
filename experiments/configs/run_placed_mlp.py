"""A small MLP placed on 3 logical CPU devices and across 2 server
processes: the smallest run of the placed-step pipeline.

    tfopt-run-placed --config=experiments/configs/run_placed_mlp.py \
        --out_dir=/tmp/placed_mlp

Expected (2-core CPU, about 20 s): 3 _FusedMatMul added, a plan chosen
within 0.3 of the memory per device, 2 placed steps equal to the unplaced
step with every op where planned, the same across 2 server processes, the
prediction line and a SavedModel checked through a PredictRequest over
gRPC.
"""

CONFIG = {
    "model": "mlp",
    "model_kwargs": {"hidden": [64, 64], "input_dim": 32},
    "batch_size": 16,
    "devices": 3,
    "memory_fraction": 0.3,
    "steps": 2,
    "processes": 2,
}
