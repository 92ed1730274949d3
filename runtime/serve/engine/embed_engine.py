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
``on_event`` listeners.

Blocking: :meth:`EmbedEngine.submit` returns a :class:`concurrent.futures.Future` at once; the engine
thread blocks on the device for each batch (and for the model upload of a re-bind);
``fallback``/``restore`` block until the re-bind is done; ``shutdown`` waits for the engine thread, then
frees the job's device memory.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from contextlib import contextmanager
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Sequence, Union

import numpy as np

from devices.errors import AclError, InvalidParamError
from runtime.models.bert import ENCODER_MODELS, EmbedJob

from .errors import EngineFailure, InvalidRequest, QueueFull, Unavailable
from .placement import DeviceBinder, Placement, RebindResult, bind_first, rebind_candidates, release
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


@dataclass
class _Rebind:
    """A ``fallback`` / ``restore`` request for the engine thread (between two batches)."""
    kind: str
    reason: str
    future: Future
    away_from: int | None = None


class EmbedEngine:
    """One sentence encoder served on ``devices`` (data parallel over them), with a fallback chain."""

    kind = "embed"

    def __init__(self, rt, model: str = "minilm-l6", devices: Union[Sequence[int], Placement] = (0,),
                 max_batch_size: int = 32, max_wait_ms: float = 5.0, max_queued_requests: int = 256,
                 stat_loggers: Sequence[StatLogger] = (), clock: Callable[[], float] = time.monotonic,
                 fallback: Sequence[Placement] = (), binder: DeviceBinder | None = None,
                 on_event: Sequence[Callable[[dict], None]] = ()):
        """``devices``: the first placement (visible ids, data parallel over all); ``fallback``: the rest of
        the chain, in order; ``binder``: turns placements into devices (default: ``rt``'s devices and an
        in-process CPU fallback device)."""
        if model not in ENCODER_MODELS:
            raise InvalidParamError(f"unknown encoder model {model!r} (known: {', '.join(ENCODER_MODELS)})")
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise InvalidParamError(f"max_batch_size must be a positive integer, got {max_batch_size!r}")
        if not isinstance(max_wait_ms, (int, float)) or max_wait_ms < 0:
            raise InvalidParamError(f"max_wait_ms must be >= 0, got {max_wait_ms!r}")
        self.model, self.max_batch_size, self.max_wait_s = model, max_batch_size, max_wait_ms / 1e3
        self.max_queued_requests, self.clock = max_queued_requests, clock
        self.stat_loggers = list(stat_loggers)
        self.on_event = list(on_event)
        first = devices if isinstance(devices, Placement) else Placement(tuple(int(d) for d in devices))
        self.chain: tuple[Placement, ...] = (first, *fallback)
        self.binder = binder or DeviceBinder(rt)
        self._own_binder = binder is None
        self.index = 0
        try:
            self.job: EmbedJob | None = self._build(self.binder.devices(first))
        except BaseException:
            if self._own_binder:
                self.binder.close()
            raise
        self.tok = self.job.tok
        self.dim = self.job.cfg.d
        self.max_len = self.job.cfg.max_len
        self._q: deque[_Item] = deque()
        self._ctl: deque[_Rebind] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._accepting = True
        self._busy = 0
        self._pauses = 0                              #: holders of paused(): no batch starts meanwhile
        self._running = 0
        self.error: str | None = None                 #: set only when a device is lost and no entry is left
        self.batches: list[int] = []                  #: texts per batch run (dynamic batching at work)
        self.events: list[dict] = []
        self.rebinds = 0
        self.failed_batches = 0                       #: batches that failed on a healthy placement
        self.replayed_batches = 0                     #: batches re-run after a device loss

    def _build(self, devs: list) -> EmbedJob:
        return EmbedJob(None, self.model, devices=devs, parallel="dp", batch_size=self.max_batch_size)

    def check(self, texts) -> list[int]:
        """Token counts of ``texts``; refuses empty, non-string or over-long inputs."""
        return check_texts(self.tok, texts, self.max_len, self.model)

    def submit(self, texts: list[str], tokens: int) -> Future:
        """Queue ``texts`` (already checked); the future's result is ``[len(texts), dim]`` float32."""
        fut: Future = Future()
        with self._cv:
            if self.error is not None:
                raise Unavailable(f"the {self.model} engine failed: {self.error}")
            if not self._accepting:
                raise Unavailable(f"the {self.model} engine is draining")
            if len(self._q) >= self.max_queued_requests:
                raise QueueFull(f"the {self.model} engine has {len(self._q)} requests waiting "
                                f"(max_queued_requests={self.max_queued_requests})")
            self._q.append(_Item(list(texts), tokens, fut, self.clock()))
            self._cv.notify_all()
        return fut

    # ------------------------------------------------------------------ placements
    @property
    def placement(self) -> Placement:
        """The chain entry the engine runs on."""
        return self.chain[self.index]

    @property
    def devices(self) -> list:
        """The devices of the current placement."""
        return list(self.job.devices) if self.job is not None else []

    def fallback(self, reason: str = "requested", timeout: float | None = None,
                 away_from: int | None = None) -> RebindResult:
        """Move to the next usable entry of the chain (between two batches; blocks until done).
        :class:`Unavailable` when no entry is left (the engine stays where it is).  ``away_from``: move only
        while the placement uses that device (``moved`` False otherwise; see
        :meth:`runtime.serve.engine.GenerateEngine.fallback`)."""
        return self._request_rebind(_Rebind("fallback", reason, Future(), away_from), timeout)

    def restore(self, timeout: float | None = None) -> RebindResult:
        """Move back to the first entry when it is healthy (between two batches; blocks until done).
        ``moved`` is False when already there; :class:`Unavailable` when the first entry is not healthy."""
        return self._request_rebind(_Rebind("restore", "requested", Future()), timeout)

    def _request_rebind(self, rq: _Rebind, timeout: float | None) -> RebindResult:
        with self._cv:
            if self._stopping:
                raise Unavailable(f"the {self.model} engine is shutting down")
            threaded = self._thread is not None
            if threaded:
                self._ctl.append(rq)
                self._cv.notify_all()
        if not threaded:
            self._run_rebind(rq)
        return rq.future.result(timeout)

    def _run_rebind(self, rq: _Rebind) -> None:
        try:
            if self.error is not None:
                raise Unavailable(f"the {self.model} engine failed: {self.error}")
            plan = rebind_candidates(self.binder, self.chain, self.index, rq.kind, self.model, rq.away_from)
            res = plan if isinstance(plan, RebindResult) else self._rebind(plan, rq.kind, rq.reason, 0)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            rq.future.set_exception(e)
        else:
            rq.future.set_result(res)

    def _rebind(self, candidates, kind: str, reason: str, replayed: int) -> RebindResult:
        """Engine thread, between batches: release the placement, build the job on the first usable
        candidate entry.  ``replayed``: requests of a batch that failed on the old placement and run again
        on the new one.  :class:`Unavailable` when no candidate builds."""
        t0, frm = time.monotonic(), self.index
        self._release()
        try:
            self.index, self.job = bind_first(self.binder, self.chain, candidates, self._build, self.model)
        except Unavailable as e:
            self._record(dict(kind=kind, ok=False, from_index=frm, reason=reason, error=str(e)))
            self._rebind_back(frm)
            raise
        self.rebinds += 1
        res = RebindResult(self.index != frm, frm, self.index, str(self.placement), reason, replayed,
                           time.monotonic() - t0)
        self._record(dict(kind=kind, ok=True, from_index=frm, to_index=self.index, placement=str(self.placement),
                          previous=str(self.chain[frm]), reason=reason, replayed=replayed, seconds=res.seconds))
        log.warning("engine %s: %s %s -> %s (%s), %d request(s) replayed in %.2f s", self.model, kind,
                    self.chain[frm], self.placement, reason, replayed, res.seconds)
        return res

    def _rebind_back(self, frm: int) -> None:
        """After a failed re-bind: build again where the engine was when that entry is still usable; the
        engine fails (every request refused) when it is not or does not build."""
        why = self.binder.lost(self.chain[frm])
        if why is None:
            try:
                self.job, self.index = self._build(self.binder.devices(self.chain[frm])), frm
                return
            except Exception as e:  # noqa: BLE001 - reported through self.error
                why = f"{type(e).__name__}: {e}"
        self._fail(f"no placement left to run on ({self.chain[frm]}: {why})")

    def _release(self) -> None:
        """Free what the current placement holds (a lost device's share is gone with it)."""
        job, self.job = self.job, None
        release(job, self.model, self.placement)        # every rank and device is tried, even when one fails

    def _auto_fallback(self, why: str, replayed: int) -> bool:
        """A device of the placement is lost: move down the chain.  False (the engine failed: every request
        from now on is refused) when no entry is left or none builds."""
        if self.index + 1 >= len(self.chain):
            self._fail(f"{self.placement} is unusable ({why}) and no fallback is left")
            return False
        try:
            self._rebind(range(self.index + 1, len(self.chain)), "fallback", f"automatic: {why}", replayed)
        except Unavailable as e:
            if self.error is None:
                self._fail(str(e))
            return False
        return True

    def _fail(self, msg: str) -> None:
        log.error("engine %s failed: %s", self.model, msg)
        with self._cv:
            self.error = msg
            left, self._q = list(self._q), deque()
        for it in left:
            if it.future.set_running_or_notify_cancel():
                it.future.set_exception(Unavailable(f"the {self.model} engine failed: {msg}"))

    def _record(self, ev: dict) -> None:
        ev = dict(ev, model=self.model, t=self.clock())
        self.events.append(ev)
        for fn in self.on_event:
            try:
                fn(ev)
            except Exception:  # noqa: BLE001 - a listener must not break the engine
                log.exception("engine event listener failed")

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"vnpu-embed-{self.model}", daemon=True)
            self._thread.start()

    def _gather(self) -> tuple[list[_Rebind], list[_Item]] | None:
        """Engine thread: the next re-bind requests, or the next batch (None: stop)."""
        with self._cv:
            self._cv.wait_for(lambda: self._stopping or self._q or self._ctl)
            if not self._q and not self._ctl:
                return None
            deadline = self.clock() + self.max_wait_s
            while not self._stopping and not self._ctl and sum(len(i.texts) for i in self._q) < self.max_batch_size:
                left = deadline - self.clock()
                if left <= 0:
                    break
                self._cv.wait(left)
            self._cv.wait_for(lambda: self._stopping or not self._pauses)
            self._busy += 1
            if self._ctl:                                        # re-binds first, between two batches
                ctl, self._ctl = list(self._ctl), deque()
                return ctl, []
            batch: list[_Item] = []
            n = 0
            while self._q and (not batch or n + len(self._q[0].texts) <= self.max_batch_size):
                it = self._q.popleft()
                if it.future.set_running_or_notify_cancel():     # a cancelled request is dropped here
                    batch.append(it)
                    n += len(it.texts)
            self._running = len(batch)
            self._cv.notify_all()
            return [], batch

    def _loop(self) -> None:
        while True:
            got = self._gather()
            if got is None:
                return
            ctl, batch = got
            try:
                for rq in ctl:
                    if self._stopping:
                        rq.future.set_exception(Unavailable(f"the {self.model} engine is shutting down"))
                    else:
                        self._run_rebind(rq)
                if batch:
                    self._run(batch)
            except Exception as e:  # noqa: BLE001 - a defect must not leave requests waiting forever
                log.exception("engine %s: a batch failed unexpectedly", self.model)
                for it in batch:
                    if not it.future.done():
                        it.future.set_exception(EngineFailure(f"the batch failed: {type(e).__name__}: {e}"))
            finally:
                with self._cv:
                    self._busy -= 1
                    self._running = 0
                    self._cv.notify_all()

    def _run(self, batch: list[_Item]) -> None:
        """Engine thread: one batch on the current placement; re-run on the next entry after a device loss."""
        texts = [t for it in batch for t in it.texts]
        attempted = 0
        while True:
            lost = self.binder.lost(self.placement) if self.error is None else None
            if lost is not None and self._auto_fallback(lost, len(batch) if attempted else 0) and attempted:
                self.replayed_batches += 1
            if self.error is not None:                           # no entry left (or the engine failed)
                err = Unavailable(f"the {self.model} engine failed: {self.error}")
                self._finish_failed(batch, err)
                return
            attempted += 1
            try:
                job = self.job
                if job is None:                                  # (a failed re-bind re-binds back or fails)
                    raise Unavailable(f"the {self.model} engine has no placement bound")
                emb = job.embed(texts)
                break
            except Exception as e:  # noqa: BLE001 - a loss re-runs the batch; anything else fails it only
                if self.binder.lost(self.placement) is not None:
                    continue
                self.failed_batches += 1
                msg = f"the batch failed on {self.placement}: {type(e).__name__}: {e}"
                log.warning("engine %s: %s (%d request(s) failed)", self.model, msg, len(batch))
                fail = EngineFailure(msg)
                fail.__cause__ = e
                self._finish_failed(batch, fail)
                return
        self.batches.append(len(texts))
        t = self.clock()
        st = StepStats(prompt_tokens=sum(it.tokens for it in batch), batch_tokens=sum(it.tokens for it in batch))
        i = 0
        for it in batch:
            it.future.set_result(np.ascontiguousarray(emb[i:i + len(it.texts)]))
            i += len(it.texts)
            st.finished.append(FinishedRequest("stop", t - it.arrival, 0.0, it.tokens, 0, 0))
        self._log_stats(st)

    def _finish_failed(self, batch: list[_Item], e: BaseException) -> None:
        t = self.clock()
        st = StepStats()
        for it in batch:
            it.future.set_exception(e)
            st.finished.append(FinishedRequest("error", t - it.arrival, 0.0, it.tokens, 0, 0))
        self._log_stats(st)

    def _log_stats(self, st: StepStats) -> None:
        with self._cv:
            st.num_waiting = len(self._q)
        for lg in self.stat_loggers:
            lg.record(self.model, st)

    # ------------------------------------------------------------------ state
    @property
    def accepting(self) -> bool:
        return self._accepting and self.error is None

    @property
    def waiting(self) -> int:
        """Requests queued, not yet in a batch."""
        with self._cv:
            return len(self._q)

    @property
    def running(self) -> int:
        """Requests in the batch the engine thread is running now (0 between batches)."""
        return self._running

    @property
    def pending_rebinds(self) -> int:
        """``fallback`` / ``restore`` requests waiting for the next batch boundary."""
        with self._cv:
            return len(self._ctl)

    def has_unfinished(self) -> bool:
        with self._cv:
            return bool(self._q) or self._busy > 0

    def wait_until(self, pred: Callable[["EmbedEngine"], bool], timeout: float | None = None) -> bool:
        """Block until ``pred(engine)`` holds (checked at every request queued, batch taken or finished)."""
        with self._cv:
            return self._cv.wait_for(lambda: pred(self), timeout)

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: not self._q and self._busy == 0, timeout)

    def drain(self, timeout: float | None = None) -> bool:
        with self._cv:
            self._accepting = False
        return self.wait_idle(timeout)

    @contextmanager
    def paused(self, timeout: float | None = None):
        """Hold the engine between two batches for the ``with`` block: nothing of it runs on its devices
        meanwhile (requests keep queuing), e.g. for a live defragmentation.  Blocks the caller until the
        running batch is done (:class:`Unavailable` after ``timeout`` seconds)."""
        with self._cv:
            self._pauses += 1
            idle = self._cv.wait_for(lambda: self._busy == 0, timeout)
        try:
            if not idle:
                raise Unavailable(f"the {self.model} engine did not finish its batch within {timeout} s")
            yield self
        finally:
            with self._cv:
                self._pauses -= 1
                self._cv.notify_all()

    def shutdown(self) -> None:
        with self._cv:
            self._accepting = False
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._cv:
            left, self._q = list(self._q), deque()
            ctl, self._ctl = list(self._ctl), deque()
        for rq in ctl:
            rq.future.set_exception(Unavailable(f"the {self.model} engine shut down"))
        for it in left:
            if it.future.set_running_or_notify_cancel():
                it.future.set_exception(Unavailable(f"the {self.model} engine shut down"))
        try:
            job, self.job = self.job, None
            if job is not None:
                try:
                    job.close()                  # every rank and device is tried, even when one fails
                except AclError as e:
                    lost = [d.index for d in job.devices if d.is_lost]
                    if not lost:
                        raise
                    # a lost device's memory went with it: nothing is left to free there (not a failed shutdown)
                    log.info("engine %s: device(s) %s lost; closed what was left (%s)", self.model,
                             ",".join(map(str, lost)), e)
        finally:
            if self._own_binder:
                self.binder.close()
