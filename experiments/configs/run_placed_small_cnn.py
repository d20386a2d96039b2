"""What `make demo` runs: the small CNN's training step profiled, rewritten
(fold, fuse), placed on 4 logical CPU devices capped at 0.15 of its memory,
run for real there and across 4 TensorFlow server processes, and exported.

    tfopt-run-placed \
        --config=experiments/configs/run_placed_small_cnn.py --out_dir=.demo

Expected (2-core CPU, about 30 s): the pass table (_FusedConv2D and
_FusedMatMul added), the placement table with the chosen plan (one device
alone is over the cap), 3 placed steps whose losses and variables equal the
unplaced step's with every op where planned, the same across 4 server
processes, an XLA report, the prediction against the clock (measured vs
simulated, one traced step beside its simulation), .demo/
gantt.png, .demo/plan.json and a checked SavedModel in .demo/saved_model.
"""

CONFIG = {
    "model": "small_cnn",
    "batch_size": 32,
    "devices": 4,
    "memory_fraction": 0.15,
    "placer": "auto",
    "steps": 3,
    "processes": 4,
}
