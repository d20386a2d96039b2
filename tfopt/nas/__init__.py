"""One-shot NAS with visual steering (NAS-Navigator style). In progress:
search spaces as data (`SearchSpace`, presets `tiny64`, `stage_block`) and
the weight-sharing super-network (`SuperNet`, switch and mask execution,
`subnet(arch)`). The sampler / ranker callbacks, steering constraints and
views are not built yet (issue 7)."""

from tfopt.nas.space import (PRESETS, ChoiceLayer, SearchSpace, stage_block,
                             tiny64)
from tfopt.nas.supernet import EXECUTIONS, SuperNet

__all__ = ["ChoiceLayer", "EXECUTIONS", "PRESETS", "SearchSpace", "SuperNet",
           "stage_block", "tiny64"]
