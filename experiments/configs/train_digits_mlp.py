"""An MLP on scikit-learn's bundled 8x8 digits, CautiousAdamW, fused step.

    tfopt-train --config=experiments/configs/train_digits_mlp.py

Expected (2-core CPU, under 10 s): the tfopt.compile report shows 3
_FusedMatMul and the check on the first batch; validation accuracy about
0.95 after 10 epochs (at least 0.9); MFU printed per epoch.
"""

CONFIG = {
    "model": "mlp",
    "model_kwargs": {"input_dim": 64, "hidden": [128, 128]},
    "data": "digits",
    "optimizer": "cautious_adamw",
    "learning_rate": 3e-3,
    "weight_decay": 0.01,
    "batch_size": 50,
    "epochs": 10,
    "fusion": True,
    "placement": None,
}
