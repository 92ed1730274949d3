"""The protocol's JSON documents other than inference: server metadata, model metadata, model
configuration (Triton's ``ModelConfig`` in its JSON form: snake_case field names, enum names), the
repository index and statistics (Triton's statistics extension).  One form for both transports: the HTTP
routes answer these dicts, the gRPC service parses them into its messages
(:mod:`runtime.serve.v2.grpc_codec`).  Pure; nothing blocks."""
from __future__ import annotations

import importlib.metadata
from dataclasses import asdict

from .datatypes import datatype
from .repository import (Duration, IndexEntry, ModelConfig, ModelMetadata, ModelStats, QueuePolicy,
                         TensorSpec)

SERVER_NAME = "vnpu"
#: the protocol extensions this server answers (Triton's names)
EXTENSIONS = ("binary_tensor_data", "model_configuration", "model_repository", "statistics", "schedule_policy")


def server_version() -> str:
    try:
        return importlib.metadata.version("vnpu")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def server_metadata() -> dict:
    return {"name": SERVER_NAME, "version": server_version(), "extensions": list(EXTENSIONS)}


def _tensor(t: TensorSpec) -> dict:
    return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}


def model_metadata(m: ModelMetadata) -> dict:
    return {"name": m.name, "versions": list(m.versions), "platform": m.platform,
            "inputs": [_tensor(t) for t in m.inputs], "outputs": [_tensor(t) for t in m.outputs]}


def _dims(m: ModelMetadata, t: TensorSpec) -> list[int]:
    """Configuration dims: without the batch dimension when the model batches."""
    return list(t.shape[1:] if m.max_batch_size > 0 else t.shape)


def _queue_policy(q: QueuePolicy) -> dict:
    return {"timeout_action": q.timeout_action, "default_timeout_microseconds": q.default_timeout_us,
            "allow_timeout_override": q.allow_timeout_override, "max_queue_size": q.max_queue_size}


def model_config(c: ModelConfig) -> dict:
    m = c.metadata
    doc = {"name": m.name, "platform": m.platform, "backend": c.backend, "max_batch_size": m.max_batch_size,
           "input": [{"name": t.name, "data_type": datatype(t.datatype).config, "dims": _dims(m, t),
                      "optional": t.optional} for t in m.inputs],
           "output": [{"name": t.name, "data_type": datatype(t.datatype).config, "dims": _dims(m, t)}
                      for t in m.outputs],
           "instance_group": [{"name": g.name or f"{m.name}_{i}", "kind": g.kind, "count": g.count,
                               "gpus": list(g.devices)} for i, g in enumerate(c.instance_groups)]}
    b = c.dynamic_batching
    if b is not None:
        doc["dynamic_batching"] = {"preferred_batch_size": list(b.preferred_batch_size),
                                   "max_queue_delay_microseconds": b.max_queue_delay_us,
                                   "priority_levels": b.priority_levels,
                                   "default_priority_level": b.default_priority_level,
                                   "default_queue_policy": _queue_policy(b.default_queue_policy)}
    return doc


def index(entries: list[IndexEntry]) -> list[dict]:
    return [asdict(e) for e in entries]


def _duration(d: Duration) -> dict:
    return {"count": d.count, "ns": d.ns}


def model_stats(s: ModelStats) -> dict:
    return {"name": s.name, "version": s.version, "last_inference": s.last_inference_ms,
            "inference_count": s.inference_count, "execution_count": s.execution_count,
            "inference_stats": {k: _duration(getattr(s, k)) for k in
                                ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")},
            "batch_stats": [{"batch_size": b.batch_size, "compute_input": _duration(b.compute_input),
                             "compute_infer": _duration(b.compute_infer),
                             "compute_output": _duration(b.compute_output)} for b in s.batch_stats]}


def statistics(stats: list[ModelStats]) -> dict:
    return {"model_stats": [model_stats(s) for s in stats]}
