"""One-shot NAS over a keras-hub Qwen3-MoE language model's shape.

    space = moe_lm_space(vocabulary_size=300)       # layers x experts x
    net = MoELMSuperNet(space)                       #   top-k x expert width
    net.compile(optimizer="adam", loss=...)
    net.fit(x, y, sample_weight=w, callbacks=[PathSampler(constraints=c)])
    ranking = rank_lm(net, x_val, y_val, w_val, constraints=c)
    child = net.subnet(ranking.top()[0])             # a Qwen3MoeCausalLM

The space (`moe_lm_space`) has four choice layers -- decoder layers,
experts per MoE block, experts per token (top-k) and expert width (the
experts' intermediate dim) -- each op a value (`{"type": "value"}`), so
constraints, sampling, views and ranking work on it as on any
`SearchSpace`; `space.param_count` is the keras-hub model's own count.

The super-network is one `keras_hub.models.Qwen3MoeCausalLM` at the
largest value of each choice whose weights every sub-network shares
("weight entanglement", as in once-for-all networks): the active
architecture (non-trainable int32 variables, set by `set_arch` without
retracing) masks the router logits of experts beyond E (a softmax over the
first E logits is the sub-model's), the top-k ranks beyond k, the expert
hidden units beyond m, and skips the decoder layers beyond L. A sub-network
therefore computes what the standalone keras-hub model of its config
computes with the sliced weights: `subnet(arch)` builds that model (weights
copied) and the tests check the two agree. The load-balancing loss is left
out of the super-network's training (its router sees a varying expert
count); the standalone model has its own.

Built on keras-hub 0.32's Qwen3-MoE classes (their MoE block and decoder
layer are re-classed to elastic subclasses, nothing else changes); another
version whose blocks differ is refused with the reason.
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np
from keras import ops

from tfopt._errors import check_positive_int, invalid_argument
from tfopt.nas.space import ChoiceLayer, SearchSpace

CHOICES = ("layers", "experts", "top_k", "expert_width")
KIND = "qwen3_moe_lm"
_PREFIX = {"layers": "L", "experts": "E", "top_k": "k", "expert_width": "m"}


def moe_lm_space(vocabulary_size: int, *, sequence_length: int = 32,
                 hidden_dim: int = 32, num_query_heads: int = 4,
                 num_key_value_heads: int = 2, head_dim: int = 8,
                 layers=(1, 2), experts=(2, 4), top_k=(1, 2),
                 expert_width=(16, 32), name: str = "qwen3_moe_lm"
                 ) -> SearchSpace:
  """The space of Qwen3-MoE LMs with the fixed parts given and one choice
  per tuple (ops named "L1", "E4", "k2", "m32", ...)."""
  for arg, value in (("vocabulary_size", vocabulary_size),
                     ("sequence_length", sequence_length),
                     ("hidden_dim", hidden_dim),
                     ("num_query_heads", num_query_heads),
                     ("num_key_value_heads", num_key_value_heads),
                     ("head_dim", head_dim)):
    check_positive_int(arg, value)
  values = {"layers": layers, "experts": experts, "top_k": top_k,
            "expert_width": expert_width}
  for arg, options in values.items():
    options = tuple(options) if isinstance(options, (list, tuple)) else ()
    if not options or any(isinstance(v, bool) or not isinstance(v, int) or
                          v <= 0 for v in options) or \
        len(set(options)) != len(options):
      raise invalid_argument(arg, "a non-empty tuple of distinct positive "
                             "integers", values[arg])
    values[arg] = tuple(sorted(options))
  if max(values["top_k"]) > min(values["experts"]):
    raise invalid_argument(
        "top_k", f"values at most the fewest experts "
        f"({min(values['experts'])}): a token cannot go to more experts "
        "than a block has", top_k)
  if num_query_heads % num_key_value_heads:
    raise invalid_argument("num_key_value_heads", "a divisor of "
                           f"num_query_heads ({num_query_heads})",
                           num_key_value_heads)
  choice_layers = tuple(
      ChoiceLayer(choice, {f"{_PREFIX[choice]}{v}": {"type": "value",
                                                     "value": v}
                           for v in values[choice]})
      for choice in CHOICES)
  head = {"kind": KIND, "vocabulary_size": vocabulary_size,
          "hidden_dim": hidden_dim, "num_query_heads": num_query_heads,
          "num_key_value_heads": num_key_value_heads, "head_dim": head_dim}
  return SearchSpace(name, (sequence_length,), vocabulary_size,
                     choice_layers, stem={}, head=head)


def _check_space(space: SearchSpace) -> None:
  if not isinstance(space, SearchSpace) or space.head.get("kind") != KIND or \
      tuple(l.name for l in space.layers) != CHOICES:
    raise invalid_argument("space", "a search space from moe_lm_space",
                           getattr(space, "name", space))


def arch_values(space: SearchSpace, arch) -> dict[str, int]:
  """{"layers": L, "experts": E, "top_k": k, "expert_width": m}."""
  arch = space.check_arch(arch)
  return {layer.name: layer.ops[op]["value"]
          for op, layer in zip(arch, space.layers)}


def backbone_config(space: SearchSpace, arch) -> dict:
  """The `keras_hub.models.Qwen3MoeBackbone` arguments of `arch`."""
  _check_space(space)
  v = arch_values(space, arch)
  head = space.head
  return dict(vocabulary_size=head["vocabulary_size"],
              num_layers=v["layers"], num_query_heads=head["num_query_heads"],
              num_key_value_heads=head["num_key_value_heads"],
              hidden_dim=head["hidden_dim"], head_dim=head["head_dim"],
              intermediate_dim=2 * head["hidden_dim"],
              moe_intermediate_dim=v["expert_width"],
              num_experts=v["experts"], top_k=v["top_k"])


def param_count(space: SearchSpace, arch) -> int:
  """The keras-hub Qwen3-MoE model's parameters (untied embeddings, q/k
  norms, router, experts' fused gate/up and down kernels)."""
  c = backbone_config(space, arch)
  h, d = c["hidden_dim"], c["head_dim"]
  e, m = c["num_experts"], c["moe_intermediate_dim"]
  attention = (h * d * (2 * c["num_query_heads"] + 2 *
                        c["num_key_value_heads"]) + 2 * d)
  moe = h * e + e * h * 2 * m + e * m * h
  per_layer = attention + moe + 2 * h  # two RMS norms
  return 2 * c["vocabulary_size"] * h + c["num_layers"] * per_layer + h


