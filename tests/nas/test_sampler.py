"""PathSampler: uniform over the allowed ops, removed ops never sampled,
untaken ops exactly untouched even under AdamW, in both execution modes."""

import collections

import keras
import numpy as np
import pytest

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)
from tfopt.nas.sampler import PathSampler
from tfopt.nas.space import tiny64
from tfopt.nas.supernet import SuperNet


def _data(n=64, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(n, 8, 8, 1)).astype("float32"),
          rng.integers(0, 10, size=n).astype("int32"))


@pytest.mark.parametrize("execution", ["switch", "mask"])
def test_removed_ops_never_sampled_nor_updated(execution):
  keras.utils.set_random_seed(0)
  net = SuperNet(tiny64(filters=4), execution=execution)
  net.compile(keras.optimizers.AdamW(1e-2, weight_decay=0.5),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              jit_compile=execution == "mask")
  frozen = net.choices[0][1]  # layer0's conv5: removed by the analyst
  before = [v.numpy().copy() for v in frozen.weights]
  taken = net.choices[0][0]   # layer0's conv3: sampled often
  taken_before = [v.numpy().copy() for v in taken.weights]
  sampler = PathSampler(allowed={"layer0": ["conv3", "maxpool", "skip"]},
                        seed=1)
  x, y = _data()
  net.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[sampler])
  assert sum(sampler.counts.values()) == 32
  assert all(arch[0] != "conv5" for arch in sampler.counts)
  # Weight decay 0.5 and BatchNorm statistics would have moved it.
  for v, b in zip(frozen.weights, before):
    np.testing.assert_array_equal(v.numpy(), b)
  assert any(not np.array_equal(v.numpy(), b)
             for v, b in zip(taken.weights, taken_before))


