"""Profile the zoo MLP's training step (batch 32, 3 traced steps) and write
it as a costgraph.

    tfopt-profile --config=experiments/configs/profile_mlp.py \
        --out=/tmp/mlp.json

Expected (2-core CPU, about 5 s): a summary of about 320 ops (317 profiled),
a few ms of total compute, the critical path and the 4-device lower bound,
about 52 MiB of memory; /tmp/mlp.json in the tfopt.costgraph/1 format, which
`tfopt-place --costgraph=/tmp/mlp.json` reads.
"""

CONFIG = {
    "model": "mlp",
    "batch_size": 32,
    "steps": 3,
    "warmup": 1,
    "devices": 4,
}
