"""Stage 4 of the demo: the pruned model served.

`tfopt.export.saved_model` writes the SavedModel (checked at reload);
then a `PredictRequest` of held-out token ids goes through TF Serving's
`PredictionService` protos to a local server of that SavedModel, and the
logits that come back are compared with `model.predict` on the same
batch.
"""

from __future__ import annotations

import os
import time

import numpy as np

from tfopt.demo.text import Splits


def run(splits: Splits, model, cfg: dict, out_dir: str, say) -> dict:
  """Runs the stage; returns its report entry."""
  from tfopt.export import saved_model  # pylint: disable=g-import-not-at-top
  from tfopt.export.serving import predict_over_grpc  # pylint: disable=g-import-not-at-top
  start = time.time()
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "saved_model")
  say("export: SavedModel of the pruned model, then a PredictRequest "
      "through TF Serving's protos")
  report = saved_model(model, path, overwrite=True, serving_check=False)
  batch = {k: v[:cfg["requests"]] for k, v in splits.held_out.x.items()}
  served = predict_over_grpc(path, batch)
  (logits,) = served.values()
  expected = model.predict(batch, verbose=0)
  diff = float(np.max(np.abs(np.asarray(logits) - expected)))
  say(f"export: served logits vs model.predict: max |diff| {diff:.2g}")
  return {"path": path, "signature_inputs": sorted(report.inputs),
          "outputs": list(served), "reload_max_abs_diff":
              report.max_abs_diff, "requests": cfg["requests"],
          "served_max_abs_diff": diff,
          "bytes": sum(os.path.getsize(os.path.join(d, f))
                       for d, _, files in os.walk(path) for f in files),
          "seconds": time.time() - start}
