"""Matplotlib without a display, and PNGs that appear whole or not at all.

Imported lazily by whatever draws: only reports and CLIs pay for
matplotlib.
"""

from __future__ import annotations

from tfopt._io import atomic_write


def pyplot():
  """matplotlib.pyplot on the Agg backend (no display needed)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def save_png(fig, path, *, overwrite: bool = False, dpi: int = 100) -> None:
  """Writes `fig` to `path` atomically (see `atomic_write`) and closes it."""
  try:
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"),
                 overwrite=overwrite)
  finally:
    pyplot().close(fig)
