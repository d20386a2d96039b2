"""NAS-Navigator's views: the search-space scatterplot, the component view
and the training curves, as PNGs (matplotlib) and as one self-contained
HTML file (inline SVG and a few lines of script; works offline).

The scatterplot places every sub-graph of the space (or a given list) by a
deterministic 2-D projection of the architecture encodings: classical MDS
on the Hamming distance between architectures (the number of layers whose
op differs), i.e. the top two eigenvectors of the double-centred squared
distances, each eigenvector's sign fixed so that its largest-magnitude
entry is positive. Colour is the one-shot score (validation log-likelihood,
`rank`'s default, or accuracy with `rank(score="accuracy")`) on a diverging scale
centred on the median score; grey = not evaluated yet; a cross marks a
sub-graph the constraints exclude (removed op, outside the region, over the
limits) and a diamond one that satisfies every lock. In the HTML file a
click selects sub-graphs and the page shows the `tfopt-nas` command
that turns the selection into a region.
"""

from __future__ import annotations

import html
import json
import math

import numpy as np

from tfopt._errors import invalid_argument
from tfopt._io import atomic_write_text

STATUSES = ("open", "excluded", "locked")
_LOW, _MID, _HIGH = (178, 24, 43), (247, 247, 247), (33, 102, 172)
_GREY = "#bdbdbd"


def hamming_mds(space, archs=None) -> np.ndarray:
  """(n, 2) coordinates of `archs` (default: every sub-graph, enumeration
  order); see the module doc."""
  archs = list(space.enumerate()) if archs is None else [
      space.check_arch(a) for a in archs]
  if not archs:
    raise invalid_argument("archs", "at least one architecture", archs)
  codes = np.array([[layer.op_names.index(op) for op, layer in
                     zip(a, space.layers)] for a in archs])
  d2 = (codes[:, None, :] != codes[None, :, :]).sum(-1).astype(np.float64)
  d2 **= 2
  n = len(archs)
  centre = np.eye(n) - 1.0 / n
  gram = -0.5 * centre @ d2 @ centre
  values, vectors = np.linalg.eigh(gram)
  order = np.argsort(-values, kind="stable")[:2]
  coords = np.zeros((n, 2))
  for j, k in enumerate(order):
    if values[k] <= 1e-12:
      continue
    v = vectors[:, k]
    v = v * (1 if v[np.argmax(np.abs(v).round(9))] >= 0 else -1)
    coords[:, j] = v * math.sqrt(values[k])
  return coords


def statuses(space, archs, constraints=None) -> list:
  """Per architecture: "excluded", "locked" or "open" (see module doc)."""
  if constraints is None:
    return ["open"] * len(archs)
  out = []
  for arch in archs:
    if not constraints.admits(space, arch):
      out.append("excluded")
    elif constraints.lock and all(
        arch[[l.name for l in space.layers].index(layer)] == op
        for layer, op in constraints.lock.items()):
      out.append("locked")
    else:
      out.append("open")
  return out


def _colour(score, lo, mid, hi) -> str:
  if score is None or not math.isfinite(score):
    return _GREY
  if score >= mid:
    t, a, b = (score - mid) / ((hi - mid) or 1), _MID, _HIGH
  else:
    t, a, b = (mid - score) / ((mid - lo) or 1), _MID, _LOW
  t = min(max(t, 0.0), 1.0)
  return "#%02x%02x%02x" % tuple(round(x + (y - x) * t) for x, y in zip(a, b))


def _scale(scores):
  known = [s for s in scores if s is not None and math.isfinite(s)]
  if not known:
    return 0.0, 0.5, 1.0
  return min(known), float(np.median(known)), max(known)


# PNG ---------------------------------------------------------------------
def _pyplot():
  from tfopt._plot import pyplot  # pylint: disable=import-outside-toplevel
  return pyplot()


def _save_png(fig, path, overwrite):
  from tfopt._plot import save_png  # pylint: disable=import-outside-toplevel
  save_png(fig, path, overwrite=overwrite, dpi=110)


