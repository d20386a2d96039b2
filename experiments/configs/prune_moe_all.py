"""Every pruning method at 50 % on the reference MoE model, then expert-wise
distillation of the MoE-Pruner model, and its sparse export.

    tfopt-prune-moe --config=experiments/configs/prune_moe_all.py \
        --export_dir=/tmp/moe_sparse

Expected (2-core CPU, about 1-2 min; seed 0): dense 3.823; magnitude 1.087x,
wanda 1.062x, moe_pruner 1.053x, sparsegpt 1.027x; after 300 distillation
steps the moe_pruner model at about 3.86; /tmp/moe_sparse holds values and a
packed bitmask, about 0.53x the dense fp32 bytes (benchmarks/results/
moe_pruning.json has the full benchmark).
"""

CONFIG = {
    "methods": ["magnitude", "wanda", "moe_pruner", "sparsegpt"],
    "sparsity": 0.5,
    "calibration_windows": 32,
    "eval_windows": 128,
    "distill_steps": 300,
}
