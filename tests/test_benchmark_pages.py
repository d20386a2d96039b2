"""The published numbers are the committed benchmark results, rendered.

docs/benchmarks.md and README's headline table are written by
tools/benchmark_pages.py from benchmarks/results/*.json; a page that
disagrees with the JSON beside it (a benchmark rerun without rerunning the
script, or a figure edited by hand) fails here.
"""

import copy
import json
import pathlib

from tests._tools import load_tool

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _pages():
  return load_tool("benchmark_pages")


def test_committed_pages_are_the_rendering_of_the_results():
  pages = _pages()
  for path, text in pages.pages().items():
    committed = path.read_text(encoding="utf-8")
    assert committed == text, (
        f"{path.relative_to(ROOT)} differs from tools/benchmark_pages.py's "
        "rendering of benchmarks/results: run the script")


def test_figures_follow_the_json(monkeypatch):
  """A changed result changes the page: the figures are read, not typed."""
  pages = _pages()
  original = pages.load

  def edited(name):
    data = copy.deepcopy(original(name))
    if name == "scale":
      data["checkpoint"]["blocking_ratio"] = 123.4
    if name == "runtime":
      data["speedup"]["speedup"] = 9.87
      data["placed"][0]["measured_over_simulated_after"] = 2.0  # a miss
    return data

  monkeypatch.setattr(pages, "load", edited)
  table = pages.headline()
  assert "123.4x less" in table and "9.87x faster" in table
  n = len(original("runtime")["placed"])
  within = sum(abs(r["measured_over_simulated_after"] - 1) <= 0.25
               for r in original("runtime")["placed"])
  assert f"within 25 % on {within - 1} of {n} rows" in table
  assert "**9.87x**" in pages.runtime_section()


def test_every_results_file_is_published(monkeypatch):
  """Each results JSON feeds the pages and each picture is shown (a new
  benchmark gets a section)."""
  pages = _pages()
  read = set()
  original = pages.load

  def recording(name):
    read.add(name)
    return original(name)

  monkeypatch.setattr(pages, "load", recording)
  guide = pages.guide() + pages.headline()
  results = ROOT / "benchmarks" / "results"
  for path in results.glob("*.json"):
    json.loads(path.read_text())
    assert path.stem in read, f"{path.name} is not rendered"
  for path in results.glob("*.png"):
    assert f"../benchmarks/results/{path.name})" in guide, (
        f"{path.name} is not shown")


def test_readme_block_is_replaced_not_appended():
  pages = _pages()
  text = f"before\n{pages.BEGIN}\nold table\n{pages.END}\nafter\n"
  out = pages.render_readme(text)
  assert out.startswith("before\n") and out.endswith("\nafter\n")
  assert "old table" not in out and out.count(pages.BEGIN) == 1
