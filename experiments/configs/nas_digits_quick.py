"""One-shot NAS on the 8x8 digits, tiny64 space (3 layers x {conv3, conv5,
maxpool, skip}), a short super-network training: the smallest run.

    tfopt-nas --config=experiments/configs/nas_digits_quick.py \
        --mode=search --run_dir=/tmp/nas

Expected (2-core CPU, about 20 s; seed 0): 64 sub-graphs ranked by one-shot
validation log-likelihood, the top one conv5 > maxpool > maxpool (#26,
about -1.2); /tmp/nas/report.html with the scatterplot. Steer it (--mode=steer
--remove=layer0:skip, --select=26,27,30) and continue with --resume.
"""

CONFIG = {
    "space": "tiny64",
    "steps": 300,
    "batch_size": 32,
    "lr": 3e-3,
    "seed": 0,
}
