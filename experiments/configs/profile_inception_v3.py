"""Profile Inception-V3's training step (batch 32, 299x299) and write it as
a costgraph, for placement.

    tfopt-profile \
        --config=experiments/configs/profile_inception_v3.py \
        --out=/tmp/inception_v3.json

Expected (2-core CPU, about 40 s: capture 7 s, 4 traced steps 25 s):
15,888 ops after inlining, all but the 2 fed inputs profiled, about 5 s of
total compute (benchmarks/results/capture.json); the summary's lower bound
on 4 devices; the file places like the shared costgraphs.
"""

CONFIG = {
    "model": "inception_v3",
    "batch_size": 32,
    "steps": 3,
    "warmup": 1,
    "devices": 4,
}
