"""The server's HTTP connections before a request reaches the routes: a deadline and a size cap for the
request headers, and a cap on connections per client address (:class:`runtime.serve.limits.HttpLimits`).

uvicorn times out idle keep-alive connections only; a connection that sends half a request line and
then nothing, or a header a byte at a time, is held for ever, and uvicorn's HTTP parser (httptools) takes
headers of any size.  :func:`guarded_protocol` subclasses uvicorn's HTTP protocol (the one it would pick:
httptools, else h11) so that:

- a request's headers must be complete within ``header_timeout_s`` of its first byte (of the connection
  opening, for the first request): else 408 and the connection is closed (closed without an answer when
  nothing at all was sent -- an idle client racing a reused connection must not read a stray 408);
- they must fit in ``max_header_bytes``: else 431, closed;
- an address holding ``max_connections_per_client`` connections gets 429 on the next one at once, closed
  (nginx's ``limit_conn`` answers 503; 429 says it is this client, and OpenAI clients back off on it).

"Headers complete" is read off uvicorn's request cycle (both protocols start one per request).  The
body's deadline and size are the routes' guard's (:mod:`.guard`): it sees the headers first.
Everything here runs on the event loop; :class:`ConnectionCounter` is also read from other threads.
"""
from __future__ import annotations

import http
import json
import threading
from typing import Callable

from ..limits import HttpLimits
from .errors import error_body


def raw_response(status: int, message: str, etype: str, code: str, headers: dict | None = None) -> bytes:
    """A whole HTTP/1.1 response in OpenAI's error shape that closes the connection (written straight to
    the transport: no request cycle to answer through)."""
    body = json.dumps(error_body(message, etype, None, code)).encode()
    head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class ConnectionCounter:
    """Open connections per client address, and how many were refused (thread-safe)."""

    def __init__(self, cap: int):
        self.cap = cap
        self.refused = 0
        self._open: dict[str, int] = {}
        self._cv = threading.Condition()

    def acquire(self, host: str) -> bool:
        """Count a new connection from ``host``; False (counted as refused) when it holds ``cap`` already."""
        with self._cv:
            n = self._open.get(host, 0)
            if n >= self.cap:
                self.refused += 1
                self._cv.notify_all()
                return False
            self._open[host] = n + 1
            self._cv.notify_all()
            return True

    def release(self, host: str) -> None:
        with self._cv:
            n = self._open.get(host, 0) - 1
            if n > 0:
                self._open[host] = n
            else:
                self._open.pop(host, None)
            self._cv.notify_all()

    def open(self) -> dict[str, int]:
        """Open connections by client address."""
        with self._cv:
            return dict(self._open)

    def wait_until(self, pred: Callable[[dict[str, int], int], bool], timeout: float | None = None) -> bool:
        """Block until ``pred(open connections by address, refused so far)`` holds (re-checked on every
        connection opened, refused or closed)."""
        with self._cv:
            return self._cv.wait_for(lambda: pred(dict(self._open), self.refused), timeout)


class _Guard:
    """The mixin over uvicorn's HTTP protocol (see the module docstring).  ``limits`` and ``counter`` are
    set on the class :func:`guarded_protocol` makes."""

    limits: HttpLimits
    counter: ConnectionCounter

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._host: str | None = None        # the address counted for this connection (None: not counted)
        self._refused = False
        self._awaiting = True                # between two requests: the next one's headers are due
        self._header_bytes = 0
        self._timer = None

    # -------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport) -> None:
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, (tuple, list)) and peer else None
        if host is not None:
            if not self.counter.acquire(host):
                self._refused = True
                transport.write(raw_response(
                    429, f"too many connections from {host}: at most {self.counter.cap} per client address "
                         f"(server http.max_connections_per_client)", "requests", "too_many_connections",
                    {"retry-after": "1"}))
                transport.close()
                return
            self._host = host
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._awaiting:
            if self._timer is None:
                self._arm()
            self._header_bytes += len(data)
        before = self.cycle
        super().data_received(data)
        if self.cycle is not before:                     # a request's headers are complete
            self._awaiting = False
            self._disarm()
        elif self._awaiting and self._header_bytes > self.limits.max_header_bytes:
            self._close_with(raw_response(
                431, f"the request headers are larger than {self.limits.max_header_bytes} bytes",
                "invalid_request_error", "request_header_fields_too_large"))

    def connection_lost(self, exc) -> None:
        if self._refused:
            return
        self._disarm()
        if self._host is not None:
            self.counter.release(self._host)
            self._host = None
        super().connection_lost(exc)

    # -------------------------------------------------------------- uvicorn's protocol
    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is None or self.cycle.response_complete:     # no pipelined request waiting
            self._awaiting, self._header_bytes = True, 0

    # -------------------------------------------------------------- the header deadline
    def _arm(self) -> None:
        self._disarm()
        self._timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timeout)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _header_timeout(self) -> None:
        self._timer = None
        if not self._awaiting or self.transport is None or self.transport.is_closing():
            return
        if self._header_bytes:
            self._close_with(raw_response(
                408, f"the request headers did not arrive within {self.limits.header_timeout_s:g} s",
                "invalid_request_error", "request_timeout"))
        else:
            self.transport.close()

    def _close_with(self, response: bytes) -> None:
        self._awaiting = False
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(response)
            self.transport.close()


def guarded_protocol(limits: HttpLimits, counter: ConnectionCounter) -> type:
    """uvicorn's HTTP protocol class (``uvicorn.Config(http=...)``) with the header deadline, the header
    size cap and the per-address connection cap of ``limits``; ``counter`` counts the connections."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol
    return type("GuardedHTTPProtocol", (_Guard, AutoHTTPProtocol), {"limits": limits, "counter": counter})
