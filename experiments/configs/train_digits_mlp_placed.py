"""The digits MLP placed by m-ETF on 2 logical CPU devices, CautiousLion.

    tfopt-train \
        --config=experiments/configs/train_digits_mlp_placed.py

Expected (2-core CPU, under 10 s): the report shows the placement on
/device:CPU:0 and /device:CPU:1 with every op verified where planned;
validation accuracy about 0.95 after 10 epochs (at least 0.9). On 2 cores
the placed step is not faster than one device: this shows the mechanism.
"""

CONFIG = {
    "model": "mlp",
    "model_kwargs": {"input_dim": 64, "hidden": [128, 128]},
    "data": "digits",
    "optimizer": "cautious_lion",
    "learning_rate": 1e-3,
    "weight_decay": 0.1,
    "batch_size": 50,
    "epochs": 10,
    "fusion": True,
    "placement": "m-etf",
    "logical_devices": 2,
}
