"""What `tfopt.compile` does for `placement=`: pins, costs, the refusal,
and where each of the model's variables goes.

* **Pins.** Nothing is pinned by default: the placer may put each variable
  (with its readers, updaters and, separately, each optimizer slot) on any
  device, and the hook then moves the Keras variable there
  (`tfopt.runtime.variables`). `pins={"dense_3": 2}` pins a layer's
  variables (a layer name, or a variable path such as "dense_3/kernel") to
  a device (an index into `devices`, or one of its strings). Variables
  tfopt cannot move (plain `tf.Variable`s outside Keras) and variables
  already moved for an earlier input signature stay where they are.
* **Costs.** A step that fits one device (by the analytic estimate, or no
  cap) is profiled on one device, as before. One that does not -- or whose
  devices are tasks of other processes -- is first placed with analytic
  costs, profiled under that plan on the target devices, and placed again
  with the measured costs; ops no measurement covered keep the estimate
  (`profiled=False`), and the report says how many were measured.
* **Refusal.** When no plan fits, the error names the bytes the step needs
  live at once, the cap, and the fewest devices of that cap on which a plan
  was found (or the fewest that could hold it at all).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from tfopt._errors import invalid_argument
from tfopt.graph.analysis import format_bytes, live_memory_bound

# Device counts beyond the live-memory bound's minimum tried for a refusal.
REFUSAL_EXTRA_DEVICES = 4


def check_pins(pins, devices: Sequence[str]) -> dict[str, int]:
  """{layer or variable path: device index}, values checked (compile time)."""
  from tfopt.runtime.session import same_device  # pylint: disable=g-import-not-at-top
  if pins is None:
    return {}
  if not isinstance(pins, Mapping):
    raise invalid_argument("pins", "a mapping {layer name or variable path: "
                           "device index or device string}", pins)
  out = {}
  for key, value in pins.items():
    if not isinstance(key, str) or not key:
      raise invalid_argument("pins", "keys that are layer names or variable "
                             "paths", key)
    if isinstance(value, str):
      index = next((i for i, d in enumerate(devices)
                    if same_device(value, d) or same_device(d, value)), None)
    elif isinstance(value, int) and not isinstance(value, bool) and \
        0 <= value < len(devices):
      index = value
    else:
      index = None
    if index is None:
      raise invalid_argument(f"pins[{key!r}]", f"a device index in [0, "
                             f"{len(devices)}) or one of {list(devices)}",
                             value)
    out[key] = index
  return out


def check_selection(calibration, select, measure_steps):
  """The calibration (loaded from a path, checked to belong here), with
  `select` and `measure_steps` checked (compile time)."""
  from tfopt.calibration import Calibration, check_here, load_calibration  # pylint: disable=g-import-not-at-top
  from tfopt.runtime.select import SELECTS  # pylint: disable=g-import-not-at-top
  if select not in SELECTS:
    raise invalid_argument("select", f"one of {list(SELECTS)}", select)
  if select == "measured" and (isinstance(measure_steps, bool) or
                               not isinstance(measure_steps, int) or
                               measure_steps <= 0):
    raise invalid_argument("measure_steps", "a positive integer with "
                           "select='measured' (steps timed per candidate)",
                           measure_steps)
  if calibration is None or isinstance(calibration, Calibration):
    if calibration is not None:
      check_here(calibration)
    return calibration
  if isinstance(calibration, (str, bytes)) or hasattr(calibration,
                                                      "__fspath__"):
    return load_calibration(calibration)
  raise invalid_argument("calibration", "a calibration file's path or a "
                         "tfopt.calibration.Calibration", calibration)


def resolve_pins(model, pins: Mapping[str, int]) -> dict[int, int]:
  """{id(Keras variable): device index} for the user's pins."""
  by_path = {}
  from tfopt.runtime.variables import keras_variables  # pylint: disable=g-import-not-at-top
  for var in keras_variables(model):
    by_path[var.path] = var
  out = {}
  for key, index in pins.items():
    if key in by_path:
      out[id(by_path[key])] = index
      continue
    layer = next((l for l in model._flatten_layers() if l.name == key),  # pylint: disable=protected-access
                 None)
    if layer is None or not layer.variables:
      raise invalid_argument(
          "pins", f"keys naming layers with variables or variable paths of "
          f"model {model.name!r} (e.g. {sorted(by_path)[:3]})", key)
    for var in layer.variables:
      out[id(var)] = index
  return out


