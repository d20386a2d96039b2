"""README examples run as written (in a fresh process each)."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _python_block(heading: str) -> str:
  text = (ROOT / "README.md").read_text(encoding="utf-8")
  section = text[text.index(heading):]
  start = section.index("```python\n") + len("```python\n")
  return section[start:section.index("```", start)]


@pytest.mark.slow
def test_compile_hook_example_runs():
  code = _python_block("### Optimize an existing Keras script")
  assert "tfopt.compile(" in code and "model.fit(" in code
  code = code.replace("epochs=2)", "epochs=1, verbose=0)")
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                        capture_output=True, text=True, timeout=600,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "verified on the first batch" in done.stdout
  assert "_FusedMatMul +3" in done.stdout
