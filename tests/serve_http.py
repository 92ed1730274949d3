"""A JSON request to a ``vnpu serve`` route as a client sends it (``Authorization: Bearer``), for the serve
tests: the HTTP status and the decoded body, an error status included (never an exception for it); and the
OpenAI client of a server and key, made once (a new ``openai.OpenAI`` builds an SSL context and loads the CA
bundle -- tens of milliseconds, paid on every ask of a test that made one per request)."""
from __future__ import annotations

import functools
import json
import urllib.error
import urllib.request

import openai


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


def openai_client(url: str, key: str, **kw) -> openai.OpenAI:
    """The OpenAI client of ``url`` (the server's base URL) with API key ``key`` and the client options ``kw``
    (``max_retries`` 0 unless given): one per distinct arguments, shared by every caller (an httpx client is
    thread-safe; its keep-alive connections are what any client of the server holds)."""
    return _client(url, key, tuple(sorted({"max_retries": 0, **kw}.items())))


@functools.lru_cache(maxsize=None)
def _client(url: str, key: str, kw: tuple) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, **dict(kw))
