"""The routes' guard: a pure ASGI middleware that sees every request's headers before anything reads its
body (:class:`runtime.serve.limits.HttpLimits`).

1. **Authentication from the headers.**  Every path but :data:`OPEN_PATHS` needs a valid API key
   (:meth:`runtime.serve.tenants.TenantRegistry.authenticate`): 401 before a byte of the body is read --
   a request without a key costs the server its headers only, whatever it sends after them (malformed JSON
   included: 401, not 400).  The routes still authenticate (and check admin keys) themselves.
2. **Body size.**  A ``Content-Length`` over ``max_body_bytes`` is 413 at once; a chunked body is counted
   as it arrives and refused (413) as soon as it passes the limit.
3. **Body deadline.**  The whole body must arrive within ``body_timeout_s`` of the headers (408 -- a slow
   body, or a ``Content-Length`` larger than what is sent); a client that goes away meanwhile gets nothing.

Every refusal here is in OpenAI's error shape (the Open Inference Protocol's on ``/v2`` routes), carries ``x-request-id`` and closes the connection; the rest
of a refused body is never kept (read and dropped for a few seconds at most, so that a client still
uploading reads the answer rather than a reset); on a model route it is counted as the sampler's
``client`` outcome.  The body,
once read, is handed to the app whole; after it, ``receive()`` is the connection's own (it reports the
client's disconnect).  Runs on the event loop; holds at most ``max_body_bytes`` of body per request.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from ..engine.errors import ServeError
from ..limits import HttpLimits
from .errors import error_response, from_exception, shaped
from .handling import model_route, outcome_of

#: paths served without an API key (load balancers' and orchestrators' probes, the Open Inference
#: Protocol's health probes included)
OPEN_PATHS = frozenset({"/health", "/v2/health/live", "/v2/health/ready"})
#: how long, and how much, a refused request's remaining body is read and dropped before the connection
#: closes (see :meth:`RequestGuard._refuse`)
LINGER_S = 5.0
LINGER_BYTES = 64 << 20


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k == name:
            return v.decode("latin-1")
    return None


class RequestGuard:
    """ASGI middleware over ``app`` for ``service`` (a :class:`runtime.serve.server.Frontend`: its current
    tenants authenticate, its sampler hears refusals of model requests)."""

    def __init__(self, app, service, limits: HttpLimits):
        self.app, self.service, self.limits = app, service, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.monotonic()
        te, cl = _header(scope, b"transfer-encoding"), _header(scope, b"content-length")
        has_body = te is not None or (cl is not None and cl.strip() not in ("", "0"))
        if scope["path"] not in OPEN_PATHS:
            try:
                self.service.tenants.authenticate(_header(scope, b"authorization"))
            except ServeError as e:
                return await self._refuse(scope, receive, send, from_exception(e), t0, linger=has_body)
        if not has_body:
            return await self.app(scope, receive, send)
        limit = self.limits.max_body_bytes
        if cl is not None and cl.strip().isdigit() and int(cl) > limit:
            return await self._refuse(scope, receive, send, self._too_large(int(cl)), t0, linger=True)
        chunks: list[bytes] = []
        got = 0
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        return                                    # the client went away: nobody to answer
                    part = msg.get("body", b"")
                    got += len(part)
                    if got > limit:
                        return await self._refuse(scope, receive, send, self._too_large(None), t0,
                                                  linger=msg.get("more_body", False))
                    chunks.append(part)
                    if not msg.get("more_body", False):
                        break
        except TimeoutError:
            return await self._refuse(scope, receive, send, error_response(
                408, f"the request body did not arrive within {self.limits.body_timeout_s:g} s ({got} bytes "
                     f"received{f' of {cl}' if cl is not None else ''})", "invalid_request_error", None,
                "request_timeout"), t0, linger=False)
        body = b"".join(chunks)
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()
        await self.app(scope, replay, send)

    def _too_large(self, declared: int | None):
        what = f"{declared} bytes" if declared is not None else "more"
        return error_response(413, f"the request body is too large: {what}, at most {self.limits.max_body_bytes} "
                                   f"bytes (server http.max_body_bytes)", "invalid_request_error", None,
                              "request_too_large")

    async def _refuse(self, scope, receive, send, resp, t0: float, linger: bool) -> None:
        """Answer ``resp`` (``connection: close``).  With ``linger`` -- the client may still be sending its
        body -- the rest of the body is read and dropped, at most :data:`LINGER_S` s and
        :data:`LINGER_BYTES`, before the connection closes: closing a socket with unread data resets it, and
        a client still uploading would see the reset instead of the answer (what nginx's lingering close
        is for).  Nothing of it is kept."""
        resp = shaped(scope["path"], resp)
        resp.headers["connection"] = "close"
        resp.headers["x-request-id"] = _header(scope, b"x-request-id") or uuid.uuid4().hex
        if model_route(scope["path"]):
            self.service.observe(outcome_of(resp.status_code, None, False), time.monotonic() - t0)
        await send({"type": "http.response.start", "status": resp.status_code, "headers": resp.raw_headers})
        await send({"type": "http.response.body", "body": resp.body, "more_body": linger})
        if not linger:
            return
        dropped = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LINGER_S):
                while dropped <= LINGER_BYTES:
                    msg = await receive()
                    if msg["type"] == "http.disconnect" or not msg.get("more_body", False):
                        break
                    dropped += len(msg.get("body", b""))
        await send({"type": "http.response.body", "body": b"", "more_body": False})
