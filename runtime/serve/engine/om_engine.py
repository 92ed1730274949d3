"""The compiled-model engine: one instance of one version of a ``.om`` model, with Triton's dynamic batching.

Requests (each with its own rows on the batch axis) are admitted into the instance's
:class:`~runtime.serve.batcher.DynamicBatcher` (priority levels, per-level queue bound and timeout, the
level's ``max_queue_size`` a :class:`QueueFull` -- this instance's share; the model-wide bound over all
its instances is :class:`runtime.serve.omserve.instances.InstanceSet`'s); the engine thread asks the
batcher for the next batch -- holding until the batcher's wake-up time or the next arrival when it says
to wait -- and runs it as ONE call of its runner (:mod:`.om_runner`: one graph replay on the NPU, or the
host's numpy run on the ``cpu`` end of the chain): the requests' rows concatenated in order and
zero-padded up to the smallest compiled batch gear, the outputs cut back into each request's rows (the
padding rows go to nobody).  A model with image-size gears (:mod:`.om_image_sizes`) executes each batch
at its requests' common (height, width); requests of other sizes wait for a batch of their own.  A request
that timed out in the queue fails with :class:`~runtime.serve.batcher.RequestTimedOut` (503); one whose
future was cancelled (its client went away) before its batch started is dropped -- taken out of the queue
at once, or left out of the batch that had already formed.

The thread, the fallback chain, re-binds, admission, drain and shutdown are the engine lifecycle's
(:mod:`.lifecycle`).  A batch is a pure function of its inputs, so it runs through the lifecycle's
replayable call: when a device of the placement is lost, the instance re-binds down its chain (the model
loaded there, or run on the host at ``cpu``) and the same batch runs again there -- every request answered
exactly once.  A batch that fails on a healthy placement fails only its own requests (500).  Each
execution and request is recorded in the version's statistics (``stats``: a
:class:`runtime.serve.omserve.stats.VersionStats`).

Blocking: :meth:`OmEngine.submit` returns a future at once (refusals raised); the engine thread blocks
for each execution (and for a re-bind's model load); the lifecycle's calls block as :mod:`.lifecycle` says.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, Union

import numpy as np

from ..batcher import Batch, DynamicBatcher, Queued, Request, RequestTimedOut
from ..modelrepo.spec import ModelConfig
from ..v2.repository import InferRequest, InferResult
from .errors import EngineFailure, Unavailable
from .lifecycle import EngineLifecycle
from .om_fixed_dims import FixedDims
from .om_image_sizes import ImageSizes
from .om_runner import build_runner
from .placement import DeviceBinder, Placement

log = logging.getLogger("vnpu.serve")

#: the most requests one instance holds waiting (whatever the model's queue policy: memory stays bounded)
MAX_WAITING = 1024
#: how many recent executions an engine keeps in :attr:`OmEngine.executions` (at least)
EXECUTION_LOG = 4096


@dataclass
class _Job:
    request: InferRequest
    future: Future
    qid: int = -1


class OmEngine(EngineLifecycle):
    """Instance ``instance`` of version ``version`` of compiled model ``name`` (the ``.om`` at ``path``,
    served as ``config`` says, padded to ``gears``), on ``devices`` with the ``fallback`` chain."""

    kind = "om"
    thread_name = "om"

    def __init__(self, rt, name: str, version: str, path: str | Path, config: ModelConfig, gears: Sequence[int],
                 stats, devices: Union[Sequence[int], Placement] = (0,), fallback: Sequence[Placement] = (),
                 binder: DeviceBinder | None = None, clock: Callable[[], float] = time.monotonic,
                 on_event: Sequence[Callable[[dict], None]] = (), instance: int = 0, max_waiting: int = MAX_WAITING):
        """Blocks for the model load on the first placement (raises what it raises)."""
        super().__init__(rt, name, devices, fallback, binder, clock, (), on_event)
        self.version, self.path, self.config, self.stats = str(version), Path(path), config, stats
        self.instance = instance
        self.thread_name = f"om{version}.{instance}"
        self.batcher = DynamicBatcher.for_model(config, gears)
        self.max_waiting = max_waiting
        #: (rows, gear) of the recent executions (batching at work), the last :data:`EXECUTION_LOG` to
        #: :data:`2 * EXECUTION_LOG` of them: a long-running server does not grow it without bound
        self.executions: list[tuple[int, int]] = []
        self.failed_batches = 0                         #: batches that failed on a healthy placement
        self.replayed_batches = 0                       #: batches re-run after a device loss
        self._running = 0
        self._arrivals = 0
        self._open()
        self.input_names, self.output_names = self.built.input_names, self.built.output_names
        #: the .om's image-size gears (None: a model without them); every runner of the file has the same
        self.image_sizes: ImageSizes | None = self.built.image_sizes
        #: the sizes the .om fixes, checked even where the config says -1 (:mod:`.om_fixed_dims`)
        self.fixed_dims = FixedDims.of_manifest(self.built.manifest, config.max_batch_size > 0)

    # ------------------------------------------------------------------ requests
    def submit(self, request: InferRequest) -> Future:
        """Queue ``request`` (checked against the model's metadata); a future of its
        :class:`InferResult`.  Refusals: :class:`QueueFull` (its priority level's ``max_queue_size``, or
        :data:`MAX_WAITING`), :class:`Unavailable` (failed or draining), :class:`InvalidRequest` (a
        priority the model does not have, an image size that is not one of the model's gears -- see
        :mod:`.om_image_sizes` -- or a size the .om fixes otherwise, :mod:`.om_fixed_dims`).  Returns at once."""
        self.fixed_dims.check(self.model, request.inputs)
        job = _Job(request, Future())
        key = self.image_sizes.of_request(self.model, request.inputs) if self.image_sizes is not None else None
        with self._admitting(1):
            q = self.batcher.add(Request(request.rows, request.priority or 0, request.timeout_us or 0, job, key),
                                 self.clock())
            job.qid = q.id
            self._arrivals += 1
        job.future.add_done_callback(lambda f, j=job: self._dropped(j) if f.cancelled() else None)
        return job.future

    def _dropped(self, job: _Job) -> None:
        """A future cancelled while queued: out of the queue now (in a batch already: left out there)."""
        with self._lock:
            if self.batcher.cancel(job.qid) is not None:
                self._retired()

    @property
    def waiting(self) -> int:
        """Requests queued, not yet in a batch."""
        with self._lock:
            return len(self.batcher)

    def waiting_at(self, level: int) -> int:
        """Requests queued at priority ``level``, not yet in a batch."""
        with self._lock:
            return self.batcher.waiting_at(level)

    @property
    def load(self) -> int:
        """Requests queued or in the batch running now (the router sends a request to the least loaded)."""
        with self._lock:
            return len(self.batcher) + self._running

    # ------------------------------------------------------------------ the batch (the lifecycle's step)
    def _step(self) -> None:
        batch = self._next_batch()
        if batch is None:
            return
        try:
            self._execute(batch)
        finally:
            with self._lock:
                self._running = 0
                self._lock.notify_all()

    def _next_batch(self) -> Batch | None:
        """Engine thread: the batch to run now, after failing the requests that timed out; or none, having
        held until the batcher's wake-up time, an arrival or a control request."""
        with self._lock:
            now = self.clock()
            nxt = self.batcher.next_batch(now)
            expired = self.batcher.expire(now)
            self._running = len(nxt.batch.requests) if nxt.batch is not None else 0
            seen = self._arrivals
        self._expire(expired, now)
        if nxt.batch is None and nxt.wake_at is not None:
            self._hold(lambda: self._arrivals != seen, nxt.wake_at)
        return nxt.batch

    def _expire(self, expired: tuple[Queued, ...], now: float) -> None:
        for q in expired:
            if q.payload.future.set_running_or_notify_cancel():
                q.payload.future.set_exception(RequestTimedOut.of(q))
                self.stats.failed(now - q.enqueued)
        if expired:
            self._retired(len(expired))

    def _started(self, batch: Batch) -> Batch | None:
        """``batch`` without the requests cancelled meanwhile (None when none is left); the others are
        running from now on (no longer cancellable)."""
        kept = [q for q in batch.requests if q.payload.future.set_running_or_notify_cancel()]
        if len(kept) == len(batch.requests):
            return batch
        self._retired(len(batch.requests) - len(kept))
        return Batch.of(kept, self.batcher.gears, batch.formed) if kept else None

    def _execute(self, batch: Batch) -> None:
        """Engine thread: one execution of ``batch`` on the current placement (re-run down the chain after
        a device loss); every request of it finished and retired."""
        batch = self._started(batch)
        if batch is None:
            return
        t0 = self.clock()
        try:
            x = self._stack(batch)
            t1 = self.clock()
            gear = batch.key if self.image_sizes is not None else batch.gear
            ys, rerun = self._run_on_placement(lambda r: r.run(x, gear), len(batch.requests))
            t2 = self.clock()
            results = self._split(batch, ys)
        except (EngineFailure, Unavailable) as e:
            self._failed(batch, e)
            return
        except Exception as e:  # noqa: BLE001 - a defect must not leave requests waiting forever
            log.exception("engine %s: a batch failed unexpectedly", self.model)
            self._failed(batch, EngineFailure(f"the batch failed: {type(e).__name__}: {e}"))
            return
        t3 = self.clock()
        for q, res in zip(batch.requests, results):
            q.payload.future.set_result(res)
        self.replayed_batches += rerun
        self.executions.append((batch.rows, batch.gear))
        if len(self.executions) >= 2 * EXECUTION_LOG:
            del self.executions[:EXECUTION_LOG]
        self.stats.batch(batch.rows, [(batch.formed - q.enqueued, t3 - q.enqueued) for q in batch.requests],
                         t1 - t0, t2 - t1, t3 - t2)
        self._retired(len(batch.requests))

    def _stack(self, batch: Batch) -> list[np.ndarray]:
        """The execution's inputs in the .om's order: each request's rows in order, padded to the gear (a
        model without a batch axis runs its one request's tensors as they are)."""
        jobs = [q.payload for q in batch.requests]
        if self.config.max_batch_size == 0:
            return [np.asarray(jobs[0].request.inputs[n]) for n in self.input_names]
        return [batch.stack([j.request.inputs[n] for j in jobs]) for n in self.input_names]

    def _split(self, batch: Batch, ys: list[np.ndarray]) -> list[InferResult]:
        """Each request's outputs (those it asked for): its own rows of every output, never a padding row."""
        outs = dict(zip(self.output_names, ys))
        if self.config.max_batch_size == 0:
            parts = {n: [y] for n, y in outs.items()}
        else:
            parts = {n: batch.split(y) for n, y in outs.items()}
        results = []
        for i, q in enumerate(batch.requests):
            asked = q.payload.request.outputs or tuple(t.name for t in self.config.outputs)
            results.append(InferResult({n: parts[n][i] for n in asked}, self.version))
        return results

    def _failed(self, batch: Batch, e: BaseException) -> None:
        if isinstance(e, EngineFailure):
            self.failed_batches += 1
            log.warning("engine %s: %s (%d request(s) failed)", self.model, e.message, len(batch.requests))
        now = self.clock()
        for q in batch.requests:
            q.payload.future.set_exception(e)
            self.stats.failed(now - q.enqueued)
        self._retired(len(batch.requests))

    # ------------------------------------------------------------------ the lifecycle's hooks
    def _build(self, devices: list):
        return build_runner(self.path, devices)

    def _has_work(self) -> bool:
        return len(self.batcher) > 0

    def _queue_state(self) -> tuple[int, int, int]:
        return len(self.batcher), self.max_waiting, self.max_waiting

    def _drop_queue(self, err: BaseException) -> None:
        with self._lock:
            left = self.batcher.drain()
        now = self.clock()
        for q in left:
            if q.payload.future.set_running_or_notify_cancel():
                q.payload.future.set_exception(err)
                self.stats.failed(now - q.enqueued)
        if left:
            self._retired(len(left))

    def _fail_requests(self, msg: str) -> None:
        self._drop_queue(Unavailable(f"the {self.model} engine failed: {msg}"))

    def _abort_requests(self) -> None:
        self._drop_queue(Unavailable(f"model {self.model!r} version {self.version} shut down"))


__all__ = ["MAX_WAITING", "EXECUTION_LOG", "OmEngine"]
