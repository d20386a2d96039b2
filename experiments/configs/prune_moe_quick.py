"""Prune the committed reference MoE language model to 50 % with magnitude
and with MoE-Pruner, on few windows: the smallest run.

    tfopt-prune-moe \
        --config=experiments/configs/prune_moe_quick.py

Expected (2-core CPU, about 6 s; seed 0): dense perplexity 3.843 on 2048
held-out bytes; magnitude about 1.09x the dense perplexity, moe_pruner about
1.04x (lower is better: the router-weighted score keeps what the routed
tokens use).
"""

CONFIG = {
    "methods": ["magnitude", "moe_pruner"],
    "sparsity": 0.5,
    "calibration_windows": 8,
    "eval_windows": 16,
}
