"""Model FLOPs utilization (MFU), throughput and goodput, as a Keras callback.

    monitor = MFUMonitor(sample_batch=(x[:32], y[:32]), peak_flops="measure")
    model.fit(x, y, batch_size=32, callbacks=[monitor])
    monitor.summary()   # {"flops_per_step", "mfu", "samples_per_s", ...}

FLOPs per step come from the compiled train step's XLA HLO
(`tfopt.scale.flops.train_step_flops`, counted once at train begin on
`sample_batch`, which must have the training batch's shape).

MFU is reported against a *stated* peak, so that it is the standard figure
and comparable across machines: a number of FLOP/s the user states, a key
of `PEAK_FLOPS` (dense figures from the vendors' data sheets, per device
and dtype), or "auto" (the default): the datasheet entry of the visible
GPU for the model's compute dtype, else this CPU's theoretical peak
(`cpu_peak_flops`: cores x clock x FLOP per cycle of its widest vector
unit). `peak_source` says which. What this machine really reaches -- the
best of chained float32 matmuls timed on the device, no host copy inside
the timing (`measure_peak_flops`) -- is a separate, labelled figure:
`achievable_flops` and `mfu_of_achievable` in the summary, measured at train
begin with `measure_achievable=True` (or `peak_flops="measure"`, which also
makes it the denominator, for backward compatibility, named as such).

Per batch the callback only reads the clock. It declares `async_safe =
False`, truthfully: Keras' asynchronous dispatch would run it on a worker
thread whenever that thread gets to it, and the clock must be read when the
step ends. Step time = time between consecutive batch ends over the steps
that call ran (with `steps_per_execution=N` Keras calls the batch hooks
once per N steps: one sample of N steps, an epoch's last maybe fewer, its
count settled by the optimizer's at the epoch's end), the first call of
each epoch excluded (it includes tracing and input start-up). MFU = FLOPs
per step / median step time (each sample weighted by its steps) / peak.
Goodput = the sum of productive step times / the wall time from train
begin to train end (tracing, compilation, evaluation, checkpoints and
callbacks are the badput).

With a `keras.callbacks.TensorBoard` in the same fit (`tfopt.summaries`),
the values it logs go to TensorBoard too: `tfopt/mfu/step` (with
`log_every`, at the training step), `tfopt/mfu/epoch` (at the epoch) and
`tfopt/goodput` (at train end); without one nothing is written.
"""

from __future__ import annotations

import time

import keras
import numpy as np

from tfopt import _fit_steps as fit_steps
from tfopt import summaries
from tfopt._errors import invalid_argument

# Dense (non-sparse) peak FLOP/s per device and dtype, from the vendors'
# data sheets ("fp32" on tensor-core GPUs: plain FP32, not TF32).
PEAK_FLOPS = {
    "h200-bf16": 989e12, "h200-fp32": 67e12,
    "h100-sxm-bf16": 989e12, "h100-sxm-fp32": 67e12,
    "a100-bf16": 312e12, "a100-fp32": 19.5e12,
    "v100-fp16": 125e12, "v100-fp32": 15.7e12,
    "tpu-v4-bf16": 275e12, "tpu-v5e-bf16": 197e12,
}

# Float32 FLOP per cycle and core of a CPU's widest FMA unit, assuming two
# FMA pipes (Intel server cores and AMD Zen since 2): lanes x 2 (multiply
# and add) x 2 pipes.
_CPU_FLOP_PER_CYCLE = (("avx512f", 64), ("avx2", 32), ("avx", 16),
                       ("sse2", 8))


