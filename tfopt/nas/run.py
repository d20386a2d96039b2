"""A search's run directory: everything a search writes, and reads back.

    run.json              manifest (format tfopt.nas.run/1, settings, files)
    space.json            the SearchSpace
    constraints.json      the analyst's steering (tfopt.nas.Constraints)
    supernet.weights.h5   the trained super-network's weights
    history.csv           training curves (one row per epoch)
    subgraphs.csv         one row per sub-graph: index, ops, params, status,
                          one-shot score (empty = not evaluated)
    components.csv        layer, op, fitness, frequency
    search_space.png / components.png / curves.png / report.html
    export/               the chosen sub-graph (model.keras, saved_model/)

Every file is written atomically; a run directory that exists is only
reused by the `RunDir` methods that say so. A missing or corrupt file is
reported with its path and what was expected there.
"""

from __future__ import annotations

import csv
import io
import json
import os
from typing import TYPE_CHECKING

from tfopt._errors import invalid_argument
from tfopt._io import atomic_write, atomic_write_text
from tfopt.nas.space import SearchSpace
from tfopt.nas.steering import Constraints

if TYPE_CHECKING:  # tfopt.nas.ranking imports Keras: steering does not need it
  from tfopt.nas.ranking import Ranking

FORMAT = "tfopt.nas.run/1"
FILES = {"manifest": "run.json", "space": "space.json",
         "constraints": "constraints.json",
         "weights": "supernet.weights.h5", "history": "history.csv",
         "subgraphs": "subgraphs.csv", "components": "components.csv",
         "scatter": "search_space.png", "components_png": "components.png",
         "curves": "curves.png", "html": "report.html", "export": "export"}


# Spaces up to this size are listed (CSV, scatterplot) whole; larger ones
# by their ranked sub-graphs.
_LIST_ALL_UP_TO = 4096


def _listed_archs(space: SearchSpace, scores: dict) -> list:
  return (list(space.enumerate()) if space.size <= _LIST_ALL_UP_TO else
          sorted(scores, key=space.index))


