"""Tokenization off the event loop, fair across tenants.

Turning a prompt or an embeddings input into tokens costs time in proportion to its size (seconds for
megabytes); on the event loop that time is everyone's -- ``/health`` and every other tenant wait.  The
routes hand it to a :class:`TokenizePool` instead: a fixed set of worker threads (the tokenizers work
without the GIL, so the loop keeps running meanwhile), one FIFO queue per tenant, and free workers take
jobs from the tenants in round-robin order, a tenant running at most ``per_tenant`` jobs at once (half
the threads by default): one tenant's big inputs never hold every worker while another tenant waits.  A
tenant with :data:`MAX_QUEUED_PER_TENANT` jobs waiting is refused more (429) until they drain.

Blocking: :meth:`TokenizePool.run` awaits the job (the loop is free); a job not yet started is dropped when
its awaiting request is cancelled; :meth:`close` fails the queued jobs and does not wait for running ones.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

from ..engine.errors import Unavailable
from ..tenants import RateLimited

#: jobs one tenant may have waiting (not yet started) before more are refused
MAX_QUEUED_PER_TENANT = 64


@dataclass
class _Job:
    fn: Callable
    args: tuple
    future: Future


class TokenizePool:
    """``threads`` workers over per-tenant queues (see the module docstring).  ``gate``, when given, is
    called in the worker thread with the tenant's name before each job runs (it already counts as
    running): a hook for tests that hold one tenant's jobs."""

    def __init__(self, threads: int = 4, per_tenant: int | None = None,
                 gate: Callable[[str], None] | None = None):
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        self.threads = threads
        self.per_tenant = per_tenant if per_tenant is not None else max(1, threads // 2)
        self.gate = gate
        self._queues: dict[str, deque[_Job]] = {}
        self._order: deque[str] = deque()          #: tenants with jobs waiting, in round-robin order
        self._running: dict[str, int] = {}
        self._started = 0
        self._closed = False
        self._cv = threading.Condition()
        self._workers = [threading.Thread(target=self._work, name=f"vnpu-tokenize-{i}", daemon=True)
                         for i in range(threads)]
        for w in self._workers:
            w.start()

    async def run(self, tenant: str, fn: Callable, *args):
        """``fn(*args)`` on a worker as ``tenant``'s job; its result (or its exception)."""
        return await asyncio.wrap_future(self.submit(tenant, fn, *args))

    def submit(self, tenant: str, fn: Callable, *args) -> Future:
        fut: Future = Future()
        with self._cv:
            if self._closed:
                raise Unavailable("the server is stopping")
            q = self._queues.get(tenant)
            if q is None:
                q = self._queues[tenant] = deque()
                self._order.append(tenant)
            if len(q) >= MAX_QUEUED_PER_TENANT:
                raise RateLimited(f"Rate limit reached for tenant {tenant}: {len(q)} requests are waiting to be "
                                  f"tokenized. Please try again in 1s.", 1.0, "requests")
            q.append(_Job(fn, args, fut))
            self._cv.notify_all()
        return fut

    def stats(self) -> dict:
        """``running`` and ``queued`` jobs by tenant, and ``started``: jobs begun since the pool started."""
        with self._cv:
            return self._stats()

    def wait_until(self, pred: Callable[[dict], bool], timeout: float | None = None) -> bool:
        """Block until ``pred(stats())`` holds (re-checked whenever a job is queued, starts or ends)."""
        with self._cv:
            return self._cv.wait_for(lambda: pred(self._stats()), timeout)

    def close(self) -> None:
        """Stop the workers once their running jobs end; queued jobs fail with :class:`Unavailable`."""
        with self._cv:
            self._closed = True
            left = [j for q in self._queues.values() for j in q]
            self._queues.clear()
            self._order.clear()
            self._cv.notify_all()
        for j in left:
            if j.future.set_running_or_notify_cancel():
                j.future.set_exception(Unavailable("the server is stopping"))

    # -------------------------------------------------------------- workers
    def _stats(self) -> dict:
        return {"running": {t: n for t, n in self._running.items() if n},
                "queued": {t: len(q) for t, q in self._queues.items()}, "started": self._started}

    def _pick(self) -> tuple[str, _Job] | None:
        """The next tenant in turn with a job waiting and a free share of the workers (lock held)."""
        for _ in range(len(self._order)):
            tenant = self._order[0]
            self._order.rotate(-1)
            if self._running.get(tenant, 0) >= self.per_tenant:
                continue
            q = self._queues[tenant]
            job = q.popleft()
            if not q:
                del self._queues[tenant]
                self._order.remove(tenant)
            return tenant, job
        return None

    def _work(self) -> None:
        while True:
            with self._cv:
                picked = None
                while picked is None:
                    if self._closed:
                        return
                    picked = self._pick()
                    if picked is None:
                        self._cv.wait()
                tenant, job = picked
                self._running[tenant] = self._running.get(tenant, 0) + 1
                if job.future.set_running_or_notify_cancel():
                    self._started += 1
                else:
                    job = None                            # its request went away while it waited
                self._cv.notify_all()
            try:
                if job is not None:
                    try:
                        if self.gate is not None:
                            self.gate(tenant)
                        result = job.fn(*job.args)
                    except BaseException as e:  # noqa: BLE001 - the request's own error, for its awaiter
                        job.future.set_exception(e)
                    else:
                        job.future.set_result(result)
            finally:
                with self._cv:
                    self._running[tenant] -= 1
                    self._cv.notify_all()
