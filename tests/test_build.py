"""BUILD and CI wiring, checked against the source tree (a full offline
Bazel build is not available on CI)."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _targets():
  """(rule, name, srcs) of every rule call in BUILD, parsed as Python."""
  tree = ast.parse((ROOT / "BUILD").read_text())
  targets = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
      kwargs = {k.arg: k.value for k in node.keywords}
      if "name" in kwargs:
        srcs = ast.literal_eval(kwargs["srcs"]) if "srcs" in kwargs else []
        targets.append((node.func.id, ast.literal_eval(kwargs["name"]), srcs))
  return targets


def _py_files(folder, pattern="*.py"):
  return {str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob(pattern)}


def test_every_module_and_test_has_a_target():
  targets = _targets()
  names = [t[1] for t in targets]
  assert len(names) == len(set(names)), "duplicate target names"
  # On failure: python tools/update_build.py
  library = {s for rule, _, srcs in targets if rule == "py_library"
             for s in srcs}
  assert _py_files("tfopt") <= library, _py_files("tfopt") - library
  tests = {s for rule, _, srcs in targets if rule == "py_test" for s in srcs}
  assert _py_files("tests", "test_*.py") == tests
  binaries = {s for rule, _, srcs in targets if rule == "py_binary"
              for s in srcs}
  # Scripts: the top-level experiments/ and benchmarks/ modules not named
  # _*.py; their helpers and config files are a library.
  every_script = _py_files("experiments") | _py_files("benchmarks")
  scripts = {p for p in every_script if p.count("/") == 1 and
             not p.rsplit("/", 1)[1].startswith("_")}
  assert scripts == binaries
  assert every_script - scripts <= library, every_script - scripts - library
  every = {s for _, _, srcs in targets for s in srcs}
  assert all((ROOT / s).exists() for s in every), "BUILD names missing files"


def test_ci_runs_make_test_and_readme_gives_both_commands():
  assert re.search(r"^make test$", (ROOT / ".ci/run").read_text(), re.M)
  readme = (ROOT / "README.md").read_text()
  assert "make demo" in readme and "make test" in readme
