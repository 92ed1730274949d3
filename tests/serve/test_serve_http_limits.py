"""A hostile HTTP client against ``vnpu serve`` (serve tier): authentication from the headers before any
body is read, the body-size limit (413), header and body deadlines (408), the header-size cap (431), the
per-address connection cap (429), and tokenization off the event loop, fair across tenants, with sizes and
quotas checked before it.

Transport tests drive a real server over raw sockets -- what a hostile client does -- on servers whose
engines are never loaded (a connection and the guard in front of the routes do not need them; a request
that gets through answers 503 ``starting``).  Deadlines are small configured values; the tests wait for
the server's answer or close (a socket read with a generous timeout), never for a time.  The tokenization
tests run loaded engines and hold one tenant's tokenization jobs with the pool's gate."""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import urllib.error
import urllib.request

import pytest

from devices.device import DeviceConfig
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.observe.metrics_store import History
from runtime.serve.api.connections import LOOPBACK, client_of
from runtime.serve.api.tokenize_pool import TokenizePool
from runtime.serve.config import ConfigError, model_spec, parse_config
from runtime.serve.engine.errors import Unavailable
from runtime.serve.engine import EngineConfig
from runtime.serve.limits import HttpLimits
from runtime.serve.server import Server, Service
from runtime.serve.tenants import Quota, Quotas, RateLimited, Tenant, key_digest

pytestmark = pytest.mark.serve

KEYS = {"a": "sk-tenant-a-0000000001", "b": "sk-tenant-b-0000000002", "small": "sk-small-00000000003",
        "ops": "sk-ops-000000000000004"}
TENANTS = (Tenant("a", (key_digest(KEYS["a"]),)), Tenant("b", (key_digest(KEYS["b"]),)),
           Tenant("small", (key_digest(KEYS["small"]),), quota=Quota(tokens_per_minute=40)),
           Tenant("ops", (key_digest(KEYS["ops"]),), admin=True))
WAIT_S = 60.0          #: the longest a test waits for the server to answer or close (an event, not a time)


@pytest.fixture(scope="module")
def rt():
    r = Runtime(LocalBackend(2, DeviceConfig(arena_bytes=1 << 30)))
    try:
        yield r
    finally:
        r.close()


@contextlib.contextmanager
def bare_server(rt, history: History | None = None, **limits):
    """A keyed server with ``limits`` whose engine is never loaded (answers 503 ``starting`` to what gets
    through to the routes); its admin routes read ``history``."""
    svc = Service(rt, (model_spec("minilm-l6", (0,), None),), TENANTS)
    svc.history = history
    srv = Server(svc, http=HttpLimits(**limits)).start()
    try:
        yield srv
    finally:
        srv.stop()


def connect(srv, source: str | None = None) -> socket.socket:
    """A connection to ``srv`` (from the loopback address ``source``: Linux lets a client bind any
    127.x.y.z)."""
    return socket.create_connection(("127.0.0.1", srv.port), timeout=WAIT_S,
                                    source_address=(source, 0) if source else None)


