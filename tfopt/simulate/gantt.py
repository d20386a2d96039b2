"""A Gantt chart of a Schedule: one row per device's compute stream and one
per device's channel (transfers), as a PNG, with a legend of the colours
(a device's ops, and the copies it sends, drawn on both ends' rows)."""

from __future__ import annotations

import os
from typing import Sequence

from tfopt.simulate.simulator import Schedule


def draw_gantt(schedule: Schedule, path: str, *, title: str = "",
               device_names: Sequence[str] | None = None,
               overwrite: bool = False) -> None:
  """Writes the chart to `path` (PNG) atomically; refuses to overwrite."""
  # Imported here: only the CLI and reports draw.
  from tfopt._plot import pyplot, save_png  # pylint: disable=import-outside-toplevel
  plt = pyplot()

  path = os.fspath(path)
  if os.path.exists(path) and not overwrite:  # fail before drawing
    raise FileExistsError(f"Argument `path` names a file that exists; pass "
                          f"overwrite=True to replace it. Received: "
                          f"path={path!r}")
  num = len(schedule.peak_bytes)
  names = list(device_names or [f"device {d}" for d in range(num)])
  scale = 1e3 if schedule.makespan_us >= 1e4 else 1.0
  unit = "ms" if scale == 1e3 else "us"
  fig, ax = plt.subplots(figsize=(12, 1.0 + 0.9 * num))
  colors = plt.get_cmap("tab10")
  rows = {}
  for d in range(num):
    rows[("compute", d)] = 2 * (num - 1 - d) + 1
    rows[("channel", d)] = 2 * (num - 1 - d)
  for d in range(num):
    bars = [(schedule.start_us[n] / scale,
             (schedule.end_us[n] - schedule.start_us[n]) / scale)
            for n, dev in schedule.device.items() if dev == d]
    ax.broken_barh(bars, (rows[("compute", d)] + 0.1, 0.8),
                   facecolors=colors(d % 10), edgecolor="none")
  for t in schedule.transfers:
    bar = [(t.start_us / scale, (t.end_us - t.start_us) / scale)]
    for d in (t.src_device, t.dst_device):
      ax.broken_barh(bar, (rows[("channel", d)] + 0.25, 0.5),
                     facecolors=colors(t.src_device % 10), alpha=0.6,
                     edgecolor="none")
  # What the colours mean: a device's colour marks its ops and the copies
  # it sends; a copy is drawn on both the sender's and the receiver's
  # "copies" row (each end's channel is busy), lighter than ops.
  from matplotlib.patches import Patch  # pylint: disable=import-outside-toplevel
  used = sorted({d for d in schedule.device.values()} |
                {t.src_device for t in schedule.transfers})
  handles = [Patch(facecolor=colors(d % 10), label=f"{names[d]}: ops")
             for d in used]
  handles += [Patch(facecolor=colors(d % 10), alpha=0.6,
                    label=f"copies sent by {names[d]}")
              for d in sorted({t.src_device for t in schedule.transfers})]
  if handles:
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize="small", frameon=False,
              title="colour = device; a copy shows on both ends' rows",
              title_fontsize="small")
  ticks = sorted(rows.items(), key=lambda kv: kv[1])
  ax.set_yticks([v + 0.5 for _, v in ticks])
  ax.set_yticklabels([f"{names[d]} {'ops' if kind == 'compute' else 'copies'}"
                      for (kind, d), _ in ticks])
  peaks = ", ".join(f"{p / 1e6:,.0f}" for p in schedule.peak_bytes)
  ax.set_xlabel(f"time ({unit}); makespan {schedule.makespan_us / scale:,.2f} "
                f"{unit}; peak MB per device: {peaks}")
  if title:
    ax.set_title(title)
  ax.set_xlim(0, max(schedule.makespan_us / scale, 1e-9))
  fig.tight_layout()
  save_png(fig, path, overwrite=overwrite, dpi=110)
