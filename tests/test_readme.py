"""README's and the guides' (docs/*.md) commands run as written (each in
a fresh process).

- Every ```sh block of README.md and docs/*.md runs, its commands in order, with /tmp/ paths moved
  into the test's temporary directory; each command's output is checked
  against what the README (and the config's docstring) says it prints.
  `make demo-cnn` runs the Makefile's recipe; `make demo` (minutes) is
  tests/test_demo.py's, with --quick; `make test` is this suite.
- Every ```python block compiles; README's `tfopt.compile` quickstart and
  two guide examples (the clock, the hook) run.
- Every other command named in the README or a guide, in a config's
  docstring or in a
  script's docstring (the longer runs and the benchmarks, minutes each) is
  parsed by its script: the module imports, every flag exists and takes its
  value, and a --config file loads with known keys.
- Every experiment script has a config whose command is in a README block,
  so each script runs with its smallest config in CI.
"""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from tfopt.cli import COMMANDS

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# What a reader runs: README, then each guide.
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
DOCS = "\n".join(p.read_text(encoding="utf-8") for p in PAGES)
CONFIGS = sorted(p for p in (ROOT / "experiments" / "configs").glob("*.py")
                 if p.name != "__init__.py")
# The console scripts' modules, and the research scripts beside the configs.
SCRIPTS = sorted(p for folder in ("tfopt/cli", "experiments")
                 for p in (ROOT / folder).glob("*.py")
                 if not p.name.startswith("_"))
BIN = pathlib.Path(sys.executable).parent  # where pip put the console scripts


def _command_name(script: pathlib.Path) -> str:
  """The console script of a tfopt/cli module, or `python -m experiments.X`'s
  module for a research script."""
  module = ".".join(script.relative_to(ROOT).with_suffix("").parts)
  names = [c for c, m in COMMANDS.items() if m == module]
  return names[0] if names else module


def _python_block(heading: str) -> str:
  section = DOCS[DOCS.index(heading):]
  start = section.index("```python\n") + len("```python\n")
  return section[start:section.index("```", start)]


def _commands(text: str) -> list[str]:
  """Shell lines of a block or docstring: continuations joined, comments
  dropped."""
  text = re.sub(r"\\\n\s*", " ", text)
  out = []
  for line in text.splitlines():
    line = line.split(" #")[0].strip()
    if line and not line.startswith("#"):
      out.append(" ".join(line.split()))
  return out


def _sh_blocks() -> list[list[str]]:
  return [_commands(b) for b in re.findall(r"```sh\n(.*?)```", DOCS,
                                           flags=re.S)]


def _docstring_commands(path: pathlib.Path) -> list[str]:
  import ast
  doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
  return [c for c in _commands(doc)
          if c.startswith("python -m ") or c.split(" ")[0] in COMMANDS]


def _inline_commands() -> list[str]:
  return [" ".join(c.split()) for c in re.findall(
      r"`((?:python\s+-m|tfopt-[a-z-]+)\s[^`]+)`", DOCS)]


