"""SavedModel export that TF Serving loads, checked before hand-over."""

from tfopt.export.saved_model import (SIGNATURE, ExportReport, sample_batch,
                                      saved_model)
from tfopt.export.serving import predict_over_grpc

__all__ = ["ExportReport", "SIGNATURE", "predict_over_grpc", "sample_batch",
           "saved_model"]
