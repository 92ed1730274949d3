"""The server's access log: one line per HTTP request once its response has ended, on the logger
``vnpu.serve.access`` (it replaces uvicorn's own access log, which the server keeps off)::

    127.0.0.1:52114 "POST /v1/completions" 200 tenant=premium tokens=12+8 latency=153.2ms

``tenant``: the caller's tenant once a route authenticated it (``-`` for a request refused before that: a
bad key's 401, a body over the limit); ``tokens``: prompt + generated tokens of a generation (the prompt's
tokens + 0 for embeddings; ``-`` where no model ran); ``latency``: from the request's arrival until the
app is done with it (its last byte sent; a stream: its end).  Probes and scrapes (:data:`QUIET_PATHS`) are logged at debug
level, everything else at info.  What the routes learn (tenant, tokens) reaches the line through the
request's ASGI ``state`` (``request.state.tenant``, ``request.state.tokens``).  Runs on the event loop;
never blocks.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

log = logging.getLogger("vnpu.serve.access")

#: probes and scrapes: one line each at debug level, so that a load balancer polling every second does not
#: fill the log
QUIET_PATHS = frozenset({"/health", "/v2/health/live", "/v2/health/ready", "/metrics"})


def access_line(client, method: str, path: str, status: int, tenant: str | None, tokens: tuple[int, int] | None,
                latency_s: float) -> str:
    """One access-log line (see the module doc)."""
    who = f"{client[0]}:{client[1]}" if client else "-"
    toks = "-" if tokens is None else f"{tokens[0]}+{tokens[1]}"
    return (f'{who} "{method} {path}" {status} tenant={tenant or "-"} tokens={toks} '
            f"latency={latency_s * 1e3:.1f}ms")


class AccessLog:
    """ASGI middleware over ``app``: an access line per HTTP request (``clock``: seconds, for the latency)."""

    def __init__(self, app, clock: Callable[[], float] = time.monotonic):
        self.app, self.clock = app, clock

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = self.clock()
        state = scope.setdefault("state", {})              # request.state of the routes
        status: list[int] = []

        async def sending(msg):
            if msg["type"] == "http.response.start":
                status.append(msg["status"])
            await send(msg)
        try:
            await self.app(scope, receive, sending)
        finally:
            tenant = state.get("tenant")
            level = logging.DEBUG if scope["path"] in QUIET_PATHS else logging.INFO
            if log.isEnabledFor(level):
                log.log(level, "%s", access_line(scope.get("client"), scope["method"], scope["path"],
                                                 status[0] if status else 500,
                                                 getattr(tenant, "name", None), state.get("tokens"),
                                                 self.clock() - t0))