def cpu_peak_flops(cpuinfo: str | None = None, cores: int | None = None
                   ) -> tuple[float, str]:
  """This CPU's theoretical float32 peak and how it was derived: usable
  cores x clock x FLOP per cycle of its widest vector unit (its flags).
  The clock is the highest of /proc/cpuinfo's "cpu MHz" and, where the
  kernel exposes it, cpufreq's maximum; in a VM often only the base clock
  is listed, and boost clocks can take a measured peak past this figure
  (seen: 405 against 332 GFLOP/s on a 2-core EPYC VM listed at 2.6 GHz).

  >>> info = "cpu MHz : 2000.000\\nflags : fpu sse2 avx avx2 fma\\n"
  >>> cpu_peak_flops(info, cores=2)
  (128000000000.0, 'theoretical: 2 cores x 2.00 GHz x 32 FLOP/cycle (avx2, two FMA pipes)')
  """
  import os  # pylint: disable=import-outside-toplevel
  own = cpuinfo is None  # this machine's: its cpufreq counts too
  if cpuinfo is None:
    try:
      with open("/proc/cpuinfo", encoding="utf-8") as f:
        cpuinfo = f.read()
    except OSError as err:
      raise RuntimeError("No CPU peak without /proc/cpuinfo: give "
                         "peak_flops as a number (FLOP/s).") from err
  mhz = [float(line.split(":", 1)[1]) for line in cpuinfo.splitlines()
         if line.startswith("cpu MHz")]
  flags = set()
  for line in cpuinfo.splitlines():
    if line.startswith("flags"):
      flags.update(line.split(":", 1)[1].split())
  isa, per_cycle = next(((name, n) for name, n in _CPU_FLOP_PER_CYCLE
                         if name in flags), ("scalar", 2))
  if not mhz:
    raise RuntimeError("No CPU clock in /proc/cpuinfo: give peak_flops as a "
                       "number (FLOP/s).")
  if own:
    try:  # kHz
      with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq",
                encoding="utf-8") as f:
        mhz.append(int(f.read()) / 1e3)
    except (OSError, ValueError):  # not exposed (VMs, containers)
      pass
  if cores is None:
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count())
  ghz = max(mhz) / 1e3
  return (cores * ghz * 1e9 * per_cycle,
          f"theoretical: {cores} cores x {ghz:.2f} GHz x {per_cycle} "
          f"FLOP/cycle ({isa}, two FMA pipes)")


def _gpu_key(device_name: str, dtype: str) -> str | None:
  """The PEAK_FLOPS key of a GPU (TensorFlow's device description) and a
  compute dtype, if the table has it."""
  name = device_name.lower()
  kind = "bf16" if "bfloat16" in dtype or "float16" in dtype else "fp32"
  for model in ("h200", "h100", "a100", "v100"):
    if model in name:
      for key in (f"{model}-{kind}", f"{model}-sxm-{kind}"):
        if key in PEAK_FLOPS:
          return key
  return None


def stated_peak(dtype: str = "float32") -> tuple[float, str]:
  """The "auto" peak: the visible GPU's datasheet figure for `dtype`, else
  this CPU's theoretical peak; with its source."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  for gpu in tf.config.list_physical_devices("GPU"):
    details = tf.config.experimental.get_device_details(gpu)
    key = _gpu_key(details.get("device_name", ""), dtype)
    if key is not None:
      return PEAK_FLOPS[key], f"datasheet: {key}"
    raise RuntimeError(
        f"No datasheet peak for GPU {details.get('device_name')!r} and "
        f"dtype {dtype}: give peak_flops as a number (FLOP/s) or a key of "
        f"{sorted(PEAK_FLOPS)}.")
  return cpu_peak_flops()


def _own_cores() -> list:
  """[host name, core] of the cores this process may run on: the cores a
  CPU peak counts, named so that workers sharing them can be told apart
  from workers on another machine's cores of the same numbers."""
  import os  # pylint: disable=import-outside-toplevel
  import socket  # pylint: disable=import-outside-toplevel
  cores = (sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else list(range(os.cpu_count() or 1)))
  return [[socket.gethostname(), core] for core in cores]


