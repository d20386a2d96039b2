"""The analyst's steering of a search, as a versioned JSON file.

A `Constraints` document (format "tfopt.nas.constraints/1") holds the
NAS-Navigator interactions as data:
- `remove`: {layer: [ops]} ops the search may no longer take;
- `lock`: {layer: op} layers fixed to one op;
- `prefer`: {layer: {op: weight}} sampling weights (default 1): an op with
  weight 3 is drawn three times as often as an op of weight 1 of its layer;
- `region`: None (every sub-graph) or a set expression over sub-graphs the
  analyst selected, e.g. on the scatterplot: {"archs": [[op, ...], ...]},
  {"union": [expr, ...]}, {"intersection": [expr, ...]},
  {"complement": expr}. `select(archs, how)` builds it: "union" adds the
  selection to the region, "intersection" keeps only the selected part of
  it, "complement" takes the selection out of it;
- `limits`: {"max_params": n, "min_params": n} on `SearchSpace.param_count`;
- `version` (incremented on every edit) and `history` (one entry per edit:
  version, action, arguments), so a running search can tell that the file
  changed and a report can say who steered what.

`allowed_ops(space)` is the per-layer restriction (remove, lock) that
`SearchSpace.enumerate / sample` take; `admits(space, arch)` adds region and
limits; `sampler(space)` draws admitted sub-graphs with the preference
weights. Every edit is validated before it changes anything: a document that
leaves a layer without any op, or admits no sub-graph at all, is refused
with an error naming the layer or the clause.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from typing import Callable

import numpy as np

from tfopt._errors import invalid_argument
from tfopt._io import atomic_write_text
from tfopt.nas.space import SearchSpace

FORMAT = "tfopt.nas.constraints/1"
REGION_OPS = ("archs", "union", "intersection", "complement")
SELECT_MODES = ("union", "intersection", "complement")
LIMITS = ("max_params", "min_params")
# Above this many sub-graphs admitted by remove/lock, region and limits are
# applied by rejection sampling instead of enumerating the space.
_ENUMERATE_UP_TO = 1 << 16
_MAX_REJECTIONS = 10_000


def _check_region(space: SearchSpace, expr, where: str = "region"):
  """Validates a region expression; returns it with archs as tuples."""
  if not isinstance(expr, dict) or len(expr) != 1 or \
      next(iter(expr)) not in REGION_OPS:
    raise invalid_argument(where, f"a dict with exactly one key of "
                           f"{REGION_OPS}", expr)
  (op, value), = expr.items()
  if op == "archs":
    if not isinstance(value, (list, tuple)):
      raise invalid_argument(f"{where}.archs", "a list of architectures",
                             value)
    archs = []
    for i, arch in enumerate(value):
      try:
        archs.append(space.check_arch(arch))
      except ValueError:
        raise invalid_argument(
            f"{where}.archs[{i}]", f"one op name per choice layer of "
            f"{space.name!r}", arch) from None
    return {"archs": archs}
  if op == "complement":
    return {"complement": _check_region(space, value, f"{where}.complement")}
  if not isinstance(value, (list, tuple)) or not value:
    raise invalid_argument(f"{where}.{op}", "a non-empty list of region "
                           "expressions", value)
  return {op: [_check_region(space, e, f"{where}.{op}[{i}]")
               for i, e in enumerate(value)]}


def _in_region(expr, arch: tuple) -> bool:
  (op, value), = expr.items()
  if op == "archs":
    return arch in {tuple(a) for a in value}
  if op == "complement":
    return not _in_region(value, arch)
  members = (_in_region(e, arch) for e in value)
  return any(members) if op == "union" else all(members)


def _json_region(expr):
  (op, value), = expr.items()
  if op == "archs":
    return {"archs": [list(a) for a in value]}
  if op == "complement":
    return {"complement": _json_region(value)}
  return {op: [_json_region(e) for e in value]}


@dataclasses.dataclass
class Constraints:
  """Steering constraints; edit with `remove_op`, `lock_layer`, `unlock`,
  `prefer_op`, `select`, `clear_region`, `set_limits` (see the module doc).
  """
  remove: dict = dataclasses.field(default_factory=dict)
  lock: dict = dataclasses.field(default_factory=dict)
  version: int = 0
  history: list = dataclasses.field(default_factory=list)
  prefer: dict = dataclasses.field(default_factory=dict)
  region: dict | None = None
  limits: dict = dataclasses.field(default_factory=dict)

  def _edit(self, space: SearchSpace, action: str, change: Callable,
            **arguments) -> None:
    """Applies `change` to a copy, validates the copy against `space`, and
    only then takes it over and logs the edit."""
    trial = copy.deepcopy(self)
    change(trial)
    trial.validate(space)
    self.__dict__.update(trial.__dict__)
    self.version += 1
    self.history.append({"version": self.version, "action": action,
                         **arguments})

  def remove_op(self, space: SearchSpace, layer: str, op: str) -> None:
    """Forbids `op` in `layer` (refused if it would leave no op)."""
    def change(c):
      c.remove.setdefault(layer, [])
      if op not in c.remove[layer]:
        c.remove[layer].append(op)
    self._edit(space, "remove", change, layer=layer, op=op)

  def restore_op(self, space: SearchSpace, layer: str, op: str) -> None:
    """Takes back a `remove_op`."""
    if op not in self.remove.get(layer, []):
      raise invalid_argument("op", f"an op removed from layer {layer!r} "
                             f"{self.remove.get(layer, [])}", op)
    def change(c):
      c.remove[layer].remove(op)
      if not c.remove[layer]:
        del c.remove[layer]
    self._edit(space, "restore", change, layer=layer, op=op)

  def lock_layer(self, space: SearchSpace, layer: str, op: str) -> None:
    """Fixes `layer` to `op`."""
    self._edit(space, "lock", lambda c: c.lock.__setitem__(layer, op),
               layer=layer, op=op)

  def unlock(self, layer: str, space: SearchSpace | None = None) -> None:
    if layer not in self.lock:
      raise invalid_argument("layer", f"a locked layer {sorted(self.lock)}",
                             layer)
    if space is None:  # removing a lock cannot make a valid file invalid
      del self.lock[layer]
      self.version += 1
      self.history.append({"version": self.version, "action": "unlock",
                           "layer": layer})
      return
    self._edit(space, "unlock", lambda c: c.lock.__delitem__(layer),
               layer=layer)

  def prefer_op(self, space: SearchSpace, layer: str, op: str,
                weight: float = 2.0) -> None:
    """Samples `op` of `layer` with relative weight `weight` (> 0; 1 is
    neutral and removes the preference)."""
    def change(c):
      c.prefer.setdefault(layer, {})[op] = weight
      if weight == 1:
        del c.prefer[layer][op]
        if not c.prefer[layer]:
          del c.prefer[layer]
    self._edit(space, "prefer", change, layer=layer, op=op, weight=weight)

  def select(self, space: SearchSpace, archs, how: str = "union") -> None:
    """Combines the sub-graphs `archs` (op-name tuples or space indices)
    with the region; see the module doc for `how`."""
    if how not in SELECT_MODES:
      raise invalid_argument("how", f"one of {SELECT_MODES}", how)
    archs = [space.arch_at(a) if isinstance(a, (int, np.integer))
             and not isinstance(a, bool) else a for a in archs]
    selection = _check_region(space, {"archs": archs})
    def change(c):
      if how == "complement":
        new = {"complement": selection}
        c.region = new if c.region is None else {
            "intersection": [c.region, new]}
      elif c.region is None:
        c.region = selection
      else:
        c.region = {how: [c.region, selection]}
    self._edit(space, "select", change, how=how,
               archs=[list(a) for a in selection["archs"]])

  def clear_region(self, space: SearchSpace) -> None:
    self._edit(space, "clear_region",
               lambda c: setattr(c, "region", None))

  def set_limits(self, space: SearchSpace, max_params: int | None = None,
                 min_params: int | None = None) -> None:
    """Bounds the sub-graphs' parameter count (None: no bound)."""
    def change(c):
      for key, value in (("max_params", max_params),
                         ("min_params", min_params)):
        if value is None:
          c.limits.pop(key, None)
        else:
          c.limits[key] = value
    self._edit(space, "limits", change, max_params=max_params,
               min_params=min_params)

  @classmethod
  def from_allowed(cls, space: SearchSpace, allowed) -> "Constraints":
    """The constraints that a per-layer `allowed` restriction ({layer: op
    names}, None = everything) means: the other ops removed."""
    space.allowed_ops(allowed)  # a clear error for a bad restriction
    return cls(remove={
        name: [op for op in space.layer(name).op_names if op not in ops]
        for name, ops in (allowed or {}).items()})

  # Meaning -------------------------------------------------------------
  def allowed_ops(self, space: SearchSpace) -> dict:
    """{layer: allowed op names} for every layer remove/lock restrict."""
    names = {l.name for l in space.layers}
    for field, value in (("remove", self.remove), ("lock", self.lock),
                         ("prefer", self.prefer)):
      unknown = sorted(set(value) - names)
      if unknown:
        raise invalid_argument(field, f"keyed by choice layers of "
                               f"{space.name!r}", unknown)
    allowed = {}
    for layer in space.layers:
      ops = layer.op_names
      removed = self.remove.get(layer.name, [])
      bad = [op for op in removed if op not in layer.ops]
      if bad:
        raise invalid_argument(f"remove[{layer.name!r}]",
                               f"ops of that layer {ops}", bad)
      if layer.name in self.lock:
        op = self.lock[layer.name]
        if op not in layer.ops:
          raise invalid_argument(f"lock[{layer.name!r}]",
                                 f"an op of that layer {ops}", op)
        ops = [op]
      kept = [op for op in ops if op not in removed]
      if not kept:
        raise invalid_argument(
            "constraints", f"constraints that leave layer {layer.name!r} at "
            "least one op (removed: "
            f"{removed}, locked: {self.lock.get(layer.name)})",
            {"remove": self.remove.get(layer.name),
             "lock": self.lock.get(layer.name)})
      if kept != layer.op_names:
        allowed[layer.name] = kept
    return allowed

  def _check_prefer_limits_region(self, space: SearchSpace) -> None:
    for layer, weights in self.prefer.items():
      ops = space.layer(layer).op_names
      for op, weight in weights.items():
        if op not in ops:
          raise invalid_argument(f"prefer[{layer!r}]",
                                 f"ops of that layer {ops}", op)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
            or not 0 < weight < math.inf:
          raise invalid_argument(f"prefer[{layer!r}][{op!r}]",
                                 "a finite weight > 0", weight)
    unknown = sorted(set(self.limits) - set(LIMITS))
    if unknown:
      raise invalid_argument("limits", f"keyed by {LIMITS}", unknown)
    for key, value in self.limits.items():
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid_argument(f"limits[{key!r}]", "an integer >= 0", value)
    if self.region is not None:
      self.region = _check_region(space, self.region)

  def admits(self, space: SearchSpace, arch) -> bool:
    """Whether the search may take `arch` (remove, lock, region, limits)."""
    arch = space.check_arch(arch)
    allowed = self.allowed_ops(space)
    if any(layer.name in allowed and op not in allowed[layer.name]
           for op, layer in zip(arch, space.layers)):
      return False
    return self._admits_rest(space, arch)

  def _admits_rest(self, space: SearchSpace, arch: tuple) -> bool:
    if self.region is not None and not _in_region(self.region, arch):
      return False
    if self.limits:
      params = space.param_count(arch)
      if params > self.limits.get("max_params", math.inf) or \
          params < self.limits.get("min_params", 0):
        return False
    return True

  def admitted(self, space: SearchSpace) -> list | None:
    """Every admitted architecture in enumeration order, or None when the
    space restricted by remove/lock is too large to enumerate."""
    allowed = self.allowed_ops(space)
    if math.prod(len(o) for o in space.allowed_ops(allowed)) > \
        _ENUMERATE_UP_TO:
      return None
    return [a for a in space.enumerate(allowed)
            if self._admits_rest(space, a)]

  def validate(self, space: SearchSpace) -> None:
    """Raises a clear error if the document does not fit `space` or admits
    no sub-graph."""
    self.allowed_ops(space)
    self._check_prefer_limits_region(space)
    if not (self.region or self.limits):
      return
    admitted = self.admitted(space)
    if admitted == []:
      clauses = {k: v for k, v in (("region", self.region),
                                   ("limits", self.limits)) if v}
      raise invalid_argument("constraints", "constraints that admit at "
                             "least one sub-graph (with remove and lock, "
                             "these clauses admit none)", clauses)

  def weights(self, space: SearchSpace, arch) -> float:
    """The sampling weight of `arch`: product of its ops' preferences."""
    return math.prod(self.prefer.get(layer.name, {}).get(op, 1.0)
                     for op, layer in zip(arch, space.layers))

  def sampler(self, space: SearchSpace) -> Callable:
    """A function rng -> arch drawing admitted sub-graphs, each with
    probability proportional to `weights` (uniform without preferences).
    Validates first."""
    self.validate(space)
    admitted = self.admitted(space) if (self.region or self.limits) \
        else None
    if admitted is not None:
      p = np.array([self.weights(space, a) for a in admitted], np.float64)
      p /= p.sum()
      return lambda rng: admitted[int(rng.choice(len(admitted), p=p))]
    allowed = space.allowed_ops(self.allowed_ops(space))
    probs = []
    for ops, layer in zip(allowed, space.layers):
      w = np.array([self.prefer.get(layer.name, {}).get(op, 1.0)
                    for op in ops], np.float64)
      probs.append(w / w.sum())

    def draw(rng):
      for _ in range(_MAX_REJECTIONS):  # conditioning on region and limits
        arch = tuple(ops[int(rng.choice(len(ops), p=p))]
                     for ops, p in zip(allowed, probs))
        if self._admits_rest(space, arch):
          return arch
      raise invalid_argument(
          "constraints", f"constraints that admit sub-graphs often enough "
          f"to sample (none in {_MAX_REJECTIONS} draws)",
          {"region": self.region, "limits": self.limits})
    return draw

  # JSON ---------------------------------------------------------------
  def to_dict(self) -> dict:
    return copy.deepcopy({
        "format": FORMAT, "version": self.version, "remove": self.remove,
        "lock": self.lock, "prefer": self.prefer,
        "region": None if self.region is None else _json_region(self.region),
        "limits": self.limits, "history": self.history})

  @classmethod
  def from_dict(cls, data) -> "Constraints":
    """Parses a document (structure only; `validate(space)` checks names)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
      raise invalid_argument("data", f"a constraints document in format "
                             f"{FORMAT}", data.get("format")
                             if isinstance(data, dict) else data)
    remove, lock = data.get("remove", {}), data.get("lock", {})
    prefer, limits = data.get("prefer", {}), data.get("limits", {})
    if not (isinstance(remove, dict) and all(
        isinstance(v, list) for v in remove.values())):
      raise invalid_argument("remove", "a mapping of layer names to lists of "
                             "op names", remove)
    if not (isinstance(lock, dict) and all(
        isinstance(v, str) for v in lock.values())):
      raise invalid_argument("lock", "a mapping of layer names to op names",
                             lock)
    if not (isinstance(prefer, dict) and all(
        isinstance(v, dict) for v in prefer.values())):
      raise invalid_argument("prefer", "a mapping of layer names to {op: "
                             "weight} mappings", prefer)
    if not isinstance(limits, dict):
      raise invalid_argument("limits", "a mapping such as {'max_params': n}",
                             limits)
    region = data.get("region")
    if region is not None and not isinstance(region, dict):
      raise invalid_argument("region", "null or a region expression", region)
    version = data.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int) \
        or version < 0:
      raise invalid_argument("version", "an integer >= 0", version)
    history = data.get("history", [])
    if not isinstance(history, list):
      raise invalid_argument("history", "a list of edits", history)
    return cls(copy.deepcopy(remove), dict(lock), version, list(history),
               copy.deepcopy(prefer), copy.deepcopy(region), dict(limits))

  def save(self, path: str, overwrite: bool = True) -> None:
    """Writes the document atomically (a running search never reads half a
    file)."""
    atomic_write_text(path, json.dumps(self.to_dict(), indent=1),
                      overwrite=overwrite)

  @classmethod
  def load(cls, path: str, space: SearchSpace | None = None
           ) -> "Constraints":
    """Reads and (with `space`) validates a constraints file."""
    if not os.path.exists(path):
      raise invalid_argument("path", "an existing constraints file", path,
                             FileNotFoundError)
    with open(path, encoding="utf-8") as f:
      try:
        data = json.load(f)
      except json.JSONDecodeError as err:
        raise invalid_argument("path", f"a JSON file ({err})", path) from None
    constraints = cls.from_dict(data)
    if space is not None:
      constraints.validate(space)
    return constraints
