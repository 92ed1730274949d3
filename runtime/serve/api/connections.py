"""The server's HTTP connections before a request reaches the routes: a deadline and a size cap for the
request headers, a cap on connections per client network and one on all connections
(:class:`runtime.serve.limits.HttpLimits`).

uvicorn times out idle keep-alive connections only; a connection that sends half a request line and
then nothing, or a header a byte at a time, is held for ever, and uvicorn's HTTP parser (httptools) takes
headers of any size.  :func:`guarded_protocol` subclasses uvicorn's HTTP protocol (the one it would pick:
httptools, else h11) so that:

- a request's headers must be complete within ``header_timeout_s`` of its first byte (of the connection
  opening, for the first request): else 408 and the connection is closed (closed without an answer when
  nothing at all was sent -- an idle client racing a reused connection must not read a stray 408);
- they must fit in ``max_header_bytes``: else 431, closed;
- a client holding ``max_connections_per_client`` connections gets 429 on the next one at once, closed
  (nginx's ``limit_conn`` answers 503; 429 says it is this client, and OpenAI clients back off on it).
  A client is a network, not an exact address (:func:`client_of`): all of loopback (127.0.0.0/8, ::1,
  IPv4-mapped loopback) is one client -- a local process can bind any 127.x.y.z source -- and an IPv6
  client is its /64 (what one host is usually given);
- the server holding ``max_connections`` connections in all answers 503 (``server_overloaded``) to the next
  one at once, closed (uvicorn's ``limit_concurrency`` is not that: it answers 503 to new *requests* and
  still accepts and holds the connections);
- while a request's response is in flight and its body has all arrived, what the client sends next (a
  pipelined request) is read up to ``max_header_bytes`` only: then the connection is not read any more
  until the response is complete (as nginx reads pipelined requests after the response), and the next
  request's header deadline and size cap apply from then on.  Such a client's disconnect is noticed when
  the response ends (ordinary clients do not pipeline).

"Headers complete" is read off uvicorn's request cycle (both protocols start one per request).  The
body's deadline and size are the routes' guard's (:mod:`.guard`): it sees the headers first.
Everything here runs on the event loop; :class:`ConnectionCounter` is also read from other threads.
"""
from __future__ import annotations

import http
import ipaddress
import json
import threading
from typing import Callable

from uvicorn.protocols.http.flow_control import FlowControl

from ..limits import HttpLimits
from .errors import error_body

#: the key of every loopback address (:func:`client_of`)
LOOPBACK = "loopback"


