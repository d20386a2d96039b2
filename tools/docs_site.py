"""The documentation site: README and the guides (docs/*.md) as HTML pages
beside the API reference, one navigation bar over all of them.

    out/index.html          README (the landing page)
    out/guides/<name>.html  each guide of docs/, benchmarks.md included
    out/api/                the API reference (pdoc, tools/build_docs.py)

Markdown is rendered with markdown2, which pdoc already depends on (no new
dependency; pdoc renders the docstrings with it too). Links between pages
are rewritten from the repository's layout (`docs/x.md#a`, `x.md`,
`../README.md`) to the site's; pictures are copied beside the pages.
`broken_links` checks every link of the pages written here: the file
exists and, for `#anchor`, the target page has that id; with
`markdown=True` it checks README and the guides as GitHub shows them
(its heading slugs).
"""

from __future__ import annotations

import html
import pathlib
import re
import shutil

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDES = ROOT / "docs"
EXTRAS = ["fenced-code-blocks", "tables", "header-ids", "code-friendly"]
_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 0 auto;
       padding: 0 1rem 3rem; line-height: 1.5; color: #1f2328; }
nav { padding: .8rem 0; border-bottom: 1px solid #d0d7de; margin-bottom: 1rem;
      font-size: .95rem; }
nav a { margin-right: .9rem; }
pre { background: #f6f8fa; padding: .8rem; overflow-x: auto; }
code { font-size: .9em; }
table { border-collapse: collapse; font-size: .9rem; }
td, th { border: 1px solid #d0d7de; padding: .25rem .5rem; }
img { max-width: 100%; }
"""


def _title(text: str) -> str:
  first = next((l for l in text.splitlines() if l.startswith("# ")), "tfopt")
  return re.sub(r"[`*]", "", first[2:]).strip()


# The navigation bar's order and labels; a guide not named here follows
# them under its own title.
NAV = {"compile": "tfopt.compile", "placement": "Placement",
       "optimizers": "Optimizers", "pruning": "MoE pruning", "nas": "NAS",
       "scale": "Scale", "export": "Export", "tensorboard": "TensorBoard",
       "demo": "make demo",
       "compatibility": "Compatibility", "benchmarks": "Measured results",
       "security": "Security", "limits": "Limits",
       "development": "Development"}


def _guides() -> list[pathlib.Path]:
  order = list(NAV)
  return sorted(GUIDES.glob("*.md"), key=lambda p: (
      order.index(p.stem) if p.stem in NAV else len(order), p.stem))


def _nav(prefix: str, api: bool) -> str:
  links = [f'<a href="{prefix}index.html"><b>tfopt</b></a>']
  for path in _guides():
    title = NAV.get(path.stem) or _title(path.read_text(encoding="utf-8"))
    links.append(f'<a href="{prefix}guides/{path.stem}.html">'
                 f"{html.escape(title)}</a>")
  if api:
    links.append(f'<a href="{prefix}api/tfopt.html">API reference</a>')
  return "<nav>" + " ".join(links) + "</nav>"


def _relink(markdown: str, *, landing: bool) -> str:
  """The repository's links as the site's."""
  def fix(match):
    target = match.group(2)
    if re.match(r"[a-z]+:", target) or target.startswith("#"):
      return match.group(0)
    path, _, anchor = target.partition("#")
    anchor = f"#{anchor}" if anchor else ""
    if landing and path.startswith("docs/"):
      path = "guides/" + path[len("docs/"):]
    elif not landing and path == "../README.md":
      path = "../index.html"
    path = re.sub(r"\.md$", ".html", path)
    return f"{match.group(1)}({path}{anchor})"
  return re.sub(r"(\]\s*)\(([^)\s]+)\)", fix, markdown)


def _one_line_code_spans(markdown: str) -> str:
  """Inline code spans joined onto one line: CommonMark (and GitHub) let a
  span run over a line break, markdown2 does not."""
  def join(match):
    return match.group(0).replace("\n", " ")
  parts = re.split(r"(^```.*?^```)", markdown, flags=re.S | re.M)
  return "".join(
      part if part.startswith("```") else
      re.sub(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", join, part, flags=re.S)
      for part in parts)


def _page(markdown: str, *, landing: bool, api: bool) -> str:
  import markdown2  # pylint: disable=g-import-not-at-top
  body = markdown2.markdown(
      _one_line_code_spans(_relink(markdown, landing=landing)),
      extras=EXTRAS)
  prefix = "" if landing else "../"
  return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\">"
          f"<title>{html.escape(_title(markdown))}</title>"
          f"<style>{_STYLE}</style></head><body>{_nav(prefix, api)}\n"
          f"{body}</body></html>\n")


def _copy_pictures(markdown: str, page_dir: pathlib.Path,
                   source_dir: pathlib.Path, out: pathlib.Path) -> None:
  """Each picture a page shows, copied to where the page's link points."""
  for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", markdown):
    source = (source_dir / target).resolve()
    if not source.is_file():
      continue  # broken_links reports it
    if source_dir == ROOT and target.startswith("docs/"):
      target = "guides/" + target[len("docs/"):]
    dest = (page_dir / target).resolve()
    if out.resolve() not in dest.parents:
      dest = out / source.relative_to(ROOT)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)


def write_pages(out: pathlib.Path, *, api: bool) -> list[pathlib.Path]:
  """README and every guide as HTML under `out`; the pages written."""
  out.mkdir(parents=True, exist_ok=True)
  (out / "guides").mkdir(exist_ok=True)
  readme = (ROOT / "README.md").read_text(encoding="utf-8")
  written = [out / "index.html"]
  written[0].write_text(_page(readme, landing=True, api=api),
                        encoding="utf-8")
  _copy_pictures(readme, out, ROOT, out)
  for path in _guides():
    text = path.read_text(encoding="utf-8")
    page = out / "guides" / f"{path.stem}.html"
    page.write_text(_page(text, landing=False, api=api), encoding="utf-8")
    # A guide's "../benchmarks/results/x.png" lands at out/benchmarks/...
    _copy_pictures(text, out / "guides", GUIDES, out)
    written.append(page)
  return written


def html_ids(text: str) -> set[str]:
  """The anchors of an HTML page: its elements' ids."""
  return set(re.findall(r'\sid="([^"]+)"', text))


def github_slugs(markdown: str) -> set[str]:
  """The anchors GitHub gives a Markdown page's headings (github-slugger:
  lower case, punctuation dropped, spaces to hyphens, repeats -1, -2)."""
  seen: dict[str, int] = {}
  slugs = set()
  text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
  for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    slugs.add(slug if n == 0 else f"{slug}-{n}")
  return slugs


def _html_targets(text: str) -> list[str]:
  return re.findall(r'(?:href|src)="([^"]+)"', text)


def _markdown_targets(text: str) -> list[str]:
  prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
  return re.findall(r"\]\(([^)\s]+)\)", prose)


def broken_links(pages: list[pathlib.Path], *, markdown: bool = False
                 ) -> list[str]:
  """Every link of `pages` whose file or anchor is missing, one line each.

  HTML pages (the site): href/src targets, anchors as the pages' ids.
  `markdown`: Markdown pages as GitHub shows them: link targets outside
  code blocks, anchors as GitHub slugs the target's headings.
  """
  targets_of, suffix, anchors_of, what = (
      (_markdown_targets, ".md", github_slugs, "heading") if markdown else
      (_html_targets, ".html", html_ids, "anchor"))
  anchors: dict[pathlib.Path, set[str]] = {}
  found = []
  for page in pages:
    for target in targets_of(page.read_text(encoding="utf-8")):
      if re.match(r"[a-z]+:", target):
        continue
      path, _, anchor = target.partition("#")
      file = (page.parent / path).resolve() if path else page
      if not file.is_file():
        found.append(f"{page.name}: {target}: no such file")
        continue
      if not anchor or file.suffix != suffix:
        continue
      if file not in anchors:
        anchors[file] = anchors_of(
            file.read_text(encoding="utf-8", errors="replace"))
      if anchor not in anchors[file]:
        found.append(f"{page.name}: {target}: no such {what}")
  return found
