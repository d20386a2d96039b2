"""The analyst's steering of a search as a versioned JSON file (first part).

A `Constraints` document (format "tfopt.nas.constraints/1") holds:
- `remove`: {layer: [ops]} ops the search may no longer take;
- `lock`: {layer: op} layers fixed to one op;
- `version` (incremented on every edit) and `history` (one entry per edit:
  version, action, arguments), so a running search can tell that the file
  changed and a report can say who steered what.

`allowed_ops(space)` turns it into the per-layer restriction that
`SearchSpace.enumerate / sample`, `PathSampler` and `rank` take; a document
that leaves a layer without any op is refused with an error naming the
layer. Not built yet: `prefer`, `region` and `limits`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os

from tfopt._errors import invalid_argument
from tfopt._io import atomic_write_text
from tfopt.nas.space import SearchSpace

FORMAT = "tfopt.nas.constraints/1"


@dataclasses.dataclass
class Constraints:
  """Steering constraints; edit with `remove_op` / `lock_layer` / `unlock`."""
  remove: dict = dataclasses.field(default_factory=dict)
  lock: dict = dataclasses.field(default_factory=dict)
  version: int = 0
  history: list = dataclasses.field(default_factory=list)

  def _log(self, action: str, **arguments) -> None:
    self.version += 1
    self.history.append({"version": self.version, "action": action,
                         **arguments})

  def remove_op(self, space: SearchSpace, layer: str, op: str) -> None:
    """Forbids `op` in `layer` (refused if it would leave no op)."""
    trial = copy.deepcopy(self)
    trial.remove.setdefault(layer, [])
    if op not in trial.remove[layer]:
      trial.remove[layer].append(op)
    trial.allowed_ops(space)  # validates before anything changes
    self.remove = trial.remove
    self._log("remove", layer=layer, op=op)

  def lock_layer(self, space: SearchSpace, layer: str, op: str) -> None:
    """Fixes `layer` to `op`."""
    trial = copy.deepcopy(self)
    trial.lock[layer] = op
    trial.allowed_ops(space)
    self.lock = trial.lock
    self._log("lock", layer=layer, op=op)

  def unlock(self, layer: str) -> None:
    if layer not in self.lock:
      raise invalid_argument("layer", f"a locked layer {sorted(self.lock)}",
                             layer)
    del self.lock[layer]
    self._log("unlock", layer=layer)

  def allowed_ops(self, space: SearchSpace) -> dict:
    """{layer: allowed op names} for every layer the constraints touch."""
    names = {l.name for l in space.layers}
    for field, value in (("remove", self.remove), ("lock", self.lock)):
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

  # JSON ---------------------------------------------------------------
  def to_dict(self) -> dict:
    return copy.deepcopy({"format": FORMAT, "version": self.version,
                          "remove": self.remove, "lock": self.lock,
                          "history": self.history})

  @classmethod
  def from_dict(cls, data) -> "Constraints":
    if not isinstance(data, dict) or data.get("format") != FORMAT:
      raise invalid_argument("data", f"a constraints document in format "
                             f"{FORMAT}", data.get("format")
                             if isinstance(data, dict) else data)
    remove, lock = data.get("remove", {}), data.get("lock", {})
    if not (isinstance(remove, dict) and all(
        isinstance(v, list) for v in remove.values())):
      raise invalid_argument("remove", "a mapping of layer names to lists of "
                             "op names", remove)
    if not (isinstance(lock, dict) and all(
        isinstance(v, str) for v in lock.values())):
      raise invalid_argument("lock", "a mapping of layer names to op names",
                             lock)
    version = data.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int) \
        or version < 0:
      raise invalid_argument("version", "an integer >= 0", version)
    return cls(copy.deepcopy(remove), dict(lock), version,
               list(data.get("history", [])))

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
      constraints.allowed_ops(space)
    return constraints