def build_causal_lm(space: SearchSpace, arch, seed: int | None = 0):
  """A fresh `Qwen3MoeCausalLM` (no preprocessor) of `arch`."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  if seed is not None:
    keras.utils.set_random_seed(seed)
  backbone = keras_hub.models.Qwen3MoeBackbone(**backbone_config(space, arch))
  return keras_hub.models.Qwen3MoeCausalLM(backbone=backbone,
                                           preprocessor=None)


# -- The elastic super-network -----------------------------------------------
def _elastic_classes():
  """keras-hub's Qwen3-MoE block and decoder layer, each with an elastic
  subclass that reads the active architecture (`_tfopt_arch`)."""
  from keras_hub.src.models.qwen3_moe import qwen3_moe_decoder as hub  # pylint: disable=g-import-not-at-top

  class ElasticMoeBlock(hub.Qwen3SparseMoeBlock):
    """Qwen3SparseMoeBlock.call on the first E experts, their first m
    hidden units and the top k of them per token."""

    def call(self, hidden_states, attention_mask=None, training=None):
      del attention_mask, training  # no load-balancing loss (module doc)
      arch = self._tfopt_arch
      batch_size, seq_len, _ = ops.shape(hidden_states)
      flat = ops.reshape(hidden_states, (-1, self.hidden_dim))
      logits = self._sparse_feedforward_gate_dense(flat)
      live = ops.arange(self.num_experts) < arch["experts"]
      logits = ops.where(live[None, :], logits,
                         ops.cast(-1e9, logits.dtype))
      probs = ops.softmax(logits, axis=-1)
      top_p, top_i = ops.top_k(probs, k=self.top_k)
      top_p = top_p * ops.cast(ops.arange(self.top_k) < arch["top_k"],
                               top_p.dtype)
      if self.norm_top_k_prob:
        top_p = top_p / ops.sum(top_p, axis=-1, keepdims=True)
      one_hot = ops.cast(ops.one_hot(top_i, self.num_experts), top_p.dtype)
      routing = ops.transpose(ops.sum(one_hot * top_p[..., None], axis=1),
                              (1, 0))
      bank = self.expert_bank
      gate_up = ops.einsum("th,ehm->etm", flat,
                           bank._expert_feedforward_gate_dense)  # pylint: disable=protected-access
      gate, up = ops.split(gate_up, 2, axis=-1)
      width = ops.cast(ops.arange(bank.intermediate_dim) <
                       arch["expert_width"], gate.dtype)
      hidden = up * bank.activation(gate) * width
      out = ops.einsum("eti,eih->eth", hidden,
                       bank._expert_feedforward_output_dense)  # pylint: disable=protected-access
      out = ops.sum(out * ops.cast(routing, out.dtype)[:, :, None], axis=0)
      return (ops.reshape(out, (batch_size, seq_len, self.hidden_dim)),
              logits)

  class ElasticDecoder(hub.Qwen3MoeTransformerDecoder):
    """The decoder layer, passed through when it is beyond the active
    depth."""

    def call(self, decoder_sequence, *args, **kwargs):
      out = super().call(decoder_sequence, *args, **kwargs)
      if isinstance(out, tuple):  # a generation cache: not elastic
        return out
      return ops.where(self._tfopt_index < self._tfopt_arch["layers"], out,
                       decoder_sequence)

  return hub, ElasticMoeBlock, ElasticDecoder


class MoELMSuperNet(keras.Model):
  """The weight-entangled super-network of a `moe_lm_space` (module doc).

  Takes and returns what `Qwen3MoeCausalLM` does ({"token_ids",
  "padding_mask"} -> next-token logits); `space`, `set_arch(arch)`,
  `arch()` and `subnet(arch)` are the super-network interface
  `tfopt.nas.PathSampler` and `rank_lm` use.
  """

  def __init__(self, space: SearchSpace, seed: int = 0, **kwargs):
    super().__init__(**kwargs)
    _check_space(space)
    self.space = space
    largest = tuple(layer.op_names[-1] for layer in space.layers)
    self.lm = build_causal_lm(space, largest, seed=seed)
    self.active = {
        choice: self.add_weight(shape=(), dtype="int32", trainable=False,
                                initializer="zeros", name=f"active_{choice}")
        for choice in CHOICES}
    self._make_elastic()
    self.set_arch(largest)

  def _make_elastic(self) -> None:
    hub, block_cls, decoder_cls = _elastic_classes()
    arch = {k: v.value for k, v in self.active.items()}
    for i, decoder in enumerate(self.lm.backbone.transformer_layers):
      if type(decoder) is not hub.Qwen3MoeTransformerDecoder or \
          type(decoder.mlp) is not hub.Qwen3SparseMoeBlock:
        raise invalid_argument(
            "space", "a keras-hub Qwen3-MoE model whose decoder layers are "
            "Qwen3MoeTransformerDecoder with a Qwen3SparseMoeBlock (keras-"
            "hub 0.32)", f"<layer {i}: {type(decoder).__name__} with "
            f"{type(getattr(decoder, 'mlp', None)).__name__}>")
      # Same instances, same weights: only the call changes. Plain
      # attributes (not tracked by Keras).
      decoder.__class__ = decoder_cls
      decoder.mlp.__class__ = block_cls
      object.__setattr__(decoder, "_tfopt_arch", arch)
      object.__setattr__(decoder, "_tfopt_index", i)
      object.__setattr__(decoder.mlp, "_tfopt_arch", arch)

  def call(self, inputs, training=None):
    return self.lm(inputs, training=training)

  def set_arch(self, arch) -> None:
    """Activates `arch` (no retracing: the values are variables)."""
    for choice, value in arch_values(self.space, arch).items():
      self.active[choice].assign(value)

  def arch(self) -> tuple:
    """The active architecture."""
    out = []
    for layer in self.space.layers:
      value = int(keras.ops.convert_to_numpy(self.active[layer.name]))
      out.append(next(op for op, spec in layer.ops.items()
                      if spec["value"] == value))
    return tuple(out)

  def subnet(self, arch):
    """The standalone `Qwen3MoeCausalLM` of `arch` with the super-network's
    weights for it (sliced, copied)."""
    arch = self.space.check_arch(arch)
    values = arch_values(self.space, arch)
    child = build_causal_lm(self.space, arch, seed=None)
    big, small = self.lm.backbone, child.backbone
    pairs = [(small.token_embedding, big.token_embedding),
             (small.layer_norm, big.layer_norm)]
    for mine, theirs in zip(small.transformer_layers,
                            big.transformer_layers):
      mlp_ids = {id(w) for w in mine.mlp.weights}
      theirs_mlp = {id(w) for w in theirs.mlp.weights}
      for a, b in zip([w for w in mine.weights if id(w) not in mlp_ids],
                      [w for w in theirs.weights
                       if id(w) not in theirs_mlp]):
        a.assign(b.value)
      _copy_moe(mine.mlp, theirs.mlp, values)
    for mine, theirs in pairs:
      for a, b in zip(mine.weights, theirs.weights):
        a.assign(b.value)
    return child


def _copy_moe(small, big, values: dict) -> None:
  """The first E experts' first m hidden units (gate and up halves of the
  fused kernel alike) and the router's first E columns."""
  e, m = values["experts"], values["expert_width"]
  big_m = big.expert_bank.intermediate_dim
  router = ops.convert_to_numpy(big._sparse_feedforward_gate_dense.kernel)  # pylint: disable=protected-access
  small._sparse_feedforward_gate_dense.kernel.assign(router[:, :e])  # pylint: disable=protected-access
  gate_up = ops.convert_to_numpy(
      big.expert_bank._expert_feedforward_gate_dense)  # pylint: disable=protected-access
  columns = np.r_[0:m, big_m:big_m + m]
  small.expert_bank._expert_feedforward_gate_dense.assign(  # pylint: disable=protected-access
      gate_up[:e][:, :, columns])
  down = ops.convert_to_numpy(big.expert_bank._expert_feedforward_output_dense)  # pylint: disable=protected-access
  small.expert_bank._expert_feedforward_output_dense.assign(down[:e, :m])  # pylint: disable=protected-access


