"""One-shot NAS with visual steering (NAS-Navigator style). In progress:
search spaces as data (`SearchSpace`, presets `tiny64`, `stage_block`) and
the weight-sharing super-network (`SuperNet`, switch and mask execution,
`subnet(arch)`), the uniform single-path sampler (`PathSampler`) and the
ranking of sub-graphs with BatchNorm recalibration (`rank`), and the
steering constraints file (`Constraints`: remove / lock, versioned, re-read
by `PathSampler` every epoch). The ranker callback, the other steering
interactions (prefer, region, limits), views and export are not built yet
(issue 7)."""

from tfopt.nas.ranking import Ranking, rank, recalibrate_batchnorm
from tfopt.nas.sampler import PathSampler
from tfopt.nas.space import (PRESETS, ChoiceLayer, SearchSpace, stage_block,
                             tiny64)
from tfopt.nas.steering import Constraints
from tfopt.nas.supernet import EXECUTIONS, SuperNet

__all__ = ["ChoiceLayer", "Constraints", "EXECUTIONS", "PRESETS", "PathSampler", "Ranking",
           "SearchSpace", "SuperNet", "rank", "recalibrate_batchnorm",
           "stage_block", "tiny64"]
