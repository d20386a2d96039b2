"""The API reference's checks (tools/build_docs.py) on hand-made modules,
and on the package itself."""

import pathlib
import sys
import types

from tests._tools import load_tool

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _build_docs():
  return load_tool("build_docs")


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


def _docs_site():
  return load_tool("docs_site")


def test_site_pages_render_and_every_link_resolves(tmp_path):
  """README and each guide become pages of one site whose links all land
  (files and #anchors), the pictures copied beside them."""
  site = _docs_site()
  pages = site.write_pages(tmp_path, api=False)
  guides = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
  assert sorted(p.name for p in pages) == sorted(["index.html"] + [
      f"{g}.html" for g in guides])
  assert site.broken_links(pages) == []
  landing = (tmp_path / "index.html").read_text()
  # README's links to guides point at the guides' pages, with anchors.
  assert 'href="guides/compile.html"' in landing
  assert "<table>" in landing  # the generated tables render as tables
  for guide in guides:
    assert f'href="../guides/{guide}.html"' in (
        tmp_path / "guides" / "compile.html").read_text()  # the nav bar


def test_broken_links_are_named(tmp_path):
  site = _docs_site()
  (tmp_path / "b.html").write_text('<h2 id="there">x</h2>')
  page = tmp_path / "a.html"
  page.write_text('<a href="b.html#there">ok</a> <a href="b.html#gone">x</a>'
                  ' <a href="c.html">x</a> <img src="p.png">'
                  ' <a href="https://example.org/x">ext</a>'
                  ' <a href="#self">x</a><h1 id="self">a</h1>')
  assert site.broken_links([page]) == [
      "a.html: b.html#gone: no such anchor", "a.html: c.html: no such file",
      "a.html: p.png: no such file"]


def test_links_are_rewritten_for_the_site():
  site = _docs_site()
  assert site._relink("[g](docs/x.md#a) [p](docs/y.png) [w](https://a.b/c.md)",
                      landing=True) == (
                          "[g](guides/x.html#a) [p](guides/y.png) "
                          "[w](https://a.b/c.md)")
  assert site._relink("[r](../README.md#s) [o](other.md) [i](#here)",
                      landing=False) == (
                          "[r](../index.html#s) [o](other.html) [i](#here)")


def test_code_spans_over_a_line_break_render_as_one():
  site = _docs_site()
  text = "a `x\ny` b ``F `n` must\nbe`` c\n```sh\nq `a\nb`\n```\n"
  assert site._one_line_code_spans(text) == (
      "a `x y` b ``F `n` must be`` c\n```sh\nq `a\nb`\n```\n")
  page = site._page("run `tfopt-place\n--devices=2` now", landing=True,
                    api=False)
  assert "<code>tfopt-place --devices=2</code>" in page


def test_markdown_links_resolve_as_github_renders_them():
  """The site's check reads markdown2's ids; a reader on GitHub follows
  GitHub's: every relative link of README and the guides, file and
  #anchor, resolves there too."""
  pages = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
  assert _docs_site().broken_links(pages, markdown=True) == []


def test_broken_markdown_links_are_named(tmp_path):
  site = _docs_site()
  (tmp_path / "b.md").write_text("# There it is\n")
  page = tmp_path / "a.md"
  page.write_text("[ok](b.md#there-it-is) [x](b.md#gone) [y](c.md)\n"
                  "```\n[in code](nowhere.md)\n```\n")
  assert site.broken_links([page], markdown=True) == [
      "a.md: b.md#gone: no such heading", "a.md: c.md: no such file"]


def test_github_slugs_oracle():
  assert _docs_site().github_slugs(
      "# A / B: c\n## `x.y` z\n## A / B: c\n```\n# no\n```") == {
          "a--b-c", "xy-z", "a--b-c-1"}
