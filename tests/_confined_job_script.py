"""A job whose TensorFlow servers the confinement tests knock on, in a
process of its own (one cluster per process).

    python -m tests._confined_job_script placed|ps

placed: a small MLP trained with plain Keras, then through `tfopt.compile`
placed on 2 `LoopbackServers` tasks; ps: the same model under
ParameterServerStrategy's coordinator (this process) with 1 worker and 1
parameter server. Prints "READY {json}" (this process's pid, the tasks',
the namespace's relay, the losses) while the servers still run, waits for
a line on stdin, then exits.
"""

import json
import os
import sys

import keras
import numpy as np

import tfopt
from tfopt.runtime import LoopbackServers


def build():
  keras.utils.set_random_seed(0)
  return keras.Sequential([keras.Input((8,)),
                           keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(1)])


def data():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((128, 8)).astype(np.float32)
  return x, (x @ rng.standard_normal((8, 1))).astype(np.float32)


def placed(out: dict) -> LoopbackServers:
  x, y = data()
  fit = dict(batch_size=16, epochs=2, shuffle=False, verbose=0)
  plain = build()
  plain.compile(keras.optimizers.SGD(0.05), "mse")
  out["plain"] = plain.fit(x, y, **fit).history["loss"]
  servers = LoopbackServers(2)
  model = build()
  tfopt.compile(model, optimizer=keras.optimizers.SGD(0.05), loss="mse",
                placement="auto", devices=servers.device_names,
                cluster=servers.spec, verbose=False)
  out["tfopt"] = model.fit(x, y, **fit).history["loss"]
  out["devices"] = sorted({v.value.device for v in model.variables})
  return servers


def ps(out: dict) -> LoopbackServers:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfopt.scale.ps import ParameterServerTrainer  # pylint: disable=g-import-not-at-top
  x, y = data()
  servers = LoopbackServers({"worker": 1, "ps": 1})
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(servers.spec), rpc_layer="grpc")
  with servers.entered():
    strategy = tf.distribute.ParameterServerStrategy(resolver)
  with strategy.scope():
    model = build()
    optimizer = keras.optimizers.SGD(0.05)
  trainer = ParameterServerTrainer(strategy, model, optimizer,
                                   keras.losses.MeanSquaredError())

  def dataset_fn(context):  # pylint: disable=unused-argument
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)
  history = trainer.fit(dataset_fn, steps=16, verbose=0)
  out["tfopt"] = history["loss"]
  out["devices"] = sorted({v.value.device for v in model.variables})
  return servers


def main(mode: str) -> None:
  out: dict = {}
  servers = {"placed": placed, "ps": ps}[mode](out)
  out.update(pid=os.getpid(), tasks=servers.pids, confined=servers.confined,
             relay=servers.namespace.relay_pid if servers.namespace else None,
             namespace=servers.namespace.identity if servers.namespace
             else None, ports=servers.ports)
  print("READY " + json.dumps(out), flush=True)
  sys.stdin.readline()
  servers.close()
  sys.stderr.flush()
  # The eager context's teardown would try to reach the closed tasks.
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main(sys.argv[1])
