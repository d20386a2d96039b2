"""A local check of the TF Serving API: a PredictRequest answered over gRPC.

The TF Serving model server is not installable here; its request and
response protos and gRPC service definitions (`tensorflow-serving-api`,
installed without its `tensorflow` requirement) are. `predict_over_grpc`
starts an in-process gRPC server implementing `PredictionService.Predict`
on a SavedModel's signatures, sends a real `PredictRequest` (model spec,
signature name, TensorProto inputs) from a client stub over a loopback
channel, and returns the decoded `PredictResponse` outputs: the wire format
and signature contract a TF Serving client relies on.
"""

from __future__ import annotations

from concurrent import futures
from typing import Mapping

import numpy as np
import tensorflow as tf


def _serving_api():
  try:
    import grpc  # pylint: disable=g-import-not-at-top
    from tensorflow_serving.apis import (  # pylint: disable=g-import-not-at-top
        predict_pb2, prediction_service_pb2_grpc)
  except ImportError as err:
    raise ImportError(
        f"The TF Serving check needs the `tensorflow-serving-api` package: "
        f"pip install --no-deps 'tensorflow-serving-api>=2.18,<2.22' (no-deps "
        f"keeps tensorflow-cpu). ({err})") from None
  return grpc, predict_pb2, prediction_service_pb2_grpc


def predict_over_grpc(saved_model_dir: str, inputs: Mapping[str, np.ndarray],
                      *, model_name: str = "model",
                      signature: str = "serving_default",
                      timeout: float = 60.0) -> dict[str, np.ndarray]:
  """Serves `saved_model_dir` locally and answers one PredictRequest."""
  grpc, predict_pb2, service = _serving_api()
  loaded = tf.saved_model.load(saved_model_dir)

  class Servicer(service.PredictionServiceServicer):
    """PredictionService.Predict on the loaded signatures."""

    def Predict(self, request, context):  # noqa: N802 (gRPC method name)
      name = request.model_spec.signature_name or "serving_default"
      if request.model_spec.name != model_name or \
          name not in loaded.signatures:
        context.abort(grpc.StatusCode.NOT_FOUND,
                      f"no model {request.model_spec.name!r} with signature "
                      f"{name!r}")
      fn = loaded.signatures[name]
      args = {k: tf.constant(tf.make_ndarray(v))
              for k, v in request.inputs.items()}
      response = predict_pb2.PredictResponse()
      response.model_spec.CopyFrom(request.model_spec)
      for key, value in fn(**args).items():
        response.outputs[key].CopyFrom(tf.make_tensor_proto(value.numpy()))
      return response

  server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
  service.add_PredictionServiceServicer_to_server(Servicer(), server)
  port = server.add_insecure_port("localhost:0")
  server.start()
  try:
    with grpc.insecure_channel(f"localhost:{port}") as channel:
      stub = service.PredictionServiceStub(channel)
      request = predict_pb2.PredictRequest()
      request.model_spec.name = model_name
      request.model_spec.signature_name = signature
      for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
      response = stub.Predict(request, timeout=timeout)
    return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}
  finally:
    server.stop(grace=None)