def client_of(host: str) -> str:
    """The client a peer address counts as: ``"loopback"`` for 127.0.0.0/8, ::1 and IPv4-mapped loopback;
    the /64 network of other IPv6 addresses (``"2001:db8::/64"``); an IPv4 address itself; anything that
    is not an IP address (a Unix socket's name) as it is."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return LOOPBACK
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def raw_response(status: int, message: str, etype: str, code: str, headers: dict | None = None) -> bytes:
    """A whole HTTP/1.1 response in OpenAI's error shape that closes the connection (written straight to
    the transport: no request cycle to answer through)."""
    body = json.dumps(error_body(message, etype, None, code)).encode()
    head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class ConnectionCounter:
    """Open connections per client (:func:`client_of`) and in all, how many were refused, and how many
    connections are not being read while a response is in flight (``held``); thread-safe."""

    def __init__(self, cap: int, total_cap: int | None = None):
        self.cap = cap                     #: per client
        self.total_cap = total_cap         #: in all (None: no cap)
        self.refused = 0
        self.held = 0
        self._open: dict[str, int] = {}
        self._total = 0
        self._cv = threading.Condition()

    def acquire(self, client: str) -> str | None:
        """Count a new connection from ``client``; None when counted, else why it is refused (counted as
        refused): ``"client"`` when it holds ``cap`` already, ``"total"`` when the server holds
        ``total_cap``."""
        with self._cv:
            n = self._open.get(client, 0)
            why = "total" if self.total_cap is not None and self._total >= self.total_cap else \
                "client" if n >= self.cap else None
            if why is not None:
                self.refused += 1
            else:
                self._open[client] = n + 1
                self._total += 1
            self._cv.notify_all()
            return why

    def hold(self, delta: int) -> None:
        """A connection stops (+1) or resumes (-1) being read while its response is in flight."""
        with self._cv:
            self.held += delta
            self._cv.notify_all()

    def release(self, client: str) -> None:
        with self._cv:
            n = self._open.get(client, 0) - 1
            if n > 0:
                self._open[client] = n
            else:
                self._open.pop(client, None)
            self._total -= 1
            self._cv.notify_all()

    def open(self) -> dict[str, int]:
        """Open connections by client (:func:`client_of`)."""
        with self._cv:
            return dict(self._open)

    def wait_until(self, pred: Callable[[dict[str, int], int], bool], timeout: float | None = None) -> bool:
        """Block until ``pred(open connections by client, refused so far)`` holds (re-checked on every
        connection opened, refused, closed, held or resumed)."""
        with self._cv:
            return self._cv.wait_for(lambda: pred(dict(self._open), self.refused), timeout)


class _HoldableFlow(FlowControl):
    """uvicorn's read/write flow control of one connection, whose reading can be held off: while held,
    nothing resumes it (uvicorn's request cycle resumes reading whenever the app awaits ``receive()``)."""

    def __init__(self, transport):
        super().__init__(transport)
        self.held = False

    def hold(self) -> None:
        self.held = True
        self.pause_reading()

    def unhold(self) -> None:
        self.held = False

    def resume_reading(self) -> None:
        if not self.held:
            super().resume_reading()


class _Guard:
    """The mixin over uvicorn's HTTP protocol (see the module docstring).  ``limits`` and ``counter`` are
    set on the class :func:`guarded_protocol` makes."""

    limits: HttpLimits
    counter: ConnectionCounter

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._client: str | None = None      # the client counted for this connection (None: not counted)
        self._refused = False
        self._awaiting = True                # between two requests: the next one's headers are due
        self._header_bytes = 0
        self._ahead = 0                      # bytes read while a response is in flight after its body
        self._timer = None

    # -------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport) -> None:
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, (tuple, list)) and peer else None
        if host is not None:
            client = client_of(str(host))
            why = self.counter.acquire(client)
            if why is not None:
                self._refused = True
                transport.write(raw_response(
                    429, f"too many connections from {client}: at most {self.counter.cap} per client "
                         f"(server http.max_connections_per_client)", "requests", "too_many_connections",
                    {"retry-after": "1"}) if why == "client" else raw_response(
                    503, f"the server is overloaded: {self.counter.total_cap} connections open "
                         f"(server http.max_connections)", "server_error", "server_overloaded",
                    {"retry-after": "1"}))
                transport.close()
                return
            self._client = client
        super().connection_made(transport)
        self.flow = _HoldableFlow(transport)        # before any request cycle takes it
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._answering():                            # a pipelined request, read ahead of its turn
            self._ahead += len(data)
        elif self._awaiting:
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
            return
        if self._ahead > self.limits.max_header_bytes and not self.flow.held and not self.transport.is_closing():
            self.flow.hold()                             # the rest waits until the response is complete
            self.counter.hold(+1)

    def _answering(self) -> bool:
        """Whether a request's body has all arrived and its response is still in flight: bytes read now
        belong to the requests after it."""
        c = self.cycle
        return c is not None and not c.more_body and not c.response_complete

    def connection_lost(self, exc) -> None:
        if self._refused:
            return
        self._disarm()
        self._unhold()
        if self._client is not None:
            self.counter.release(self._client)
            self._client = None
        super().connection_lost(exc)

    # -------------------------------------------------------------- uvicorn's protocol
    def on_response_complete(self) -> None:
        ahead, self._ahead = self._ahead, 0
        self._unhold()                                   # uvicorn resumes reading (unless the connection closes)
        super().on_response_complete()
        if self.cycle is None or self.cycle.response_complete:     # no pipelined request waiting
            # what was read ahead is the start of the next request's headers: its deadline runs from now
            self._awaiting, self._header_bytes = True, ahead
            if ahead and self.transport is not None and not self.transport.is_closing():
                if ahead > self.limits.max_header_bytes:
                    self._close_with(raw_response(
                        431, f"the request headers are larger than {self.limits.max_header_bytes} bytes",
                        "invalid_request_error", "request_header_fields_too_large"))
                else:
                    self._arm()

    def _unhold(self) -> None:
        if isinstance(self.flow, _HoldableFlow) and self.flow.held:
            self.flow.unhold()
            self.counter.hold(-1)

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
    size cap, the read-ahead bound and the connection caps of ``limits``; ``counter`` counts the
    connections (built with the caps)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol
    return type("GuardedHTTPProtocol", (_Guard, AutoHTTPProtocol), {"limits": limits, "counter": counter})
