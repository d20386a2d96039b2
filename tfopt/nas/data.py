"""The NAS benchmark's data: scikit-learn's bundled 8x8 digits (1797 images,
shipped inside the package, nothing downloaded), split stratified by class
into train / validation / test (1000 / 400 / 397 by default)."""

from __future__ import annotations

import dataclasses

import numpy as np

from tfopt._errors import check_positive_int, invalid_argument


@dataclasses.dataclass
class Split:
  """Images (n, 8, 8, 1) float32 in [0, 1] and int32 labels."""
  x_train: np.ndarray
  y_train: np.ndarray
  x_val: np.ndarray
  y_val: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray


def _stratified_take(y, n, rng):
  """`n` indices drawn per class in proportion to the class counts (largest
  remainders), so every part keeps the class balance."""
  classes, counts = np.unique(y, return_counts=True)
  exact = counts * n / len(y)
  take = np.floor(exact).astype(int)
  for i in np.argsort(-(exact - take), kind="stable")[:n - take.sum()]:
    take[i] += 1
  chosen = [rng.permutation(np.flatnonzero(y == c))[:k]
            for c, k in zip(classes, take)]
  return np.sort(np.concatenate(chosen))


def digits(seed: int = 0, train: int = 1000, val: int = 400) -> Split:
  """The digits split with `seed`; the test part is what remains (397)."""
  check_positive_int("train", train)
  check_positive_int("val", val)
  try:
    from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ImportError("tfopt.nas.data.digits needs scikit-learn (its bundled "
                      "digits): pip install 'tfopt[nas]'") from None
  bunch = load_digits()
  x = (bunch.data.reshape(-1, 8, 8, 1) / 16.0).astype("float32")
  y = bunch.target.astype("int32")
  if train + val >= len(y):
    raise invalid_argument("train", f"with val, fewer than the {len(y)} "
                           "images (the rest is the test part)", train)
  rng = np.random.default_rng(seed)
  idx_train = _stratified_take(y, train, rng)
  rest = np.setdiff1d(np.arange(len(y)), idx_train)
  idx_val = rest[_stratified_take(y[rest], val, rng)]
  idx_test = np.setdiff1d(rest, idx_val)
  return Split(x[idx_train], y[idx_train], x[idx_val], y[idx_val],
               x[idx_test], y[idx_test])
