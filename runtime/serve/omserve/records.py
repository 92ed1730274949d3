"""A served compiled model's configuration (:class:`runtime.serve.modelrepo.ModelConfig`, Triton's fields
read from ``config.yaml`` and the ``.om``) as the Open Inference Protocol's records
(:mod:`runtime.serve.v2.repository`): the metadata shapes lead with the batch dimension (-1) when the model
batches, as Triton's do.  Pure."""
from __future__ import annotations

from typing import Sequence

from ..modelrepo import ModelConfig
from ..modelrepo.spec import QueuePolicy
from ..v2 import repository as v2


def _tensor(t, batching: bool) -> v2.TensorSpec:
    return v2.TensorSpec(t.name, t.datatype, ((-1,) if batching else ()) + tuple(t.dims))


def metadata(config: ModelConfig, versions: Sequence[str]) -> v2.ModelMetadata:
    b = config.max_batch_size > 0
    return v2.ModelMetadata(config.name, tuple(versions), config.platform,
                            tuple(_tensor(t, b) for t in config.inputs), tuple(_tensor(t, b) for t in config.outputs),
                            config.max_batch_size)


def _queue(q: QueuePolicy) -> v2.QueuePolicy:
    return v2.QueuePolicy(q.max_queue_size, q.default_timeout_microseconds, q.allow_timeout_override,
                          q.timeout_action)


def model_config(config: ModelConfig, versions: Sequence[str]) -> v2.ModelConfig:
    db = config.dynamic_batching
    batching = None if db is None else v2.DynamicBatching(
        db.preferred_batch_size, db.max_queue_delay_microseconds, db.priority_levels, db.default_priority_level,
        _queue(db.default_queue_policy))
    groups = tuple(v2.InstanceGroup(g.count, "KIND_CPU" if g.on_cpu else "KIND_GPU", tuple(g.devices or ()),
                                    g.name or f"{config.name}_{i}") for i, g in enumerate(config.instance_group))
    return v2.ModelConfig(metadata(config, versions), "vnpu", batching, groups)


__all__ = ["metadata", "model_config"]