class RunDir:
  """The files of one search (see the module doc)."""

  def __init__(self, path: str):
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
      raise invalid_argument("run_dir", "a directory path", path)
    self.path = os.fspath(path)

  def file(self, key: str) -> str:
    return os.path.join(self.path, FILES[key])

  def exists(self, key: str) -> bool:
    return os.path.exists(self.file(key))

  # Creation and the manifest ---------------------------------------------
  def create(self, space: SearchSpace, settings: dict | None = None,
             overwrite: bool = False) -> None:
    """Starts a run: manifest, space and an empty constraints file. An
    existing run is replaced only with `overwrite` (its other files stay
    until rewritten)."""
    if self.exists("manifest") and not overwrite:
      raise invalid_argument("run_dir", "a new directory (or overwrite=True "
                             "to replace the run in it)", self.path,
                             FileExistsError)
    os.makedirs(self.path, exist_ok=True)
    atomic_write_text(self.file("space"), space.to_json(), overwrite=True)
    if not self.exists("constraints") or overwrite:
      Constraints().save(self.file("constraints"))
    self.write_manifest(settings or {}, overwrite=True)

  def write_manifest(self, settings: dict, overwrite: bool = True) -> None:
    manifest = {"format": FORMAT, "settings": settings,
                "files": {k: v for k, v in FILES.items()
                          if os.path.exists(os.path.join(self.path, v))}}
    atomic_write_text(self.file("manifest"), json.dumps(manifest, indent=1),
                      overwrite=overwrite)

  def _json(self, key: str, what: str) -> dict:
    path = self.file(key)
    if not os.path.exists(path):
      raise invalid_argument("run_dir", f"a run directory with {what} "
                             f"({FILES[key]}; is it a run directory? "
                             "start one with --mode=search)", self.path,
                             FileNotFoundError)
    try:
      with open(path, encoding="utf-8") as f:
        return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
      raise invalid_argument(FILES[key], f"valid JSON ({err})", path) \
          from None

  def manifest(self) -> dict:
    data = self._json("manifest", "a manifest")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
      raise invalid_argument(FILES["manifest"], f"a manifest in format "
                             f"{FORMAT}", self.file("manifest"))
    return data

  def space(self) -> SearchSpace:
    self.manifest()
    try:
      return SearchSpace.from_dict(self._json("space", "a search space"))
    except ValueError as err:
      raise invalid_argument(FILES["space"], f"a search space ({err})",
                             self.file("space")) from None

  def constraints(self, space: SearchSpace | None = None) -> Constraints:
    return Constraints.load(self.file("constraints"), space or self.space())

  # Super-network weights --------------------------------------------------
  def save_supernet(self, net) -> None:
    # The temporary name ends in ".weights.h5" too, as Keras requires.
    atomic_write(self.file("weights"), net.save_weights, overwrite=True)

  def load_supernet(self, execution: str = "switch"):
    """A `SuperNet` of the run's space with the saved weights."""
    from tfopt.nas.supernet import SuperNet  # pylint: disable=import-outside-toplevel
    net = SuperNet(self.space(), execution=execution)
    path = self.file("weights")
    if not os.path.exists(path):
      raise invalid_argument("run_dir", "a run with trained super-network "
                             f"weights ({FILES['weights']}; run "
                             "--mode=search first)", self.path,
                             FileNotFoundError)
    try:
      net.load_weights(path)
    except (OSError, ValueError) as err:
      raise invalid_argument(FILES["weights"], "the weights of this run's "
                             f"super-network ({type(err).__name__}: "
                             f"{str(err)[:200]})", path) from None
    return net

  # CSVs -------------------------------------------------------------------
  def _write_csv(self, key: str, header: list, rows: list) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    atomic_write_text(self.file(key), buffer.getvalue(), overwrite=True)

  def _read_csv(self, key: str, header: list) -> tuple:
    """(header row, data rows); the header must start with `header`."""
    path = self.file(key)
    if not os.path.exists(path):
      raise invalid_argument("run_dir", f"a run with {FILES[key]}",
                             self.path, FileNotFoundError)
    with open(path, encoding="utf-8", newline="") as f:
      rows = list(csv.reader(f))
    if not rows or rows[0][:len(header)] != header:
      raise invalid_argument(FILES[key], f"a CSV file with columns {header}",
                             rows[0] if rows else path)
    return rows[0], rows[1:]

  def write_history(self, history: dict) -> None:
    keys = sorted(history)
    epochs = max((len(history[k]) for k in keys), default=0)
    self._write_csv("history", ["epoch"] + keys, [
        [e + 1] + [history[k][e] if e < len(history[k]) else ""
                   for k in keys] for e in range(epochs)])

  def history(self) -> dict:
    path = self.file("history")
    if not os.path.exists(path):
      return {}
    with open(path, encoding="utf-8", newline="") as f:
      rows = list(csv.reader(f))
    if not rows or rows[0][:1] != ["epoch"]:
      raise invalid_argument(FILES["history"], "a CSV with an epoch column",
                             path)
    try:
      return {k: [float(r[i + 1]) for r in rows[1:] if r[i + 1] != ""]
              for i, k in enumerate(rows[0][1:])}
    except (ValueError, IndexError) as err:
      raise invalid_argument(FILES["history"], f"numbers ({err})", path) \
          from None

  def write_ranking(self, ranking: Ranking, space: SearchSpace,
                    constraints: Constraints | None = None) -> None:
    """subgraphs.csv (every sub-graph when the space is small enough to
    list, else the ranked ones) and components.csv."""
    from tfopt.nas.views import statuses  # pylint: disable=import-outside-toplevel
    scores = dict(ranking.scores)
    archs = _listed_archs(space, scores)
    status = statuses(space, archs, constraints)
    names = [l.name for l in space.layers]
    self._write_csv("subgraphs", ["index"] + names + [
        "params", "status", f"oneshot_{ranking.score}"], [
            [space.index(a)] + list(a) + [space.param_count(a), st,
                                          scores.get(a, "")]
            for a, st in zip(archs, status)])
    self._write_csv("components", ["layer", "op", "fitness", "frequency"],
                    [[l, o, f, c] for (l, o), (f, c) in
                     ranking.components.items()])

  def ranking(self, space: SearchSpace | None = None) -> Ranking:
    """The ranking written by `write_ranking` (scores best first)."""
    space = space or self.space()
    names = [l.name for l in space.layers]
    scores = []
    header, rows = self._read_csv("subgraphs", ["index"] + names)
    # The score column says which score the ranking used.
    metric = header[-1][len("oneshot_"):] if header[-1].startswith(
        "oneshot_") else "accuracy"
    try:
      for row in rows:
        arch = space.check_arch(row[1:1 + len(names)])
        if row[-1] != "":
          scores.append((arch, float(row[-1])))
      _, rows = self._read_csv("components",
                               ["layer", "op", "fitness", "frequency"])
      components = {(r[0], r[1]): (float(r[2]), int(r[3])) for r in rows}
    except (ValueError, IndexError) as err:
      raise invalid_argument("run_dir", f"a run whose subgraphs.csv and "
                             f"components.csv fit its space ({err})",
                             self.path) from None
    scores.sort(key=lambda item: (-item[1], space.index(item[0])))
    from tfopt.nas.ranking import Ranking  # pylint: disable=import-outside-toplevel
    return Ranking(scores, components, "read", metric)

  # Views --------------------------------------------------------------------
  def write_views(self, space: SearchSpace, ranking: Ranking | None,
                  constraints: Constraints | None, history: dict) -> list:
    """The scatterplot, component view and curves (PNGs) and report.html.
    Returns the paths written."""
    from tfopt.nas import views  # pylint: disable=import-outside-toplevel
    scores = dict(ranking.scores) if ranking is not None else {}
    archs = _listed_archs(space, scores)
    if not archs:
      return []
    coords = views.hamming_mds(space, archs)
    values = [scores.get(a) for a in archs]
    status = views.statuses(space, archs, constraints)
    components = ranking.components if ranking is not None else {}
    metric = ranking.score if ranking is not None else "accuracy"
    views.scatter_png(self.file("scatter"), space, archs, coords, values,
                      status, title=f"{space.name}: one-shot {metric}",
                      overwrite=True, metric=metric)
    views.components_png(self.file("components_png"), components,
                         overwrite=True, metric=metric)
    views.curves_png(self.file("curves"), history, overwrite=True)
    views.report_html(self.file("html"), space, archs, coords, values,
                      status, components, history, constraints,
                      run_dir=self.path, overwrite=True, metric=metric)
    return [self.file(k) for k in ("scatter", "components_png", "curves",
                                   "html")]

