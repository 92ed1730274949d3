"""A JSON request to a ``vnpu serve`` route as a client sends it (``Authorization: Bearer``), for the serve
tests: the HTTP status and the decoded body, an error status included (never an exception for it)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request


def call(url: str, path: str, key: str, body=None, method: str | None = None,
         timeout: float = 120.0) -> tuple[int, dict]:
    """``(status, JSON body)`` of ``method`` (POST with a body, else GET) ``url + path``."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
