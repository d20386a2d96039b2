"""Fitting a cluster's link and core sharing on this machine.

`fit_cluster(kind, num_devices)` starts the devices (logical CPUs of a
session in this process; server processes on loopback; or server processes
each pinned to a core of its own, one intra-op thread and two inter-op
threads), measures, and returns a `tfopt.calibration.Calibration`:

1. **Link.** Tensors of 1 B to 64 MiB copied between two devices, each time
   minus the same step without the copy; latency + bytes / bandwidth fitted
   in relative error (`fit_comm_model`). Logical CPUs share memory: their
   "copy" is a hand-over whose time does not grow with size, so the link is
   that time and no bandwidth term.
2. **Overlap.** Batches of 1 to 16 small tensors sent at once: the slope of
   their time over their count is the per-transfer overhead that holds the
   channels (`fit_overhead`). gRPC keeps many in flight.
3. **Control messages.** Always on for TensorFlow's runtime: its
   partitioner sends a dummy tensor for each control dependency between
   devices (seen in RunMetadata as zero-byte RecvTensor calls).
4. **Core sharing.** Chains of MatMuls (small to large) on one device,
   then two such chains on two devices at once: capacity = 2 x alone /
   together, in [1, 2] (`fit_capacity`). Logical devices and unpinned
   processes of one host share their cores (one group, that capacity); a
   pinned task has one core of its own (its own group, capacity 1: two ops
   it runs at once share that core). The executors' thread pools are
   recorded with it (`Calibration.sharing`): logical devices draw on
   their process's one inter-op pool, a pinned task on its own two
   threads.
5. **Per-op overhead.** Chains of 100 and 500 dependent scalar adds on one
   device: what the executor spends per op beyond its kernel (a profile
   times kernels alone; a step of hundreds of small ops pays this for
   each, 5 us or so here).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Sequence

import numpy as np
import tensorflow as tf

from tfopt._errors import check_positive_int, invalid_argument
from tfopt._timing import median_us
from tfopt.calibration import KINDS, Calibration
from tfopt.cost.comm import Link, fit_comm_model, fit_overhead
from tfopt.cost.comm_measure import (DEFAULT_SIZES,
                                     measure_concurrent_transfers,
                                     measure_transfer_times)
from tfopt.runtime.placed import LOCAL_PREFIX

# Pinned tasks: one core's worth of compute, two inter-op threads so that a
# Send is not queued behind the op running (measured: with one, a two-tower
# step on two pinned tasks took 90 ms instead of 76 ms).
PINNED_INTRA_OP_THREADS = 1
PINNED_INTER_OP_THREADS = 2
# The hand-over between logical devices: no bandwidth term.
SHARED_MEMORY_GBPS = 1e6


def fit_capacity(alone_us: float, together_us: float,
                 num_together: int = 2) -> float:
  """Ops of one sharing group that run at full speed at once, from the time
  of one chain alone and of `num_together` chains side by side: under
  processor sharing, together = alone x n / capacity (capacity <= n).

  >>> fit_capacity(10.0, 20.0), fit_capacity(10.0, 10.0)
  (1.0, 2.0)
  """
  check_positive_int("num_together", num_together)
  if not alone_us > 0 or not together_us > 0:
    raise invalid_argument("alone_us", "positive times (alone_us and "
                           "together_us)", (alone_us, together_us))
  return float(min(max(num_together * alone_us / together_us, 1.0),
                   num_together))


def fit_link(points: Sequence[tuple[int, float]], *,
             shared_memory: bool = False) -> tuple[Link, dict]:
  """The link from (bytes, microseconds) copies, and the fit's numbers.

  Where the time does not grow with size (devices sharing memory) the link
  is the median time with no bandwidth term. With `shared_memory` (logical
  devices of one process), copies all within the measurement's noise are a
  free hand-over; otherwise too few copies above noise is an error."""
  usable = [(b, t) for b, t in points if t > 0]
  if len(usable) < 2:
    if shared_memory:
      hand_over = statistics.median(max(0.0, t) for _, t in points)
      return Link(hand_over, SHARED_MEMORY_GBPS), {
          "link": "hand-over below the measurement's noise",
          "hand_over_us": hand_over, "points": list(points)}
    raise RuntimeError(f"Too few copies measured above noise to fit a link: "
                       f"{list(points)}")
  try:
    fit = fit_comm_model([b for b, _ in usable], [t for _, t in usable])
  except ValueError:
    fit = None
  if fit is None or fit.link.bandwidth_gbps > SHARED_MEMORY_GBPS / 1e3:
    hand_over = statistics.median(t for _, t in usable)
    return Link(hand_over, SHARED_MEMORY_GBPS), {
        "link": "hand-over (time does not grow with size)",
        "hand_over_us": hand_over, "points": list(points)}
  return fit.link, {"link": str(fit), "relative_rms": fit.relative_residual,
                    "points": list(points)}


# The chains of `measure_sharing`: (matrix size, chain length). Small
# MatMuls run on one thread and two of them side by side barely slow each
# other; large ones use every core alone. Measured here on 2 logical CPUs
# (warmed up): capacity 1.7-1.8 for 16 x 512 by 512 x 512, 1.0-1.04 for
# 256 x 1024 by 1024 x 1024 and for 1024 x 1024, 1.1 for element-wise
# chains over 4 MB. The sum over a mix is dominated by the large ones, as
# a training step's time is.
SHARING_CHAINS = ((64, 40), (256, 12), (1024, 3))


def measure_sharing(devices: Sequence[str], *, target: str = "",
                    config: tf.compat.v1.ConfigProto | None = None,
                    repeats: int = 7,
                    chains: Sequence[tuple[int, int]] = SHARING_CHAINS
                    ) -> tuple[float, float]:
  """(alone, together) microseconds summed over `chains`: for each (size,
  depth), a chain of `depth` size x size MatMuls on devices[0], then one
  such chain on each of devices[0] and [1] at once, alternately, `repeats`
  times (medians)."""
  if len(devices) < 2:
    raise invalid_argument("devices", "at least two device strings", devices)
  graph = tf.Graph()
  rng = np.random.default_rng(0)
  built = []
  with graph.as_default():
    for size, depth in chains:
      start = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(
          np.float32)
      ends = []
      for device in devices[:2]:
        with tf.device(device):
          x = tf.Variable(start)
          h = x.read_value()
          for _ in range(depth):
            h = tf.tanh(tf.matmul(h, x))
          ends.append(tf.reduce_sum(h))
      built.append(ends)
    init = tf.compat.v1.global_variables_initializer()
  from tfopt.cost.comm_measure import _plain_config  # pylint: disable=g-import-not-at-top
  with tf.compat.v1.Session(target, graph=graph,
                            config=_plain_config(config)) as session:
    session.run(init)
    # Warm-up of both fetches: a session builds an executor per fetch on
    # its first run, and the first runs of a chain alone were slower
    # (allocations, oneDNN's primitive cache): without them the chain
    # alone measured 35 ms and then 22 ms, and the capacity of 1024 x 1024
    # MatMuls 1.21 against 1.02-1.04 warmed up.
    for ends in built:
      for _ in range(2):
        session.run(ends[0])
        session.run(ends)
    alone, together = 0.0, 0.0
    # Interleaved rounds, medians: drift on a shared machine touches both.
    for ends in built:
      pairs = []
      for _ in range(repeats):
        began = time.perf_counter()
        session.run(ends[0])
        middle = time.perf_counter()
        session.run(ends)
        pairs.append((middle - began, time.perf_counter() - middle))
      alone += statistics.median(a for a, _ in pairs) * 1e6
      together += statistics.median(t for _, t in pairs) * 1e6
  return alone, together


def measure_op_overhead(device: str, *, target: str = "",
                        config: tf.compat.v1.ConfigProto | None = None,
                        repeats: int = 7, counts: tuple[int, int] = (100, 500)
                        ) -> float:
  """Microseconds a device's executor spends per op beyond a tiny kernel:
  chains of `counts` dependent scalar adds, the difference of their median
  times over the difference of their lengths."""
  graph = tf.Graph()
  ends = []
  with graph.as_default(), tf.device(device):
    x = tf.Variable(0.0)
    one = tf.constant(1.0)
    for count in counts:
      h = x.read_value()
      for _ in range(count):
        h = tf.add(h, one)
      ends.append(h)
    init = tf.compat.v1.global_variables_initializer()
  from tfopt.cost.comm_measure import _plain_config  # pylint: disable=g-import-not-at-top
  with tf.compat.v1.Session(target, graph=graph,
                            config=_plain_config(config)) as session:
    session.run(init)
    times = [median_us(lambda e=end: session.run(e), repeats)
             for end in ends]
  return max(0.0, (times[1] - times[0]) / (counts[1] - counts[0]))


def fit_cluster(kind: str = "logical", num_devices: int = 2, *,
                sizes: Sequence[int] = DEFAULT_SIZES,
                counts: Sequence[int] = (1, 2, 4, 8, 16), repeats: int = 5,
                progress: bool = True) -> Calibration:
  """Starts `num_devices` devices of `kind` (see module doc), measures and
  returns their Calibration (not saved)."""
  if kind not in KINDS:
    raise invalid_argument("kind", f"one of {list(KINDS)}", kind)
  check_positive_int("num_devices", num_devices)
  if num_devices < 2:
    raise invalid_argument("num_devices", "at least 2 (a link needs two "
                           "devices)", num_devices)
  check_positive_int("repeats", repeats)
  measure = dict(sizes=sizes, counts=counts, repeats=repeats,
                 progress=progress)
  if kind == "logical":
    config = tf.compat.v1.ConfigProto(device_count={"CPU": num_devices})
    names = [f"{LOCAL_PREFIX}{i}" for i in range(num_devices)]
    return calibrate_devices(kind, names, config=config, **measure)
  from tfopt.runtime.processes import LoopbackServers, pinned_cpus  # pylint: disable=g-import-not-at-top
  pinned = kind == "pinned"
  threads = ((PINNED_INTRA_OP_THREADS, PINNED_INTER_OP_THREADS) if pinned
             else (None, None))
  with LoopbackServers(num_devices,
                       cpus=pinned_cpus(num_devices) if pinned else None,
                       intra_op_threads=threads[0],
                       inter_op_threads=threads[1]) as servers:
    return calibrate_devices(kind, servers.device_names,
                             target=servers.target, threads=threads,
                             **measure)


def calibrate_devices(kind: str, names: Sequence[str], *, target: str = "",
                      config: tf.compat.v1.ConfigProto | None = None,
                      sizes: Sequence[int] = DEFAULT_SIZES,
                      counts: Sequence[int] = (1, 2, 4, 8, 16),
                      repeats: int = 5, threads=(None, None),
                      progress: bool = False) -> Calibration:
  """The measurements of the module doc between running devices `names`
  of `kind` (names[1] -> names[0]); `threads` are their (intra-op,
  inter-op) thread counts, recorded in the Calibration."""
  if kind not in KINDS:
    raise invalid_argument("kind", f"one of {list(KINDS)}", kind)
  if len(names) < 2:
    raise invalid_argument("names", "at least two device strings", names)
  bar = None
  if progress:
    import keras  # pylint: disable=g-import-not-at-top
    bar = keras.utils.Progbar(3, unit_name="measurement")
  link, link_fit = measure_link(names[1], names[0], target=target,
                                config=config, sizes=sizes, counts=counts,
                                repeats=repeats,
                                shared_memory=kind == "logical")
  if bar:
    bar.update(2)
  alone, together = measure_sharing(names, target=target, config=config,
                                    repeats=max(repeats, 7))
  op_overhead = measure_op_overhead(names[0], target=target, config=config,
                                    repeats=max(repeats, 7))
  capacity = fit_capacity(alone, together)
  if bar:
    bar.update(3)
  pinned = kind == "pinned"
  return Calibration(
      kind=kind, num_devices=len(names), link=link, control_messages=True,
      capacity=1.0 if pinned else capacity, shared=not pinned,
      op_overhead_us=op_overhead, cores_per_device=1 if pinned else None,
      intra_op_threads=threads[0], inter_op_threads=threads[1],
      fit={**link_fit, "chain_alone_us": alone,
           "chains_together_us": together, "capacity_measured": capacity})


def measure_link(src: str, dst: str, *, target: str = "",
                 config: tf.compat.v1.ConfigProto | None = None,
                 sizes: Sequence[int] = DEFAULT_SIZES,
                 counts: Sequence[int] = (1, 2, 4, 8, 16), repeats: int = 5,
                 shared_memory: bool = False) -> tuple[Link, dict]:
  """The link `src` -> `dst` (steps 1 and 2 of the module doc): copies of
  each size fitted to latency + bytes / bandwidth, then batches of small
  copies for the overhead that holds the channels; the fit's numbers."""
  pair = {"src_device": src, "dst_device": dst, "target": target,
          "config": config}
  link, link_fit = fit_link(
      measure_transfer_times(sizes, repeats=repeats, **pair),
      shared_memory=shared_memory)
  batches = measure_concurrent_transfers(counts, repeats=max(repeats, 7),
                                         **pair)
  positive = [(n, t) for n, t in batches if t > 0]
  if len({n for n, _ in positive}) >= 2:
    overhead, overhead_rms = fit_overhead([n for n, _ in positive],
                                          [t for _, t in positive], link)
  else:  # nothing measurable above noise: transfers overlap completely
    overhead, overhead_rms = 0.0, None
  return (Link(link.latency_us, link.bandwidth_gbps, overhead),
          {**link_fit, "batches": batches,
           "overhead_relative_rms": overhead_rms})