# -- Ranking ----------------------------------------------------------------
@dataclasses.dataclass
class LMRanking:
  """Held-out perplexity of each ranked sub-network, best (lowest) first;
  `params` per architecture, `excluded` those the constraints rule out
  (ranked too, for the scatterplot)."""
  perplexity: list  # [(arch, perplexity)]
  params: dict
  excluded: list

  def top(self, k: int = 1, admitted_only: bool = True) -> list:
    archs = [a for a, _ in self.perplexity
             if not admitted_only or a not in self.excluded]
    return archs[:k]


def token_perplexity(model, x: dict, y, sample_weight,
                     batch_size: int = 64) -> float:
  """exp of the mean next-token cross-entropy over the weighted (real,
  not padding) tokens of the batch."""
  logits = model.predict(x, batch_size=batch_size, verbose=0)
  logits = logits - logits.max(axis=-1, keepdims=True)
  log_z = np.log(np.exp(logits).sum(axis=-1))
  y = np.asarray(y)
  picked = np.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
  nll = log_z - picked
  w = np.asarray(sample_weight, np.float64)
  if not w.sum() > 0:
    raise invalid_argument("sample_weight", "at least one real token",
                           "<all zero>")
  return float(math.exp((nll * w).sum() / w.sum()))


def rank_lm(net: MoELMSuperNet, x_val: dict, y_val, w_val, *,
            constraints=None, batch_size: int = 64) -> LMRanking:
  """Every sub-network's held-out perplexity under the shared weights
  (exhaustive: these spaces are small), the constraints' exclusions
  marked."""
  if not isinstance(net, MoELMSuperNet):
    raise invalid_argument("net", "a MoELMSuperNet", type(net).__name__)
  space = net.space
  before = net.arch()
  scores, excluded = [], []
  try:
    for arch in space.enumerate():
      net.set_arch(arch)
      scores.append((arch, token_perplexity(net, x_val, y_val, w_val,
                                            batch_size)))
      if constraints is not None and not constraints.admits(space, arch):
        excluded.append(arch)
  finally:
    net.set_arch(before)
  scores.sort(key=lambda item: (item[1], space.index(item[0])))
  return LMRanking(scores, {a: space.param_count(a) for a, _ in scores},
                   excluded)
