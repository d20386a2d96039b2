"""Which native libraries share a process with TensorFlow.

OR-Tools' CP-SAT crashes (segmentation fault in `solve`) in a process where
TensorFlow's native library was loaded first: the two link different
protobuf builds (google/or-tools#3230; loading OR-Tools first is the known
working order). `tfopt` imports this module before anything else, so the
solvers are safe whenever `import tfopt` comes before TensorFlow.
`TENSORFLOW_LOADED_FIRST` records the other case, where the exact placer
solves in a child process instead.

Processes that tfopt starts and that only run TensorFlow (server tasks, a
parameter-server coordinator) are started with `TFOPT_TENSORFLOW_ONLY=1`:
then neither OR-Tools nor JAX is loaded beside TensorFlow. TensorFlow 2.21
imports JAX whenever it is installed (tf.lite's util, for `jax.jit`), which
loads jaxlib's own XLA extension: three native stacks with their own
protobuf and absl builds in one process, a combination with known crashes
(jax-ml/jax#120, #11431). The parameter-server coordinator died of SIGSEGV
inside TensorFlow now and then with all three loaded.
"""

import os
import sys

TENSORFLOW_ONLY_ENV = "TFOPT_TENSORFLOW_ONLY"
TENSORFLOW_ONLY = os.environ.get(TENSORFLOW_ONLY_ENV) == "1"

TENSORFLOW_LOADED_FIRST = TENSORFLOW_ONLY or (
    "tensorflow" in sys.modules and
    "ortools.sat.python.cp_model" not in sys.modules)

if TENSORFLOW_ONLY:
  # `import jax` now raises ImportError, which TensorFlow's and Keras'
  # optional imports handle. Only where JAX is not loaded yet.
  sys.modules.setdefault("jax", None)  # type: ignore[arg-type]
else:
  try:
    from ortools.linear_solver import pywraplp  # noqa: E402,F401
    from ortools.sat.python import cp_model  # noqa: E402,F401
  except ImportError:
    # Only placement needs OR-Tools, and it imports it itself (and fails
    # loudly there). The optimizers must import on a machine with Keras on
    # JAX and neither OR-Tools nor TensorFlow.
    pass


def tensorflow_only_env(env=None) -> dict:
  """`env` (default: this process's) for a child that only runs
  TensorFlow (see module doc)."""
  return dict(os.environ if env is None else env,
              **{TENSORFLOW_ONLY_ENV: "1"})