def scatter_png(path, space, archs, coords, scores, status,
                title: str = "search space", overwrite: bool = False,
                metric: str = "accuracy"):
  """The scatterplot as a PNG; `scores[i]` None = not evaluated."""
  plt = _pyplot()
  lo, mid, hi = _scale(scores)
  fig, ax = plt.subplots(figsize=(6.4, 5.6))
  colours = [_colour(s, lo, mid, hi) for s in scores]
  for kind, marker in (("open", "o"), ("locked", "D"), ("excluded", "X")):
    idx = [i for i, s in enumerate(status) if s == kind]
    if idx:
      ax.scatter(coords[idx, 0], coords[idx, 1], c=[colours[i] for i in idx],
                 marker=marker, s=60, edgecolors="#333333", linewidths=0.6,
                 label=kind)
  best = [i for i, s in enumerate(scores) if s is not None and s == hi]
  for i in best[:1]:
    # Label toward the plot's centre, so a point near an edge keeps its
    # label inside the axes.
    right = coords[i, 0] > float(np.median(coords[:, 0]))
    ax.annotate(space.describe(archs[i]), coords[i], fontsize=7,
                xytext=(-4 if right else 4, 4), textcoords="offset points",
                ha="right" if right else "left")
  ax.set_title(f"{title}\ncolour: one-shot {metric} {lo:.3f} (red) - "
               f"{mid:.3f} (white) - {hi:.3f} (blue), grey: not evaluated",
               fontsize=9)
  ax.set_xlabel("MDS 1 (Hamming distance)")
  ax.set_ylabel("MDS 2")
  ax.legend(fontsize=8, loc="best")
  _save_png(fig, path, overwrite)


def components_png(path, components: dict, overwrite: bool = False,
                   metric: str = "accuracy"):
  """Fitness (mean one-shot score of the sub-graphs containing the
  component) vs frequency (how many were ranked), one point per
  (layer, op)."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6.4, 4.8))
  for (layer, op), (fitness, count) in components.items():
    if math.isfinite(fitness):
      ax.scatter(count, fitness, color="tab:blue")
      ax.annotate(f"{layer}:{op}", (count, fitness), fontsize=7,
                  xytext=(3, 3), textcoords="offset points")
  ax.set_xlabel("frequency (ranked sub-graphs containing it)")
  ax.set_ylabel(f"fitness (their mean one-shot {metric})")
  ax.set_title("components")
  _save_png(fig, path, overwrite)


def curves_png(path, history: dict, overwrite: bool = False):
  """Training curves: every metric of a Keras `History.history` dict."""
  plt = _pyplot()
  keys = [k for k, v in history.items() if len(v)]
  fig, axes = plt.subplots(1, max(1, len(keys)),
                           figsize=(4.2 * max(1, len(keys)), 3.4),
                           squeeze=False)
  for ax, key in zip(axes[0], keys):
    ax.plot(range(1, len(history[key]) + 1), history[key])
    ax.set_xlabel("epoch")
    ax.set_title(key)
  fig.tight_layout()
  _save_png(fig, path, overwrite)


# HTML ----------------------------------------------------------------------
def _svg_scatter(space, archs, coords, scores, status, params, metric):
  width, height, pad = 560, 460, 30
  lo, mid, hi = _scale(scores)
  xs, ys = coords[:, 0], coords[:, 1]
  def sx(x):
    span = (xs.max() - xs.min()) or 1
    return pad + (x - xs.min()) / span * (width - 2 * pad)
  def sy(y):
    span = (ys.max() - ys.min()) or 1
    return height - pad - (y - ys.min()) / span * (height - 2 * pad)
  items = []
  for i, arch in enumerate(archs):
    x, y = sx(xs[i]), sy(ys[i])
    colour = _colour(scores[i], lo, mid, hi)
    score = "not evaluated" if scores[i] is None else f"{scores[i]:.4f}"
    tip = html.escape(f"#{space.index(arch)} {space.describe(arch)}\n"
                      f"one-shot {metric}: {score}\nparams: {params[i]}\n"
                      f"status: {status[i]}")
    base = f'class="pt" data-index="{space.index(arch)}"'
    if status[i] == "excluded":  # a cross in the point's colour
      shape = (f'<path {base} fill="none" stroke="{colour}" '
               f'stroke-width="3" d="M{x - 5:.1f},{y - 5:.1f}L{x + 5:.1f},'
               f'{y + 5:.1f}M{x - 5:.1f},{y + 5:.1f}L{x + 5:.1f},'
               f'{y - 5:.1f}">')
      end = "</path>"
    elif status[i] == "locked":
      shape = (f'<path {base} fill="{colour}" stroke="#333" '
               f'stroke-width="0.8" d="M{x:.1f},{y - 7:.1f}L{x + 7:.1f},'
               f'{y:.1f}L{x:.1f},{y + 7:.1f}L{x - 7:.1f},{y:.1f}Z">')
      end = "</path>"
    else:
      shape = (f'<circle {base} fill="{colour}" stroke="#333" '
               f'stroke-width="0.8" cx="{x:.1f}" cy="{y:.1f}" r="6">')
      end = "</circle>"
    items.append(f"{shape}<title>{tip}</title>{end}")
  return (f'<svg width="{width}" height="{height}" '
          f'style="border:1px solid #ccc">{"".join(items)}</svg>')


def _svg_components(components):
  width, height, pad = 460, 360, 40
  points = [(k, f, c) for k, (f, c) in components.items()
            if math.isfinite(f)]
  if not points:
    return "<p>no component evaluated yet</p>"
  fs = [f for _, f, _ in points]
  cs = [c for _, _, c in points]
  def sx(c):
    return pad + (c - min(cs)) / ((max(cs) - min(cs)) or 1) * (width - 2 * pad)
  def sy(f):
    return height - pad - (f - min(fs)) / ((max(fs) - min(fs)) or 1) * (
        height - 2 * pad)
  items = [
      f'<circle cx="{sx(c):.1f}" cy="{sy(f):.1f}" r="5" fill="#1f77b4">'
      f'<title>{html.escape(f"{l}:{o} fitness {f:.4f}, frequency {c}")}'
      f'</title></circle><text x="{sx(c) + 6:.1f}" y="{sy(f) - 4:.1f}" '
      f'font-size="10">{html.escape(f"{l}:{o}")}</text>'
      for (l, o), f, c in points]
  return (f'<svg width="{width}" height="{height}" style="border:1px solid '
          f'#ccc">{"".join(items)}<text x="{width / 2}" y="{height - 8}" '
          'font-size="11" text-anchor="middle">frequency</text>'
          f'<text x="10" y="16" font-size="11">fitness</text></svg>')


def _svg_curves(history):
  blocks = []
  for key, values in history.items():
    if not values:
      continue
    width, height, pad = 300, 180, 25
    lo, hi = min(values), max(values)
    pts = " ".join(
        f"{pad + i / max(1, len(values) - 1) * (width - 2 * pad):.1f},"
        f"{height - pad - (v - lo) / ((hi - lo) or 1) * (height - 2 * pad):.1f}"
        for i, v in enumerate(values))
    blocks.append(
        f'<svg width="{width}" height="{height}" style="border:1px solid '
        f'#ccc"><polyline points="{pts}" fill="none" stroke="#1f77b4" '
        f'stroke-width="1.5"/><text x="{pad}" y="14" font-size="11">'
        f'{html.escape(key)}: {values[0]:.4g} -> {values[-1]:.4g}</text>'
        '</svg>')
  return "".join(blocks) or "<p>no training history</p>"


_SCRIPT = """
const chosen = new Set();
function refresh() {
  const list = [...chosen].sort((a, b) => a - b).join(",");
  document.getElementById("cmd").textContent = list ?
    "tfopt-nas --mode=steer --run_dir=" + RUN_DIR +
    " --select=" + list + " --how=union" : "(click points to select)";
}
document.querySelectorAll(".pt").forEach(p => p.addEventListener("click",
  () => { const i = +p.dataset.index;
          chosen.has(i) ? chosen.delete(i) : chosen.add(i);
          p.setAttribute("stroke-width", chosen.has(i) ? "3" : "0.8");
          refresh(); }));