def test_sampling_uniform_over_allowed_ops():
  keras.utils.set_random_seed(0)
  net = SuperNet(tiny64(filters=2))
  net.compile("sgd", keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  sampler = PathSampler(seed=3, freeze_untaken=False)
  x, y = _data(n=800)
  net.fit(x, y, batch_size=1, epochs=1, verbose=0, callbacks=[sampler])
  per_layer = [np.zeros(4) for _ in range(3)]
  for arch, count in sampler.counts.items():
    for i, op in enumerate(arch):
      per_layer[i][net.space.layers[i].op_names.index(op)] += count
  for counts in per_layer:  # 800 draws, 200 expected per op
    assert ((counts > 150) & (counts < 250)).all(), counts


def test_sampler_errors():
  keras.utils.set_random_seed(0)
  net = SuperNet(tiny64(filters=2))
  net.compile("sgd", "mse")
  x, _ = _data(4)
  with pytest.raises(ValueError, match="at least one op"):
    net.fit(x, np.zeros((4, 10)), verbose=0,
            callbacks=[PathSampler(allowed={"layer1": []})])
  plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  plain.compile("sgd", "mse")
  with pytest.raises(ValueError, match=r"Argument `model` must be a "
                     r"super-network with `space` and `set_arch` .*"
                     r"Received: model=.Sequential"):
    plain.fit(np.zeros((2, 2)), np.zeros((2, 1)), verbose=0,
              callbacks=[PathSampler()])


def _steered_net(tmp_path):
  """A small super-network and an empty steering file beside it."""
  from tfopt.nas.steering import Constraints
  keras.utils.set_random_seed(0)
  net = SuperNet(tiny64(filters=2))
  net.compile("sgd", keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  path = str(tmp_path / "steer.json")
  Constraints().save(path)
  return net, path


def test_constraints_file_reread_every_epoch(tmp_path):
  from tfopt.nas.steering import Constraints
  net, path = _steered_net(tmp_path)
  seen = []

  class Steer(keras.callbacks.Callback):
    """The analyst: after epoch 0, locks layer1 to skip."""

    def on_train_batch_begin(self, batch, logs=None):
      seen.append(net.arch())

    def on_epoch_end(self, epoch, logs=None):
      if epoch == 0:
        c = Constraints.load(path)
        c.lock_layer(net.space, "layer1", "skip")
        c.save(path)

  sampler = PathSampler(seed=0, constraints_file=path)
  x, y = _data(n=40)
  net.fit(x, y, batch_size=2, epochs=2, verbose=0,
          callbacks=[sampler, Steer()])
  assert sampler.versions == [0, 0, 1]  # train begin, epoch 0, epoch 1
  first, second = seen[:20], seen[20:]
  assert {a[1] for a in first} != {"skip"}  # free before the lock
  assert {a[1] for a in second} == {"skip"}


def test_in_graph_sampling_follows_the_constraints_under_xla():
  from tfopt.nas.steering import Constraints
  keras.utils.set_random_seed(0)
  space = tiny64(filters=4)
  net = SuperNet(space, execution="mask", in_graph_sampling=True, seed=3)
  c = Constraints()
  c.remove_op(space, "layer0", "conv5")
  c.lock_layer(space, "layer2", "skip")
  c.prefer_op(space, "layer1", "conv3", 3.0)
  net.set_sampling(c)
  # Each training call draws a path: frequencies follow the weights.
  x, y = _data(n=4)
  counts = collections.Counter()
  for _ in range(300):
    net(x, training=True)
    counts[net.arch()] += 1
  layer1 = collections.Counter()
  for arch, n in counts.items():
    assert arch[0] != "conv5" and arch[2] == "skip"
    layer1[arch[1]] += n
  assert abs(layer1["conv3"] / 300 - 0.5) < 0.1  # 3 / (3 + 1 + 1 + 1)
  # Inside compiled (XLA) training: the removed op is never trained.
  net.compile(keras.optimizers.Adam(1e-2),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              jit_compile=True)
  # Its trainable weights, that is: in mask execution every op runs, so
  # BatchNorm moving statistics move (ranking recalibrates them anyway).
  removed = [v.numpy().copy() for v in net.choices[0][1].trainable_weights]
  sampler = PathSampler(constraints=c)
  x, y = _data(n=64)
  net.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[sampler])
  for v, b in zip(net.choices[0][1].trainable_weights, removed):
    np.testing.assert_array_equal(v.numpy(), b)
  assert not np.array_equal(net.choices[0][0].trainable_weights[0].numpy(),
                            removed[0])  # conv3 of layer0 did train
  assert not sampler.counts  # nothing drawn in Python
  with pytest.raises(ValueError, match="Argument `freeze_untaken`"):
    net.fit(x, y, epochs=1, verbose=0,
            callbacks=[PathSampler(freeze_untaken=True)])
  c.set_limits(space, max_params=10**6)
  with pytest.raises(ValueError, match="without region or limits"):
    net.set_sampling(c)


def test_fair_schedule_trains_every_op_equally_often():
  keras.utils.set_random_seed(0)
  net = SuperNet(tiny64(filters=2))
  net.compile("sgd", keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  sampler = PathSampler(seed=1, schedule="fair", freeze_untaken=False,
                        allowed={"layer1": ["conv3", "skip"]})
  x, y = _data(n=48)
  net.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[sampler])
  for i, expected in ((0, {"conv3": 6, "conv5": 6, "maxpool": 6, "skip": 6}),
                      (1, {"conv3": 12, "skip": 12}),
                      (2, {"conv3": 6, "conv5": 6, "maxpool": 6, "skip": 6})):
    counts = collections.Counter()
    for arch, n in sampler.counts.items():
      counts[arch[i]] += n
    assert counts == expected
  assert len(sampler.counts) > 4  # layers permuted independently
  from tfopt.nas.steering import Constraints
  c = Constraints()
  c.prefer_op(net.space, "layer0", "conv3", 2.0)
  with pytest.raises(ValueError, match="Argument `schedule` must be "
                     "'uniform' with prefer"):
    net.fit(x, y, epochs=1, verbose=0, callbacks=[
        PathSampler(constraints=c, schedule="fair")])
  with pytest.raises(ValueError, match="Argument `schedule` must be one of"):
    PathSampler(schedule="round_robin")


def test_bad_live_edits_are_reported_and_the_search_goes_on(tmp_path, caplog):
  # The analyst edits the steering file while the search runs: garbage,
  # then a half-written file, then a valid lock. The first two are reported
  # (file, line, what) and the last valid constraints stay; the lock takes.
  from tfopt.nas.callbacks import SubgraphRanker
  from tfopt.nas.steering import Constraints
  net, path = _steered_net(tmp_path)
  locked = Constraints()
  locked.lock_layer(net.space, "layer1", "skip")
  locked.save(str(tmp_path / "locked.json"))
  valid = open(tmp_path / "locked.json", encoding="utf-8").read()
  edits = {0: "garbage {", 1: valid[:len(valid) // 2], 2: valid}
  seen = []

  class Analyst(keras.callbacks.Callback):

    def on_train_batch_begin(self, batch, logs=None):
      seen.append(net.arch())

    def on_epoch_end(self, epoch, logs=None):
      if epoch in edits:
        with open(path, "w", encoding="utf-8") as f:
          f.write(edits[epoch])

  x, y = _data(n=16)
  sampler = PathSampler(seed=0, constraints_file=path)
  ranker = SubgraphRanker(x[:8], x[:8], y[:8], every_n_epochs=1,
                          constraints_file=path, samples=2,
                          max_exhaustive=1)
  with caplog.at_level("WARNING", logger="tfopt"):
    net.fit(x, y, batch_size=2, epochs=4, verbose=0,
            callbacks=[sampler, Analyst(), ranker])
  assert len(sampler.steering_errors) == 2
  assert all(path in e for e in sampler.steering_errors)
  assert "line 1 column 1" in sampler.steering_errors[0]
  assert "line" in sampler.steering_errors[1]
  assert sampler.versions == [0, 0, 1]  # begin, epoch 0, then the lock
  assert {a[1] for a in seen[:24]} != {"skip"}  # epochs 0-2 free
  assert {a[1] for a in seen[24:]} == {"skip"}
  # The ranker, reading the same file at each epoch's end, went on too.
  assert len(ranker.rankings) == 4 and len(ranker.steering_errors) == 2
  assert sum("not applied" in r.getMessage() for r in caplog.records) == 4
