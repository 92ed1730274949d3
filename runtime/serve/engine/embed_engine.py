"""The embedding engine: dynamic batching of embedding requests over an :class:`EmbedJob`.

Requests queue up; the engine thread takes the first one, then waits up to ``max_wait_ms`` (on the
injectable ``clock``) for more, until ``max_batch_size`` texts are gathered, and runs them as ONE call of
the job (the same code as ``vnpu run embed``), handing each request its rows.

Blocking: :meth:`EmbedEngine.submit` returns a :class:`concurrent.futures.Future` at once; the engine
thread blocks on the device for each batch.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from contextlib import contextmanager
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from devices.errors import AclError, InvalidParamError
from runtime.models.bert import ENCODER_MODELS, EmbedJob

from .errors import InvalidRequest, QueueFull, Unavailable
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
            raise InvalidRequest(f"input[{i}] has {n} tokens or more; {model} takes at most {max_len - 1}", "input",
                                 "context_length_exceeded")
    return counts


@dataclass
class _Item:
    texts: list[str]
    tokens: int
    future: Future
    arrival: float


class EmbedEngine:
    """One sentence encoder served on ``devices`` (data parallel over them)."""

    kind = "embed"

    def __init__(self, rt, model: str = "minilm-l6", devices: Sequence[int] = (0,), max_batch_size: int = 32,
                 max_wait_ms: float = 5.0, max_queued_requests: int = 256, stat_loggers: Sequence[StatLogger] = (),
                 clock: Callable[[], float] = time.monotonic):
        if model not in ENCODER_MODELS:
            raise InvalidParamError(f"unknown encoder model {model!r} (known: {', '.join(ENCODER_MODELS)})")
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise InvalidParamError(f"max_batch_size must be a positive integer, got {max_batch_size!r}")
        if not isinstance(max_wait_ms, (int, float)) or max_wait_ms < 0:
            raise InvalidParamError(f"max_wait_ms must be >= 0, got {max_wait_ms!r}")
        self.model, self.max_batch_size, self.max_wait_s = model, max_batch_size, max_wait_ms / 1e3
        self.max_queued_requests, self.clock = max_queued_requests, clock
        self.stat_loggers = list(stat_loggers)
        self.job = EmbedJob(rt, model, devices=list(devices), parallel="dp", batch_size=max_batch_size)
        self.devices = self.job.devices
        self.dim = self.job.cfg.d
        self.max_len = self.job.cfg.max_len
        self._q: deque[_Item] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._accepting = True
        self._busy = 0
        self._pauses = 0                              #: holders of paused(): no batch starts meanwhile
        self.error: str | None = None
        self.batches: list[int] = []                  #: texts per batch run (dynamic batching at work)

    def check(self, texts) -> list[int]:
        """Token counts of ``texts``; refuses empty, non-string or over-long inputs."""
        return check_texts(self.job.tok, texts, self.max_len, self.model)

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

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"vnpu-embed-{self.model}", daemon=True)
            self._thread.start()

    def _gather(self) -> list[_Item] | None:
        with self._cv:
            self._cv.wait_for(lambda: self._stopping or self._q)
            if not self._q:
                return None
            deadline = self.clock() + self.max_wait_s
            while not self._stopping and sum(len(i.texts) for i in self._q) < self.max_batch_size:
                left = deadline - self.clock()
                if left <= 0:
                    break
                self._cv.wait(left)
            self._cv.wait_for(lambda: self._stopping or not self._pauses)
            batch, n = [], 0
            while self._q and (not batch or n + len(self._q[0].texts) <= self.max_batch_size):
                it = self._q.popleft()
                if it.future.set_running_or_notify_cancel():     # a cancelled request is dropped here
                    batch.append(it)
                    n += len(it.texts)
            self._busy += 1
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._gather()
            if batch is None:
                return
            try:
                if batch:
                    self._run(batch)
            finally:
                with self._cv:
                    self._busy -= 1
                    self._cv.notify_all()

    def _run(self, batch: list[_Item]) -> None:
        texts = [t for it in batch for t in it.texts]
        try:
            emb = self.job.embed(texts)
        except Exception as e:  # noqa: BLE001 - every request of the batch gets the error
            self.error = f"{type(e).__name__}: {e}"
            for it in batch:
                it.future.set_exception(e)
            return
        self.batches.append(len(texts))
        t = self.clock()
        st = StepStats(prompt_tokens=sum(it.tokens for it in batch), batch_tokens=sum(it.tokens for it in batch))
        i = 0
        for it in batch:
            it.future.set_result(np.ascontiguousarray(emb[i:i + len(it.texts)]))
            i += len(it.texts)
            st.finished.append(FinishedRequest("stop", t - it.arrival, 0.0, it.tokens, 0, 0))
        with self._cv:
            st.num_waiting = len(self._q)
        for lg in self.stat_loggers:
            lg.record(self.model, st)

    # ------------------------------------------------------------------ state
    @property
    def accepting(self) -> bool:
        return self._accepting and self.error is None

    def has_unfinished(self) -> bool:
        with self._cv:
            return bool(self._q) or self._busy > 0

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
        for it in left:
            if it.future.set_running_or_notify_cancel():
                it.future.set_exception(Unavailable(f"the {self.model} engine shut down"))
        try:
            self.job.close()                     # every rank and device is tried, even when one fails
        except AclError as e:
            lost = [d.index for d in self.devices if d.is_lost]
            if not lost:
                raise
            # a lost device's memory went with it: nothing is left to free there (not a failed shutdown)
            log.info("engine %s: device(s) %s lost; closed what was left (%s)", self.model,
                     ",".join(map(str, lost)), e)
