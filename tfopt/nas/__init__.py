"""One-shot NAS with visual steering (NAS-Navigator style). In progress:
search spaces as data (`SearchSpace`, presets `tiny64`, `stage_block`) and
the weight-sharing super-network (`SuperNet`, switch and mask execution,
`subnet(arch)`), and the uniform single-path sampler (`PathSampler`). The
ranker, steering constraint file, views and export are not built yet
(issue 7)."""

from tfopt.nas.sampler import PathSampler
from tfopt.nas.space import (PRESETS, ChoiceLayer, SearchSpace, stage_block,
                             tiny64)
from tfopt.nas.supernet import EXECUTIONS, SuperNet

__all__ = ["ChoiceLayer", "EXECUTIONS", "PRESETS", "PathSampler",
           "SearchSpace", "SuperNet", "stage_block", "tiny64"]
