"""Times one tensor sent from one task to another through a Session on
`target` (run in LocalHosts' client place): prints {"seconds": best of 3}.

    python -m tests._hosts_transfer_script TARGET SRC_DEVICE DST_DEVICE MB
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(target, src, dst, megabytes):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  graph = tf.Graph()
  with graph.as_default():
    with tf.device(src):
      # A new value each run (no caching of the transfer).
      x = tf.random.uniform([int(float(megabytes) * 2**20 / 4)])
    with tf.device(dst):
      total = tf.reduce_sum(x)
  with tf.compat.v1.Session(target, graph=graph) as sess:
    sess.run(total)  # warm-up: graph registration, channels
    best = float("inf")
    for _ in range(3):
      start = time.perf_counter()
      sess.run(total)
      best = min(best, time.perf_counter() - start)
  print(json.dumps({"seconds": best}))


if __name__ == "__main__":
  main(*sys.argv[1:5])
