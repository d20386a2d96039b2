"""FLOPs of a compiled step, counted from its XLA HLO.

MFU needs the FLOPs one training step really does. Summing the HLO's `dot`
and `convolution` instructions of the compiled step counts exactly what XLA
runs (forward, both backward products, attention's batched matmuls, any
Einsum), where `tf.compat.v1.profiler` misses Einsum and drifts by a few
per cent. Element-wise ops are not counted: MFU conventionally counts the
matrix work only.

- dot: 2 x (output elements) x (product of the lhs contracting dims).
- convolution: 2 x batch x output features x (input features per group) x
  the number of (output position, kernel tap) pairs that land on a real
  input element, per spatial dimension: taps that fall into padding or
  between the elements of an lhs-dilated (transposed, i.e. backprop-input)
  input multiply zeros and are not counted, so the backward pass of a
  convolution counts the same work as its forward pass, as the analytic
  count does.

`step_flops(fn, *args)` compiles `fn` (a `tf.function`, made
`jit_compile=True` if needed) for `args` and returns a `FlopCount`;
`train_step_flops(model, x, y)` does it for a compiled Keras model's
`train_step`, `hlo_flops(text)` for HLO text.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

from tfopt._errors import invalid_argument

_SHAPE = r"([a-z]+[0-9]*)\[([0-9,]*)\]"
_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*" + _SHAPE +
    r"(?:\{[^}]*\})?\s+(?P<op>dot|convolution)\((?P<operands>[^)]*)\)"
    r"(?P<attrs>.*)$")
_OPERAND = re.compile(_SHAPE)


@dataclasses.dataclass
class FlopCount:
  """Total FLOPs and the per-instruction breakdown [(name, kind, flops,
  op_name from the metadata)]."""
  total: int
  by_instruction: list

  def by_kind(self) -> dict:
    out = collections.Counter()
    for _, kind, flops, _ in self.by_instruction:
      out[kind] += flops
    return dict(out)


def _dims(text: str) -> list:
  return [int(d) for d in text.split(",") if d]


def _attr(attrs: str, key: str) -> str | None:
  """`key`'s value in an HLO attribute list: a braced list ("{1,2}", up to
  its own closing brace: the text may go on with more braces) or a word.

  >>> _attr("lhs_batch_dims={0}, lhs_contracting_dims={2}}", "lhs_contracting_dims")
  '{2}'
  >>> _attr("dim_labels=b01f_01io->b01f, window={size=3}", "dim_labels")
  'b01f_01io->b01f'
  """
  match = re.search(rf"\b{key}=(\{{[^}}]*\}}|[^\s,}}]+)", attrs)
  return match.group(1) if match else None


def _dot_flops(out_dims, lhs_dims, attrs) -> int:
  contracting = _attr(attrs, "lhs_contracting_dims")
  idx = [int(i) for i in contracting.strip("{}").split(",") if i] \
      if contracting else []
  return 2 * math.prod(out_dims) * math.prod(lhs_dims[i] for i in idx)


def _window(attrs: str, rank: int) -> list:
  """Per spatial dim: (size, stride, (pad_lo, pad_hi), lhs_dilate,
  rhs_dilate); HLO leaves out the fields at their defaults."""
  text = re.search(r"window=\{([^}]*)\}", attrs)
  fields = dict(item.split("=", 1) for item in text.group(1).split()) \
      if text else {}
  def per_dim(key, default):
    return fields[key].split("x") if key in fields else [default] * rank
  size = [int(v) for v in per_dim("size", 1)]
  stride = [int(v) for v in per_dim("stride", 1)]
  pads = [tuple(int(p) for p in v.split("_")) for v in per_dim("pad", "0_0")]
  lhs_d = [int(v) for v in per_dim("lhs_dilate", 1)]
  rhs_d = [int(v) for v in per_dim("rhs_dilate", 1)]
  return list(zip(size, stride, pads, lhs_d, rhs_d))


def _valid_pairs(in_size, out_size, size, stride, pad, lhs_d, rhs_d) -> int:
  """(output position, kernel tap) pairs that read a real input element."""
  last = (in_size - 1) * lhs_d
  count = 0
  for o in range(out_size):
    for t in range(size):
      pos = o * stride + t * rhs_d - pad[0]
      if 0 <= pos <= last and pos % lhs_d == 0:
        count += 1
  return count


def _conv_flops(out_dims, lhs_dims, rhs_dims, attrs) -> int:
  labels = _attr(attrs, "dim_labels")
  if labels is None:
    raise ValueError(f"convolution without dim_labels: {attrs[:200]}")
  lhs_l, rest = labels.split("_", 1)
  rhs_l, out_l = rest.split("->")
  spatial = [c for c in lhs_l if c.isdigit()]
  # Grouped / depthwise convolutions: the kernel's "i" dimension is
  # already the input features per group.
  batch = out_dims[out_l.index("b")]
  out_features = out_dims[out_l.index("f")]
  in_per_group = rhs_dims[rhs_l.index("i")]
  window = _window(attrs, len(spatial))
  pairs = 1
  for d, (size, stride, pad, lhs_d, rhs_d) in zip(spatial, window):
    pairs *= _valid_pairs(lhs_dims[lhs_l.index(d)], out_dims[out_l.index(d)],
                          size, stride, pad, lhs_d, rhs_d)
  return 2 * batch * out_features * in_per_group * pairs


_COMPUTATION = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*)?\{\s*$")
_ASSIGN = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_REF = re.compile(r"%([\w.\-]+)")


def _computations(text: str):
  """{computation: {"entry": bool, "root": name, "instrs": {name: (line,
  refs)}}} from HLO text."""
  comps, current = {}, None
  for line in text.splitlines():
    if current is None:
      match = _COMPUTATION.match(line)
      if match and "=" not in line.split("(")[0]:
        current = match.group(2)
        comps[current] = {"entry": bool(match.group(1)), "root": None,
                          "instrs": {}}
      continue
    if line.strip() == "}":
      current = None
      continue
    match = _ASSIGN.match(line)
    if match:
      name = match.group(2)
      comps[current]["instrs"][name] = (line, _REF.findall(match.group(3)))
      if match.group(1):
        comps[current]["root"] = name
  return comps


def _live_lines(text: str) -> list:
  """The instruction lines that contribute to the result: reachable from
  the ROOT of the entry computation, through operands and the computations
  live instructions call. The HLO that TensorFlow hands XLA still holds
  dead code (e.g. a first convolution's input gradient, which TF's Conv2D
  gradient always builds); XLA removes it, so must the count."""
  comps = _computations(text)
  entries = [c for c, v in comps.items() if v["entry"]]
  if not entries:  # a bare list of instructions: count them all
    return text.splitlines()
  live, todo = [], [(entries[0], comps[entries[0]]["root"])]
  seen = set()
  while todo:
    comp, name = todo.pop()
    if (comp, name) in seen or name not in comps[comp]["instrs"]:
      continue
    seen.add((comp, name))
    line, refs = comps[comp]["instrs"][name]
    live.append(line)
    for ref in refs:
      if ref in comps[comp]["instrs"]:
        todo.append((comp, ref))
      elif ref in comps and comps[ref]["root"] is not None:
        todo.append((ref, comps[ref]["root"]))  # a called computation
  return live


def hlo_flops(text: str) -> FlopCount:
  """Sums the dot and convolution FLOPs of the live instructions of HLO
  text (see the module doc). Instructions inside loops count once."""
  if not isinstance(text, str):
    raise invalid_argument("text", "HLO text (str)", type(text).__name__)
  rows = []
  for line in _live_lines(text):
    match = _INSTR.match(line)
    if not match:
      continue
    out_dims = _dims(match.group(3))
    operands = [_dims(m.group(2)) for m in
                _OPERAND.finditer(match.group("operands"))]
    attrs = match.group("attrs")
    if match.group("op") == "dot":
      flops = _dot_flops(out_dims, operands[0], attrs)
    else:
      flops = _conv_flops(out_dims, operands[0], operands[1], attrs)
    op_name = re.search(r'op_name="([^"]*)"', attrs)
    rows.append((match.group("name"), match.group("op"), flops,
                 op_name.group(1) if op_name else ""))
  return FlopCount(sum(r[2] for r in rows), rows)


def step_flops(fn, *args, **kwargs) -> FlopCount:
  """FLOPs of one call of `fn(*args, **kwargs)` as XLA compiles it."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  if not isinstance(fn, tf.types.experimental.PolymorphicFunction) or \
      not getattr(fn, "_jit_compile", False):
    fn = tf.function(getattr(fn, "python_function", fn), jit_compile=True)
  text = fn.experimental_get_compiler_ir(*args, **kwargs)(stage="hlo")
  return hlo_flops(text)


