"""The scale_train job (MLP, MultiWorkerMirroredStrategy) on 2 loopback
workers, a checkpoint every 5 steps, up to 3 restarts.

    tfopt-launch \
        --config=experiments/configs/launch_scale_train.py --run_dir=/tmp/run

Expected (2-core CPU, about 30 s, most of it TensorFlow start-up): one
attempt, "success"; trajectory 30 steps, lost [], repeated []; both workers
print the same final loss and weights SHA-256. With --inject=kill:1:12 the
first attempt ends "killed (worker 1)", the second resumes from the last
checkpoint, and the final loss and SHA-256 are the unfaulted run's, bit for
bit (use a new --run_dir: an existing one resumes from its checkpoints).
"""

CONFIG = {
    "command": "experiments/scale_train.py --epochs=3 --steps_per_epoch=10 "
               "--checkpoint_every=5 --dropout=0",
    "workers": 2,
    "max_restarts": 3,
}
