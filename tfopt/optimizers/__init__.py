"""Cautious Weight Decay optimizers for Keras 3: CautiousAdamW, CautiousLion,
CautiousMuon.

Importing this package registers the three classes with Keras, so
`model.compile(optimizer="cautious_adamw")` (also "CautiousAdamW",
"cautious_lion", "cautious_muon", ...) works, and `.keras` files that use
them load with `keras.saving.load_model` without `custom_objects`.
"""

import keras

from tfopt.optimizers.adamw import CautiousAdamW
from tfopt.optimizers.cautious import (CautiousDecayMixin, cautious_mask,
                                       decay_then_step)
from tfopt.optimizers.diagnostics import DecayFractionLogger
from tfopt.optimizers.lion import CautiousLion
from tfopt.optimizers.muon import CautiousMuon
from tfopt.optimizers.muon_routing import Route, format_routing_table
from tfopt.optimizers.newton_schulz import newton_schulz, scale_factors

_ALIASES = {
    "cautious_adamw": CautiousAdamW, "CautiousAdamW": CautiousAdamW,
    "cautious_lion": CautiousLion, "CautiousLion": CautiousLion,
    "cautious_muon": CautiousMuon, "CautiousMuon": CautiousMuon,
}


def register() -> None:
  """Makes the string names resolvable by `keras.optimizers.get`.

  Done on import; call again after `keras.saving.get_custom_objects()` was
  cleared.
  """
  keras.saving.get_custom_objects().update(_ALIASES)


register()

__all__ = ["CautiousAdamW", "CautiousDecayMixin", "CautiousLion",
           "CautiousMuon", "DecayFractionLogger", "Route", "cautious_mask",
           "decay_then_step", "format_routing_table", "newton_schulz",
           "register", "scale_factors"]