def head(path="/v1/embeddings", key: str | None = KEYS["a"], method="POST", **headers) -> bytes:
    h = {"Host": "127.0.0.1", "Content-Type": "application/json", **headers}
    if key is not None:
        h["Authorization"] = f"Bearer {key}"
    lines = [f"{method} {path} HTTP/1.1"] + [f"{k.replace('_', '-')}: {v}" for k, v in h.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer(s: socket.socket) -> tuple[int, dict, bytes]:
    """``(status, headers, body)`` of the server's next response (read to the end of its body)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        part = s.recv(1)
        if not part:
            raise AssertionError(f"the server closed without a response: {buf!r}")
        buf += part
    lines = buf.decode("latin-1").split("\r\n")
    hdr = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
    body = b""
    while len(body) < int(hdr["content-length"]):
        part = s.recv(int(hdr["content-length"]) - len(body))
        assert part, "the server closed in the middle of a response"
        body += part
    return int(lines[0].split()[1]), hdr, body


def refused(s: socket.socket, done_sending: bool = False) -> tuple[int, dict, bytes, bool]:
    """The server's answer (one that closes the connection), and whether the server then closed it --
    after this client says it is done sending (half-close), with ``done_sending``: a refusal of a body
    still on its way is answered at once, and the rest of the body read and dropped until then."""
    st, hdr, body = answer(s)
    assert hdr["connection"] == "close"
    if done_sending:
        s.shutdown(socket.SHUT_WR)
    return st, hdr, body, closed(s)


def closed(s: socket.socket) -> bool:
    """Whether the server closes the connection (reads until EOF; a reset counts as closed)."""
    try:
        while True:
            if not s.recv(65536):
                return True
    except ConnectionResetError:
        return True


def error_of(body: bytes) -> dict:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def trickle(s: socket.socket, data: bytes, every_s: float, stop: threading.Event) -> threading.Thread:
    """Send ``data`` a byte at a time, one every ``every_s`` (a slow client's pace), until the server
    closes or ``stop``."""
    def run():
        for i in range(len(data)):
            if stop.wait(every_s):
                return
            try:
                s.send(data[i:i + 1])
            except OSError:
                return
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------------------------------------- auth, body size
def test_no_key_is_401_before_the_body_is_read(rt):
    with bare_server(rt) as srv:
        with connect(srv) as s:            # 40 MB announced, 16 KiB sent: the answer must not wait for the rest
            s.sendall(head(key=None, Content_Length=40_000_000) + b"x" * 16384)
            st, hdr, body, gone = refused(s, done_sending=True)
        assert st == 401 and error_of(body)["code"] == "invalid_api_key" and gone and hdr["x-request-id"]
        with connect(srv) as s:                                     # malformed JSON without a key: 401, not 400
            s.sendall(head(key=None, Content_Length=1) + b"{")
            st, _, body = answer(s)
        assert st == 401 and error_of(body)["code"] == "invalid_api_key"
        with connect(srv) as s:                                     # with the key it reaches the routes: 400
            s.sendall(head(Content_Length=1) + b"{")
            st, _, body = answer(s)
        assert st == 400 and error_of(body)["code"] == "invalid_json"
        with connect(srv) as s:                                     # probes need no key
            s.sendall(head("/health", key=None, method="GET"))
            st, _, body = answer(s)
        assert st == 503 and json.loads(body)["status"] == "starting"


def test_a_body_over_the_limit_is_413_before_it_is_read(rt):
    limit = 64 << 10
    with bare_server(rt, max_body_bytes=limit) as srv:
        with connect(srv) as s:                                     # announced: refused before a byte of it
            s.sendall(head(Content_Length=10 << 20))
            st, hdr, body, gone = refused(s, done_sending=True)
        err = error_of(body)
        assert st == 413 and err["code"] == "request_too_large" and str(limit) in err["message"] and gone
        with connect(srv) as s:                                     # chunked: refused once past the limit
            s.sendall(head(Transfer_Encoding="chunked"))
            for _ in range(5):
                s.sendall(b"4000\r\n" + b"x" * 0x4000 + b"\r\n")   # 5 x 16 KiB, no last chunk
            st, _, body, gone = refused(s, done_sending=True)
        assert st == 413 and error_of(body)["code"] == "request_too_large" and gone
        doc = b'{"model": "minilm-l6", "input": "%s"}'
        exact = doc % (b"y" * (limit - len(doc % b"")))
        with connect(srv) as s:                                     # exactly the limit: through to the routes
            s.sendall(head(Content_Length=len(exact)) + exact)
            st, _, body = answer(s)
        assert len(exact) == limit and st == 503 and "loading" in error_of(body)["message"]
        big = json.dumps({"model": "minilm-l6", "input": "z" * (1 << 20)}).encode()
        for key, status in ((KEYS["a"], 413), (None, 401)):          # a plain client uploading it all first
            h = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
            req = urllib.request.Request(srv.url + "/v1/embeddings", data=big, method="POST", headers=h)
            with pytest.raises(urllib.error.HTTPError) as e:           # the answer, not a connection reset
                urllib.request.urlopen(req, timeout=WAIT_S)
            assert e.value.code == status and error_of(e.value.read())["code"]


# ---------------------------------------------------------------------------------------------- deadlines
def test_slow_headers_are_408_and_silent_connections_are_closed(rt):
    with bare_server(rt, header_timeout_s=0.5) as srv:
        with connect(srv) as s:                                     # half a request, then nothing
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            st, _, body, gone = refused(s)
        assert st == 408 and error_of(body)["code"] == "request_timeout" and gone
        stop = threading.Event()
        with connect(srv) as s:                                     # a header byte at a time: a deadline, not idle
            s.sendall(b"GET /health HTTP/1.1\r\n")
            t = trickle(s, b"X-Slow: " + b"a" * 10_000, 0.05, stop)
            try:
                st, _, body, gone = refused(s)
            finally:
                stop.set()
                t.join()
        assert st == 408 and gone
        with connect(srv) as s:                                     # connected, sent nothing: closed, no answer
            assert s.recv(65536) == b""
        with connect(srv) as s:                                     # keep-alive: the next request's headers too
            s.sendall(head("/health", method="GET"))
            st, _, _ = answer(s)
            s.sendall(b"GET /health HTTP/1.1\r\n")
            st2, _, body, gone = refused(s)
        assert (st, st2, gone) == (503, 408, True)


def test_header_size_cap_is_431(rt):
    with bare_server(rt, max_header_bytes=4096) as srv:
        with connect(srv) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 8192)
            st, _, body, gone = refused(s)
        assert st == 431 and error_of(body)["code"] == "request_header_fields_too_large" and gone
        with connect(srv) as s:                                     # big enough, under the cap: served
            s.sendall(head("/health", method="GET", X_Big="b" * 3000))
            assert answer(s)[0] == 503


def test_slow_body_and_content_length_lie_are_408(rt):
    with bare_server(rt, body_timeout_s=0.5) as srv:
        with connect(srv) as s:                                     # announces 1000 bytes, sends 10
            s.sendall(head(Content_Length=1000) + b'{"model": ')
            st, _, body, gone = refused(s)
        err = error_of(body)
        assert st == 408 and err["code"] == "request_timeout" and "10 bytes" in err["message"] and gone
        stop = threading.Event()
        with connect(srv) as s:                                     # an honest length, sent a byte at a time
            s.sendall(head(Content_Length=10_000))
            t = trickle(s, b"z" * 10_000, 0.05, stop)
            try:
                st, _, body, gone = refused(s)
            finally:
                stop.set()
                t.join()
        assert st == 408 and gone


def test_connections_per_client_address_are_capped(rt):
    with bare_server(rt, max_connections_per_client=3, header_timeout_s=600) as srv:
        held = [connect(srv) for _ in range(3)]
        try:
            assert srv.connections.wait_until(lambda o, r: o.get(LOOPBACK) == 3, WAIT_S)
            with connect(srv) as s:                                 # the fourth: refused at once
                st, hdr, body, gone = refused(s)
            err = error_of(body)
            assert st == 429 and err["code"] == "too_many_connections" and hdr["retry-after"] == "1" and gone
            assert srv.connections.refused == 1
            held.pop().close()                                      # one goes: room for one more
            assert srv.connections.wait_until(lambda o, r: o.get(LOOPBACK) == 2, WAIT_S)
            with connect(srv) as s:
                s.sendall(head("/health", method="GET"))
                assert answer(s)[0] == 503                          # served (the engines never load here)
        finally:
            for s in held:
                s.close()
        assert srv.connections.wait_until(lambda o, r: not o, WAIT_S)


def test_every_loopback_address_is_one_client_and_all_connections_are_capped(rt):
    with bare_server(rt, max_connections_per_client=2, header_timeout_s=600) as srv:
        held = [connect(srv, "127.0.0.2"), connect(srv, "127.0.0.3")]     # two sources, one client
        try:
            assert srv.connections.wait_until(lambda o, r: o == {LOOPBACK: 2}, WAIT_S)
            with connect(srv, "127.0.0.4") as s:
                st, _, body, gone = refused(s)
            assert st == 429 and error_of(body)["code"] == "too_many_connections" and gone
        finally:
            for s in held:
                s.close()
        assert srv.connections.wait_until(lambda o, r: not o, WAIT_S)
    with bare_server(rt, max_connections=2, header_timeout_s=600) as srv:
        held = [connect(srv) for _ in range(2)]
        try:
            assert srv.connections.wait_until(lambda o, r: o == {LOOPBACK: 2}, WAIT_S)
            with connect(srv) as s:                                 # the server is full: 503, not this client's 429
                st, hdr, body, gone = refused(s)
            assert st == 503 and error_of(body)["code"] == "server_overloaded" and hdr["retry-after"] and gone
            held.pop().close()
            assert srv.connections.wait_until(lambda o, r: o == {LOOPBACK: 1}, WAIT_S)
            with connect(srv) as s:
                s.sendall(head("/health", method="GET"))
                assert answer(s)[0] == 503                          # served
        finally:
            for s in held:
                s.close()


def test_clients_are_networks():
    assert {client_of(h) for h in ("127.0.0.1", "127.9.8.7", "::1", "::ffff:127.0.0.5")} == {LOOPBACK}
    assert client_of("2001:db8:1:2:aaaa::1") == client_of("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert client_of("2001:db8:1:3::1") != client_of("2001:db8:1:2::1")
    assert client_of("10.0.0.1") != client_of("10.0.0.2") and client_of("::ffff:10.0.0.1") == "10.0.0.1"


# ---------------------------------------------------------------------------------------------- pipelining
@contextlib.contextmanager
def slow_response(srv, hist: History):
    """A connection whose ``GET /admin/history/latest`` long poll is in flight (answered once the test
    records a sample into ``hist``)."""
    with connect(srv) as s:
        s.sendall(head("/admin/history/latest?after=0&wait_s=20", key=KEYS["ops"], method="GET"))
        with connect(srv) as gate:                                  # the server says the poll is parked
            gate.sendall(head("/admin/state?long_polls=1&wait_s=20", key=KEYS["ops"], method="GET"))
            st, _, body = answer(gate)
            assert st == 200 and json.loads(body)["history_long_polls"] == 1
        yield s


def test_pipelined_headers_behind_a_slow_response_are_bounded(rt):
    hist = History(":memory:")
    with bare_server(rt, hist, max_header_bytes=4096, header_timeout_s=0.5) as srv:
        with slow_response(srv, hist) as s:                         # then 8 MB of one unterminated header
            big = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (8 << 20)
            sender = threading.Thread(target=_send, args=(s, big), daemon=True)
            sender.start()
            # the server stops reading this connection (the client's send blocks) ...
            assert srv.connections.wait_until(lambda o, r: srv.connections.held == 1, WAIT_S)
            hist.record_tick(1.0, {"": {"qps": 1.0}})
            st, _, body = answer(s)                                 # ... the response goes out whole ...
            assert st == 200 and json.loads(body)["server"]["qps"]
            st, _, body, gone = refused(s)                          # ... then the next request is 431
            assert st == 431 and error_of(body)["code"] == "request_header_fields_too_large" and gone
            sender.join(WAIT_S)
        assert srv.connections.wait_until(lambda o, r: srv.connections.held == 0 and not o, WAIT_S)
        hist2 = History(":memory:")
        srv.service.history = hist2
        with slow_response(srv, hist2) as s:                        # a pipelined half header, then nothing
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            hist2.record_tick(1.0, {"": {"qps": 1.0}})
            assert answer(s)[0] == 200
            st, _, body, gone = refused(s)                          # its deadline runs from the response
            assert st == 408 and error_of(body)["code"] == "request_timeout" and gone


def _send(s: socket.socket, data: bytes) -> None:
    try:
        s.sendall(data)
    except OSError:                                                 # the server closed: what a refusal does
        pass


def test_a_pool_the_caller_gave_outlives_the_server(rt):
    pool = TokenizePool(1)
    try:
        svc = Service(rt, (model_spec("minilm-l6", (0,), None),), TENANTS)
        Server(svc, tokenizer=pool).start().stop()
        assert pool.submit("a", lambda: 7).result(WAIT_S) == 7      # still the caller's, still working
    finally:
        pool.close()
    with bare_server(rt) as srv:
        own = srv.tokenizer
    with pytest.raises(Unavailable):                                # the server's own: closed with it
        own.submit("a", lambda: 7)


# ---------------------------------------------------------------------------------------------- tokenization
class Gate:
    """The tokenize pool's gate: holds the jobs of the tenants in ``held`` until released."""

    def __init__(self):
        self.held: set[str] = set()
        self.cv = threading.Condition()

    def __call__(self, tenant: str) -> None:
        with self.cv:
            self.cv.wait_for(lambda: tenant not in self.held)

    def hold(self, tenant: str) -> None:
        with self.cv:
            self.held.add(tenant)

    def release(self, tenant: str) -> None:
        with self.cv:
            self.held.discard(tenant)
            self.cv.notify_all()


@pytest.fixture(scope="module")
def loaded(rt):
    gate = Gate()
    pool = TokenizePool(2, gate=gate)                 # one tenant runs at most one job at once
    gen = model_spec("smollm2", (0,), 1, EngineConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128,
                                                      num_gpu_blocks_override=32))
    svc = Service(rt, (gen, model_spec("minilm-l6", (1,), None)), TENANTS)
    srv = Server(svc, tokenizer=pool).start()
    try:
        svc.load()
        yield srv, pool, gate
    finally:
        srv.stop()
        pool.close()                                  # the server leaves the caller's pool to the caller


def post(srv, path, body, key, timeout=WAIT_S):
    req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, json.loads(e.read())


def test_one_tenants_tokenization_stalls_no_one(loaded):
    srv, pool, gate = loaded
    big = {"model": "minilm-l6", "input": "q" * (512 << 10)}      # one huge word: 3 tokens, under every limit
    results: list = []
    gate.hold("a")
    threads = [threading.Thread(target=lambda: results.append(post(srv, "/v1/embeddings", big, KEYS["a"])))
               for _ in range(3)]
    try:
        for t in threads:
            t.start()
        assert pool.wait_until(lambda s: s["running"].get("a", 0) + s["queued"].get("a", 0) == 3, WAIT_S)
        with urllib.request.urlopen(srv.url + "/health", timeout=WAIT_S) as r:     # the loop is free ...
            assert r.status == 200
        st, _, e = post(srv, "/v1/embeddings", {"model": "minilm-l6", "input": "hello"}, KEYS["b"])
        assert st == 200 and len(e["data"][0]["embedding"]) == 384    # ... and another tenant gets a worker
        st, _, c = post(srv, "/v1/completions", {"model": "smollm2", "prompt": "one two", "max_tokens": 2}, KEYS["b"])
        assert st == 200 and c["usage"]["completion_tokens"] == 2
        s = pool.stats()                                            # all the while, a's jobs were held
        assert s["running"] == {"a": 1} and s["queued"] == {"a": 2} and not results     # (a's share: 1 of 2)
    finally:
        gate.release("a")
        for t in threads:
            t.join(WAIT_S)
    assert [r[0] for r in results] == [200, 200, 200]
    assert all(r[2]["usage"]["prompt_tokens"] == 3 for r in results)


def test_a_long_tokenization_runs_while_others_are_served(loaded):
    """Not held at a gate: tenant a's input really is being tokenized (seconds of work, off the GIL) while
    ``/health`` and tenant b are answered -- a's job is still running when they are."""
    srv, pool, _ = loaded
    big = {"model": "minilm-l6", "input": "q" * 2_000_000}         # one 2 MB word: 3 tokens, under the body limit
    results: list = []
    t = threading.Thread(target=lambda: results.append(post(srv, "/v1/embeddings", big, KEYS["a"])))
    t.start()
    try:
        assert pool.wait_until(lambda s: s["running"].get("a") == 1, WAIT_S)     # a's job has started
        with urllib.request.urlopen(srv.url + "/health", timeout=WAIT_S) as r:
            assert r.status == 200
        st, _, e = post(srv, "/v1/embeddings", {"model": "minilm-l6", "input": "hello"}, KEYS["b"])
        assert st == 200 and len(e["data"][0]["embedding"]) == 384
        assert pool.stats()["running"].get("a") == 1 and not results               # a's is still running
    finally:
        t.join(WAIT_S)
    assert results[0][0] == 200 and results[0][2]["usage"]["prompt_tokens"] == 3


def test_sizes_and_quotas_are_checked_before_tokenizing(loaded):
    srv, pool, _ = loaded
    emb = srv.service.engines["minilm-l6"]
    before = pool.stats()["started"]
    huge = "word " * 400_000                                         # 2 MB: far over a 128-token context
    long = "context_length_exceeded"
    cases = [("/v1/completions", {"model": "smollm2", "prompt": huge, "max_tokens": 2}, KEYS["a"], 400, "prompt", long),
             ("/v1/chat/completions", {"model": "smollm2", "messages": [{"role": "user", "content": huge}]},
              KEYS["a"], 400, "messages", long),
             ("/v1/embeddings", {"model": "minilm-l6", "input": ["ok", "w " * emb.max_len]}, KEYS["a"], 400, "input",
              long),
             ("/v1/embeddings", {"model": "minilm-l6", "input": ["ok"] * 2049}, KEYS["a"], 400, "input", None),
             ("/v1/completions", {"model": "smollm2", "prompt": ["ok"] * 2049}, KEYS["a"], 400, "prompt", None),
             # under the context, but more than the tenant's 40 tokens a minute: refused by its quota first
             ("/v1/completions", {"model": "smollm2", "prompt": "z" * (81 * 45), "max_tokens": 2}, KEYS["small"],
              429, None, "rate_limit_exceeded"),
             ("/v1/embeddings", {"model": "minilm-l6", "input": "w " * 60}, KEYS["small"], 429, None,
              "rate_limit_exceeded")]
    for path, body, key, status, param, code in cases:
        st, hdr, b = post(srv, path, body, key)
        err = b["error"]
        assert (st, err["param"], err["code"]) == (status, param, code), (path, b)
        assert st == 400 or hdr["x-should-retry"] == "false"
    assert pool.stats()["started"] == before                        # none of them was tokenized
    st, _, _ = post(srv, "/v1/embeddings", {"model": "minilm-l6", "input": "w " * 10}, KEYS["small"])
    assert st == 200 and pool.stats()["started"] == before + 1      # what fits is tokenized, on the pool


def test_token_floors_are_lower_bounds(loaded):
    """The floors the routes refuse on never exceed the real counts (mixed scripts, controls, spaces)."""
    import random
    srv, _, _ = loaded
    gen, emb = srv.service.engines["smollm2"], srv.service.engines["minilm-l6"]
    pieces = list("abc XYZ 09\t\n\r.,!_-#=\x00\x01\x1c\x7f\x85\u00a0\u2028\u3000\u200b\ufffd\u0301éİß中ﬁ²") + \
        ["<|im_start|>", "<|im_end|>", "[CLS]", "[MASK]", "#" * 80, " " * 90, "\n" + " " * 80, "word "]
    rnd = random.Random(7)
    for _ in range(400):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 300)))
        assert gen.tok.min_tokens(text) <= len(gen.encode(text))
        n = emb.tok.lengths([text])[0]
        assert emb.tok.min_tokens(text, emb.max_len) <= n
        assert emb.tok.min_tokens(text, emb.max_len, rnd.randint(0, len(text))) <= n     # a prefix only


