"""Error types and Keras-style argument messages shared by every tfopt module.

Every check that rejects user input goes through `invalid_argument`, so the
message always names the argument, the constraint and the value received:
"Argument `batch_size` must be a positive integer. Received: batch_size=0".
"""

from __future__ import annotations

from typing import Any


class GraphError(ValueError):
  """A graph is malformed: cyclic, duplicate names, dangling edges."""


class CostGraphFormatError(ValueError):
  """A `tfopt.costgraph/1` document does not follow the format."""


class TfoptWarning(UserWarning):
  """What tfopt warns a user about (its own category, so tests and users
  can filter or raise tfopt's warnings apart from other libraries')."""


def _short_repr(value: Any, limit: int = 200) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[: limit - 3] + "..."


def invalid_argument(name: str, constraint: str, value: Any,
                     error: type[Exception] = ValueError) -> Exception:
  """Builds (does not raise) a Keras-style error for argument `name`."""
  return error(f"Argument `{name}` must be {constraint}. "
               f"Received: {name}={_short_repr(value)}")


def check_positive_int(name: str, value: Any) -> int:
  """Returns `value` if it is an int > 0, else raises a clear ValueError."""
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise invalid_argument(name, "a positive integer", value)
  return value


def check_non_negative(name: str, value: Any) -> float:
  """Returns `value` as float if it is a finite number >= 0."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise invalid_argument(name, "a number >= 0", value)
  if not value >= 0 or value == float("inf"):
    raise invalid_argument(name, "a finite number >= 0", value)
  return float(value)
