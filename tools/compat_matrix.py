"""Runs the compatibility suite and writes what it found: the matrix of
model families x paths (`tests/compat/test_matrix.py`), as JSON
(`tests/compat/matrix.json`) and as the Markdown table in README.md and
docs/compatibility.md, between their `compat-matrix` markers.

    .venv/bin/python tools/compat_matrix.py          # the whole suite
    .venv/bin/python tools/compat_matrix.py --render # only re-render

A cell reads "pass" only when its test passed in that run; the table is
never edited by hand (tests/compat/test_matrix.py checks that README's
table is this script's rendering of the committed JSON).
"""

from __future__ import annotations

import datetime
import json
import pathlib
import platform
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "tests" / "compat" / "matrix.json"
PAGES = (ROOT / "README.md", ROOT / "docs" / "compatibility.md")
BEGIN = "<!-- compat-matrix:begin (tools/compat_matrix.py) -->"
END = "<!-- compat-matrix:end -->"
SYMBOLS = {"passed": "pass", "failed": "FAIL", "skipped": "skipped"}


class _Recorder:
  """A pytest plugin keeping each cell's outcome."""

  def __init__(self):
    self.outcomes: dict[tuple[str, str], str] = {}

  def pytest_runtest_logreport(self, report):
    cell = dict(report.user_properties).get("cell")
    if cell is None:
      return
    key = tuple(cell)
    if report.when == "call" or report.outcome != "passed":
      # A failed or skipped set-up is the cell's outcome; else the call's.
      if self.outcomes.get(key) not in ("failed",):
        self.outcomes[key] = report.outcome


def run_suite() -> dict:
  """The suite's outcomes as the JSON document."""
  import pytest  # pylint: disable=g-import-not-at-top
  recorder = _Recorder()
  # The README check reads what this run writes: not part of the run.
  code = pytest.main(["-q", "-p", "no:cacheprovider", "-n", "2",
                      "--dist", "loadgroup", "-k",
                      "not test_readme_matrix_is_generated",
                      str(ROOT / "tests" / "compat" / "test_matrix.py")],
                     plugins=[recorder])
  sys.path.insert(0, str(ROOT))
  from tests.compat.test_matrix import EXCEPTIONS, PATHS, applies  # pylint: disable=g-import-not-at-top
  from tests.compat.families import FAMILIES  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  def cell(family, path):
    outcome = recorder.outcomes.get((family.name, path))
    if outcome is None:
      return applies(family, path)
    # An exception's cell passes when its reason still holds.
    if outcome == "passed" and (family.name, path) in EXCEPTIONS:
      return applies(family, path)
    return outcome

  rows = [{"family": f.name, "cells": {p: cell(f, p) for p in PATHS}}
          for f in FAMILIES]
  return {"paths": list(PATHS), "rows": rows, "pytest_exit": int(code),
          "exceptions": {f"{n} / {p}": f"{status}: {why}"
                         for (n, p), (status, why) in EXCEPTIONS.items()},
          "date": datetime.date.today().isoformat(),
          "versions": {"tensorflow": tf.__version__,
                       "keras": keras.__version__,
                       "python": platform.python_version()}}


def render(results: dict) -> str:
  """The Markdown table of a results document."""
  paths = results["paths"]
  lines = ["| model family | " + " | ".join(paths) + " |",
           "|---|" + "---|" * len(paths)]
  for row in results["rows"]:
    cells = [SYMBOLS.get(row["cells"][p], row["cells"][p]) for p in paths]
    lines.append(f"| {row['family']} | " + " | ".join(cells) + " |")
  versions = results["versions"]
  lines.append("")
  lines.append(f"From `python tools/compat_matrix.py` on {results['date']} "
               f"(TensorFlow {versions['tensorflow']}, Keras "
               f"{versions['keras']}); every cell runs in CI. n/a: the path "
               f"does not apply (pruning is for MoE models). The other "
               f"cells that do not read pass, and why (each cell's test "
               f"checks that the reason still holds):")
  for cell, why in sorted(results.get("exceptions", {}).items()):
    lines.append(f"- {cell}: {why}.")
  return "\n".join(lines)


def write_pages(results: dict) -> None:
  table = render(results)
  for page in PAGES:
    text = page.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    if not rest:
      raise SystemExit(f"{page}: no {BEGIN!r} marker")
    page.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def main(argv) -> int:
  if "--render" in argv:
    results = json.loads(RESULTS.read_text())
  else:
    results = run_suite()
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
  write_pages(results)
  print(render(results))
  return 0 if results["pytest_exit"] == 0 else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
