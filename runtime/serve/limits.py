"""What the HTTP server of ``vnpu serve`` takes from one client before refusing it (``serve.yaml``'s
``http:`` section; restart-only).  The defaults, and what a client over each one gets:

=============================  ===========  ===================================================================
key                            default      over it
=============================  ===========  ===================================================================
``max_body_bytes``             2 MiB        413 before the body is read (``Content-Length``), or as soon as a
                                            chunked body passes it; the connection is closed (the rest of the
                                            body read and dropped first, 5 s at most).  JSON is parsed on the
                                            event loop: this also bounds that (TGI and TEI default to 2 MB)
``max_header_bytes``           64 KiB       431, connection closed (request line and headers together)
``header_timeout_s``           10           408 when a request's headers have not all arrived this long after
                                            its first byte (or after the connection opened); a connection that
                                            sent nothing is closed without an answer
``body_timeout_s``             30           408 when the whole body has not arrived this long after the headers
                                            (a slow body, or a ``Content-Length`` larger than what is sent)
``max_connections_per_client`` 128          429 (``too_many_connections``, ``Retry-After: 1``) and closed at
                                            once, for a connection from a client that holds this many (a
                                            client: all of loopback is one, an IPv6 client is its /64)
``max_connections``            1024         503 (``server_overloaded``, ``Retry-After: 1``) and closed at once,
                                            for a connection while the server holds this many in all (keep it
                                            under the process's open-files limit)
``tokenizer_threads``          4            (not a refusal) threads that tokenize prompts and inputs off the
                                            event loop; one tenant uses at most half of them at once
=============================  ===========  ===================================================================

Every refusal is in OpenAI's error shape.  All clients on one host share its address, and every loopback
address is one client (a load generator on the server's own host counts against
``max_connections_per_client``).  Pure data; nothing here blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

from devices.errors import InvalidParamError


@dataclass(frozen=True)
class HttpLimits:
    max_body_bytes: int = 2 << 20
    max_header_bytes: int = 64 << 10
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections_per_client: int = 128
    max_connections: int = 1024
    tokenizer_threads: int = 4

    def __post_init__(self):
        for k in ("max_body_bytes", "max_header_bytes", "max_connections_per_client", "max_connections",
                  "tokenizer_threads"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidParamError(f"{k} must be a positive integer, got {v!r}")
        for k in ("header_timeout_s", "body_timeout_s"):
            v = getattr(self, k)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= 3600:
                raise InvalidParamError(f"{k} must be in (0, 3600] seconds, got {v!r}")
