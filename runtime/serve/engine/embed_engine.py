"""The embedding engine: dynamic batching of embedding requests over an :class:`EmbedJob`.

Requests queue up; the engine thread takes the first one, then waits up to ``max_wait_ms`` (on the
injectable ``clock``) for more, until ``max_batch_size`` texts are gathered, and runs them as ONE call of
the job (the same code as ``vnpu run embed``), handing each request its rows.

**Placements and the fallback chain** (:mod:`.placement`, as the generation engine): the encoder runs
data parallel on one entry of its chain at a time (a device list, or the CPU fallback device).  Before
every batch the engine reads the loss flags of its devices (no call).  A lost device re-binds the engine
to the next usable entry (the job is built there: weights uploaded); a batch that failed because a device
of the placement was lost is RE-RUN there -- an embedding is a pure function of its input, so the replay
gives the same result (up to the float32 rounding of another device) and every request gets its rows
exactly once.  A batch that fails on a healthy placement (a task exception) fails only its own requests
(HTTP 500); the engine stays up and runs the next batch -- whether repeated failures should move the model
is the self-healing policy's call (``error_rate`` over a window -> ``fallback``), as for generation
models, not one failed batch's.  Only when a device is lost and no chain entry is left does the engine
fail (every later request: :class:`Unavailable`).  :meth:`EmbedEngine.fallback` /
:meth:`EmbedEngine.restore` move on request, between two batches (queued requests wait and run on the new
placement; none is dropped).  Every re-bind is an event in :attr:`EmbedEngine.events` and goes to
``on_event`` listeners.  The thread, the chain, re-binds, admission and shutdown are the engine
lifecycle's (:mod:`.lifecycle`); this module gives the batch.

Blocking: :meth:`EmbedEngine.submit` returns a :class:`concurrent.futures.Future` at once; the engine
thread blocks on the device for each batch (and for the model upload of a re-bind); the lifecycle's calls
block as :mod:`.lifecycle` says.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Sequence, Union

import numpy as np

from devices.errors import InvalidParamError
from runtime.models.bert import ENCODER_MODELS, EmbedJob

from .errors import EngineFailure, InvalidRequest, Unavailable
from .lifecycle import EngineLifecycle
from .placement import DeviceBinder, Placement
from .stats import FinishedRequest, StatLogger, StepStats

log = logging.getLogger("vnpu.serve")


def check_texts(tok, texts, max_len: int, model: str) -> list[int]:
    """Token counts of ``texts`` (one string or a list) under ``tok``; refuses empty, non-string or inputs
    of ``max_len`` tokens or more (:class:`InvalidRequest`)."""
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        raise InvalidRequest("input must be a non-empty string or a non-empty list of strings", "input")
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t.strip():
            raise InvalidRequest(f"input[{i}] must be a non-empty string (token-id input is not supported by "
                                 f"{model})", "input")
    counts = tok.lengths(texts)
    for i, n in enumerate(counts):
        if n >= max_len:
            raise input_too_long(i, n, max_len, model)
    return counts


def input_too_long(i: int, n: int, max_len: int, model: str) -> InvalidRequest:
    """The refusal of ``input[i]``, known to have ``n`` tokens or more (>= ``max_len``)."""
    return InvalidRequest(f"input[{i}] has {n} tokens or more; {model} takes at most {max_len - 1}", "input",
                          "context_length_exceeded")


@dataclass
class _Item:
    texts: list[str]
    tokens: int
    future: Future
    arrival: float


class EmbedEngine(EngineLifecycle):
    """One sentence encoder served on ``devices`` (data parallel over them), with a fallback chain."""

    kind = "embed"
    thread_name = "embed"

    def __init__(self, rt, model: str = "minilm-l6", devices: Union[Sequence[int], Placement] = (0,),
                 max_batch_size: int = 32, max_wait_ms: float = 5.0, max_queued_requests: int = 256,
                 stat_loggers: Sequence[StatLogger] = (), clock: Callable[[], float] = time.monotonic,
                 fallback: Sequence[Placement] = (), binder: DeviceBinder | None = None,
                 on_event: Sequence[Callable[[dict], None]] = ()):
        """``devices``: the first placement (visible ids, data parallel over all); ``fallback``: the rest of
        the chain, in order; ``binder``: turns placements into devices (default: ``rt``'s devices and an
        in-process CPU fallback device).  Blocks for the weights upload."""
        if model not in ENCODER_MODELS:
            raise InvalidParamError(f"unknown encoder model {model!r} (known: {', '.join(ENCODER_MODELS)})")
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise InvalidParamError(f"max_batch_size must be a positive integer, got {max_batch_size!r}")
        if not isinstance(max_wait_ms, (int, float)) or max_wait_ms < 0:
            raise InvalidParamError(f"max_wait_ms must be >= 0, got {max_wait_ms!r}")
        super().__init__(rt, model, devices, fallback, binder, clock, stat_loggers, on_event)
        self.max_batch_size, self.max_wait_s = max_batch_size, max_wait_ms / 1e3
        self.batch_capacity = max_batch_size     #: what the job is built with: a live batch stays <=
        self.max_queued_requests = max_queued_requests
        self._q: deque[_Item] = deque()
        self._running = 0
        self.batches: list[int] = []                  #: texts per batch run (dynamic batching at work)
        self.failed_batches = 0                       #: batches that failed on a healthy placement
        self.replayed_batches = 0                     #: batches re-run after a device loss
        self._open()
        self.tok = self.job.tok
        self.dim = self.job.cfg.d
        self.max_len = self.job.cfg.max_len

    @property
    def job(self) -> EmbedJob | None:
        """The embedding job of the current placement (None while re-binding)."""
        return self.built

    def check(self, texts) -> list[int]:
        """Token counts of ``texts``; refuses empty, non-string or over-long inputs."""
        return check_texts(self.tok, texts, self.max_len, self.model)

    def set_batching(self, max_batch_size: int, max_wait_ms: float, max_queued_requests: int) -> None:
        """Dynamic batching from the next batch on: up to ``max_batch_size`` texts (at most what the engine was
        built with), waiting up to ``max_wait_ms``; ``max_queued_requests`` bounds the queue for new arrivals.
        Nothing queued or running is dropped.  :class:`InvalidParamError` (nothing changed) otherwise.
        Host-only (a short lock; a batch being gathered sees the new size at once, the new wait applies
        from the next batch)."""
        if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 1:
            raise InvalidParamError(f"max_batch_size must be a positive integer, got {max_batch_size!r}")
        if max_batch_size > self.batch_capacity:
            raise InvalidParamError(f"batching.max_batch_size {max_batch_size} is above the {self.batch_capacity} "
                                    f"the engine was built with; that needs a restart")
        if not isinstance(max_wait_ms, (int, float)) or isinstance(max_wait_ms, bool) or max_wait_ms < 0:
            raise InvalidParamError(f"max_wait_ms must be >= 0, got {max_wait_ms!r}")
        if not isinstance(max_queued_requests, int) or isinstance(max_queued_requests, bool) or max_queued_requests < 1:
            raise InvalidParamError(f"max_queued_requests must be a positive integer, got {max_queued_requests!r}")
        with self._lock:
            self.max_batch_size, self.max_wait_s = max_batch_size, max_wait_ms / 1e3
            self.max_queued_requests = max_queued_requests
            self._lock.notify_all()

    def submit(self, texts: list[str], tokens: int) -> Future:
        """Queue ``texts`` (already checked); the future's result is ``[len(texts), dim]`` float32.  A failed
        or draining engine: :class:`Unavailable`; a full queue: :class:`QueueFull`.  Returns at once."""
        fut: Future = Future()
        with self._admitting(1):
            self._q.append(_Item(list(texts), tokens, fut, self.clock()))
        return fut

    # ------------------------------------------------------------------ the batch (the lifecycle's step)
    def _step(self) -> None:
        batch = self._gather()
        if not batch:
            return
        try:
            self._run(batch)
        except Exception as e:  # noqa: BLE001 - a defect must not leave requests waiting forever
            log.exception("engine %s: a batch failed unexpectedly", self.model)
            for it in batch:
                if not it.future.done():
                    it.future.set_exception(EngineFailure(f"the batch failed: {type(e).__name__}: {e}"))
                    self._retired()
        finally:
            with self._lock:
                self._running = 0
                self._lock.notify_all()

    def _gather(self) -> list[_Item]:
        """Engine thread: the next batch -- up to ``max_batch_size`` texts, waiting up to ``max_wait_ms``
        for them -- or none when a control request or a stop came meanwhile (they go first)."""
        self._hold(lambda: sum(len(i.texts) for i in self._q) >= self.max_batch_size, self.clock() + self.max_wait_s)
        with self._lock:
            if self._stopping or self._control:
                return []
            batch: list[_Item] = []
            n = dropped = 0
            while self._q and (not batch or n + len(self._q[0].texts) <= self.max_batch_size):
                it = self._q.popleft()
                if it.future.set_running_or_notify_cancel():     # a cancelled request is dropped here
                    batch.append(it)
                    n += len(it.texts)
                else:
                    dropped += 1
            self._retired(dropped)
            self._running = len(batch)
            self._lock.notify_all()
            return batch

    def _run(self, batch: list[_Item]) -> None:
        """Engine thread: one batch on the current placement; re-run on the next entry after a device loss."""
        texts = [t for it in batch for t in it.texts]
        try:
            emb, rerun = self._run_on_placement(lambda job: job.embed(texts), len(batch))
        except EngineFailure as e:
            self.failed_batches += 1
            log.warning("engine %s: %s (%d request(s) failed)", self.model, e.message, len(batch))
            self._finish(batch, error=e)
            return
        except Unavailable as e:                                 # no entry left (the engine failed)
            self._finish(batch, error=e)
            return
        self.replayed_batches += rerun
        self.batches.append(len(texts))
        self._finish(batch, emb)

    def _finish(self, batch: list[_Item], emb: np.ndarray | None = None, error: BaseException | None = None) -> None:
        """Hand each request of ``batch`` its rows of ``emb`` (or ``error``), and record the batch."""
        t = self.clock()
        tokens = sum(it.tokens for it in batch)
        st = StepStats() if error is not None else StepStats(prompt_tokens=tokens, batch_tokens=tokens)
        i = 0
        for it in batch:
            if error is None:
                it.future.set_result(np.ascontiguousarray(emb[i:i + len(it.texts)]))
                i += len(it.texts)
            else:
                it.future.set_exception(error)
            self._retired()
            st.finished.append(FinishedRequest("stop" if error is None else "error", t - it.arrival, 0.0, it.tokens,
                                               0, 0))
        self._log_stats(st)

    # ------------------------------------------------------------------ the lifecycle's hooks
    def _build(self, devs: list) -> EmbedJob:
        return EmbedJob(None, self.model, devices=devs, parallel="dp", batch_size=self.batch_capacity)

    def _has_work(self) -> bool:
        return bool(self._q)

    def _queue_state(self) -> tuple[int, int, int]:
        return len(self._q), self.max_queued_requests, self.max_queued_requests

    def _drop_queue(self, err: BaseException) -> None:
        with self._lock:
            left, self._q = list(self._q), deque()
        for it in left:
            if it.future.set_running_or_notify_cancel():
                it.future.set_exception(err)
        self._retired(len(left))

    def _fail_requests(self, msg: str) -> None:
        self._drop_queue(Unavailable(f"the {self.model} engine failed: {msg}"))

    def _abort_requests(self) -> None:
        self._drop_queue(Unavailable(f"the {self.model} engine shut down"))

    def _gauges(self, stats: StepStats) -> None:
        with self._lock:
            stats.num_waiting = len(self._q)

    # ------------------------------------------------------------------ state
    @property
    def waiting(self) -> int:
        """Requests queued, not yet in a batch."""
        with self._lock:
            return len(self._q)

    @property
    def running(self) -> int:
        """Requests in the batch the engine thread is running now (0 between batches)."""
        return self._running
