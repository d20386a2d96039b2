"""Model FLOPs utilization (MFU), throughput and goodput, as a Keras callback.

    monitor = MFUMonitor(sample_batch=(x[:32], y[:32]), peak_flops="measure")
    model.fit(x, y, batch_size=32, callbacks=[monitor])
    monitor.summary()   # {"flops_per_step", "mfu", "samples_per_s", ...}

FLOPs per step come from the compiled train step's XLA HLO
(`tfopt.scale.flops.train_step_flops`, counted once at train begin on
`sample_batch`, which must have the training batch's shape). The peak is a
number, a device name from `PEAK_FLOPS` (dense bf16 / fp32 tensor-core
figures from the vendors' data sheets), or "measure": the best of a few
large float32 matmuls timed on this machine (what a CPU really reaches).

Per batch the callback only reads the clock. It declares `async_safe =
False`, truthfully: Keras' asynchronous dispatch would run it on a worker
thread whenever that thread gets to it, and the clock must be read when the
step ends. Step time = time between consecutive batch ends, the first step of each
epoch excluded (it includes tracing and input start-up). MFU = FLOPs per
step / median step time / peak. Goodput = the sum of productive step times
/ the wall time from train begin to train end (tracing, compilation,
evaluation, checkpoints and callbacks are the badput).
"""

from __future__ import annotations

import statistics
import time

import keras
import numpy as np

from tfopt._errors import invalid_argument

# Dense (non-sparse) peak FLOP/s per device, from the vendors' data sheets.
PEAK_FLOPS = {
    "h200-bf16": 989e12, "h100-sxm-bf16": 989e12, "a100-bf16": 312e12,
    "a100-fp32": 19.5e12, "v100-fp16": 125e12, "tpu-v4-bf16": 275e12,
    "tpu-v5e-bf16": 197e12,
}


