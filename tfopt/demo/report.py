"""The demo's report: `report.json` (one object per stage, each with its
figures) and `report.html`, one self-contained page (images inlined as
data URIs) with the pictures a person would look at: the NAS scatterplot,
the Gantt chart of the placed step, the loss and MFU curves with the fault
marked, and the sparsity per expert."""

from __future__ import annotations

import base64
import html
import json
import os

from tfopt._io import atomic_write_text


def curves_png(path: str, train: dict) -> None:
  """Loss per step of the run without the fault and the faulted run's
  stitched trajectory, and MFU per step, the fault and the resume marked."""
  from tfopt._plot import pyplot, save_png  # pylint: disable=g-import-not-at-top
  plt = pyplot()
  clean, faulted = train["clean"], train["faulted"]
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6), sharex=True)
  for run, style, label in ((clean, "-", "without the fault"),
                            (faulted, "--", "with a server task killed")):
    steps = sorted(run["loss"])
    top.plot(steps, [run["loss"][s] for s in steps], style, label=label)
    mfu = sorted(run["mfu"])
    bottom.plot(mfu, [100 * run["mfu"][s] for s in mfu], style, label=label)
  for attempt in faulted["attempts"]:
    for fault in attempt["faults"]:
      for ax in (top, bottom):
        ax.axvline(fault["at_step"], color="red", lw=1)
      top.annotate(f"task killed after step {fault['at_step']}",
                   (fault["at_step"], top.get_ylim()[1]), color="red",
                   fontsize=8, xytext=(4, -12), textcoords="offset points")
    if attempt["resumed_from"]:
      for ax in (top, bottom):
        ax.axvline(attempt["resumed_from"], color="grey", ls=":", lw=1)
  top.set_ylabel("training loss")
  top.legend(fontsize=8)
  bottom.set_ylabel("MFU (%)")
  bottom.set_xlabel("global step (dotted: the checkpoint the restart "
                    "resumed from)")
  save_png(fig, path, overwrite=True, dpi=100)


def sparsity_png(path: str, prune: dict) -> None:
  """Share of zero weights per expert, per MoE block."""
  from tfopt._plot import pyplot, save_png  # pylint: disable=g-import-not-at-top
  plt = pyplot()
  blocks = prune["sparsity_per_expert"]
  fig, ax = plt.subplots(figsize=(7.5, 3))
  labels, values = [], []
  for b, (name, per_expert) in enumerate(blocks.items()):
    for e, value in enumerate(per_expert):
      labels.append(f"block {b}\nexpert {e}")
      values.append(100 * value)
  ax.bar(range(len(values)), values, color="#4477aa")
  ax.axhline(100 * prune["target_sparsity"], color="grey", ls="--", lw=1)
  ax.set_xticks(range(len(values)), labels, fontsize=7)
  ax.set_ylabel("zero weights (%)")
  ax.set_ylim(0, 100)
  save_png(fig, path, overwrite=True, dpi=100)


def _img(path: str | None, alt: str) -> str:
  if not path or not os.path.exists(path):
    return f"<p><em>{html.escape(alt)}: not drawn</em></p>"
  with open(path, "rb") as f:
    data = base64.b64encode(f.read()).decode("ascii")
  return (f'<img alt="{html.escape(alt)}" style="max-width:100%" '
          f'src="data:image/png;base64,{data}">')


def _table(rows) -> str:
  cells = "".join(f"<tr><th>{html.escape(str(k))}</th>"
                  f"<td>{html.escape(str(v))}</td></tr>" for k, v in rows)
  return f"<table>{cells}</table>"


