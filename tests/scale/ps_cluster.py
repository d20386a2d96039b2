"""Trains a linear regression with ParameterServerTrainer on an in-process
cluster (2 workers, 1 parameter server, the chief) and prints the outcome
as JSON. Run in a fresh process by test_ps.py: the in-process workers
share the process's thread pools, which must be configured before
TensorFlow's eager context starts (with the default inter-op threads =
cores, 2 in CI, the remote steps deadlock)."""

import json
import sys


def main() -> int:
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tfopt  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  import keras  # pylint: disable=import-outside-toplevel
  from tfopt.scale.launch import free_ports  # pylint: disable=import-outside-toplevel
  from tfopt.scale.ps import ParameterServerTrainer  # pylint: disable=import-outside-toplevel

  w_true = np.array([[2.0], [-1.0], [0.5]], np.float32)
  ports = free_ports(3)
  spec = tf.train.ClusterSpec({
      "worker": [f"localhost:{p}" for p in ports[:2]],
      "ps": [f"localhost:{ports[2]}"]})
  config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=8)
  servers = [tf.distribute.Server(spec, job_name="worker", task_index=i,
                                  protocol="grpc", config=config)
             for i in range(2)]
  servers.append(tf.distribute.Server(spec, job_name="ps", task_index=0,
                                      protocol="grpc"))
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      spec, rpc_layer="grpc")
  strategy = tf.distribute.ParameterServerStrategy(resolver)
  with strategy.scope():
    model = keras.Sequential([keras.Input((3,)),
                              keras.layers.Dense(1, use_bias=False)])
    optimizer = keras.optimizers.SGD(0.1)
  trainer = ParameterServerTrainer(strategy, model, optimizer,
                                   keras.losses.MeanSquaredError())

  def dataset_fn(context):
    rng = np.random.RandomState(context.input_pipeline_id)
    x = rng.randn(256, 3).astype("float32")
    return tf.data.Dataset.from_tensor_slices(
        (x, x @ w_true)).repeat().batch(16)

  history = trainer.fit(dataset_fn, steps=120, verbose=0)
  print(json.dumps({"steps": history["steps"], "losses": len(history["loss"]),
                    "iterations": history["iterations"],
                    "first_loss": history["loss"][0],
                    "last_loss": history["loss"][-1],
                    "weights": model.get_weights()[0].ravel().tolist(),
                    "device": model.weights[0].value.device}))
  del servers
  return 0


if __name__ == "__main__":
  sys.exit(main())