def _run(command: str, tmp: pathlib.Path) -> subprocess.CompletedProcess:
  argv = shlex.split(command.replace("/tmp/", f"{tmp}/"))
  if argv[:2] == ["make", "demo-cnn"]:
    recipe = subprocess.run(["make", "-n", "demo-cnn"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    line = next(c for c in _commands(recipe) if "tfopt-" in c)
    argv = shlex.split(line)
    argv = [a.replace(".demo-cnn", str(tmp / "demo")) for a in argv
            if "=" not in a or not a.split("=")[0].isupper()]
    argv[0] = os.path.basename(argv[0])
  if argv[0] in COMMANDS:
    argv[0] = str(BIN / argv[0])  # the installed console script itself
  else:
    assert argv[0] in ("python", ".venv/bin/python"), command
    argv[0] = sys.executable
  return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                        timeout=900, check=False)


def _check_output(command: str, out: str, seen: dict) -> None:
  """What the README and the configs say each command prints."""
  if command == "make demo-cnn":
    for line in ("<- chosen", "ran where planned", "across 4 server "
                 "processes", "PredictRequest over gRPC"):
      assert line in out, (line, out[-3000:])
  elif command.startswith("tfopt-profile"):
    assert "critical path" in out and "wrote" in out
  elif command.startswith("tfopt-calibrate"):
    assert "calibrated logical x2" in out and "wrote" in out, out[-2000:]
  elif command.startswith("tfopt-run-placed"):
    assert "chosen by measurement" in out, out[-3000:]
    assert "ran where planned" in out and "simulated" in out, out[-3000:]
  elif command.startswith("tfopt-place"):
    assert re.search(r"feasible\s+True", out), out[-2000:]
    if "place_gnmt_4dev" in command:
      assert "m-sct/coarse+refine" in out and "374.12 ms" in out, \
          out[-2000:]
  elif command.startswith("tfopt-train"):
    final = re.search(r"val_accuracy (\d\.\d+)", out)
    assert final and float(final.group(1)) >= 0.9, out[-2000:]
    if "placed" in command:
      assert "ops ran where planned" in out
      assert "devices used: ['/device:CPU:0', '/device:CPU:1']" in out
  elif command.startswith("tfopt-fit-across"):
    assert out.count("equal (rtol 1e-5)") == 2, out[-3000:]
    # No fewer devices than the live bytes over the cap, no more than the
    # 4 it trained on (m-pack may pack it onto 3; CI saw both), as
    # tests/test_compile_placement.py checks.
    fewest = re.search(r"of ([\d.]+) MB each \(memory_per_device\): it "
                       r"needs (\d+) MB live at once.*?on which a plan was "
                       r"found: (\d+)", out)
    assert fewest and "variables unchanged: True" in out, out[-3000:]
    cap, needed, found = fewest.groups()
    assert -(-int(needed) // float(cap)) <= int(found) <= 4, out[-3000:]
  elif command.startswith("tfopt-prune-moe"):
    ratio = dict(re.findall(r"^(\w+)\s+50%\s+[\d.]+\s+([\d.]+)", out, re.M))
    assert float(ratio["moe_pruner"]) < float(ratio["magnitude"]), out
  elif command.startswith("tfopt-nas") and "--mode=search" in command:
    assert "top 5 of" in out and "report.html" in out, out[-2000:]
  elif command.startswith("tfopt-launch"):
    assert "lost [], repeated []" in out, out[-2000:]
    if "--inject=kill" in command:
      assert "killed (worker 1)" in out, out[-2000:]
      asked = re.search(r"--inject=kill:1:(\d+)", command).group(1)
      assert (f"injected kill into worker 1 after step {asked} (asked: "
              f"{asked}; raised by the worker)") in out, out[-2000:]
    shas = set(re.findall(r"weights sha256 (\w+)", out))
    assert len(shas) == 1, out[-2000:]
    seen.setdefault("sha", shas)
    assert shas == seen["sha"], "a fault changed the final weights"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(_sh_blocks())))
def test_readme_shell_block_runs(index, tmp_path):
  seen = {}
  for command in _sh_blocks()[index]:
    if command == "make test":
      continue  # this suite
    if command == "make demo" or command.startswith("tfopt-demo "):
      continue  # tests/test_demo.py runs its recipe (--quick)
    done = _run(command, tmp_path)
    assert done.returncode == 0, (command, done.stderr[-3000:])
    _check_output(command, done.stdout, seen)


_PARSE = r"""
import importlib, sys
import tfopt  # OR-Tools before TensorFlow, as the scripts do
from absl import flags
module, args = sys.argv[1], sys.argv[2:]
script = importlib.import_module(module)
rest = flags.FLAGS([module, *args])
if "config" in flags.FLAGS:
  from tfopt.cli._config import apply_config, load_config
  if hasattr(script, "DEFAULTS"):  # train.py: the config's own knobs
    load_config(flags.FLAGS.config, script.DEFAULTS)
  else:
    apply_config()
print("parsed", rest[1:])
"""


def _parsed_commands() -> list[str]:
  run = {c for block in _sh_blocks() for c in block}
  commands = _inline_commands()
  for path in CONFIGS + SCRIPTS:
    commands += _docstring_commands(path)
  # "tfopt-<name>" is a template, not a command.
  return sorted({c for c in commands if c not in run and "<" not in c})


@pytest.mark.parametrize("command", _parsed_commands(), ids=lambda c: c[10:70])
def test_other_commands_parse(command):
  argv = shlex.split(command)
  if argv[0] in COMMANDS:
    argv = ["python", "-m", COMMANDS[argv[0]], *argv[1:]]
  assert argv[:2] == ["python", "-m"], command
  module = argv[2]
  source = ROOT / (module.replace(".", "/") + ".py")
  assert source.exists(), command
  if "import argparse" in source.read_text(encoding="utf-8"):
    # Not an absl script (the launcher's library CLI): its help names every
    # flag the command uses.
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    own = argv[3:argv.index("--")] if "--" in argv else argv[3:]
    for arg in own:
      assert arg.split("=")[0] in done.stdout, (arg, done.stdout)
    return
  done = subprocess.run([sys.executable, "-c", _PARSE, module, *argv[3:]],
                        cwd=ROOT, capture_output=True, text=True,
                        timeout=300, check=False)
  assert done.returncode == 0 and "parsed" in done.stdout, (
      command, done.stderr[-2000:])


