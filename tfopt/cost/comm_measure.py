"""Measuring tensor copies between two real TensorFlow devices.

By default the two devices are two `tf.distribute.Server` processes on
loopback ports (`tfopt.runtime.LoopbackServers`, `/job:worker/task:0` and
`task:1`), stopped after the measurement: a tensor produced on one and
consumed on the other really crosses TensorFlow's gRPC runtime between
processes. (Two CPU devices of one process share memory, so a "copy" between
them moves nothing and would fit a meaningless bandwidth.) Any two device
strings reachable from a session target can be measured instead, e.g. two
GPUs.

Each size is timed twice: producer and consumer on different devices, then
both on the consumer's device; the difference is the transfer, so session
and kernel overheads cancel out of the fit. The two are run in pairs, one
right after the other, their order alternating, and the transfer is the
mean of the two orders' median differences: this machine's speed drifts
within seconds, and two batches of runs timed one after the other differ
by the drift, while within a pair the drift adds to one order's
difference what it takes from the other's. A pair of fast steps (small
tensors: what the link's latency is fitted from) is repeated more often,
for it costs little. The batches of concurrent copies
(`measure_concurrent_transfers`) are timed the same way.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import tensorflow as tf

from tfopt._errors import check_positive_int, invalid_argument
from tfopt.cost.comm import CommFit, fit_comm_model

DEFAULT_SIZES = tuple(4 ** k for k in range(0, 14))  # 1 B .. 64 MiB
# A pair of runs faster than this is timed at least FAST_PAIRS times. Four
# server tasks pinned two to a core measured small copies between the two
# of one core at 322-1,602 us within one calibration (each the median of 3
# runs minus the median of 3 others), the fitted latency 163-830 us over
# six calibrations, and the placed step's prediction moved with it by 25 %.
FAST_PAIR_S = 0.02
FAST_PAIRS = 21


def paired_difference_us(with_copy: Callable[[], object],
                         without: Callable[[], object], repeats: int, *,
                         clock: Callable[[], float] = time.perf_counter
                         ) -> float:
  """Microseconds `with_copy()` takes beyond `without()`, from pairs of
  runs of one right after the other, the order alternating (module doc):
  the mean of the two orders' median differences. `repeats` pairs (at
  least 2: one of each order), at least FAST_PAIRS where the first pair
  took under FAST_PAIR_S. The caller has run both once (their setup)."""

  def timed(run) -> float:
    began = clock()
    run()
    return clock() - began

  # Per order, the differences: a drift between a pair's two runs adds to
  # one order's what it takes from the other's, so their mean cancels it.
  check_positive_int("repeats", repeats)
  orders: tuple[list, list] = ([], [])
  pairs, done = max(2, repeats), 0  # both orders, whatever `repeats`
  while done < pairs:
    if done % 2:  # the order alternates: neither always runs warm
      base = timed(without)
      copy = timed(with_copy)
    else:
      copy = timed(with_copy)
      base = timed(without)
    if not done and copy + base < FAST_PAIR_S:
      pairs = max(repeats, FAST_PAIRS)
    orders[done % 2].append(copy - base)
    done += 1
  return statistics.fmean(statistics.median(o) for o in orders) * 1e6


def _remote_minus_local(graph, init, keys, fetches, *, target: str, config,
                        repeats: int) -> list[tuple[int, float]]:
  """(key, microseconds) per (remote, local) fetch pair: the step with the
  transfer minus the same step without it (`paired_difference_us`)."""
  results = []
  with tf.compat.v1.Session(target, graph=graph,
                            config=_plain_config(config)) as session:
    session.run(init)
    for key, (remote, local) in zip(keys, fetches):
      session.run(remote)  # the first runs' setup (executors, rendezvous)
      session.run(local)
      delta = paired_difference_us(lambda f=remote: session.run(f),
                                   lambda f=local: session.run(f), repeats)
      results.append((key, max(0.0, delta)))
  return results


def measure_transfer_times(sizes: Sequence[int] = DEFAULT_SIZES, *,
                           src_device: str | None = None,
                           dst_device: str | None = None, target: str = "",
                           repeats: int = 5,
                           config: tf.compat.v1.ConfigProto | None = None
                           ) -> list[tuple[int, float]]:
  """(bytes, microseconds) of copying a tensor from `src` to `dst`.

  With no devices given, starts two loopback server processes, measures
  worker 1 -> worker 0 and stops them. `config` is the session's
  ConfigProto (e.g. with `device_count={"CPU": 2}` to measure two logical
  CPU devices). Returns one pair per size: the transfer's time beyond the
  same computation without it, from `repeats` pairs of runs (at least 2,
  and FAST_PAIRS for fast ones: `paired_difference_us`).
  """
  check_positive_int("repeats", repeats)
  sizes = list(sizes)
  if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0
                      for s in sizes):
    raise invalid_argument("sizes", "a non-empty list of positive byte counts",
                           sizes)
  if src_device is None and dst_device is None:
    # Imported here: tfopt.runtime imports tfopt.cost.
    from tfopt.runtime.processes import LoopbackServers  # pylint: disable=import-outside-toplevel
    with LoopbackServers(2) as servers:
      return measure_transfer_times(
          sizes, src_device=servers.device_names[1],
          dst_device=servers.device_names[0], target=servers.target,
          repeats=repeats, config=config)
  if src_device is None or dst_device is None:
    raise invalid_argument("src_device", "given together with `dst_device`",
                           src_device)
  graph = tf.Graph()
  fetches = []
  with graph.as_default():
    for size in sizes:
      elements = max(1, size // 4) if size >= 4 else 1
      dtype = tf.float32 if size >= 4 else tf.int8
      count = elements if size >= 4 else size
      pair = []
      for producer in (src_device, dst_device):
        with tf.device(producer):
          # A variable holds the payload, so producing it costs a read, not
          # a fill, and is the same on both devices.
          var = tf.Variable(tf.zeros([count], dtype), name="payload")
          value = var.read_value()
        with tf.device(dst_device):
          # Touch one element: the whole tensor must arrive first.
          pair.append(tf.gather(value, [0]))
      fetches.append(pair)
    init = tf.compat.v1.global_variables_initializer()
  return _remote_minus_local(graph, init, sizes, fetches, target=target,
                             config=config, repeats=repeats)


def measure_comm_model(sizes: Sequence[int] = DEFAULT_SIZES, *,
                       repeats: int = 5, **kwargs) -> tuple[CommFit, list]:
  """Measures transfers and fits latency + bytes / bandwidth.

  Returns (fit, measurements). `print(fit)` shows the link and its residual.
  """
  points = measure_transfer_times(sizes, repeats=repeats, **kwargs)
  # A copy timed at or below its no-copy twin is noise, not a transfer.
  usable = [(b, t) for b, t in points if t > 0]
  if len(usable) < 2:
    raise RuntimeError(f"Too few transfers measured above noise to fit a "
                       f"model: {points}")
  return fit_comm_model([b for b, _ in usable], [t for _, t in usable]), points


def measure_concurrent_transfers(counts: Sequence[int] = (1, 2, 4, 8, 16), *,
                                 src_device: str, dst_device: str,
                                 target: str = "", repeats: int = 7,
                                 config: tf.compat.v1.ConfigProto | None = None
                                 ) -> list[tuple[int, float]]:
  """(n, microseconds) for n small tensors sent from `src` to `dst` at once.

  Each batch is n 4-byte variables read on `src` and all consumed by one
  op on `dst`; its time is the step's beyond the same step with the reads
  on `dst` (no transfer), from paired runs (`paired_difference_us`).
  `fit_overhead` turns these into the channel overhead per transfer: how
  far transfers overlap.
  """
  check_positive_int("repeats", repeats)
  counts = list(counts)
  if len(counts) < 2 or any(isinstance(n, bool) or not isinstance(n, int) or
                            n <= 0 for n in counts):
    raise invalid_argument("counts", "at least two positive integers", counts)
  graph = tf.Graph()
  fetches = []
  with graph.as_default():
    for n in counts:
      pair = []
      for producer in (src_device, dst_device):
        values = []
        for i in range(n):
          with tf.device(producer):
            var = tf.Variable(tf.zeros([1]), name=f"scalar_{n}_{i}")
            values.append(var.read_value())
        with tf.device(dst_device):
          pair.append(tf.add_n(values) if n > 1 else tf.identity(values[0]))
      fetches.append(pair)
    init = tf.compat.v1.global_variables_initializer()
  return _remote_minus_local(graph, init, counts, fetches, target=target,
                             config=config, repeats=repeats)


def _plain_config(config):
  """The session config for measurements: as given, no soft placement,
  no graph rewrites (the ops measured are the ones built)."""
  out = tf.compat.v1.ConfigProto()
  if config is not None:
    out.CopyFrom(config)
  out.allow_soft_placement = False
  out.graph_options.rewrite_options.disable_meta_optimizer = True
  out.graph_options.optimizer_options.opt_level = (
      tf.compat.v1.OptimizerOptions.L0)
  return out
