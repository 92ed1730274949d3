"""What the Open Inference Protocol's routes (HTTP and gRPC) need of the models they serve:
:class:`ModelRepositoryView`, and the frozen records that cross it.  The compiled-model engine implements
the view; the protocol layer (:mod:`runtime.serve.v2`) only translates the wire to these calls and back.

Conventions, for whoever implements the view:

- **Names and versions.**  ``version`` is the protocol's string (``"1"``) or None for "the server's
  choice" (the newest ready version).  An unknown model or version raises
  :class:`~runtime.serve.engine.errors.ModelNotFound` (404); one known but not loaded raises
  :class:`~runtime.serve.engine.errors.Unavailable` (503) where it cannot answer.  Tenants' visibility is
  the protocol layer's job: the view sees every model.
- **Shapes.**  :attr:`TensorSpec.shape` is the metadata shape: ``-1`` for a dynamic dimension, and, when
  the model batches (``max_batch_size > 0``, Triton's semantics), the first dimension is the batch
  dimension (``-1``).  Requests reach :meth:`ModelRepositoryView.submit` already checked against the
  metadata (names, datatypes, ranks, fixed dimensions, batch within ``max_batch_size``, one batch size for
  all inputs): no bad tensor reaches the view.
- **What blocks.**  :meth:`~ModelRepositoryView.index`, ``metadata``, ``config``, ``ready`` and ``stats``
  answer at once from host state (they are called on the event loop).  :meth:`~ModelRepositoryView.submit`
  returns at once with a :class:`concurrent.futures.Future` (admission refusals --
  :class:`~runtime.serve.engine.errors.QueueFull`, ``Unavailable`` -- are raised by ``submit`` itself, a
  request that fails later fails its future with a ``ServeError``); a future cancelled before its batch
  started is dropped.  :meth:`~ModelRepositoryView.load` and ``unload`` block until done (they run off
  the event loop).
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable

import numpy as np

from ..tenants import Tenant


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model: name, the protocol's datatype (``FP32``...), metadata shape."""
    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False        #: an input a request may leave out


@dataclass(frozen=True)
class ModelMetadata:
    """A model's metadata (``GET /v2/models/{m}``); ``max_batch_size > 0``: the first dimension of every
    input and output is the batch dimension, at most this many rows per request."""
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = 0


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy``: queue bound (0: none) and per-request timeout (0: none)."""
    max_queue_size: int = 0
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    timeout_action: str = "REJECT"


@dataclass(frozen=True)
class DynamicBatching:
    """Triton's ``dynamic_batching``: preferred sizes, queue delay, priority levels (1 = highest)."""
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = QueuePolicy()


@dataclass(frozen=True)
class InstanceGroup:
    """Triton's ``instance_group``: ``count`` instances of ``kind`` (``KIND_GPU``: on NPUs, the
    ``devices``; ``KIND_CPU``: the CPU fallback)."""
    count: int = 1
    kind: str = "KIND_GPU"
    devices: tuple[int, ...] = ()
    name: str = ""


@dataclass(frozen=True)
class ModelConfig:
    """A model's configuration (``GET /v2/models/{m}/config``), in Triton's terms."""
    metadata: ModelMetadata
    backend: str = "vnpu"
    dynamic_batching: DynamicBatching | None = None
    instance_groups: tuple[InstanceGroup, ...] = ()


@dataclass(frozen=True)
class IndexEntry:
    """One model version of the repository: ``state`` is ``READY``, ``UNAVAILABLE``, ``LOADING`` or
    ``UNLOADING`` (Triton's), ``reason`` why it is not ready ("" when it is)."""
    name: str
    version: str
    state: str
    reason: str = ""


@dataclass(frozen=True)
class Duration:
    """Triton's ``StatisticDuration``: how many, and their total time in nanoseconds."""
    count: int = 0
    ns: int = 0


@dataclass(frozen=True)
class BatchStats:
    """Per executed batch size (Triton's ``InferBatchStatistics``)."""
    batch_size: int
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()


@dataclass(frozen=True)
class ModelStats:
    """One model version's statistics (Triton's statistics extension): requests that succeeded and
    failed, their time queued and computing, samples (batch rows) inferred and batches executed."""
    name: str
    version: str
    last_inference_ms: int = 0               #: ms since the epoch of the last request (0: none yet)
    inference_count: int = 0                 #: samples inferred (a request of batch 4 counts 4)
    execution_count: int = 0                 #: batches executed
    success: Duration = Duration()
    fail: Duration = Duration()
    queue: Duration = Duration()
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()
    batch_stats: tuple[BatchStats, ...] = ()


@dataclass(frozen=True)
class InferRequest:
    """One inference request as the engine gets it, checked against the model's metadata."""
    model: str
    version: str | None                      #: None: the server's choice
    inputs: Mapping[str, np.ndarray]         #: by input name (read-only: copy to modify); BYTES: object arrays of bytes
    outputs: tuple[str, ...]                 #: the outputs asked for (every output of the model when empty)
    rows: int                                #: batch rows (the first dimension; 1 for a model that does not batch)
    tenant: Tenant                           #: who asks (its priority class, its quotas were charged)
    priority: int | None = None              #: Triton priority level asked for (1 = highest); None: the default
    timeout_us: int | None = None            #: Triton per-request timeout asked for (microseconds)
    id: str = ""                             #: the request's id (echoed; for logs)


@dataclass(frozen=True)
class InferResult:
    """What an inference produced: the outputs asked for, by name, and the version that ran."""
    outputs: Mapping[str, np.ndarray]
    model_version: str
    parameters: Mapping[str, object] = field(default_factory=dict)


@runtime_checkable
class ModelRepositoryView(Protocol):
    """The models behind the Open Inference Protocol's routes (see the module docstring for errors and
    what blocks)."""

    def index(self) -> list[IndexEntry]:
        """Every model version the repository knows, loaded or not."""
        ...

    def metadata(self, name: str, version: str | None) -> ModelMetadata:
        ...

    def config(self, name: str, version: str | None) -> ModelConfig:
        ...

    def ready(self, name: str, version: str | None) -> bool:
        """Whether the model (version) answers inference requests now (ModelNotFound if unknown)."""
        ...

    def submit(self, request: InferRequest) -> Future:
        """Queue ``request``; a future of its :class:`InferResult` (returns at once)."""
        ...

    def load(self, name: str) -> None:
        """Load (or reload: a new version is loaded before traffic moves to it) ``name``; blocks."""
        ...

    def unload(self, name: str) -> None:
        """Unload ``name`` once its requests in flight are answered; blocks."""
        ...

    def stats(self, name: str | None, version: str | None) -> list[ModelStats]:
        """Statistics of one model (version), or of every model when ``name`` is None."""
        ...