def measure_peak_flops(size: int = 1024, repeats: int = 5) -> float:
  """The best float32 FLOP/s of `repeats` size x size matmuls here."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  a = tf.random.normal((size, size))
  b = tf.random.normal((size, size))
  matmul = tf.function(lambda a, b: tf.linalg.matmul(a, b))
  matmul(a, b).numpy()  # trace and warm up
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, b).numpy()
    best = min(best, time.perf_counter() - start)
  return 2 * size ** 3 / best


class MFUMonitor(keras.callbacks.Callback):
  """MFU, samples/s and goodput of a `fit` (see the module doc).

  Args:
    sample_batch: (x, y) or (x, y, sample_weight) shaped like one training
      batch; its train step is compiled (not run) to count FLOPs.
    peak_flops: FLOP/s (number), a key of `PEAK_FLOPS`, or "measure".
    log_every: add `mfu` to the batch logs every n batches (0: only epochs).
  """

  def __init__(self, sample_batch, peak_flops="measure", log_every: int = 0):
    super().__init__()
    if not isinstance(sample_batch, (tuple, list)) or not 1 <= len(
        sample_batch) <= 3:
      raise invalid_argument("sample_batch", "a tuple (x, y) or (x, y, "
                             "sample_weight) shaped like one batch",
                             type(sample_batch).__name__)
    if isinstance(peak_flops, str):
      if peak_flops != "measure" and peak_flops not in PEAK_FLOPS:
        raise invalid_argument("peak_flops", f"a number, 'measure' or one "
                               f"of {sorted(PEAK_FLOPS)}", peak_flops)
    elif isinstance(peak_flops, bool) or not isinstance(
        peak_flops, (int, float)) or not peak_flops > 0:
      raise invalid_argument("peak_flops", "a positive number of FLOP/s",
                             peak_flops)
    if isinstance(log_every, bool) or not isinstance(log_every, int) or \
        log_every < 0:
      raise invalid_argument("log_every", "an integer >= 0", log_every)
    self.sample_batch = tuple(sample_batch)
    self.peak_spec = peak_flops
    self.log_every = log_every
    self.flops_per_step = None
    self.peak = None
    self.batch_size = int(np.shape(sample_batch[0])[0])
    self.step_times: list = []
    self.epoch_starts: list = []  # index into step_times of each epoch
    self.epochs: list = []
    self._last = None
    self._train_start = None
    self._wall = None

  # The clock must be read when the step ends, not when a thread pool gets
  # to the callback: not safe for Keras' asynchronous batch-end dispatch.
  async_safe = False

  def on_train_begin(self, logs=None):
    from tfopt.scale.flops import train_step_flops  # pylint: disable=import-outside-toplevel
    self.flops_per_step = train_step_flops(self.model,
                                           *self.sample_batch).total
    self.peak = (measure_peak_flops() if self.peak_spec == "measure" else
                 PEAK_FLOPS.get(self.peak_spec, self.peak_spec))
    self._train_start = time.perf_counter()

  def on_epoch_begin(self, epoch, logs=None):
    self._last = None  # the first step of an epoch is not a clean sample
    self._epoch_first = len(self.step_times)
    self.epoch_starts.append(self._epoch_first)

  def on_train_batch_end(self, batch, logs=None):
    now = time.perf_counter()
    if self._last is not None:
      self.step_times.append(now - self._last)
      if self.log_every and logs is not None and \
          len(self.step_times) % self.log_every == 0:
        logs["mfu"] = self._mfu(self.step_times[-self.log_every:])
    self._last = now

  def on_epoch_end(self, epoch, logs=None):
    times = self.step_times[self._epoch_first:]
    if times:
      mfu = self._mfu(times)
      self.epochs.append({"epoch": epoch, "mfu": mfu,
                          "step_s": statistics.median(times)})
      if logs is not None:
        logs["mfu"] = mfu

  def on_train_end(self, logs=None):
    self._wall = time.perf_counter() - self._train_start

  def _mfu(self, times) -> float:
    return self.flops_per_step / statistics.median(times) / self.peak

  def timeline_png(self, path: str, *, window: int = 10,
                   overwrite: bool = False) -> None:
    """Step time and MFU per step (rolling median of `window` steps), epoch
    starts marked, as a PNG written atomically."""
    if not self.step_times:
      raise RuntimeError("MFUMonitor.timeline_png() needs a fit with at least "
                         "two batches in an epoch.")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
      raise invalid_argument("window", "a positive integer", window)
    from tfopt._plot import pyplot, save_png  # pylint: disable=import-outside-toplevel
    plt = pyplot()
    times = np.asarray(self.step_times)
    rolling = np.array([np.median(times[max(0, i - window + 1):i + 1])
                        for i in range(len(times))])
    steps = np.arange(len(times))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.2), sharex=True)
    top.plot(steps, times * 1e3, lw=0.6, color="#999999", label="step")
    top.plot(steps, rolling * 1e3, lw=1.4, color="#1f77b4",
             label=f"median of {window}")
    top.set_ylabel("step time (ms)")
    top.legend(fontsize=8, loc="upper right")
    bottom.plot(steps, 100 * self.flops_per_step / rolling / self.peak,
                lw=1.4, color="#d62728")
    bottom.set_ylabel("MFU (%)")
    bottom.set_xlabel("step (first step of each epoch excluded)")
    for start in self.epoch_starts[1:]:
      for ax in (top, bottom):
        ax.axvline(start - 0.5, color="#cccccc", lw=0.8, ls="--")
    summary = self.summary()
    top.set_title(f"MFU {100 * summary['mfu']:.2f} % of {self.peak:.3g} "
                  f"FLOP/s, {summary['samples_per_s']:.0f} samples/s "
                  f"(dashed: epoch starts)", fontsize=9)
    fig.tight_layout()
    save_png(fig, path, overwrite=overwrite)

  def summary(self) -> dict:
    """FLOPs per step, peak, median step time, MFU, samples/s, goodput."""
    if not self.step_times:
      raise RuntimeError("MFUMonitor.summary() needs a fit with at least two "
                         "batches in an epoch.")
    step = statistics.median(self.step_times)
    return {"flops_per_step": self.flops_per_step, "peak_flops": self.peak,
            "step_s": step, "mfu": self.flops_per_step / step / self.peak,
            "samples_per_s": self.batch_size / step,
            "goodput": (sum(self.step_times) / self._wall
                        if self._wall else None)}