def train_step_flops(model, x, y=None, sample_weight=None) -> FlopCount:
  """FLOPs of one `model.train_step` on the batch (x, y) (the model must be
  compiled; its optimizer is built if it is not yet). Runs nothing: the step
  is only compiled.

  A model of a distribution strategy (`MirroredStrategy`,
  `MultiWorkerMirroredStrategy`, ...) is counted on a copy outside the
  strategy (`_replica_copy`), left untouched itself: give the batch one
  replica sees (the global batch / the replicas) for one replica's FLOPs.
  The all-reduce does no matrix work. The copy is compiled with the loss
  only (metrics and loss weights add no matmuls) and runs Keras' own
  `train_step`: a model class that overrides it is counted by the
  default step."""
  import keras  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  if not isinstance(model, keras.Model) or not model.compiled:
    raise invalid_argument("model", "a compiled keras.Model",
                           type(model).__name__)
  # Outside every scope get_strategy() is the default strategy: a model of
  # another one is counted on a copy. Inside a scope, as before: directly.
  if not tf.distribute.has_strategy() and getattr(
      model, "distribute_strategy", None) not in (
          None, tf.distribute.get_strategy()):
    model = _replica_copy(model)
  if not model.built:
    model(x)
  if not model.optimizer.built:
    model.optimizer.build(model.trainable_variables)
  data = (x,) if y is None else (x, y) if sample_weight is None else (
      x, y, sample_weight)
  def step(*batch):
    return model.train_step(batch)
  from tfopt.scale.stragglers import untimed  # pylint: disable=import-outside-toplevel
  with untimed(model):  # a straggler monitor's timestamps have no XLA kernel
    return step_flops(step, *data)


def _replica_copy(model):
  """`model` cloned outside its distribution strategy and compiled with its
  loss and a fresh optimizer of its optimizer's config: what one replica's
  train step computes, without building the user's optimizer outside its
  strategy's scope (which fails there and leaves it half built)."""
  import keras  # pylint: disable=import-outside-toplevel
  try:
    copy = keras.models.clone_model(model)
  except Exception as err:  # pylint: disable=broad-except
    raise invalid_argument(
        "model", f"a Sequential or functional model (or one "
        f"keras.models.clone_model rebuilds: {err}) to count its FLOPs "
        f"under a distribution strategy; else count a copy built outside "
        f"the strategy, or give MFUMonitor flops_per_step",
        type(model).__name__) from err
  optimizer = type(model.optimizer).from_config(model.optimizer.get_config())
  copy.compile(optimizer=optimizer, loss=model.loss)
  return copy
