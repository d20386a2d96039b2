"""Builds tfopt's documentation site: README as the landing page, the
guides of docs/ (the benchmark page included) and the API reference from
the docstrings (pdoc, under api/), one navigation bar over all
(tools/docs_site.py). Before building it checks the docstrings: every
public module has a docstring, every name a package exports in `__all__`
exists (a broken reference fails) and, when it is a class or function, has
a docstring of its own. After building, every link of the README and guide
pages must resolve (file and #anchor), or the build fails. Where Chromium
is installed it also takes headless screenshots of the landing page and a
guide (`screenshots/`), so a person can look at what a reader sees.

    python tools/build_docs.py --out=build/docs     # what `make docs` runs
    python tools/build_docs.py --check              # the checks alone

The API reference's own index is `tfopt`'s docstring: one line per
capability, with its modules and its guide.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import pathlib
import pkgutil
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Each console script's module defines its absl flags at import (two of them
# in one process would collide): the reference documents `tfopt.cli` itself.
SKIPPED_PREFIXES = ("tfopt.cli.",)


def public_modules() -> list[str]:
  """tfopt and its public submodules (no `_private` part, no scripts)."""
  import tfopt
  names = ["tfopt"]
  for info in pkgutil.walk_packages(tfopt.__path__, "tfopt."):
    if any(part.startswith("_") for part in info.name.split(".")):
      continue
    if info.name.startswith(SKIPPED_PREFIXES):
      continue
    names.append(info.name)
  return sorted(names)


def problems(modules: list[str]) -> list[str]:
  """What the reference would show wrong, one line each."""
  found = []
  for name in modules:
    module = importlib.import_module(name)
    if not (module.__doc__ or "").strip():
      found.append(f"{name}: module without a docstring")
    for export in getattr(module, "__all__", ()):
      try:
        obj = getattr(module, export)
      except AttributeError:
        found.append(f"{name}.__all__ names {export!r}, which does not exist")
        continue
      # Lazily exported names (tfopt._lazy) enter the module's namespace, so
      # that pdoc, which reads it, documents them where they are exported.
      vars(module).setdefault(export, obj)
      if (inspect.isclass(obj) or inspect.isfunction(obj)) and not (
          inspect.getdoc(obj) or "").strip():
        found.append(f"{name}.{export}: exported without a docstring")
  return found


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="build/docs",
                      help="Folder for the site.")
  parser.add_argument("--check", action="store_true",
                      help="Only check the docstrings; write nothing.")
  args = parser.parse_args(argv)
  modules = public_modules()
  wrong = problems(modules)
  for line in wrong:
    print(line, file=sys.stderr)
  if wrong:
    print(f"{len(wrong)} docstring problem(s); no reference built",
          file=sys.stderr)
    return 1
  if args.check:
    print(f"{len(modules)} modules checked")
    return 0
  import pdoc  # pylint: disable=g-import-not-at-top
  pdoc.render.configure(docformat="google", show_source=False)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pdoc.pdoc(*modules, output_directory=pathlib.Path(args.out) / "api")
  pdoc_problems = [str(w.message) for w in caught
                   if w.filename.startswith(os.path.dirname(pdoc.__file__))
                   # A package without __all__ brings its submodules along,
                   # which the list names again: one page each all the same.
                   and "has already been added" not in str(w.message)]
  for line in pdoc_problems:
    print(f"pdoc: {line}", file=sys.stderr)
  if pdoc_problems:
    return 1
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
  import docs_site  # pylint: disable=g-import-not-at-top
  out = pathlib.Path(args.out)
  pages = docs_site.write_pages(out, api=True)
  broken = docs_site.broken_links(pages)
  for line in broken:
    print(f"broken link: {line}", file=sys.stderr)
  if broken:
    return 1
  _screenshots(out)
  print(f"site: {out}/index.html ({len(pages)} pages; API reference of "
        f"{len(modules)} modules under {out}/api)")
  return 0


def _screenshots(out: pathlib.Path) -> None:
  """Headless Chromium pictures of the landing page and a guide, where
  Debian's Chromium is installed (not needed in CI)."""
  import shutil  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  browser = shutil.which("chromium") or shutil.which("chromium-browser")
  if browser is None:
    print("no Chromium here: no screenshots")
    return
  (out / "screenshots").mkdir(exist_ok=True)
  for page in ("index.html", "guides/compile.html"):
    png = out / "screenshots" / (page.replace("/", "_")[:-5] + ".png")
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                    f"--screenshot={png}", "--window-size=1280,1600",
                    (out / page).resolve().as_uri()],
                   capture_output=True, timeout=120, check=False)
    print(f"screenshot: {png}" if png.exists() else
          f"Chromium wrote no screenshot of {page}")


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