def measure_peak_flops(size: int = 1024, repeats: int = 5,
                       chain: int = 8) -> float:
  """What this machine's default device really reaches: the best float32
  FLOP/s of `repeats` runs of `chain` dependent size x size matmuls, timed
  on the device (only a scalar comes back to the host, after the chain)."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  a = tf.random.normal((size, size))
  b = tf.random.normal((size, size)) / size ** 0.5  # values stay bounded

  @tf.function
  def chained(a, b):
    for _ in range(chain):
      a = tf.linalg.matmul(a, b)
    return tf.reduce_sum(a[:1, :1])

  chained(a, b).numpy()  # trace and warm up
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    chained(a, b).numpy()
    best = min(best, time.perf_counter() - start)
  return 2 * size ** 3 * chain / best


class MFUMonitor(keras.callbacks.Callback):
  """MFU, samples/s and goodput of a `fit` (see the module doc).

  Args:
    sample_batch: (x, y) or (x, y, sample_weight) shaped like one training
      batch; its train step is compiled (not run) to count FLOPs.
    peak_flops: the stated peak: FLOP/s (a number), a key of `PEAK_FLOPS`,
      or "auto" (the visible GPU's datasheet figure for the model's
      compute dtype, else this CPU's theoretical peak); "measure" uses the
      measured achievable peak instead (not the standard MFU: named so).
    log_every: add `mfu` to the batch logs every n steps, at the batch end
      that completes them (0: only epochs).
    measure_achievable: also time what this machine reaches at train begin
      (`achievable_flops`, `mfu_of_achievable` in the summary).
    flops_per_step: the step's FLOPs when known (then nothing is
      compiled); by default counted at the first train begin. Under a
      distribution strategy they are one replica's: give `sample_batch`
      the batch one replica sees.

  `peak` is the denominator, `peak_source` where it came from; with this
  CPU's theoretical peak, `cores` are the (host name, core) pairs it counts
  (`tfopt.scale.host_report.pooled_mfu` counts cores that workers
  share once). Several `fit` calls
  with one monitor (as `tfopt.scale.worker.fit` makes, one per epoch)
  count the FLOPs once and pool their steps and wall time.
  """

  def __init__(self, sample_batch, peak_flops="auto", log_every: int = 0,
               measure_achievable: bool = False,
               flops_per_step: int | float | None = None):
    super().__init__()
    if not isinstance(sample_batch, (tuple, list)) or not 1 <= len(
        sample_batch) <= 3:
      raise invalid_argument("sample_batch", "a tuple (x, y) or (x, y, "
                             "sample_weight) shaped like one batch",
                             type(sample_batch).__name__)
    if isinstance(peak_flops, str):
      if peak_flops not in ("auto", "measure") and \
          peak_flops not in PEAK_FLOPS:
        raise invalid_argument("peak_flops", f"a number, 'auto', 'measure' "
                               f"or one of {sorted(PEAK_FLOPS)}", peak_flops)
    elif isinstance(peak_flops, bool) or not isinstance(
        peak_flops, (int, float)) or not peak_flops > 0:
      raise invalid_argument("peak_flops", "a positive number of FLOP/s",
                             peak_flops)
    if isinstance(log_every, bool) or not isinstance(log_every, int) or \
        log_every < 0:
      raise invalid_argument("log_every", "an integer >= 0", log_every)
    if flops_per_step is not None and (
        isinstance(flops_per_step, bool) or
        not isinstance(flops_per_step, (int, float)) or
        not 0 < flops_per_step < float("inf")):
      raise invalid_argument("flops_per_step", "a positive number or None",
                             flops_per_step)
    self.sample_batch = tuple(sample_batch)
    self.peak_spec = peak_flops
    self.log_every = log_every
    self.measure_achievable = bool(measure_achievable)
    self.flops_per_step = flops_per_step
    self.peak = None
    self.peak_source = None
    self.cores = None
    self.achievable_flops = None
    self.batch_size = int(np.shape(sample_batch[0])[0])
    self.step_times: list = []  # seconds per step, one entry per batch end
    self.step_counts: list = []  # the steps each of those covered
    self.epoch_starts: list = []  # index into step_times of each epoch
    self.epochs: list = []
    self._last = None
    self._unlogged = 0  # steps since `mfu` last went into the batch logs
    self._epoch_counted = 0
    self._epoch_iterations = None
    self._train_start = None
    self._wall = None
    self._summaries = None  # the fit's TensorBoard, if it has one
    self._step = 0  # the training step, counted while writing there

  # The clock must be read when the step ends, not when a thread pool gets
  # to the callback: not safe for Keras' asynchronous batch-end dispatch.
  async_safe = False

  def on_train_begin(self, logs=None):
    if self.peak is None:  # the first fit with this monitor
      if self.flops_per_step is None:
        from tfopt.scale.flops import train_step_flops  # pylint: disable=import-outside-toplevel
        self.flops_per_step = train_step_flops(self.model,
                                               *self.sample_batch).total
      self.peak, self.peak_source = self._peak()
      if self.measure_achievable or self.peak_spec == "measure":
        self.achievable_flops = measure_peak_flops()
        if self.peak_spec == "measure":
          self.peak = self.achievable_flops
    self._summaries = summaries.for_fit(self.model, self)
    if self._summaries is not None:
      self._step = summaries.training_step(self.model)
    self._train_start = time.perf_counter()

  def on_epoch_begin(self, epoch, logs=None):
    self._last = None  # the first step of an epoch is not a clean sample
    self._epoch_first = len(self.step_times)
    self.epoch_starts.append(self._epoch_first)
    self._epoch_counted = 0  # steps of the epoch's calls, as the hooks say
    # With several steps per call the epoch's last call may have run other
    # than the hooks say (tfopt._fit_steps): the optimizer's count corrects
    # it at the epoch's end (one device read per epoch).
    self._epoch_iterations = (
        summaries.training_step(self.model)
        if fit_steps.steps_per_execution(self.model) > 1 and
        not isinstance(getattr(self.model, "optimizer", None),
                       keras.optimizers.LossScaleOptimizer) else None)

  def on_train_batch_end(self, batch, logs=None):
    now = time.perf_counter()
    steps = fit_steps.count(self, batch)
    self._epoch_counted += steps
    if self._last is not None:
      self.step_times.append((now - self._last) / steps)
      self.step_counts.append(steps)
      self._unlogged += steps
      if self.log_every and logs is not None and \
          self._unlogged >= self.log_every:
        logs["mfu"] = self._mfu(self._median_step(self._since(
            self.log_every)))
        self._unlogged %= self.log_every
        if self._summaries is not None:
          self._summaries.write_scalar("mfu/step", logs["mfu"],
                                       self._step + steps)
    self._last = now
    self._step += steps

  def _since(self, steps: int) -> int:
    """Where the last samples covering `steps` steps begin."""
    first, covered = len(self.step_counts), 0
    while first > 0 and covered < steps:
      first -= 1
      covered += self.step_counts[first]
    return first

  def _correct_last_call(self) -> None:
    """Gives the epoch's last call the steps the optimizer counted beyond
    the hooks' count (see on_epoch_begin)."""
    if self._epoch_iterations is None:
      return
    missing = (summaries.training_step(self.model) - self._epoch_iterations
               - self._epoch_counted)
    self._step += missing
    if missing and self._last is not None and \
        len(self.step_times) > self._epoch_first:
      steps = max(1, self.step_counts[-1] + missing)
      self.step_times[-1] *= self.step_counts[-1] / steps
      self.step_counts[-1] = steps

  def on_epoch_end(self, epoch, logs=None):
    self._correct_last_call()
    if len(self.step_times) > self._epoch_first:
      step_s = self._median_step(self._epoch_first)
      mfu = self._mfu(step_s)
      self.epochs.append({"epoch": epoch, "mfu": mfu, "step_s": step_s})
      if logs is not None:
        logs["mfu"] = mfu
      if self._summaries is not None:
        self._summaries.write_scalar("mfu/epoch", mfu, epoch)

  def on_train_end(self, logs=None):
    self._wall = (self._wall or 0.0) + time.perf_counter() - \
        self._train_start
    if self._summaries is not None:
      if self.step_times:
        self._summaries.write_scalar("goodput", self.summary()["goodput"],
                                     self._step)
      self._summaries.flush()

  def _peak(self) -> tuple[float | None, str]:
    spec = self.peak_spec
    if spec == "measure":
      return None, ("measured achievable (float32 matmuls on this machine; "
                    "not the standard MFU)")
    if spec == "auto":
      peak, source = stated_peak(keras.config.dtype_policy().compute_dtype)
      if source.startswith("theoretical"):
        self.cores = _own_cores()
      return peak, source
    if spec in PEAK_FLOPS:
      return PEAK_FLOPS[spec], f"datasheet: {spec}"
    return float(spec), "stated by the user"

  def _median_step(self, first: int = 0, last: int | None = None) -> float:
    """The median seconds per step of samples [first, last), each sample
    counted once per step it covered."""
    return float(np.median(np.repeat(self.step_times[first:last],
                                     self.step_counts[first:last])))

  def _mfu(self, step_s: float) -> float:
    return self.flops_per_step / step_s / self.peak

  def timeline_png(self, path: str, *, window: int = 10,
                   overwrite: bool = False) -> None:
    """Step time and MFU per sample (one per call of the train function;
    rolling median of `window` samples), epoch starts marked, as a PNG
    written atomically."""
    if not self.step_times:
      raise RuntimeError("MFUMonitor.timeline_png() needs a fit with at least "
                         "two batches (calls, with steps_per_execution > 1) "
                         "in an epoch.")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
      raise invalid_argument("window", "a positive integer", window)
    from tfopt._plot import pyplot, save_png  # pylint: disable=import-outside-toplevel
    plt = pyplot()
    times = np.asarray(self.step_times)
    rolling = np.array([np.median(times[max(0, i - window + 1):i + 1])
                        for i in range(len(times))])
    # x: the training step each sample ends at (N apart with
    # steps_per_execution=N), counted over the clean samples.
    steps = np.cumsum(self.step_counts)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.2), sharex=True)
    top.plot(steps, times * 1e3, lw=0.6, color="#999999", label="step")
    top.plot(steps, rolling * 1e3, lw=1.4, color="#1f77b4",
             label=f"median of {window}")
    top.set_ylabel("step time (ms)")
    top.legend(fontsize=8, loc="upper right")
    bottom.plot(steps, 100 * self.flops_per_step / rolling / self.peak,
                lw=1.4, color="#d62728")
    bottom.set_ylabel("MFU (%)")
    bottom.set_xlabel("step (each epoch's first call excluded)")
    for start in self.epoch_starts[1:]:
      if start >= len(steps):
        continue  # an epoch with no clean sample
      for ax in (top, bottom):
        ax.axvline(steps[start] - 0.5 * self.step_counts[start],
                   color="#cccccc", lw=0.8, ls="--")
    summary = self.summary()
    top.set_title(f"MFU {100 * summary['mfu']:.2f} % of {self.peak:.3g} "
                  f"FLOP/s ({self.peak_source}), {summary['samples_per_s']:.0f} samples/s "
                  f"(dashed: epoch starts)", fontsize=9)
    fig.tight_layout()
    save_png(fig, path, overwrite=overwrite)

  def summary(self) -> dict:
    """FLOPs per step, peak, median step time, MFU, samples/s, goodput."""
    if not self.step_times:
      raise RuntimeError("MFUMonitor.summary() needs a fit with at least two "
                         "batches (calls, with steps_per_execution > 1) in "
                         "an epoch.")
    step = self._median_step()
    achieved = self.flops_per_step / step
    return {"flops_per_step": self.flops_per_step, "peak_flops": self.peak,
            "peak_source": self.peak_source,
            "step_s": step, "mfu": achieved / self.peak,
            "achievable_flops": self.achievable_flops,
            "mfu_of_achievable": (achieved / self.achievable_flops
                                  if self.achievable_flops else None),
            "samples_per_s": self.batch_size / step,
            "cores": self.cores,
            "goodput": (sum(t * n for t, n in zip(self.step_times,
                                                  self.step_counts))
                        / self._wall
                        if self._wall else None)}