def test_every_script_runs_a_config_in_the_readme():
  run = " ".join(c for block in _sh_blocks() for c in block)
  for script in SCRIPTS:
    if script.stem == "scale_train":
      # The launcher's worker job: its flags are in launch_scale_train.py.
      assert "launch_scale_train.py" in run
      continue
    if script.stem == "demo":
      # Settings built in (tfopt.demo.job): `make demo` runs it, and
      # tests/test_demo.py that recipe with --quick.
      assert "make demo" in run
      continue
    name = _command_name(script)
    configs = [c.name for c in CONFIGS if any(
        name in cmd.split() for cmd in _docstring_commands(c))]
    assert configs, f"{script.name} has no config in experiments/configs"
    assert any(f"{name} --config=experiments/configs/{c}" in run or
               (script.stem == "run_placed" and "make demo-cnn" in run)
               for c in configs), (script.name, configs)


def test_every_config_states_its_command_and_expected_result():
  import ast
  assert CONFIGS
  for path in CONFIGS:
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree) or ""
    commands = [c for c in _docstring_commands(path)
                if f"--config=experiments/configs/{path.name}" in c]
    assert commands, path
    assert "Expected" in doc, path
    assert any(isinstance(n, ast.Assign) and n.targets[0].id == "CONFIG"
               for n in tree.body), path


def test_command_extraction_oracle():
  """The extraction itself, on a hand-written block."""
  text = ("python -m a --x=1 \\\n    --y=2   # note\n# comment only\n"
          "make test\n")
  assert _commands(text) == ["python -m a --x=1 --y=2", "make test"]
  assert _commands("") == []


def _run_python(code: str) -> subprocess.CompletedProcess:
  """A README or guide example run in a fresh process; it must succeed."""
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                        capture_output=True, text=True, timeout=600,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return done


@pytest.mark.slow
def test_clock_example_runs(tmp_path):
  code = _python_block("## Placement judged by the clock")
  assert 'select="measured"' in code and "fit_cluster" in code
  code = code.replace("/tmp/", f"{tmp_path}/").replace(
      "epochs=2)", "epochs=1, verbose=0)")
  done = _run_python(code)
  assert "chosen by measurement" in done.stdout, done.stdout[-3000:]
  assert "cluster: calibrated logical x2" in done.stdout


def test_every_python_block_compiles():
  """A guide's fragment may lean on the block before it, but it parses."""
  blocks = re.findall(r"```python\n(.*?)```", DOCS, flags=re.S)
  assert len(blocks) > 15
  for block in blocks:
    compile(block, "<python block>", "exec")


def test_first_screen_has_install_the_two_commands_and_an_example():
  """What a newcomer looks for first, in README's first 60 lines: pip
  install, `make demo` and `make test`, and the tfopt.compile example."""
  first = "\n".join(README.splitlines()[:60])
  for needed in ("pip install 'tfopt[cpu]'", "make demo ", "make test ",
                 "## Quickstart: `tfopt.compile`", "tfopt.compile(",
                 "model.fit("):
    assert needed in first, needed


@pytest.mark.slow
def test_readme_quickstart_runs():
  """The first code a reader meets, within README's first screen."""
  assert README.index("```python") < len("\n".join(
      README.splitlines()[:60]))
  code = _python_block("## Quickstart: `tfopt.compile`")
  assert len(code.strip().splitlines()) <= 15, "README's example grew"
  code = code.replace("epochs=2)", "epochs=1, verbose=0)")
  done = _run_python(code)
  assert "verified on the first batch" in done.stdout, done.stdout[-3000:]
  assert "placement" in done.stdout


@pytest.mark.slow
def test_compile_hook_example_runs():
  code = _python_block("## Optimize an existing Keras script")
  assert "tfopt.compile(" in code and "model.fit(" in code
  code = code.replace("epochs=2)", "epochs=1, verbose=0)")
  done = _run_python(code)
  assert "verified on the first batch" in done.stdout
  assert "_FusedMatMul +3" in done.stdout


def test_nothing_reads_the_shared_folder_of_the_checkout():
  """A user's clone has no ../shared: README, configs, tests, benchmarks and
  the package read the shipped workloads (tfopt/data) instead."""
  here = pathlib.Path(__file__).name
  for folder in ("tfopt", "experiments", "benchmarks", "tests", "tools"):
    for path in (ROOT / folder).rglob("*.py"):
      if path.name == here:
        continue
      text = path.read_text(encoding="utf-8")
      assert "../shared" not in text and "shared/data" not in text, path
  for name in ("README.md", "Makefile", "BUILD", "pyproject.toml"):
    assert "../shared" not in (ROOT / name).read_text(encoding="utf-8"), name


def test_every_console_script_is_declared_and_has_a_module():
  import tomllib
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  declared = {name: target.split(":")[0]
              for name, target in project["scripts"].items()}
  assert declared == COMMANDS
  for name, target in project["scripts"].items():
    module, function = target.split(":")
    assert function == "run", target
    assert (ROOT / (module.replace(".", "/") + ".py")).exists(), name
