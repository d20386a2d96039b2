"""The reference MoE language model and its data, shared by
`benchmarks/moe_pruning.py` and `experiments/prune_moe.py`.

Text that ships offline: CPython's `pydoc_data.topics` (the help topics,
about 0.8 MB), as UTF-8 bytes (vocabulary 256, no tokenizer to download).
The first 90 % trains and calibrates, the last 10 % evaluates. The model is
`tfopt.zoo.moe_lm` (8 experts of width 64, top-2, 2 blocks, d_model 128) trained with
AdamW and a cosine schedule.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from tfopt._errors import check_positive_int, invalid_argument

SEQ_LEN = 128
MODEL_KWARGS = dict(vocab_size=256, seq_len=SEQ_LEN, num_layers=2, d_model=128,
                    num_heads=4, num_experts=8, expert_dim=64, top_k=2)


@dataclasses.dataclass(frozen=True)
class Corpus:
  train: np.ndarray  # int32 byte ids
  eval: np.ndarray

  def windows(self, count: int, seed: int, split: str = "train"
              ) -> tuple[np.ndarray, np.ndarray]:
    """`count` random (inputs, next-byte targets) windows of SEQ_LEN."""
    ids = self.train if split == "train" else self.eval
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(ids) - SEQ_LEN - 1, size=count)
    x = np.stack([ids[s:s + SEQ_LEN] for s in starts])
    y = np.stack([ids[s + 1:s + SEQ_LEN + 1] for s in starts])
    return x, y

  def eval_windows(self, count: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """Up to `count` consecutive, non-overlapping held-out windows."""
    n = min(count, (len(self.eval) - 1) // SEQ_LEN)
    x = self.eval[: n * SEQ_LEN].reshape(n, SEQ_LEN)
    y = self.eval[1: n * SEQ_LEN + 1].reshape(n, SEQ_LEN)
    return x, y


def corpus() -> Corpus:
  """pydoc topics as bytes, split 90/10 (deterministic)."""
  from pydoc_data import topics  # pylint: disable=import-outside-toplevel
  text = "\n".join(topics.topics[k] for k in sorted(topics.topics))
  ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
  cut = int(0.9 * len(ids))
  return Corpus(ids[:cut], ids[cut:])


def build(seed: int = 0, learning_rate: float = 3e-3, steps: int = 1500,
          jit_compile: bool = True):
  """The reference model, compiled with AdamW on a warm-up + cosine schedule
  over `steps` steps."""
  import keras  # pylint: disable=import-outside-toplevel
  from tfopt import zoo  # pylint: disable=import-outside-toplevel
  keras.utils.set_random_seed(seed)
  schedule = keras.optimizers.schedules.CosineDecay(
      0.0, max(steps - steps // 20, 1), warmup_target=learning_rate,
      warmup_steps=max(steps // 20, 1), alpha=0.05)
  model = zoo.moe_lm(**MODEL_KWARGS).model
  model.compile(optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.05),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True), jit_compile=jit_compile)
  return model


def train(model, data: Corpus, steps: int, batch_size: int = 32,
          seed: int = 0, verbose: int = 1, callbacks=()):
  """`steps` steps on fresh random training windows; returns the History."""
  check_positive_int("steps", steps)
  x, y = data.windows(steps * batch_size, seed)
  return model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False,
                   verbose=verbose, callbacks=list(callbacks))


def perplexity(model, x: np.ndarray, y: np.ndarray,
               batch_size: int = 32) -> float:
  """exp(mean next-byte cross-entropy) over (x, y)."""
  from keras import ops  # pylint: disable=import-outside-toplevel
  total, count = 0.0, 0
  for i in range(0, len(x), batch_size):
    logits = model(x[i:i + batch_size], training=False)
    logp = ops.convert_to_numpy(ops.log_softmax(logits, axis=-1))
    yy = y[i:i + batch_size]
    total -= float(np.take_along_axis(logp, yy[..., None], -1).sum())
    count += yy.size
  return math.exp(total / count)


def load_or_train(path: str | None, steps: int = 1500, seed: int = 0,
                  verbose: int = 1, *, train_if_missing: bool = False):
  """The reference model from `path` (a .weights.h5).

  A `path` that does not exist is an error (a relative path is read from
  the working directory), unless `train_if_missing=True`: then the model is
  trained for `steps` steps (about 12 minutes on 2 cores at 1500) and saved
  there. `path=None` trains without saving.
  """
  if path is not None and not path.endswith(".weights.h5"):
    raise invalid_argument("path", "a file name ending in .weights.h5", path)
  if path is not None and not os.path.exists(path) and not train_if_missing:
    raise FileNotFoundError(
        f"Argument `path` must name an existing .weights.h5 file (relative "
        f"paths are read from the working directory, {os.getcwd()}); pass "
        f"train_if_missing=True to train the reference model ({steps} steps, "
        f"minutes) and save it there. Received: path={path!r}")
  model = build(seed=seed, steps=steps)
  if path is not None and os.path.exists(path):
    model.load_weights(path)
    return model, None
  history = train(model, corpus(), steps, seed=seed, verbose=verbose)
  if path is not None:
    save_weights(model, path)
  return model, history


def save_weights(model, path: str) -> None:
  """The model's weights only (no optimizer state: a third of the bytes)."""
  import keras  # pylint: disable=import-outside-toplevel
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  # An uncompiled Model over the same layers: nothing of the optimizer.
  keras.Model(model.inputs, model.outputs, name=model.name).save_weights(path)
