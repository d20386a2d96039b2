"""One-shot NAS with visual steering (NAS-Navigator style).

- `SearchSpace` (presets `tiny64`, `stage_block`): choice layers of
  candidate ops as data (JSON, enumeration, sampling, encoding, params).
- `SuperNet`: the weight-sharing super-network (switch or mask execution,
  `subnet(arch)`).
- Callbacks: `PathSampler` (uniform single-path sampling under the
  analyst's constraints, untaken ops untouched), `SubgraphRanker`
  (inherited weights, BatchNorm recalibrated before every score;
  exhaustive, random or evolutionary), `NASReport` (the run directory).
- `Constraints`: the steering file (remove, lock, prefer, region, limits,
  versioned, re-read every epoch).
- Views (`tfopt.nas.views`): scatterplot (MDS on Hamming distance),
  component view, training curves, as PNG and offline HTML.
- `export_subgraph`: the chosen sub-graph as `.keras` and SavedModel.
- `tfopt.nas.benchmark`: one-shot vs exhaustive vs random search on tiny64.
"""

from tfopt.nas.callbacks import NASReport, SubgraphRanker
from tfopt.nas.export import SubgraphExport, export_subgraph
from tfopt.nas.ranking import Ranking, rank, recalibrate_batchnorm
from tfopt.nas.run import RunDir
from tfopt.nas.sampler import PathSampler
from tfopt.nas.space import (PRESETS, ChoiceLayer, SearchSpace, stage_block,
                             tiny64)
from tfopt.nas.steering import Constraints
from tfopt.nas.supernet import EXECUTIONS, SuperNet

__all__ = ["ChoiceLayer", "Constraints", "EXECUTIONS", "NASReport",
           "PRESETS", "PathSampler", "Ranking", "RunDir", "SearchSpace",
           "SubgraphExport", "SubgraphRanker", "SuperNet", "export_subgraph",
           "rank", "recalibrate_batchnorm", "stage_block", "tiny64"]
