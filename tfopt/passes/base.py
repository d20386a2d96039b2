"""Pass infrastructure: a pass is a function (graph_def, ctx) -> PassResult.

Passes are Python GraphDef -> GraphDef rewrites (custom Grappler optimizers
can only be registered from C++; an unknown name in `custom_optimizers` is
silently ignored). A `PassManager` runs a pipeline string such as
"prune,fold,fuse,coarsen,place" and reports, per pass, its time, whether it
changed the graph and the op count per op type before and after. With
`verify=`, a check runs after every pass that changed the graph (e.g.
`tfopt.runtime.run_and_compare`: the rewritten step must compute what the
original computed). A pass never modifies the GraphDef it is given.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable, Mapping, Sequence

from tensorflow.core.framework import graph_pb2

from tfopt._errors import invalid_argument


@dataclasses.dataclass(frozen=True)
class PassResult:
  """What a pass returns: the (new) graph and whether anything changed."""
  graph: graph_pb2.GraphDef
  changed: bool
  note: str = ""


@dataclasses.dataclass
class PassContext:
  """What passes need beyond the graph, and what they leave for later ones.

  Attributes:
    keep: node names that must survive every rewrite under their own name:
      fed placeholders, fetched ops and run targets. Pruning needs them.
    batch_size: the leading dimension of unknown batch shapes.
    costs: op name -> OpCost (a CostModel) for the placement pass.
    cluster: the devices for the placement pass.
    placer: the placer the placement pass runs ("auto" or a name).
    placement: a ready Placement; the placement pass then only writes it.
    pins: op name -> device index the placer must keep (its colocation
      group follows), e.g. each variable on the device it lives on.
    choose: optional `choose(placed_graph_def, placement_result)` ->
      (placement_result, report): the place pass lets it pick the plan
      among the portfolio's candidates (e.g. by measuring them:
      `tfopt.runtime.select.measured_chooser`); its report lands in
      `results["selection"]`.
    coarsen: set by the coarsen pass: placement also tries coarse graphs.
    fused: set by the fusion pass: fused node -> the nodes it replaced, so
      the fused op's cost is its members' sum.
    results: per-pass outputs for the caller (placement result, coarsening).
  """
  keep: tuple[str, ...] = ()
  batch_size: int | None = None
  costs: Mapping | None = None
  cluster: object | None = None
  placer: str = "auto"
  placement: Mapping[str, int] | None = None
  pins: Mapping[str, int] | None = None
  choose: Callable | None = None
  coarsen: bool = False
  fused: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
  results: dict[str, object] = dataclasses.field(default_factory=dict)

  def require_keep(self, pass_name: str) -> set[str]:
    """`keep` as a set; a pass that needs it raises without it."""
    if not self.keep:
      raise invalid_argument(
          "ctx.keep", f"the node names to keep (feeds, fetches, targets) for "
          f"pass {pass_name!r}: without them every node is as live as any "
          f"other; use PassContext.for_step(step)", self.keep)
    return set(self.keep)

  @classmethod
  def for_step(cls, step, **kwargs) -> "PassContext":
    """A context keeping a CapturedStep's feeds, fetches and targets."""
    keep = (tuple(step.input_names) +
            tuple(t.partition(":")[0] for t in step.output_names) +
            tuple(step.target_names))
    return cls(keep=keep, batch_size=step.batch_size, **kwargs)


PassFn = Callable[[graph_pb2.GraphDef, PassContext], PassResult]
_REGISTRY: dict[str, PassFn] = {}


def register_pass(name: str) -> Callable[[PassFn], PassFn]:
  """Decorator registering a pass under `name` (lowercase, unique)."""
  if not name or name != name.strip().lower() or "," in name:
    raise invalid_argument("name", "a lowercase name without commas", name)

  def decorate(fn: PassFn) -> PassFn:
    if name in _REGISTRY and _REGISTRY[name] is not fn:
      raise invalid_argument("name", "a pass name not registered yet", name)
    _REGISTRY[name] = fn
    return fn

  return decorate


def registered_passes() -> tuple[str, ...]:
  """The names a pipeline may use."""
  _load_builtin_passes()
  return tuple(sorted(_REGISTRY))


def _load_builtin_passes() -> None:
  # The built-in passes register themselves on import.
  from tfopt.passes import control, fold, fuse, place, prune  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import