refresh();
"""


def report_html(path, space, archs, coords, scores, status, components,
                history, constraints=None, run_dir: str = ".",
                overwrite: bool = False, title: str | None = None,
                metric: str = "accuracy"):
  """The three views in one offline HTML file (see the module doc)."""
  if not len(archs) == len(coords) == len(scores) == len(status):
    raise invalid_argument("scores", f"one entry per architecture "
                           f"({len(archs)})", len(scores))
  params = [space.param_count(a) for a in archs]
  evaluated = sum(s is not None for s in scores)
  lo, mid, hi = _scale(scores)
  # A path with "</script>" in it must not end the script element.
  run_dir_js = json.dumps(run_dir).replace("</", "<\\/")
  steering = html.escape(json.dumps(
      constraints.to_dict() if constraints is not None else {}, indent=1))
  body = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title or space.name)}
</title><style>body{{font-family:sans-serif;margin:20px}}
.row{{display:flex;gap:24px;flex-wrap:wrap}} pre{{background:#f6f6f6;
padding:8px;max-height:240px;overflow:auto}}</style></head><body>
<h2>{html.escape(title or "NAS search: " + space.name)}</h2>
<p>{len(archs)} sub-graphs, {evaluated} evaluated. Colour: one-shot {html.escape(metric)}
{lo:.4f} (red) - {mid:.4f} (white, median) - {hi:.4f} (blue); grey: not
evaluated; cross: excluded by the constraints; diamond: satisfies the locks.
Position: MDS on the Hamming distance between architectures. Hover for
details, click to select.</p>
<div class="row"><div><h3>Search space</h3>
{_svg_scatter(space, archs, coords, scores, status, params, metric)}
<p>Selection as a region edit:</p><pre id="cmd"></pre></div>
<div><h3>Components (fitness vs frequency)</h3>
{_svg_components(components)}</div></div>
<h3>Training curves</h3><div class="row">{_svg_curves(history)}</div>
<h3>Constraints</h3><pre>{steering}</pre>
<script>const RUN_DIR = {run_dir_js};{_SCRIPT}</script>
</body></html>
"""
  atomic_write_text(path, body, overwrite=overwrite)