# Two tasks on different hosts whose MatMul chains run side by side at
# this capacity or more compute on cores of their own (2: fully apart).
APART_CAPACITY = 1.8


def calibrate_hosts(names: Sequence[str], hosts: Sequence[str], *,
                    target: str, kind: str = "processes",
                    sizes: Sequence[int] = DEFAULT_SIZES,
                    counts: Sequence[int] = (1, 2, 4, 8, 16),
                    repeats: int = 5, progress: bool = False) -> Calibration:
  """A two-level calibration of server tasks `names` on `hosts` (per task,
  its host; at least two hosts): `calibrate_devices` between two tasks of
  one host (where a host has two; else between hosts), the link between
  two tasks of different hosts as `host_link`, and whether different
  hosts' tasks share cores (their MatMul chains side by side)."""
  if kind not in ("processes", "pinned"):
    raise invalid_argument("kind", "'processes' or 'pinned' (server tasks)",
                           kind)
  names, hosts = list(names), list(hosts)
  if len(hosts) != len(names):
    raise invalid_argument("hosts", f"one host per task ({len(names)})",
                           hosts)
  if len(set(hosts)) < 2:
    raise invalid_argument("hosts", "tasks on at least two hosts", hosts)
  across = next((a, b) for a in range(len(names)) for b in range(len(names))
                if hosts[a] != hosts[b])
  inside = next(((a, b) for a in range(len(names))
                 for b in range(a + 1, len(names)) if hosts[a] == hosts[b]),
                across)
  threads = ((PINNED_INTRA_OP_THREADS, PINNED_INTER_OP_THREADS)
             if kind == "pinned" else (None, None))
  one_host = calibrate_devices(
      kind, [names[i] for i in inside], target=target, sizes=sizes,
      counts=counts, repeats=repeats, threads=threads, progress=progress)
  if inside == across:  # one task per host: that was the link between
    host_link, host_fit = one_host.link, {}
  else:
    host_link, host_fit = measure_link(names[across[1]], names[across[0]],
                                       target=target, sizes=sizes,
                                       counts=counts, repeats=repeats)
  apart = [names[i] for i in across]
  alone, together = measure_sharing(apart, target=target,
                                    repeats=max(repeats, 7))
  capacity = fit_capacity(alone, together)
  return dataclasses.replace(
      one_host, num_devices=len(names),
      host_link=host_link,
      hosts_share_cores=capacity < APART_CAPACITY,
      hosts_capacity=capacity,
      fit={**one_host.fit, "between_hosts": {
          **host_fit, "capacity_measured": capacity}})
