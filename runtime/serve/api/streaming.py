"""The engine's outputs on the event loop, and a client that goes away.

Generation requests go to the engine with an ``on_output`` callback that hands every increment to the
event loop (:class:`Submitted`); a client that disconnects (stream closed, or connection dropped while
waiting for a non-streamed answer: :func:`collect`) aborts its requests, which frees their KV blocks at the
engine's next step; its handler returns :func:`client_gone` (a 499 nobody reads) rather than raising, so a
dropped client is never a traceback.  Server-sent events are :func:`sse` lines in an :class:`EventStream`.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from typing import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..engine.request import RequestOutput, merge_outputs
from ..engine.sampling import SamplingParams
from .errors import error_response


def sse(obj) -> str:
    """One server-sent event carrying ``obj`` as compact JSON."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def disconnected(request: Request) -> None:
    """Returns when the client goes away (the body is already read, so receive() only reports that)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


class Submitted:
    """Engine requests of one HTTP request, their outputs tagged by choice index on one asyncio queue.  It
    keeps what the engine reported for each request (prompt tokens computed, completion tokens): what the
    request is charged -- :meth:`when_finished` hands the totals over once every request has finished,
    also after the client went away and the requests were aborted."""

    def __init__(self, engine, loop: asyncio.AbstractEventLoop):
        self.engine, self.loop = engine, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.handles: list = []
        self.open: set[str] = set()
        self._done: dict[str, tuple[int, int]] = {}       #: request id -> (prompt computed, completion tokens)
        self._ended: set[str] = set()                     #: request ids whose last output arrived
        self._on_finished = None

    async def add(self, prompts: list[list[int]], params: SamplingParams, prompt_param: str, priority: int = 0,
                  admit: Callable[[int], object] | None = None, cache_salt: str = "") -> None:
        """Queue the requests of ``prompts`` (the choices, in order), all or none: the engine checks them,
        calls ``admit(tokens)``, queues them (an engine in another process -- Ray Serve replicas -- answers
        with an awaitable that resolves once they are accepted or raises the refusal).  ``cache_salt``: their
        prefix-cache namespace (the tenant's)."""
        def on_output(i: int, out: RequestOutput):
            with contextlib.suppress(RuntimeError):       # the loop is gone (server stopping)
                self.loop.call_soon_threadsafe(self._arrived, i, out)
        hs = self.engine.add_requests(prompts, params, priority, prompt_param, on_output, admit=admit,
                                      cache_salt=cache_salt)
        if inspect.isawaitable(hs):
            hs = await hs
        self.handles.extend(hs)
        self.open.update(h.request_id for h in hs)

    def _arrived(self, i: int, out: RequestOutput) -> None:
        """On the loop: one output of the engine."""
        self._done[out.request_id] = (out.prompt_computed, out.completion_tokens)
        if out.finished:
            self._ended.add(out.request_id)
        self.queue.put_nowait((i, out))
        self._check_finished()

    def when_finished(self, fn) -> None:
        """Call ``fn(prompt_tokens, completion_tokens)`` -- the work the engine did for these requests -- once
        every request added has finished (now, if they have); no request added: ``fn(0, 0)``."""
        self._on_finished = fn
        self._check_finished()

    def _check_finished(self) -> None:
        fn = self._on_finished
        if fn is not None and all(h.request_id in self._ended for h in self.handles):
            self._on_finished = None
            fn(sum(p for p, _ in self._done.values()), sum(c for _, c in self._done.values()))

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        while self.open:
            i, out = await self.queue.get()
            if out.finished:
                self.open.discard(out.request_id)
            yield i, out

    def abort(self) -> None:
        for rid in list(self.open):
            self.engine.abort(rid)


async def collect(sub: Submitted, n: int, request: Request) -> list[RequestOutput] | None:
    """All outputs merged per choice; None (everything aborted) if the client disconnects first."""
    async def gather():
        per: list[list[RequestOutput]] = [[] for _ in range(n)]
        async for i, out in sub.outputs():
            per[i].append(out)
        return [merge_outputs(p) for p in per]

    work = asyncio.ensure_future(gather())
    gone = asyncio.ensure_future(disconnected(request))
    try:
        done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            return work.result()
        sub.abort()
        work.cancel()
        return None
    finally:
        gone.cancel()


def client_gone() -> JSONResponse:
    """What a handler returns when its client went away: nobody reads it (nginx's 499, "client closed
    request"); a handler must not raise for it -- that is logged as a failed ASGI application."""
    return error_response(499, "the client closed the request", "invalid_request_error", None, "client_closed")


class EventStream(StreamingResponse):
    """Server-sent events whose ``on_close`` runs however the response ends: after the stream's own end, and
    when the client went away before the stream started or while a chunk was being sent -- the stream is
    closed here (its ``finally`` runs now, not whenever the generator is collected)."""

    def __init__(self, events, on_close):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()
            finally:
                self._on_close()
