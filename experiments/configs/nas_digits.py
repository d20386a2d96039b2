"""One-shot NAS on the 8x8 digits, tiny64 space, the full super-network
training of the benchmark.

    tfopt-nas --config=experiments/configs/nas_digits.py \
        --mode=search --run_dir=/tmp/nas_full

Expected (2-core CPU, about 1-2 min; seed 0): 64 sub-graphs ranked; the
one-shot ranking agrees with stand-alone training as in benchmarks/results/
nas.json (`--mode=benchmark` trains the top sub-graphs stand-alone, about 10
min); /tmp/nas_full/report.html with the scatterplot.
"""

CONFIG = {
    "space": "tiny64",
    "steps": 2000,
    "batch_size": 32,
    "lr": 3e-3,
    "seed": 0,
}
