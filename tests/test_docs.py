"""The API reference's checks (tools/build_docs.py) on hand-made modules,
and on the package itself."""

import importlib.util
import pathlib
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _build_docs():
  spec = importlib.util.spec_from_file_location(
      "build_docs", ROOT / "tools" / "build_docs.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _fake(name, doc, **members):
  module = types.ModuleType(name, doc)
  for key, value in members.items():
    setattr(module, key, value)
  sys.modules[name] = module
  return name


def test_checks_catch_missing_docstrings_and_broken_exports():
  docs = _build_docs()

  def documented():
    """Has one."""

  def bare():
    pass

  try:
    good = _fake("fake_docs_good", "A module.", documented=documented,
                 CONSTANT=3, __all__=["documented", "CONSTANT"])
    bad = _fake("fake_docs_bad", None, bare=bare,
                __all__=["bare", "missing"])
    assert docs.problems([good]) == []
    assert docs.problems([bad]) == [
        "fake_docs_bad: module without a docstring",
        "fake_docs_bad.bare: exported without a docstring",
        "fake_docs_bad.__all__ names 'missing', which does not exist"]
  finally:
    sys.modules.pop("fake_docs_good", None)
    sys.modules.pop("fake_docs_bad", None)


def test_every_public_module_passes_the_checks():
  docs = _build_docs()
  modules = docs.public_modules()
  assert "tfopt.placement" in modules and "tfopt.cli" in modules
  assert not any(m.startswith("tfopt.cli.") for m in modules)
  assert docs.problems(modules) == []