def step_pins(step, model, devices: Sequence[str],
              user: Mapping[int, int], keep_in_place: bool) -> dict[str, int]:
  """VarHandleOp name -> device index the placer must keep.

  User pins; every captured variable that is not a Keras variable of the
  model (tfopt cannot move it) where it lives; and, with `keep_in_place`,
  every variable where it lives (variables already moved for an earlier
  input signature: one variable lives in one place)."""
  from tfopt.runtime.session import same_device  # pylint: disable=g-import-not-at-top
  from tfopt.runtime.variables import keras_variables  # pylint: disable=g-import-not-at-top
  keras_of = {id(v.value): v for v in keras_variables(model)
              if getattr(v, "value", None) is not None}
  out = {}
  for name, tf_var in step.variables.items():
    var = keras_of.get(id(tf_var))
    if var is not None and id(var) in user:
      out[name] = user[id(var)]
      continue
    if var is not None and not keep_in_place:
      continue
    index = next((i for i, d in enumerate(devices)
                  if tf_var.device and same_device(d, tf_var.device)), None)
    if index is None:
      raise invalid_argument(
          "devices", f"a list including the device of every variable tfopt "
          f"cannot move ({name!r} is not a Keras variable of the model and "
          f"lives on {tf_var.device or 'an unknown device'})", list(devices))
    out[name] = index
  return out


def keras_assignment(step, model, graph_def) -> list[tuple[object, str]]:
  """(Keras variable, the device string the placed graph gives it) pairs
  (Keras variables are not hashable)."""
  from tfopt.runtime.variables import keras_variables  # pylint: disable=g-import-not-at-top
  keras_of = {id(v.value): v for v in keras_variables(model)}
  device_of = {n.name: n.device for n in graph_def.node}
  out = []
  for name, tf_var in step.variables.items():
    var = keras_of.get(id(tf_var))
    if var is not None and device_of.get(name):
      out.append((var, device_of[name]))
  return out


def one_device_peak(step) -> int:
  """The step's analytic liveness peak on one device (bytes): the
  simulator's schedule of the whole step on one device with the analytic
  cost estimate, what `tfopt.compile` judges a cap against first."""
  from tfopt.cluster import Cluster  # pylint: disable=g-import-not-at-top
  from tfopt.cost.analytic import estimate_costs  # pylint: disable=g-import-not-at-top
  from tfopt.placement.placement import Placement  # pylint: disable=g-import-not-at-top
  from tfopt.simulate import simulate  # pylint: disable=g-import-not-at-top
  graph = step.graph
  schedule = simulate(graph, Placement.single_device(graph),
                      estimate_costs(graph), Cluster.uniform(1, None))
  return int(schedule.peak_bytes[0])


def fits_one_device(step, cap: int | None) -> bool:
  """Whether the step's analytic one-device liveness peak fits `cap`."""
  if cap is None:
    return True
  from tfopt.cluster import Cluster  # pylint: disable=g-import-not-at-top
  from tfopt.cost.analytic import estimate_costs  # pylint: disable=g-import-not-at-top
  from tfopt.placement.placement import Placement  # pylint: disable=g-import-not-at-top
  from tfopt.simulate import simulate  # pylint: disable=g-import-not-at-top
  graph = step.graph
  schedule = simulate(graph, Placement.single_device(graph), estimate_costs(
      graph), Cluster.uniform(1, cap, device_type="CPU"))
  return schedule.feasible


