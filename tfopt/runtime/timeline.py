"""What a placed step really did, op by op and transfer by transfer, next to
what the simulator said it would do.

`measure_timeline` runs one traced step and reads TensorFlow's RunMetadata:
each op's device and kernel start and end, and, across server processes,
each RecvTensor call (the tensor, its bytes, from and to which task, when).
`compare_timeline` sets that beside a simulated Schedule of the same plan:
per device the busy time, how much longer the kernels ran than the
simulator's durations (devices that share cores stretch them), the ops that
ran longest over, and the transfers: how many, how long, how many in flight
at once. This is how the simulator's sharing, overlap and control-message
models were found (docs/placement.md, "Placement judged by the clock").
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from typing import Mapping, Sequence

import tensorflow as tf

from tfopt._quiet import native_info_logs_quiet
from tfopt._timing import union_us
from tfopt.runtime.session import StepSession, same_device

_RPC = re.compile(r"\[(?P<size>[\d.]+)(?P<unit>B|KB|MB|GB)\].*?edge_\d+_"
                  r"(?P<tensor>\S+) from (?P<src>\S+) to (?P<dst>\S+)")
_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


@dataclasses.dataclass(frozen=True)
class MeasuredTransfer:
  """One RecvTensor call: `tensor` (an op name) from device `src` to
  `dst`, about `bytes` (TensorFlow rounds its label), start and end. The
  call opens when the receiver asks for the tensor, often before the
  sender produced it: its span is wait plus transfer, not the link's
  latency (which `tfopt.runtime.calibrate` measures)."""
  tensor: str
  src: int
  dst: int
  bytes: int
  start_us: float
  end_us: float


@dataclasses.dataclass(frozen=True)
class MeasuredStep:
  """One traced step: op -> (device, kernel start, kernel end) relative to
  the first op's start, and the transfers seen (None: not observable, the
  in-process hand-over between logical devices)."""
  ops: Mapping[str, tuple[int, float, float]]
  transfers: tuple[MeasuredTransfer, ...] | None
  wall_us: float
  # Where ops' intervals were cut to their share of a device's cores
  # (read_timeline's `cores_per_device`): the simulated side is then cut
  # the same way before the two are compared.
  cores_per_device: int | None = None

  def busy_us(self, num_devices: int) -> tuple[float, ...]:
    """Per device, the time it had an op running: ops that ran side by
    side on it (an inter-op pool of several threads) count once, as in
    `Schedule.busy_us`. Where intervals were cut to core shares, their
    sum: the core time the device used."""
    spans: list[list[tuple[float, float]]] = [[] for _ in range(num_devices)]
    for d, start, end in self.ops.values():
      if 0 <= d < num_devices:
        spans[d].append((start, end))
    if self.cores_per_device:
      return tuple(sum(e - s for s, e in device) for device in spans)
    return tuple(union_us(device) for device in spans)


def _device_index(name: str, device_names: Sequence[str]) -> int:
  return next((i for i, d in enumerate(device_names) if same_device(d, name)),
              -1)


def read_timeline(run_metadata, device_names: Sequence[str],
                  ops: set[str] | None = None,
                  cores_per_device: int | None = None) -> MeasuredStep:
  """The MeasuredStep in a traced run's metadata; only ops in `ops` (None:
  every node with a kernel time) count. With `cores_per_device` (a pinned
  task running two ops at once on one core), each op's interval ends
  after its share of the core (`profile.shared_times`), not its wall
  time: busy times then count the core once."""
  from tfopt.cost.profile import shared_times  # pylint: disable=g-import-not-at-top
  times, rpcs = {}, []
  for dev in run_metadata.step_stats.dev_stats:
    d = _device_index(dev.device, device_names)
    shared = (shared_times(dev.node_stats, cores_per_device, ops)
              if cores_per_device else {})
    for ns in dev.node_stats:
      if ns.node_name == "RecvTensor":
        rpcs.append(ns)
      elif ns.op_end_rel_nanos and (ops is None or ns.node_name in ops):
        start = (ns.all_start_nanos + ns.op_start_rel_nanos) / 1e3
        end = (ns.all_start_nanos + ns.op_end_rel_nanos) / 1e3
        if ns.node_name in shared:
          end = start + shared[ns.node_name]
        times[ns.node_name] = (d, start, end)
  if not times:
    return MeasuredStep({}, None, 0.0, cores_per_device)
  origin = min(start for _, start, _ in times.values())
  ops_rel = {n: (d, s - origin, e - origin) for n, (d, s, e) in times.items()}
  transfers = []
  for ns in rpcs:
    match = _RPC.search(ns.timeline_label)
    if match is None:
      continue
    start = ns.all_start_micros - origin
    transfers.append(MeasuredTransfer(
        match["tensor"], _device_index(match["src"], device_names),
        _device_index(match["dst"], device_names),
        int(float(match["size"]) * _UNITS[match["unit"]]), start,
        start + ns.all_end_rel_micros))
  ends = [e for _, _, e in ops_rel.values()] + [t.end_us for t in transfers]
  return MeasuredStep(ops_rel, tuple(transfers) if rpcs else None, max(ends),
                      cores_per_device)


def measure_timeline(step, graph_def, inputs: Sequence, device_names:
                     Sequence[str], *, target: str = "", config=None,
                     warmup: int = 3, cores_per_device: int | None = None
                     ) -> MeasuredStep:
  """Runs `graph_def` (`warmup` untraced steps, then one traced) and reads
  its timeline (`read_timeline`); the variables start from the step's and
  are not kept."""
  from tfopt.graph.capture import opgraph_from_graphdef  # pylint: disable=g-import-not-at-top
  ops = {op.name for op in opgraph_from_graphdef(graph_def,
                                                 inline=False).ops}
  with StepSession(step, graph_def=graph_def, target=target,
                   config=config) as session:
    for _ in range(warmup):
      session.run(inputs)
    metadata = tf.compat.v1.RunMetadata()
    with native_info_logs_quiet():  # the profiler's INFO lines
      session.run(inputs, options=tf.compat.v1.RunOptions(
          trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                  run_metadata=metadata)
  return read_timeline(metadata, device_names, ops, cores_per_device)


def _simulated_kernel_us(schedule, cores_per_device: int | None
                         ) -> dict[str, float]:
  """Per op, its simulated interval, or (with `cores_per_device`, as the
  measured side was read) its share of its device's cores."""
  if not cores_per_device:
    return {n: schedule.end_us[n] - schedule.start_us[n]
            for n in schedule.start_us}
  from tfopt.cost.profile import core_shares  # pylint: disable=g-import-not-at-top
  spans: dict[int, list] = {}
  for n, d in schedule.device.items():
    spans.setdefault(d, []).append((schedule.start_us[n], schedule.end_us[n],
                                    n))
  out: dict[str, float] = {}
  for device_spans in spans.values():
    out.update(core_shares(device_spans, cores_per_device))
  return out


