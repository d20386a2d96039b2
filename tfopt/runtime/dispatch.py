"""What a step costs the runtime beyond its ops, measured from the client.

`tfopt.compile` trains on server tasks through this process's eager
runtime (`tfopt.runtime.remote.connect`): each step, the client sends the
step's function to every task it uses, feeds the batch from its own
memory to the task that consumes it, waits for the replies and fetches
the loss. None of that is an op of the step's graph, so the simulator's
ops and transfers leave it out: on LocalHosts (2 hosts x 2 pinned tasks)
the placed MLP's step was 4-7 ms above its simulated ops before this was
measured (docs/scale.md).

`measure_dispatch(spec, names)` measures it on a running cluster:

- **Dispatch**: a `tf.function` with one trivial op (a variable's
  increment) on each of the first k tasks, for k = 1..N, fed a 4-byte
  tensor from the client on the first task and returning a value read on
  the last, fetched here: the median call time per k. The rounds
  alternate the order of the counts (this machine's speed drifts within
  seconds); each count's time is the median over the rounds' medians.
- **Feed**: the one-task function fed tensors of `feed_sizes` bytes
  instead, each timed in pairs against the 4-byte call
  (`paired_difference_us`); the feed's bandwidth is the least-squares
  slope through the origin (`feed_bandwidth_gbps`; the latency is in the
  dispatch already). It is measured into the first task only: where the
  hosts' links differ, a batch consumed on another host crosses that
  host's link instead.

`tfopt.compile` charges a plan the dispatch of the tasks it uses
(`Cluster.step_overhead_us`, in the simulated makespan, so the placers
weigh it) and the batch at the feed's rate.

It connects this process's eager runtime to `spec` (once per process, as
`tfopt.compile` does): run it in the process that will train, or in a
process of its own (`tfopt-calibrate --cluster` does).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

from tfopt._errors import check_positive_int, invalid_argument

FEED_SIZES = (64 << 10, 256 << 10, 1 << 20)
ROUNDS = 7
CALLS_PER_ROUND = 15


def feed_bandwidth_gbps(points: Sequence[tuple[int, float]]) -> float | None:
  """GB/s from (bytes, extra microseconds) feeds: the least-squares slope
  through the origin, in absolute error, so the largest feeds set it (a
  link's token bucket lets a small feed after a pause through at memory
  speed: LocalHosts' 1 Gbit/s hosts fed 64 KiB in 51 us, 1 MiB at 0.124
  GB/s; a stream of batches sees the rate). None where no feed took
  measurably longer than the 4-byte one.

  >>> feed_bandwidth_gbps([(1000, 1.0), (2000, 2.0)])
  1.0
  """
  usable = [(b, max(0.0, t)) for b, t in points if b > 0]
  if not usable or not any(t > 0 for _, t in usable):
    return None
  slope = sum(b * t for b, t in usable) / sum(b * b for b, _ in usable)
  return 1.0 / slope / 1e3


def measure_dispatch(spec: Any, names: Sequence[str], *,
                     feed_sizes: Sequence[int] = FEED_SIZES,
                     rounds: int = ROUNDS, calls: int = CALLS_PER_ROUND
                     ) -> dict:
  """Measures the step dispatch over 1..len(names) tasks and the feed
  (module doc). Returns {"dispatch_us": [per task count], "feed_gbps":
  GB/s or None, "feed_points": [(bytes, us)]}."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfopt.cost.comm_measure import paired_difference_us  # pylint: disable=g-import-not-at-top
  from tfopt.runtime import remote  # pylint: disable=g-import-not-at-top
  check_positive_int("rounds", rounds)
  check_positive_int("calls", calls)
  names = list(names)
  if not names:
    raise invalid_argument("names", "at least one task's device", names)
  if any(isinstance(s, bool) or not isinstance(s, int) or s < 4 or s % 4
         for s in feed_sizes):
    raise invalid_argument("feed_sizes", "byte counts >= 4, multiples of 4 "
                           "(float32 elements)", feed_sizes)
  remote.connect(spec)
  counters = []
  for name in names:
    with tf.device(name):
      counters.append(tf.Variable(0.0, trainable=False,
                                  name="dispatch_counter"))

  def step_on(k: int):
    # One signature for every feed size: a size is not a new trace.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def step(fed):
      for i in range(k):
        with tf.device(names[i]):
          # The fed tensor goes to the first task, as a batch does.
          counters[i].assign_add(fed[0] if i == 0 else 1.0)
      with tf.device(names[k - 1]):
        # A value comes back from a task, as the step's loss does.
        return counters[k - 1].read_value()

    def call(fed):
      return step(fed).numpy()  # waits for it here, as Keras' logs do
    return call

  steps = [step_on(k) for k in range(1, len(names) + 1)]
  small = tf.constant(np.zeros([1], np.float32))
  for step in steps:  # tracing, then the first call's setup
    step(small)
    step(small)
  medians: list[list[float]] = [[] for _ in steps]
  for r in range(rounds):
    # Every other round the other way round: a drift does not favour the
    # counts timed first.
    for k in (range(len(steps)) if r % 2 == 0 else
              reversed(range(len(steps)))):
      times = []
      for _ in range(calls):
        began = time.perf_counter()
        steps[k](small)
        times.append(time.perf_counter() - began)
      medians[k].append(statistics.median(times) * 1e6)
  points = []
  for size in feed_sizes:
    fed = tf.constant(np.zeros([size // 4], np.float32))
    steps[0](fed)
    steps[0](fed)
    points.append((int(size), max(0.0, paired_difference_us(
        lambda f=fed: steps[0](f), lambda: steps[0](small), rounds))))
  return {"dispatch_us": [statistics.median(m) for m in medians],
          "feed_gbps": feed_bandwidth_gbps(points),
          "feed_points": points}