@dataclasses.dataclass(frozen=True)
class Refusal:
  """Why a step cannot be placed: what it needs and what would hold it."""
  live_bytes: int
  single_device_peak: int
  cap: int | None
  num_devices: int
  fewest_devices: int | None  # a plan was found on this many
  at_least: int  # no fewer devices of this cap can hold the step
  tried_up_to: int  # device counts tried for a plan, up to this many
  # Set when one op (or colocation group) alone exceeds the cap: then no
  # number of devices of this cap helps.
  indivisible: str | None = None

  def message(self, model_name: str, reason: str | None = None) -> str:
    """The refusal; with `reason`, the placers' own account after it."""
    cap = format_bytes(self.cap) if self.cap else "unlimited"
    if self.indivisible:
      return (f"tfopt.compile cannot place {model_name}'s training step on "
              f"devices of {cap} each (memory_per_device): "
              f"{self.indivisible[:1].lower()}{self.indivisible[1:]} No "
              f"number of devices of this cap can hold it; raise the cap. "
              f"The model's variables were not changed.")
    found = (f"the fewest devices of this cap on which a plan was found: "
             f"{self.fewest_devices}" if self.fewest_devices else
             f"no plan was found on up to {self.tried_up_to} devices of this "
             f"cap; at least {self.at_least} are needed")
    return (f"tfopt.compile cannot place {model_name}'s training step on "
            f"{self.num_devices} device(s) of {cap} each (memory_per_device):"
            f" it needs {format_bytes(self.live_bytes)} live at once in any "
            f"schedule (on one device its peak is "
            f"{format_bytes(self.single_device_peak)}); {found}. The model's "
            f"variables were not changed." + (f" ({reason})" if reason else ""))


def refusal(graph, costs, cluster) -> Refusal:
  """What `graph` needs and the fewest devices like `cluster`'s first that
  hold it (m-stage, then the portfolio, from the live-memory bound's
  minimum up to REFUSAL_EXTRA_DEVICES more)."""
  from tfopt.cluster import Cluster, Device  # pylint: disable=g-import-not-at-top
  from tfopt.placement.api import place  # pylint: disable=g-import-not-at-top
  from tfopt.placement.placement import Placement  # pylint: disable=g-import-not-at-top
  from tfopt.placement.problem import InfeasiblePlacement, make_problem  # pylint: disable=g-import-not-at-top
  from tfopt.simulate import simulate  # pylint: disable=g-import-not-at-top
  first = cluster.devices[0]
  cap = first.memory_bytes
  bound = live_memory_bound(graph, costs).bytes
  single = simulate(graph, Placement.single_device(graph), costs,
                    Cluster((Device(first.name, first.device_type),)))
  at_least = max(1, math.ceil(bound / cap)) if cap else 1
  try:
    make_problem(graph, Cluster.uniform(1, cap, device_type=first.device_type),
                 costs)
  except InfeasiblePlacement as err:  # one op or group over the cap
    return Refusal(bound, single.peak_bytes[0], cap, len(cluster), None,
                   at_least, 0, indivisible=str(err))
  # The caller's own device count already failed with the whole portfolio.
  start = max(at_least, len(cluster) + 1)
  fewest = None
  for k in range(start, start + REFUSAL_EXTRA_DEVICES):
    trial = Cluster.uniform(k, cap, device_type=first.device_type,
                            comm=cluster.comm)
    for placer in ("m-stage", "auto"):
      try:
        place(graph, trial, costs, placer, coarsen=False)
        fewest = k
        break
      except InfeasiblePlacement:
        continue
    if fewest is not None:
      break
  return Refusal(bound, single.peak_bytes[0], cap, len(cluster), fewest,
                 at_least, start + REFUSAL_EXTRA_DEVICES - 1)


def placement_summary(plan, graph_def, variables: Mapping[str, Any]
                      ) -> dict[str, Any]:
  """Per device: predicted peak and the share of the variables' bytes."""
  device_of = {n.name: n.device for n in graph_def.node}
  per_device: dict[str, int] = {}
  total = 0
  for name, var in variables.items():
    nbytes = int(var.shape.num_elements()) * var.dtype.size
    per_device[device_of.get(name, "")] = per_device.get(
        device_of.get(name, ""), 0) + nbytes
    total += nbytes
  return {"variable_bytes": per_device, "variable_total": total,
          "peak_bytes": tuple(plan.schedule.peak_bytes)}