def write(report: dict, out_dir: str) -> tuple[str, str]:
  """Writes report.json and report.html; returns their paths."""
  json_path = os.path.join(out_dir, "report.json")
  atomic_write_text(json_path, json.dumps(report, indent=1, default=float),
                    overwrite=True)
  search, train = report["search"], report["train"]
  prune, export = report["prune"], report["export"]
  sizes, faulted = train["sizes"], train["faulted"]
  gantt = next((a["hook"]["gantt_png"] for a in reversed(faulted["attempts"])
                if a.get("hook")), None)
  hook = next((a["hook"] for a in reversed(faulted["attempts"])
               if a.get("hook")), {}) or {}
  sections = [
      ("1. Search", _table([
          ("sub-networks", search["sub_networks"]),
          ("constraint", f"{search['constraint']['action']} "
                         f"{search['constraint']['layer']}="
                         f"{search['constraint']['op']} "
                         f"({search['constraint']['why']})"),
          ("rule", search["rule"]),
          ("chosen", f"{search['chosen']['arch']} "
                     f"({search['chosen']['params']:,} parameters, "
                     f"perplexity {search['chosen']['perplexity']:.2f})"),
          ("best overall", f"{search['best_overall']['arch']} "
                           f"({search['best_overall']['perplexity']:.2f})"),
          ("seconds", f"{search['seconds']:.0f}")]) +
       _img(search["scatter_png"], "NAS scatterplot")),
      ("2. Train placed, with a fault", _table([
          ("devices", f"{sizes['tasks']} TensorFlow server tasks, each in "
                      f"a memory cgroup"),
          ("training state vs cap", f"{sizes['state_bytes'] / 1e6:.2f} MB "
                                    f"vs {sizes['cap_bytes'] / 1e6:.2f} MB "
                                    f"per device"),
          ("step's peak on one device",
           f"{sizes['one_device_peak_bytes'] / 1e6:.2f} MB"),
          ("plan", f"{hook.get('placer')} on {hook.get('devices_used')}"),
          ("peak per task: plan / OS (with TensorFlow's own)", _peaks(hook)),
          ("faults survived", len(faulted["failures"])),
          ("steps lost / repeated / recomputed",
           f"{len(faulted['lost'])} / {len(faulted['repeated'])} / "
           f"{faulted['recomputed']}"),
          ("losses vs the run without the fault",
           f"max relative difference {train['loss_max_rel_diff']:.2g}"),
          ("MFU (median)", _median_mfu(faulted)),
          ("seconds", f"{train['seconds']:.0f}")]) +
       _img(gantt, "Gantt chart of the placed step") +
       _img(train.get("curves_png"), "loss and MFU curves")),
      ("3. Prune and distil", _table([
          ("perplexity dense / pruned / distilled",
           " / ".join(f"{prune['perplexity'][k]:.2f}"
                      for k in ("dense", "pruned", "distilled"))),
          ("expert weights zero", f"{100 * prune['sparsity']:.1f} %"),
          ("seconds", f"{prune['seconds']:.0f}")]) +
       _img(prune.get("sparsity_png"), "sparsity per expert")),
      ("4. Serve", _table([
          ("SavedModel", export["path"]),
          ("signature inputs", ", ".join(export["signature_inputs"])),
          ("PredictRequest vs model.predict",
           f"max |diff| {export['served_max_abs_diff']:.2g}"),
          ("seconds", f"{export['seconds']:.0f}")])),
  ]
  body = "".join(f"<h2>{html.escape(title)}</h2>{content}"
                 for title, content in sections)
  page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>tfopt demo</title>
<style>body{{font-family:sans-serif;margin:24px;max-width:900px}}
table{{border-collapse:collapse;margin:8px 0}} th,td{{border:1px solid #ccc;
padding:4px 8px;text-align:left}} th{{background:#f4f4f4}}</style></head>
<body><h1>tfopt: search, train placed and fault-tolerant, prune, serve</h1>
<p>A keras-hub Qwen3-MoE language model, from architecture search to
serving, on this machine ({html.escape(report.get('machine', ''))}).
The numbers are in report.json.</p>{body}</body></html>
"""
  html_path = os.path.join(out_dir, "report.html")
  atomic_write_text(html_path, page, overwrite=True)
  return json_path, html_path


def _peaks(hook: dict) -> str:
  """The plan's predicted peak per task beside the cgroup's measurement
  (which also holds TensorFlow's own growth in that process)."""
  predicted = hook.get("predicted_peak_bytes") or []
  measured = hook.get("os_peak_bytes") or []
  return ", ".join(f"{p / 1e6:.2f} / {m / 1e6:.2f} MB"
                   for p, m in zip(predicted, measured))


def _median_mfu(run: dict) -> str:
  values = sorted(run["mfu"].values())
  if not values:
    return "-"
  return f"{100 * values[len(values) // 2]:.2f} % of the CPU's peak"
