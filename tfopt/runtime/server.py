"""One TensorFlow server task, run as its own process by `LoopbackServers`.

    python -m tfopt.runtime.server --cluster='{"worker": [...]}' --task=1 \
        [--cpus=1 --intra_op_threads=1 --inter_op_threads=1]

Starts `tf.distribute.Server` for job `--job` and serves until killed, or
until the process given as `--parent` is gone (TensorFlow cannot stop a
server; a client that crashes must not leave its servers running).

`--cpus` pins the process to those cores before TensorFlow starts (its
default thread pools are then sized to them): one pinned task per core is
a device that really computes apart from the others. The thread counts are
the server's own: a remote task runs its partitions on its own pools,
whatever the client's session config says.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time


def _exit_with(parent: int, poll_s: float = 1.0) -> None:
  """Ends this process once `parent` is no longer its parent (it died and
  the process was re-parented)."""
  def watch():
    while os.getppid() == parent:
      time.sleep(poll_s)
    os._exit(0)  # pylint: disable=protected-access
  threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cluster", required=True,
                      help="cluster spec as JSON: {job: [host:port, ...]}")
  parser.add_argument("--job", default="worker")
  parser.add_argument("--task", type=int, required=True)
  parser.add_argument("--inter_op_threads", type=int, default=0)
  parser.add_argument("--intra_op_threads", type=int, default=0)
  parser.add_argument("--cpus", default="",
                      help="comma-separated cores to pin this process to")
  parser.add_argument("--parent", type=int, default=None,
                      help="exit when this pid is no longer the parent")
  parser.add_argument("--netns_fd", type=int, default=None,
                      help="an inherited fd of the network namespace to "
                      "serve in, entered before any other thread starts")
  args = parser.parse_args(argv)
  if args.netns_fd is not None:
    from tfopt.runtime import netns  # pylint: disable=g-import-not-at-top
    netns.enter_fd(args.netns_fd)
  if args.parent is not None:
    _exit_with(args.parent)
  if args.cpus:
    os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  spec = tf.train.ClusterSpec(json.loads(args.cluster))
  config = tf.compat.v1.ConfigProto(
      inter_op_parallelism_threads=args.inter_op_threads,
      intra_op_parallelism_threads=args.intra_op_threads)
  server = tf.distribute.Server(spec, job_name=args.job, task_index=args.task,
                               config=config, start=True)
  print(f"serving {args.job}:{args.task} at {server.target}", flush=True)
  server.join()
  return 0


if __name__ == "__main__":
  sys.exit(main())