# ---------------------------------------------------------------------------------------------- units
def test_pool_takes_tenants_in_turn():
    order: list[str] = []
    gate = Gate()
    pool = TokenizePool(1, gate=gate)
    try:
        gate.hold("a")
        futs = [pool.submit("a", order.append, "a1")]
        assert pool.wait_until(lambda s: s["running"] == {"a": 1}, WAIT_S)
        futs += [pool.submit("a", order.append, f"a{i}") for i in (2, 3, 4)]
        futs += [pool.submit("b", order.append, f"b{i}") for i in (1, 2)]
        gate.release("a")
        for f in futs:
            f.result(WAIT_S)
    finally:
        pool.close()
    assert order == ["a1", "a2", "b1", "a3", "b2", "a4"]            # in turn, not first come first served


def test_quota_precheck_refuses_as_admit_would_and_charges_nothing():
    t = Tenant("t", ("0" * 64,), quota=Quota(concurrent_requests=1, tokens_per_minute=100))
    q = Quotas(lambda: 0.0)
    q.precheck(t, 100)
    assert q.usage(t)["requests"] == 0 and q.usage(t)["tokens_this_minute"] == 0
    with pytest.raises(RateLimited) as e:
        q.precheck(t, 101)
    assert e.value.retry_after_s is None and q.usage(t)["rate_limited"] == 1
    ticket = q.admit(t, 10)
    with pytest.raises(RateLimited) as e:                           # the one slot is taken
        q.precheck(t, 1)
    assert e.value.limit == "requests" and q.usage(t)["rate_limited"] == 2
    ticket.settle(5, 0)
    q.precheck(t, 95)
    with pytest.raises(RateLimited):
        q.precheck(t, 96)


def test_http_limits_in_serve_yaml():
    assert parse_config("").http == HttpLimits()
    cfg = parse_config("http: {max_body_bytes: 1048576, header_timeout_s: 2.5, max_connections_per_client: 8, "
                       "max_connections: 64}\n")
    assert cfg.http.max_connections == 64 and HttpLimits().max_connections == 1024
    assert (cfg.http.max_body_bytes, cfg.http.header_timeout_s, cfg.http.max_connections_per_client) == \
        (1 << 20, 2.5, 8) and cfg.http.body_timeout_s == HttpLimits().body_timeout_s
    for text, where in (("http:\n  body_timeout_s: 0\n", "line 2: http.body_timeout_s"),
                        ("http:\n  max_body_bytes: 0\n", "line 2: http.max_body_bytes"),
                        ("http:\n  header_timeout: 3\n", "line 2: unknown key http.header_timeout"),
                        ("http:\n  tokenizer_threads: two\n", "line 2: http.tokenizer_threads")):
        with pytest.raises(ConfigError) as e:
            parse_config(text)
        assert where in str(e.value), str(e.value)
