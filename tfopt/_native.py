"""Load OR-Tools' native solvers before TensorFlow.

OR-Tools' CP-SAT crashes (segmentation fault in `solve`) in a process where
TensorFlow's native library was loaded first: the two link different
protobuf builds (google/or-tools#3230; loading OR-Tools first is the known
working order). `tfopt` imports this module before anything else, so the
solvers are safe whenever `import tfopt` comes before TensorFlow.
`TENSORFLOW_LOADED_FIRST` records the other case, where the exact placer
solves in a child process instead.
"""

import sys

TENSORFLOW_LOADED_FIRST = ("tensorflow" in sys.modules and
                           "ortools.sat.python.cp_model" not in sys.modules)

try:
  from ortools.linear_solver import pywraplp  # noqa: E402,F401
  from ortools.sat.python import cp_model  # noqa: E402,F401
except ImportError:
  # Only placement needs OR-Tools, and it imports it itself (and fails
  # loudly there). The optimizers must import on a machine with Keras on
  # JAX and neither OR-Tools nor TensorFlow.
  pass
