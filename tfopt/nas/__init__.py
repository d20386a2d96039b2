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

from tfopt._lazy import lazy_getattr
from tfopt.nas.run import RunDir
from tfopt.nas.space import (PRESETS, ChoiceLayer, SearchSpace, stage_block,
                             tiny64)
from tfopt.nas.steering import Constraints

# What builds or runs the super-network imports Keras; it is resolved on
# first use, so that steering a run (the analyst's loop: edit, look again)
# and a command's refusal of bad input do not pay for importing TensorFlow.
_LAZY = {
    "NASReport": "tfopt.nas.callbacks",
    "SubgraphRanker": "tfopt.nas.callbacks",
    "SubgraphExport": "tfopt.nas.export",
    "export_subgraph": "tfopt.nas.export",
    "Ranking": "tfopt.nas.ranking",
    "rank": "tfopt.nas.ranking",
    "recalibrate_batchnorm": "tfopt.nas.ranking",
    "PathSampler": "tfopt.nas.sampler",
    "EXECUTIONS": "tfopt.nas.supernet",
    "SuperNet": "tfopt.nas.supernet",
}

__getattr__ = lazy_getattr("tfopt.nas", _LAZY)

__all__ = ["ChoiceLayer", "Constraints", "PRESETS", "RunDir", "SearchSpace",
           "stage_block", "tiny64", *_LAZY]
