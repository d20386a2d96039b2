"""tfopt's command-line tools, installed as console scripts by pip.

Each module is one absl script; its docstring is its `--help` text and
states a command with its expected result. `COMMANDS` maps each console
script to its module (pyproject.toml's `[project.scripts]` lists the same,
and a test keeps the two equal):

    tfopt-profile            profile a zoo model's training step to a costgraph
    tfopt-place              place a costgraph (a shipped workload or a file)
    tfopt-run-placed         place, rewrite and run a zoo model's step for real
    tfopt-train              train a Keras model with the tfopt.compile hook
    tfopt-prune-moe          one-shot MoE pruning against the baselines
    tfopt-nas                one-shot NAS with steering (search/steer/rank/export)
    tfopt-launch             launch workers with heartbeats and restarts
    tfopt-calibrate          fit this machine's link and core sharing to a file
    tfopt-fit-across-devices train a model larger than one device's cap
    tfopt-demo               all five on a keras-hub MoE LM: search, train
                             placed with a fault, prune, serve (make demo)

Configs for each (`--config=...`) live in the repository's
`experiments/configs/`; every flag can be given on the command line instead.
Library modules define no flags: only these scripts do.
"""

COMMANDS = {
    "tfopt-profile": "tfopt.cli.profile",
    "tfopt-place": "tfopt.cli.place",
    "tfopt-run-placed": "tfopt.cli.run_placed",
    "tfopt-train": "tfopt.cli.train",
    "tfopt-prune-moe": "tfopt.cli.prune_moe",
    "tfopt-nas": "tfopt.cli.nas",
    "tfopt-launch": "tfopt.cli.launch",
    "tfopt-calibrate": "tfopt.cli.calibrate",
    "tfopt-fit-across-devices": "tfopt.cli.fit_across_devices",
    "tfopt-demo": "tfopt.cli.demo",
}

__all__ = ["COMMANDS"]
