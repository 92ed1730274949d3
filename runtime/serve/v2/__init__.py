"""The Open Inference Protocol (KServe v2) for ``vnpu serve``: REST routes with Triton's binary tensor
data, and the gRPC ``inference.GRPCInferenceService``, over a
:class:`~.repository.ModelRepositoryView` that the compiled-model engine implements.

- :mod:`.repository`: the interface and the records that cross it (metadata, config, stats, requests);
- :mod:`.datatypes`, :mod:`.tensors`: the datatypes table and one tensor between the wire and numpy;
- :mod:`.checks`: a request against the model's metadata (every bad tensor a 400 before device work);
- :mod:`.request`, :mod:`.http_codec`, :mod:`.grpc_codec`: parsed requests, the REST and gRPC bodies;
- :mod:`.documents`: the JSON documents (metadata, config, index, statistics) both transports answer;
- :mod:`.access`, :mod:`.inference`: what a caller may see, and one inference flow for both transports;
- :mod:`.http_routes`, :mod:`.http_infer`: the FastAPI routes; :mod:`.grpc_service`: the gRPC servicer,
  :mod:`.grpc_server`: its server.
"""
from .repository import (BatchStats, Duration, DynamicBatching, IndexEntry, InferRequest, InferResult,
                         InstanceGroup, ModelConfig, ModelMetadata, ModelRepositoryView, ModelStats, QueuePolicy,
                         TensorSpec)

__all__ = ["BatchStats", "Duration", "DynamicBatching", "IndexEntry", "InferRequest", "InferResult",
           "InstanceGroup", "ModelConfig", "ModelMetadata", "ModelRepositoryView", "ModelStats", "QueuePolicy",
           "TensorSpec"]