def op_counts(graph_def: graph_pb2.GraphDef) -> collections.Counter:
  """Op type -> number of nodes (top-level nodes only)."""
  return collections.Counter(node.op for node in graph_def.node)


@dataclasses.dataclass(frozen=True)
class PassReport:
  """One pass's run: time, change, op counts and its note."""
  name: str
  seconds: float
  changed: bool
  nodes_before: int
  nodes_after: int
  op_diff: Mapping[str, int]
  note: str = ""
  verified: bool = False

  def line(self) -> str:
    diff = ", ".join(f"{op} {d:+d}" for op, d in sorted(self.op_diff.items()))
    verified = " verified" if self.verified else ""
    note = f"  {self.note}" if self.note else ""
    return (f"{self.name:<9}{self.seconds * 1e3:>9.1f} ms  {self.nodes_before:>6}"
            f" -> {self.nodes_after:<6}{verified}  {diff or 'no op change'}"
            f"{note}")


@dataclasses.dataclass(frozen=True)
class PipelineResult:
  """The final graph and one report per pass."""
  graph: graph_pb2.GraphDef
  reports: tuple[PassReport, ...]

  @property
  def changed(self) -> bool:
    return any(r.changed for r in self.reports)

  def table(self) -> str:
    header = f"{'pass':<9}{'time':>12}  {'nodes':>6}    {'':<6}  op changes"
    return "\n".join([header] + [r.line() for r in self.reports])


class PassError(RuntimeError):
  """A pass failed; the message names it and the passes that ran before."""

  def __init__(self, pass_name: str, completed: Sequence[str],
               error: BaseException):
    before = ", ".join(completed) if completed else "none"
    super().__init__(f"Pass {pass_name!r} failed (passes completed before "
                     f"it: {before}): {type(error).__name__}: {error}")
    self.pass_name = pass_name
    self.completed = tuple(completed)


def parse_pipeline(pipeline: str | Sequence[str]) -> tuple[str, ...]:
  """Pass names of a pipeline string ("prune,fuse") or sequence, checked."""
  available = registered_passes()
  names = ([p.strip() for p in pipeline.split(",")]
           if isinstance(pipeline, str) else list(pipeline))
  if not names or any(not isinstance(n, str) or n not in available
                      for n in names):
    raise invalid_argument("pipeline", f"comma-separated pass names from "
                           f"{list(available)}", pipeline)
  return tuple(names)


class PassManager:
  """Runs a pipeline of registered passes.

  >>> PassManager("prune,fuse").passes
  ('prune', 'fuse')

  Args:
    pipeline: "prune,fold,fuse,coarsen,place" or a sequence of names.
    verify: optional `verify(before, after, pass_name)` called after each
      pass that changed the graph; it raises if the rewrite broke the graph.
  """

  def __init__(self, pipeline: str | Sequence[str], *,
               verify: Callable[[graph_pb2.GraphDef, graph_pb2.GraphDef, str],
                                None] | None = None):
    self.passes = parse_pipeline(pipeline)
    if verify is not None and not callable(verify):
      raise invalid_argument("verify", "a callable (before, after, pass_name) "
                             "or None", verify)
    self.verify = verify

  def run(self, graph_def: graph_pb2.GraphDef,
          ctx: PassContext | None = None) -> PipelineResult:
    """Runs every pass in order on a copy of `graph_def`."""
    if not isinstance(graph_def, graph_pb2.GraphDef):
      raise invalid_argument("graph_def", "a tf.compat.v1.GraphDef",
                             type(graph_def).__name__)
    ctx = ctx if ctx is not None else PassContext()
    current, reports, done = graph_def, [], []
    for name in self.passes:
      before = op_counts(current)
      start = time.perf_counter()
      try:
        result = _REGISTRY[name](current, ctx)
        if not isinstance(result, PassResult):
          raise TypeError(f"the pass returned {type(result).__name__}, not a "
                          f"PassResult")
        seconds = time.perf_counter() - start
        verified = False
        if self.verify is not None and result.changed:
          self.verify(current, result.graph, name)
          verified = True
      except Exception as err:  # pylint: disable=broad-except
        raise PassError(name, done, err) from err
      after = op_counts(result.graph)
      diff = {op: after[op] - before[op] for op in set(before) | set(after)
              if after[op] != before[op]}
      reports.append(PassReport(name, seconds, result.changed,
                                len(current.node), len(result.graph.node),
                                diff, result.note, verified))
      current = result.graph
      done.append(name)
    return PipelineResult(current, tuple(reports))
