"""How every tfopt console script starts: absl's `app.run`, with the
script's docstring as its help and a usage error reported in two lines (the
error and "see --help") instead of the whole help text."""

from __future__ import annotations

import os
import sys
from typing import Callable, NoReturn

from absl import app, flags

from tfopt.runtime.netns import ALLOW_EXPOSED_ENV

flags.DEFINE_bool(
    "allow_exposed_servers", False,
    "Where the TensorFlow servers this command starts cannot be confined to "
    "a private network namespace (not root), run them on every interface "
    "anyway, with a warning: anyone who reaches the machine can run graphs "
    f"in them. Same as {ALLOW_EXPOSED_ENV}=1.")


def _program() -> str:
  return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "tfopt"


def run_main(main: Callable[[list[str]], int | None], doc: str | None
             ) -> NoReturn:
  """Runs `main` under absl with `doc` as the help text.

  `main`'s return value is the exit status (None: 0). An `app.UsageError`
  raised by `main` or by flag parsing exits 2 (or its own exitcode) after
  printing "<program>: error: <message>" and "see <program> --help".
  """
  # absl's --help prints the __main__ module's docstring; a console script's
  # __main__ is pip's generated wrapper, which has none.
  main_module = sys.modules.get("__main__")
  if main_module is not None and doc:
    main_module.__doc__ = doc

  def guarded(argv):
    if flags.FLAGS.allow_exposed_servers:  # children (workers) inherit it
      os.environ[ALLOW_EXPOSED_ENV] = "1"
    try:
      status = main(argv)
    except app.UsageError as err:
      program = _program()
      sys.stderr.write(f"{program}: error: {err}\nsee {program} --help\n")
      sys.exit(err.exitcode if err.exitcode not in (None, 0, 1) else 2)
    sys.exit(status or 0)

  app.run(guarded)
  raise AssertionError("app.run returned")  # app.run always exits
