"""The adapter contract: abstract methods enforced, the Dense adapter
reproduces its layer."""

import keras
import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.pruning.adapters import (DenseAdapter, ExpertKernel, INPUT,
                                    MoEAdapter, block_input)


def test_incomplete_adapter_cannot_be_made():
  class KernelsOnly(MoEAdapter):
    def kernels(self, layer):
      return [ExpertKernel("w", None, INPUT)]

  with pytest.raises(TypeError, match="abstract"):
    KernelsOnly()


def test_dense_adapter_is_one_expert_with_gate_one():
  keras.utils.set_random_seed(0)
  dense = keras.layers.Dense(3)
  tokens = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
  expected = np.asarray(dense(tokens))
  adapter = DenseAdapter()
  np.testing.assert_array_equal(np.asarray(adapter.gates(dense, tokens)),
                                np.ones((5, 1), "float32"))
  np.testing.assert_allclose(np.asarray(adapter.combine(dense, tokens)),
                             expected, atol=1e-6)
  with pytest.raises(TypeError, match="no HIDDEN-stage kernel"):
    adapter.expert_hidden(dense, tokens)


def test_block_input_lookup():
  assert block_input((1, 2), {}) == 1
  assert block_input((), {"hidden_states": 7, "training": True}) == 7
  with pytest.raises(ValueError, match="to contain the block input"):
    block_input((), {"training": True})
