"""Text and a tokenizer for the demo, built in code: Python's own pydoc
topics (shipped with CPython), a byte-level BPE vocabulary learned from
them, and keras-hub's Qwen3-MoE tokenizer and preprocessor on it.

`train_bpe` is the textbook algorithm (Sennrich et al.): words as byte
sequences in GPT-2's byte-to-unicode alphabet, the most frequent adjacent
pair merged, repeated; every byte is in the vocabulary, so no text is out
of vocabulary. `lm_data` turns paragraphs into what keras-hub's
`Qwen3MoeCausalLMPreprocessor` feeds a CausalLM -- token ids, padding mask,
next-token targets and the padding mask again as sample weights -- as
NumPy arrays, split into train / validation / held-out paragraphs.
"""

from __future__ import annotations

import collections
import dataclasses
import re

import numpy as np

from tfopt._errors import check_positive_int

SPECIAL = ("<|endoftext|>", "<|im_end|>")  # Qwen's pad and end tokens
_WORDS = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+")


def paragraphs(min_chars: int = 40) -> list[str]:
  """The pydoc topics' paragraphs (blank-line separated, whitespace
  squeezed) with at least `min_chars` characters, in a fixed order."""
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top
  out = []
  for key in sorted(topics.topics):
    for block in topics.topics[key].split("\n\n"):
      text = " ".join(block.split())
      if len(text) >= min_chars:
        out.append(text)
  return out


def byte_alphabet() -> dict[int, str]:
  """GPT-2's reversible byte -> printable unicode character map (what
  keras-hub's byte-pair tokenizers read vocabularies in)."""
  printable = (list(range(ord("!"), ord("~") + 1)) +
               list(range(ord("¡"), ord("¬") + 1)) +
               list(range(ord("®"), ord("ÿ") + 1)))
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[b] = chr(b)
    else:
      chars[b] = chr(256 + extra)
      extra += 1
  return chars


def train_bpe(texts, merges: int) -> tuple[dict[str, int], list[str]]:
  """(vocabulary, merges) of a byte-level BPE with `merges` merges learned
  from `texts`: the special tokens, the 256 bytes, then one token per
  merge, in the order learned (ties: the pair first seen)."""
  check_positive_int("merges", merges)
  alphabet = byte_alphabet()
  words = collections.Counter()
  for text in texts:
    for word in _WORDS.findall(text):
      words[tuple(alphabet[b] for b in word.encode("utf-8"))] += 1
  vocabulary = {token: i for i, token in enumerate(SPECIAL)}
  for b in range(256):
    vocabulary[alphabet[b]] = len(vocabulary)
  learned = []
  for _ in range(merges):
    pairs = collections.Counter()
    for word, count in words.items():
      for pair in zip(word, word[1:]):
        pairs[pair] += count
    if not pairs:
      break
    best = max(pairs, key=pairs.get)  # first seen among the most frequent
    joined = best[0] + best[1]
    learned.append(f"{best[0]} {best[1]}")
    vocabulary.setdefault(joined, len(vocabulary))
    words = collections.Counter({_merge(w, best, joined): c
                                 for w, c in words.items()})
  return vocabulary, learned


def _merge(word: tuple, pair: tuple, joined: str) -> tuple:
  out, i = [], 0
  while i < len(word):
    if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
      out.append(joined)
      i += 2
    else:
      out.append(word[i])
      i += 1
  return tuple(out)


def tokenizer(vocabulary: dict[str, int], merges: list[str]):
  """keras-hub's `Qwen3MoeTokenizer` on this vocabulary."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  return keras_hub.models.Qwen3MoeTokenizer(vocabulary=vocabulary,
                                            merges=merges)


@dataclasses.dataclass(frozen=True)
class LMData:
  """A CausalLM's batches as NumPy arrays: `x` ({"token_ids",
  "padding_mask"}), `y` (next tokens) and `sample_weight` (the mask)."""
  x: dict
  y: np.ndarray
  sample_weight: np.ndarray

  def __len__(self) -> int:
    return len(self.y)

  def take(self, index) -> "LMData":
    return LMData({k: v[index] for k, v in self.x.items()}, self.y[index],
                  self.sample_weight[index])

  def fit_kwargs(self) -> dict:
    return dict(x=self.x, y=self.y, sample_weight=self.sample_weight)

  @property
  def tokens(self) -> int:
    """Real (weighted) target tokens."""
    return int(self.sample_weight.sum())


def lm_data(texts, tok, sequence_length: int) -> LMData:
  """What keras-hub's Qwen3-MoE preprocessor feeds `fit` for `texts`."""
  import keras  # pylint: disable=g-import-not-at-top
  import keras_hub  # pylint: disable=g-import-not-at-top
  check_positive_int("sequence_length", sequence_length)
  pre = keras_hub.models.Qwen3MoeCausalLMPreprocessor(
      tokenizer=tok, sequence_length=sequence_length)
  x, y, w = keras.utils.unpack_x_y_sample_weight(pre(list(texts)))
  as_np = keras.ops.convert_to_numpy
  # int32 masks: the backbone's own dtype (a bool mask also has no AddN
  # kernel for Keras' strategies).
  return LMData({"token_ids": as_np(x["token_ids"]).astype("int32"),
                 "padding_mask": as_np(x["padding_mask"]).astype("int32")},
                as_np(y).astype("int32"), as_np(w).astype("float32"))


@dataclasses.dataclass(frozen=True)
class Splits:
  """The demo's text: the tokenizer's vocabulary and merges, and train,
  validation (NAS ranking) and held-out (perplexities) data."""
  vocabulary: dict
  merges: list
  train: LMData
  validation: LMData
  held_out: LMData


def demo_splits(examples: int, sequence_length: int, merges: int,
                held_out: int) -> Splits:
  """`examples` training paragraphs and `held_out` each for validation
  and held-out text, every 10th paragraph going to the last two in turn
  (deterministic); the BPE learned on the training paragraphs only."""
  for arg, value in (("examples", examples), ("held_out", held_out)):
    check_positive_int(arg, value)
  texts = paragraphs()
  rest = [t for i, t in enumerate(texts) if i % 10 not in (3, 7)]
  val = [t for i, t in enumerate(texts) if i % 10 == 3]
  out = [t for i, t in enumerate(texts) if i % 10 == 7]
  train_texts = rest[:examples]
  vocabulary, learned = train_bpe(train_texts, merges)
  tok = tokenizer(vocabulary, learned)
  return Splits(vocabulary, learned,
                lm_data(train_texts, tok, sequence_length),
                lm_data(val[:held_out], tok, sequence_length),
                lm_data(out[:held_out], tok, sequence_length))
