"""One-shot NAS search spaces as data.

A `SearchSpace` is a stem, a sequence of `ChoiceLayer`s (each a list of
candidate ops, exactly one of which a sub-graph takes) and a head. An
architecture (`Arch`) is the tuple of chosen op names, one per choice layer.
Everything is plain data: JSON round trip (`to_json` / `from_json`), size,
enumeration in a fixed order, a bijection to integers (`index` / `arch_at`),
uniform sampling under per-layer restrictions, one-hot encodings and a
human-readable description. Presets: `tiny64` (3 choice layers x {conv3,
conv5, maxpool, skip} on 8x8 digits: 64 sub-graphs) and `stage_block`
(stages of parallel-candidate conv blocks, each stage ending in a choice of
pooling).

Op specs are dicts: {"type": "conv", "kernel": k} (k x k convolution, batch
norm, ReLU; the stage's width), {"type": "maxpool" | "avgpool", "pool": p,
"stride": s}, {"type": "skip"} (identity), {"type": "dense", "units": n},
or {"type": "value", "value": n} (a hyperparameter's value: the spaces of
`tfopt.nas.moe_lm`, whose `head["kind"]` says how to count parameters).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
from typing import Iterator, Mapping

import numpy as np

from tfopt._errors import check_positive_int, invalid_argument

FORMAT = "tfopt.nas.space/1"
OP_TYPES = ("conv", "maxpool", "avgpool", "skip", "dense", "value")
Arch = tuple  # of op names, one per choice layer


def _check_op(name: str, spec: Mapping) -> dict:
  where = f"op {name!r}"
  if not isinstance(spec, Mapping) or spec.get("type") not in OP_TYPES:
    raise invalid_argument(where, f"a dict with 'type' in {OP_TYPES}", spec)
  spec = dict(spec)
  kind = spec["type"]
  if kind == "conv":
    check_positive_int(f"{where}.kernel", spec.get("kernel"))
    spec.setdefault("stride", 1)
  elif kind in ("maxpool", "avgpool"):
    spec.setdefault("pool", 3)
    spec.setdefault("stride", 1)
    check_positive_int(f"{where}.pool", spec["pool"])
  elif kind == "dense":
    check_positive_int(f"{where}.units", spec.get("units"))
  elif kind == "value":
    check_positive_int(f"{where}.value", spec.get("value"))
  if "stride" in spec:
    check_positive_int(f"{where}.stride", spec["stride"])
  return spec


@dataclasses.dataclass(frozen=True)
class ChoiceLayer:
  """One decision: `ops` maps op names to specs (order is the enumeration
  order); `filters` is the width of conv ops in this layer."""
  name: str
  ops: dict
  filters: int | None = None

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise invalid_argument("name", "a non-empty string", self.name)
    if not isinstance(self.ops, Mapping) or not self.ops:
      raise invalid_argument(f"layers[{self.name!r}].ops",
                             "a non-empty mapping of op names to specs",
                             self.ops)
    object.__setattr__(self, "ops", {str(n): _check_op(n, s)
                                     for n, s in self.ops.items()})
    if self.filters is not None:
      check_positive_int(f"layers[{self.name!r}].filters", self.filters)

  @property
  def op_names(self) -> list[str]:
    return list(self.ops)


@dataclasses.dataclass(frozen=True)
class SearchSpace:
  """Stem -> choice layers -> head, for inputs `input_shape` and
  `num_classes` classes."""
  name: str
  input_shape: tuple
  num_classes: int
  layers: tuple
  stem: dict = dataclasses.field(default_factory=dict)
  head: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    object.__setattr__(self, "input_shape", tuple(self.input_shape))
    object.__setattr__(self, "layers", tuple(self.layers))
    check_positive_int("num_classes", self.num_classes)
    if not self.layers:
      raise invalid_argument("layers", "at least one ChoiceLayer", self.layers)
    names = [layer.name for layer in self.layers]
    if len(set(names)) != len(names):
      raise invalid_argument("layers", "choice layers with unique names",
                             names)

  # Size, enumeration, indexing -------------------------------------------
  @property
  def size(self) -> int:
    """Number of sub-graphs."""
    return math.prod(len(layer.ops) for layer in self.layers)

  def layer(self, name: str) -> ChoiceLayer:
    for layer in self.layers:
      if layer.name == name:
        return layer
    raise invalid_argument("layer", f"one of {[l.name for l in self.layers]}",
                           name)

  def allowed_ops(self, allowed: Mapping | None = None) -> list[list[str]]:
    """Per layer, the op names allowed by `allowed` ({layer: ops}; a layer
    not named keeps all its ops). A layer left without ops is an error."""
    allowed = dict(allowed or {})
    unknown = sorted(set(allowed) - {l.name for l in self.layers})
    if unknown:
      raise invalid_argument("allowed", "keyed by choice layer names "
                             f"{[l.name for l in self.layers]}", unknown)
    result = []
    for layer in self.layers:
      if layer.name not in allowed:
        result.append(layer.op_names)
        continue
      keep = list(allowed[layer.name])
      bad = [op for op in keep if op not in layer.ops]
      if bad:
        raise invalid_argument(f"allowed[{layer.name!r}]",
                               f"ops of that layer {layer.op_names}", bad)
      ordered = [op for op in layer.op_names if op in keep]
      if not ordered:
        raise invalid_argument(f"allowed[{layer.name!r}]",
                               "at least one op (a layer without any op "
                               "leaves no sub-graph)", keep)
      result.append(ordered)
    return result

  def enumerate(self, allowed: Mapping | None = None) -> Iterator[Arch]:
    """Every (allowed) architecture, in lexicographic order of op positions."""
    return (tuple(a) for a in itertools.product(*self.allowed_ops(allowed)))

  def check_arch(self, arch) -> Arch:
    arch = tuple(arch)
    if len(arch) != len(self.layers) or any(
        op not in layer.ops for op, layer in zip(arch, self.layers)):
      raise invalid_argument(
          "arch", f"one op name per choice layer, from "
          f"{[l.op_names for l in self.layers]}", arch)
    return arch

  def index(self, arch) -> int:
    """The position of `arch` in `enumerate()` (mixed-radix number)."""
    arch = self.check_arch(arch)
    value = 0
    for op, layer in zip(arch, self.layers):
      value = value * len(layer.ops) + layer.op_names.index(op)
    return value

  def arch_at(self, index: int) -> Arch:
    """The inverse of `index`."""
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) \
        or not 0 <= index < self.size:
      raise invalid_argument("index", f"an integer in [0, {self.size})",
                             index)
    ops = []
    for layer in reversed(self.layers):
      index, digit = divmod(int(index), len(layer.ops))
      ops.append(layer.op_names[digit])
    return tuple(reversed(ops))

  # Sampling and encoding ---------------------------------------------------
  def sample(self, rng: np.random.Generator, allowed: Mapping | None = None
             ) -> Arch:
    """A uniform random architecture among the allowed ones (each layer's op
    uniform and independent)."""
    return tuple(ops[rng.integers(len(ops))]
                 for ops in self.allowed_ops(allowed))

  def encode(self, arch) -> np.ndarray:
    """One-hot encoding, concatenated over layers (length = total ops)."""
    arch = self.check_arch(arch)
    parts = []
    for op, layer in zip(arch, self.layers):
      one = np.zeros(len(layer.ops), dtype=np.float32)
      one[layer.op_names.index(op)] = 1.0
      parts.append(one)
    return np.concatenate(parts)

  def param_count(self, arch) -> int:
    """Number of weights of the sub-graph `arch` (trainable and BatchNorm
    statistics alike, as `keras.Model.count_params` counts them): stem,
    chosen ops (with their 1x1 projections where the width changes), head."""
    arch = self.check_arch(arch)
    if self.head.get("kind") == "qwen3_moe_lm":
      from tfopt.nas import moe_lm  # pylint: disable=g-import-not-at-top
      return moe_lm.param_count(self, arch)
    stem = self.stem
    width = stem.get("filters", self.layers[0].filters or 16)
    channels = self.input_shape[-1]
    total = _conv_params(stem.get("kernel", 3), channels, width)
    for op, layer in zip(arch, self.layers):
      filters = layer.filters or width
      spec = layer.ops[op]
      if spec["type"] == "conv":
        total += _conv_params(spec["kernel"], width, filters)
      elif spec["type"] == "dense":
        total += width * spec["units"] + spec["units"]
      elif width != filters:  # skip / pooling into a wider layer: projection
        total += _conv_params(1, width, filters)
      width = filters
    return total + width * self.num_classes + self.num_classes

  def describe(self, arch) -> str:
    """"conv1=conv3 > conv2=maxpool > ..." for reports and tooltips."""
    arch = self.check_arch(arch)
    return " > ".join(f"{layer.name}={op}"
                      for op, layer in zip(arch, self.layers))

  # JSON ----------------------------------------------------------------
  def to_dict(self) -> dict:
    """A JSON-ready copy (editing it does not touch the space)."""
    return copy.deepcopy({"format": FORMAT, "name": self.name,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes, "stem": self.stem,
            "head": self.head,
            "layers": [{"name": l.name, "filters": l.filters, "ops": l.ops}
                       for l in self.layers]})

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=1)

  @classmethod
  def from_dict(cls, data: Mapping) -> "SearchSpace":
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
      raise invalid_argument("data", f"a search space in format {FORMAT}",
                             data.get("format") if isinstance(data, Mapping)
                             else data)
    try:
      layers = [ChoiceLayer(l["name"], l["ops"], l.get("filters"))
                for l in data["layers"]]
      return cls(data["name"], tuple(data["input_shape"]),
                 data["num_classes"], tuple(layers), dict(data.get("stem", {})),
                 dict(data.get("head", {})))
    except (KeyError, TypeError) as err:
      raise invalid_argument("data", "a search space with name, input_shape, "
                             "num_classes and layers (each with name and "
                             f"ops); missing or malformed: {err}",
                             sorted(data)) from None

  @classmethod
  def from_json(cls, text: str) -> "SearchSpace":
    return cls.from_dict(json.loads(text))


def _conv_params(kernel: int, cin: int, cout: int) -> int:
  # k x k convolution without bias, then BatchNorm (gamma, beta, moving
  # mean, moving variance).
  return kernel * kernel * cin * cout + 4 * cout


# Presets ---------------------------------------------------------------
_TINY_OPS = {"conv3": {"type": "conv", "kernel": 3},
             "conv5": {"type": "conv", "kernel": 5},
             "maxpool": {"type": "maxpool", "pool": 3, "stride": 1},
             "skip": {"type": "skip"}}


def tiny64(filters: int = 16) -> SearchSpace:
  """The ground-truth space: 3 choice layers x {conv3, conv5, maxpool, skip}
  on 8x8x1 digits, 10 classes; 64 sub-graphs, few enough to train each."""
  return SearchSpace(
      "tiny64", (8, 8, 1), 10,
      tuple(ChoiceLayer(f"layer{i}", _TINY_OPS, filters) for i in range(3)),
      stem={"type": "conv", "kernel": 3, "filters": filters},
      head={"pool": "global_average", "dropout": 0.0})


def stage_block(input_shape=(32, 32, 3), num_classes: int = 10,
                stages: int = 2, blocks: int = 2,
                filters=(16, 32)) -> SearchSpace:
  """The stage x block template: each stage has `blocks` choice layers over
  {conv3, conv5, skip} at the stage's width, then a choice of pooling
  {maxpool, avgpool, strided conv3} that halves the resolution."""
  check_positive_int("stages", stages)
  check_positive_int("blocks", blocks)
  filters = tuple(filters)
  if len(filters) != stages:
    raise invalid_argument("filters", f"one width per stage ({stages})",
                           filters)
  block_ops = {"conv3": {"type": "conv", "kernel": 3},
               "conv5": {"type": "conv", "kernel": 5},
               "skip": {"type": "skip"}}
  pool_ops = {"maxpool": {"type": "maxpool", "pool": 2, "stride": 2},
              "avgpool": {"type": "avgpool", "pool": 2, "stride": 2},
              "conv3s2": {"type": "conv", "kernel": 3, "stride": 2}}
  layers = []
  for s, width in enumerate(filters):
    layers += [ChoiceLayer(f"stage{s}_block{b}", block_ops, width)
               for b in range(blocks)]
    layers.append(ChoiceLayer(f"stage{s}_pool", pool_ops, width))
  return SearchSpace("stage_block", tuple(input_shape), num_classes,
                     tuple(layers),
                     stem={"type": "conv", "kernel": 3,
                           "filters": filters[0]},
                     head={"pool": "global_average", "dropout": 0.0})


PRESETS = {"tiny64": tiny64, "stage_block": stage_block}
