"""One-shot NAS with visual steering (NAS-Navigator style). In progress:
the search spaces as data (`SearchSpace`, presets `tiny64`, `stage_block`).
The super-network, sampler / ranker callbacks, steering constraints and
views are not built yet (issue 7)."""

from tfopt.nas.space import (PRESETS, ChoiceLayer, SearchSpace, stage_block,
                             tiny64)

__all__ = ["ChoiceLayer", "PRESETS", "SearchSpace", "stage_block", "tiny64"]
