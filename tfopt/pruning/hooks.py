"""Forward hooks for Keras 3 layers, always removed.

Keras has no forward-hook API; `Layer.__call__` runs `self.call`, so an
instance attribute `call` shadows the class method for that one layer.
`capture_inputs` installs such a wrapper that records the block input of each
call (as NumPy, so it only works for eager calls) and passes everything
through untouched; on leaving the `with` block, normally or by an exception,
the attribute is deleted and the layer is exactly as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from keras import ops

from tfopt.pruning.adapters import adapter_for, block_input


@dataclasses.dataclass
class Capture:
  """What the hooks saw: `inputs[id(layer)]` is a list of (T, d_model)
  arrays, one per call; `order` the layers in order of their first call."""
  inputs: dict
  order: list

  def of(self, layer) -> list:
    return self.inputs[id(layer)]


@contextlib.contextmanager
def capture_inputs(layers) -> Iterator[Capture]:
  """Records each layer's block input per eager call.

  Yields a `Capture` filled while the model runs inside the block. The
  call's result is returned unchanged, so a hooked forward pass equals the
  original.
  """
  capture = Capture({id(layer): [] for layer in layers}, [])
  installed = []
  try:
    for layer in layers:
      adapter = adapter_for(layer)
      find_input = adapter.block_input if adapter else block_input  # Dense
      original = layer.call

      def hooked(*args, _layer=layer, _find=find_input, _original=original,
                 **kwargs):
        value = ops.convert_to_numpy(_find(args, kwargs))
        seen = capture.inputs[id(_layer)]
        if not seen:
          capture.order.append(_layer)
        seen.append(value.reshape(-1, value.shape[-1]))
        return _original(*args, **kwargs)

      object.__setattr__(layer, "call", hooked)
      installed.append(layer)
    yield capture
  finally:
    for layer in installed:
      if "call" in vars(layer):
        object.__delattr__(layer, "call")


def is_hooked(layer) -> bool:
  """True while a tfopt hook shadows `layer.call`."""
  return "call" in vars(layer)