def _most_at_once(spans) -> int:
  """The most (start, end) spans open at one instant."""
  events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
  level = best = 0
  for _, delta in events:
    level += delta
    best = max(best, level)
  return best


@dataclasses.dataclass(frozen=True)
class TimelineComparison:
  """A measured step beside its simulated schedule (see module doc)."""
  measured_us: float
  simulated_us: float
  busy_measured: tuple[float, ...]
  busy_simulated: tuple[float, ...]
  stretch: float  # summed kernel time measured / simulated, same ops
  overrun: tuple[tuple[str, float, float], ...]  # (op, measured, simulated)
  transfers_measured: int | None
  transfers_simulated: int
  transfer_median_measured_us: float | None
  transfer_median_simulated_us: float | None
  in_flight_measured: int | None
  in_flight_simulated: int

  def table(self) -> str:
    def ms(values):
      return "/".join(f"{v / 1e3:.2f}" for v in values)

    if self.transfers_measured is None:
      seen = "measured: not observable (in-process hand-overs)"
    else:
      seen = (f"measured {self.transfers_measured} (median "
              f"{self.transfer_median_measured_us or 0:.0f} us, up to "
              f"{self.in_flight_measured} in flight)")
    simulated = (f"simulated {self.transfers_simulated}" + (
        f" (median {self.transfer_median_simulated_us:.0f} us, up to "
        f"{self.in_flight_simulated} in flight)"
        if self.transfers_simulated else ""))
    lines = [
        f"step: measured {self.measured_us / 1e3:.2f} ms, simulated "
        f"{self.simulated_us / 1e3:.2f} ms (ratio "
        f"{self.measured_us / max(self.simulated_us, 1e-9):.2f})",
        f"busy per device (ms): measured {ms(self.busy_measured)}, "
        f"simulated {ms(self.busy_simulated)}; kernels ran "
        f"{self.stretch:.2f}x their simulated time",
        f"transfers (RecvTensor calls, wait included): {seen}; "
        f"{simulated}"]
    for name, meas, sim in self.overrun:
      lines.append(f"  ran over: {name} {meas:.0f} us (simulated "
                   f"{sim:.0f} us)")
    return "\n".join(lines)


def compare_timeline(schedule, measured: MeasuredStep,
                     top: int = 5) -> TimelineComparison:
  """`measured` beside `schedule` (a `tfopt.simulate.Schedule` of the same
  graph and plan)."""
  num = len(schedule.peak_bytes)
  common = [n for n in measured.ops if n in schedule.start_us]
  simulated = _simulated_kernel_us(schedule, measured.cores_per_device)
  meas_kernel = sum(measured.ops[n][2] - measured.ops[n][1] for n in common)
  sim_kernel = sum(simulated[n] for n in common)
  overrun = sorted(
      ((n, measured.ops[n][2] - measured.ops[n][1], simulated[n])
       for n in common), key=lambda r: r[2] - r[1])[:top]
  sim_spans = [(t.start_us, t.end_us) for t in schedule.transfers]
  meas = measured.transfers
  return TimelineComparison(
      measured.wall_us, schedule.makespan_us, measured.busy_us(num),
      schedule.busy_us(), meas_kernel / sim_kernel if sim_kernel else 1.0,
      tuple(r for r in overrun if r[1] > r[2]),
      None if meas is None else len(meas), len(sim_spans),
      statistics.median(t.end_us - t.start_us for t in meas) if meas
      else None,
      statistics.median(e - s for s, e in sim_spans) if sim_spans else None,
      None if meas is None else _most_at_once(
          [(t.start_us, t.end_us) for t in meas]),
      _most_at_once(sim_spans))
