"""Run a training script on N loopback workers with heartbeats, restarts and
fault injection (`tfopt.scale.launch`), and report how the run went.

    tfopt-launch \
        --config=experiments/configs/launch_scale_train.py --run_dir=/tmp/run

The config names the command each worker runs (`command`, a string split
like a shell line; or give it after `--`) and the launcher's knobs (workers,
max_restarts, heartbeat and stuck timeouts). `--inject=kill:1:25` (or
stop:W:S, term:W:S) injects a fault to test the restart path. `--hosts=2`
runs the workers on two hosts made on this machine (`LocalHosts`: network
namespaces, links shaped at `--link_rate`, as root), where the faults
partition:W:S and kill_host:W:S apply too, and the report gives each
host's measured link and names a network straggler. Prints every
attempt (failure kind and worker, steps), the stitched trajectory (steps,
lost, repeated, recomputed), the goodput and its badput split, and each
worker's final-worker-<i>.json (the scale_train job's final loss and weights
SHA-256). Exit status: 0 done, 1 the launcher gave up, 2 bad input, 75
preempted (SIGTERM to the launcher).

`python -m tfopt.scale.launch` is the same launcher with argparse flags, for
scripts that cannot import `experiments`.
"""

from __future__ import annotations

import shlex

from absl import app, flags
from tfopt.cli._main import run_main

from tfopt.cli._config import apply_config, define_config_flag
from tfopt.scale.launch import CLI_KNOBS, DEFAULTS, run_and_report

FLAGS = flags.FLAGS
define_config_flag()
flags.DEFINE_string("command", None, "The worker command (script.py and its "
                    "flags, split like a shell line); arguments after `--` "
                    "replace it.")
flags.DEFINE_integer("workers", 2, "Loopback workers.")
flags.DEFINE_integer("max_restarts", DEFAULTS["max_restarts"],
                     "Restarts before giving up.")
flags.DEFINE_string("run_dir", None, "Run directory (a new temporary one "
                    "when not given); an existing one is reused, nothing in "
                    "it is deleted.")
flags.DEFINE_list("inject", [], "Faults kind:worker:step[:attempt], kind in "
                  "kill, stop, term; on --hosts also partition, kill_host.")
flags.DEFINE_integer("hosts", 0, "Run the workers on this many hosts made on "
                     "this machine (network namespaces joined by shaped "
                     "links; needs root); 0: loopback.", lower_bound=0)
flags.DEFINE_string("link_rate", "1gbit", "With --hosts: each host's link "
                    "rate (1gbit, 100mbit), or a comma-separated rate per "
                    "host.")
for _name, _help in (
    ("backoff_s", "First restart backoff (doubles)."),
    ("heartbeat_timeout_s", "A beat older than this is a lost worker."),
    ("stuck_factor", "No step for this many median step times is stuck ..."),
    ("min_stuck_s", "... and at least this long."),
    ("startup_timeout_s", "Launch to first step.")):
  flags.DEFINE_float(_name, DEFAULTS[_name], _help)


def main(argv):
  apply_config()
  command = list(argv[1:]) or shlex.split(FLAGS.command or "")
  if not command:
    raise app.UsageError("Give the worker command: command in --config or "
                         "after --, e.g. -- experiments/scale_train.py "
                         "--epochs=2")
  if FLAGS.workers <= 0:
    raise app.UsageError(f"--workers must be a positive integer. Received: "
                         f"{FLAGS.workers}")
  return run_and_report(command, FLAGS.workers, run_dir=FLAGS.run_dir,
                        faults=FLAGS.inject, num_hosts=FLAGS.hosts,
                        link_rate=FLAGS.link_rate,
                        **{name: getattr(FLAGS, name) for name in CLI_KNOBS})


def run() -> None:
  """The console script's entry point (main's value is the exit status)."""
  run_main(main, __doc__)


if __name__ == "__main__":
  run()
