"""Checks what a built tfopt wheel holds: the package and its data (the
shipped workloads and their license), the console scripts, and nothing of
the repository's tests, benchmarks, results or pictures.

    python tools/wheel_contents.py dist/tfopt-0.1.0-py3-none-any.whl
"""

import sys
import zipfile

REQUIRED = ("tfopt/__init__.py", "tfopt/cli/place.py",
            "tfopt/data/costgraphs/LICENSE",
            "tfopt/data/costgraphs/msr_gnmt_training_layers.json")
FORBIDDEN_PREFIXES = ("tests/", "benchmarks/", "experiments/", "docs/",
                      "tools/", "third_party/")
FORBIDDEN_SUFFIXES = (".png", ".h5", ".pyc")


def main(path: str) -> None:
  names = zipfile.ZipFile(path).namelist()
  missing = [n for n in REQUIRED if n not in names]
  stray = [n for n in names if n.startswith(FORBIDDEN_PREFIXES) or
           n.endswith(FORBIDDEN_SUFFIXES)]
  entry_points = next((n for n in names if n.endswith("entry_points.txt")),
                      None)
  scripts = (zipfile.ZipFile(path).read(entry_points).decode()
             if entry_points else "")
  if missing or stray or "tfopt-place" not in scripts:
    sys.exit(f"{path}: missing {missing}, should not hold {stray[:10]}, "
             f"console scripts: {scripts!r}")
  print(f"{path}: {len(names)} files, the workloads and console scripts in, "
        f"no tests, benchmarks or pictures")


if __name__ == "__main__":
  if len(sys.argv) != 2:
    sys.exit("usage: python tools/wheel_contents.py WHEEL")
  main(sys.argv[1])
