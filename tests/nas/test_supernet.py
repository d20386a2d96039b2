"""The weight-sharing super-network: both execution modes and the standalone
sub-graph compute the same function; untaken ops are untouched in switch
mode; mask mode compiles under XLA."""

import keras
import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.nas.space import stage_block, tiny64
from tfopt.nas.supernet import SuperNet


def _data(n=16, seed=0, shape=(8, 8, 1)):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(n,) + shape).astype("float32"),
          rng.integers(0, 10, size=n).astype("int32"))


def _ce():
  return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_switch_mask_and_subnet_agree_for_every_arch():
  keras.utils.set_random_seed(0)
  space = tiny64(filters=4)
  switch, mask = SuperNet(space), SuperNet(space, execution="mask")
  mask.set_weights(switch.get_weights())
  x, _ = _data(4)
  outputs = set()
  for arch in list(space.enumerate())[::7]:
    switch.set_arch(arch)
    mask.set_arch(arch)
    assert switch.arch() == arch
    a = np.asarray(switch(x))
    np.testing.assert_allclose(np.asarray(mask(x)), a, atol=1e-6)
    np.testing.assert_allclose(np.asarray(switch.subnet()(x)), a, atol=1e-6)
    outputs.add(a.round(5).tobytes())
  assert len(outputs) > 1  # the path really changes the function


def test_switch_training_leaves_untaken_ops_untouched():
  keras.utils.set_random_seed(1)
  space = tiny64(filters=4)
  net = SuperNet(space)
  # Adam: Keras' decoupled weight decay (AdamW) shrinks every trainable
  # variable, taken or not (see SuperNet's docstring).
  net.compile(keras.optimizers.Adam(1e-2), _ce())
  net.set_arch(("conv3", "skip", "conv5"))
  before = {v.path: v.numpy().copy() for v in net.weights}
  x, y = _data()
  net.fit(x, y, epochs=2, batch_size=8, verbose=0)
  changed = {v.path.split("/", 1)[-1] for v in net.weights  # drop model
             if not np.array_equal(v.numpy(), before[v.path])}
  assert any(p.startswith("layer0_conv3") for p in changed)
  assert any(p.startswith("layer2_conv5") for p in changed)
  # Untaken convs: no gradient step, no BatchNorm statistics.
  assert not any(p.startswith(("layer0_conv5", "layer1_conv3",
                               "layer1_conv5", "layer2_conv3")) for p in changed)
  # The trained weights are what the sub-graph inherits.
  sub = net.subnet()
  np.testing.assert_allclose(np.asarray(sub(x)), np.asarray(net(x)),
                             atol=1e-5)


def test_mask_mode_trains_under_xla_and_switches_path_without_retrace():
  keras.utils.set_random_seed(2)
  net = SuperNet(tiny64(filters=4), execution="mask")
  net.compile("adam", _ce(), jit_compile=True)
  x, y = _data()
  first = net.fit(x, y, epochs=3, batch_size=8, verbose=0).history["loss"]
  assert first[-1] < first[0]
  train_function = net.train_function
  net.set_arch(("skip", "maxpool", "conv3"))
  net.fit(x, y, epochs=1, batch_size=8, verbose=0)
  assert net.train_function is train_function


def test_stage_block_widens_with_projections():
  keras.utils.set_random_seed(3)
  space = stage_block(filters=(4, 8))
  net = SuperNet(space)
  x, _ = _data(2, shape=(32, 32, 3))
  assert tuple(net(x).shape) == (2, 10)
  net.set_arch(("skip", "skip", "maxpool", "skip", "conv5", "conv3s2"))
  sub = net.subnet()
  np.testing.assert_allclose(np.asarray(sub(x)), np.asarray(net(x)),
                             atol=1e-5)
  inner = [l.name for block in sub.layers for l in getattr(block, "layers",
                                                           [])]
  assert "stage1_block0_skip_proj_conv" in inner  # 4 -> 8 channels


def test_bad_arguments():
  with pytest.raises(ValueError, match="Argument `execution` must be one of"):
    SuperNet(tiny64(), execution="eager")
  with pytest.raises(ValueError, match="Argument `space`"):
    SuperNet({"layers": []})
  with pytest.raises(ValueError, match="one op name per choice layer"):
    SuperNet(tiny64(filters=4)).set_arch(("conv3",))


def test_switch_under_xla_is_refused_not_aborted():
  net = SuperNet(tiny64(filters=4))
  with pytest.raises(ValueError, match="execution='mask' to compile it "
                     "under XLA"):
    net.compile("adam", _ce(), jit_compile=True)
  net.compile("adam", _ce())  # "auto": no XLA for a switch network
  assert net.jit_compile is False
  x, y = _data()
  net.fit(x, y, epochs=1, batch_size=8, verbose=0)
