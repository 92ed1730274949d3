"""``vnpu serve`` against a hostile or careless client (serve tier): a real server on loopback driven over
plain HTTP.

- Every field of every request body is swept with values of the wrong type, NaN, infinities, huge and
  negative numbers, empty strings/lists/objects, lone surrogates and too deep nesting; the cases are generated from the routes'
  request models (nested models included), so a new field or route is covered without a line here.  Each
  answer is a 4xx in OpenAI's error shape -- or a 2xx where the API accepts the value (:data:`ACCEPTED`, e.g.
  a negative ``seed``: any int64 is a seed) -- and the server logs no traceback.
- A batch that can never be admitted is 400, not 503 + Retry-After.
- Refused admin actions log one line each, no traceback.
- A client that drops its request after the engine worked on it is charged what the engine did (the
  engine's own counters in /metrics are the independent count), for generation and embeddings.
- ``vnpu bench serve``'s verification on a prompt whose tokens decode to text only together (emoji bytes).
- ``vnpu serve`` in a subprocess, SIGTERM with dropped requests in flight: no traceback in its log.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import types
import typing
import urllib.error
import urllib.request
from urllib.parse import urlparse

import pytest
from fastapi.routing import APIRoute
from pydantic import BaseModel

from devices.device import DeviceConfig
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.bench import serve as bench
from runtime.observe.metrics_store import History
from runtime.serve.api import protocol as P
from runtime.serve.config import parse_config
from runtime.serve.reconfigure import Reconfigurer
from runtime.serve.metrics_sampler import Sampler
from runtime.serve.server import Server, Service

pytestmark = pytest.mark.serve

KEYS = {"ops": "sk-ops-hostile-0000001", "app": "sk-app-hostile-0000002", "meter": "sk-meter-hostile-00003",
        "emb": "sk-emb-hostile-0000004"}
CONFIG = f"""
models:
  - model: smollm2@0
    engine: {{max_num_seqs: 4, max_num_batched_tokens: 64, max_model_len: 128, num_gpu_blocks_override: 48,
              max_queued_requests: 8}}
  - model: minilm-l6@1
tenants:
  - {{name: ops, api_keys: [{KEYS['ops']}], admin: true}}
  - {{name: app, api_keys: [{KEYS['app']}]}}
  - {{name: meter, api_keys: [{KEYS['meter']}]}}
  - {{name: emb, api_keys: [{KEYS['emb']}]}}
"""


class Records(logging.Handler):
    """Every record of the server's loggers (``vnpu``, and ``uvicorn``: "Exception in ASGI application")."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def tracebacks(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.exc_info or r.levelno >= logging.ERROR]

    def lines(self, words: str) -> list[str]:
        return [r.getMessage() for r in self.records if words in r.getMessage()]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    rt = Runtime(LocalBackend(2, DeviceConfig(arena_bytes=1 << 30)))
    cfg = parse_config(CONFIG)
    svc = Service(rt, cfg.models, cfg.tenants)
    hist = History(tmp_path_factory.mktemp("hostile") / "history.sqlite")
    Sampler(svc, hist, rt)                                   # (its thread is not started: /admin/events only)
    Reconfigurer(svc, cfg, CONFIG, None, hist)
    srv = Server(svc).start()
    try:
        svc.load()
        yield srv
    finally:
        srv.stop()
        hist.close()
        rt.close()


@pytest.fixture
def records():
    h = Records()
    loggers = [logging.getLogger(n) for n in ("vnpu", "uvicorn")]
    for lg in loggers:
        lg.addHandler(h)
    try:
        yield h
    finally:
        for lg in loggers:
            lg.removeHandler(h)


def post(srv, path: str, body, key: str = "app") -> tuple[int, dict, dict]:
    """``(status, headers, JSON body)`` (GET without a body); ``body`` as Python's json writes it (NaN and
    Infinity included, strings with \\u escapes: a lone surrogate travels as ``"\\ud800"``); ``key``: a
    tenant of :data:`KEYS` or a key."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(srv.url + path, data=data, method="POST" if data is not None else "GET",
                                 headers={"Authorization": f"Bearer {KEYS.get(key, key)}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, json.loads(e.read())


def openai_error(body: dict) -> dict:
    """The ``error`` object of OpenAI's error shape (asserted)."""
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and (err["param"] is None or isinstance(err["param"], str)), err
    return err


# ---------------------------------------------------------------------------------------------- the sweep
#: a valid body per route with a body (admin routes are posted with the admin key)
BASE = {
    "/v1/completions": {"model": "smollm2", "prompt": "hi", "max_tokens": 1, "temperature": 0},
    "/v1/chat/completions": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                             "temperature": 0},
    "/v1/embeddings": {"model": "minilm-l6", "input": "hi"},
    "/admin/throttle": {"factor": 1},
    "/admin/replicas": {"replicas": 1},
    "/admin/events": {"kind": "manual", "diagnosis": "hostile sweep"},
    "/admin/reconfigure": {"set": ["slo.target_p99_ms=5000"]},
}
#: routes whose valid body is refused on this server anyway (in-process engines: no replicas to scale)
BASE_REFUSED = {"/admin/replicas": 400}
#: a valid instance of each nested model, and what its parent needs besides (``stream_options`` needs a stream)
NESTED: dict[type, tuple[dict, dict]] = {
    P.StreamOptions: ({"include_usage": True}, {"stream": True}),
    P.ChatMessage: ({"role": "user", "content": "hi"}, {}),
    P.ContentPart: ({"type": "text", "text": "hi"}, {}),
}
#: (route, field, case) the OpenAI API (or vLLM, for its extras) accepts: answered 2xx.  Any other case is 4xx.
ACCEPTED = {
    ("/v1/completions", "seed", "negative"), ("/v1/chat/completions", "seed", "negative"),    # any int64
    ("/v1/completions", "top_k", "negative"), ("/v1/chat/completions", "top_k", "negative"),  # vLLM: -1 = all
    ("/v1/completions", "stop", "empty_list"), ("/v1/chat/completions", "stop", "empty_list"),
    ("/v1/completions", "user", "empty_str"), ("/v1/chat/completions", "user", "empty_str"),
    ("/v1/embeddings", "user", "empty_str"),
    ("/v1/completions", "priority", "negative"), ("/v1/chat/completions", "priority", "negative"),
    ("/v1/embeddings", "priority", "negative"),            # never earlier than the tenant's class: that class
    ("/v1/chat/completions", "messages[].content", "empty_str"),
    ("/v1/chat/completions", "messages[].content", "empty_list"),
    ("/v1/chat/completions", "messages[].content[].text", "empty_str"),
    ("/admin/events", "diagnosis", "empty_str"), ("/admin/events", "source", "empty_str"),
    ("/admin/events", "result", "empty_str"), ("/admin/events", "detail", "empty_obj"),
}
#: cases whose 400 names the field (``param``: the top-level field of the body)
NAMES_FIELD = ("wrong_type", "nan", "infinity", "huge_int", "surrogate", "surrogate_in_list", "surrogate_key",
               "too_deep")

KIND_SAMPLE = {"string": "x", "integer": 7, "number": 0.5, "boolean": True, "array": ["x"], "object": {"k": "v"}}


def _json_kinds(ann) -> set[str]:
    """The JSON kinds a field's annotation admits."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return _json_kinds(args[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_json_kinds(a) for a in args))
    if origin is typing.Literal:
        return {"string"}
    if ann is list or origin is list:
        return {"array"}
    if ann is dict or origin is dict or (isinstance(ann, type) and issubclass(ann, BaseModel)):
        return {"object"}
    if ann is type(None):
        return {"null"}
    if ann is typing.Any:
        return set(KIND_SAMPLE) | {"null"}
    return {bool: {"boolean"}, int: {"integer"}, float: {"integer", "number"}, str: {"string"}}[ann]


def _nested(ann, in_list: bool = False):
    """``(model, in_list)`` for each request model inside a field's annotation."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        yield ann, in_list
    for a in args:
        if origin is typing.Annotated:
            yield from _nested(a, in_list)
            break
        yield from _nested(a, in_list or origin is list)


def hostile_values(ann):
    """``(case, value)``: wrong JSON types for this field, then what is bad whatever the type."""
    kinds = _json_kinds(ann)
    for kind, v in KIND_SAMPLE.items():
        if kind not in kinds and not (kind == "integer" and "number" in kinds):
            yield "wrong_type", v
    yield from [("nan", math.nan), ("infinity", math.inf), ("infinity", -math.inf), ("huge_int", 10 ** 30),
                ("huge", 1e300), ("negative", -1), ("empty_str", ""), ("empty_list", []), ("empty_obj", {}),
                ("surrogate", "a\ud800b"), ("surrogate", "\udfff"), ("surrogate_in_list", ["ok", "a\udc00"]),
                ("surrogate_key", {"a\ud800": "x"}), ("wrong_element", [{"bogus": 1}]), ("too_deep", _deep(40))]


def _deep(n: int):
    v: list = []
    for _ in range(n):
        v = [v]
    return v


def sweep_cases(model: type[BaseModel], base: dict, wrap, path: str = ""):
    """``(field path, top-level field, case, body)`` for every field of ``model`` and of the models in it."""
    for name, f in model.model_fields.items():
        for case, v in hostile_values(f.annotation):
            yield path + name, None, case, wrap({**base, name: v})
        for sub, in_list in _nested(f.annotation):
            valid, parent = NESTED[sub]

            def inner(d, name=name, in_list=in_list, parent=parent):
                return wrap({**base, **parent, name: [d] if in_list else d})
            yield from sweep_cases(sub, valid, inner, f"{path}{name}{'[]' if in_list else ''}.")


def body_routes(srv) -> dict[str, type[BaseModel]]:
    """Every route of the app that takes a JSON body, with its request model."""
    return {r.path: r.body_field.field_info.annotation for r in srv.app.routes
            if isinstance(r, APIRoute) and r.body_field is not None}


def test_every_field_of_every_route_refuses_bad_values_with_a_4xx(served, records):
    routes = body_routes(served)
    assert {"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/admin/reconfigure"} <= set(routes)
    assert set(routes) == set(BASE), "a route with a body has no valid BASE body here"
    seen_accepted, n = set(), 0
    for route, model in routes.items():
        key = "ops" if route.startswith("/admin/") else "app"
        st, _, b = post(served, route, BASE[route], key)        # the base is valid: what fails is the field
        assert st == BASE_REFUSED.get(route, 200), (route, b)
        for field, _, case, body in sweep_cases(model, BASE[route], lambda d: d):
            top = field.split(".")[0].split("[")[0]
            st, _, b = post(served, route, body, key)
            n += 1
            what = f"{route} {field}={json.dumps(body.get(top))[:60]} ({case}): {st} {json.dumps(b)[:200]}"
            if (route, field, case) in ACCEPTED:
                seen_accepted.add((route, field, case))
                assert 200 <= st < 300, what
                continue
            assert 400 <= st < 500, what
            err = openai_error(b)
            if st == 400 and case in NAMES_FIELD:
                assert err["param"] == top and err["type"] == "invalid_request_error", what
    assert seen_accepted == ACCEPTED                                 # (no stale entry)
    assert n > 500
    for path in ("/v1/models/%ED%A0%80", "/v1/models/" + "x" * 5000, "/v1/models/%00", "/v1/models/a%2Fb"):
        st, _, b = post(served, path, None)
        assert 400 <= st < 500, (path, st, b)
        openai_error(b)
    assert records.tracebacks() == []


def test_seed_takes_any_int64(served):
    body = dict(BASE["/v1/completions"], max_tokens=2, temperature=1.0)
    texts = {}
    for seed in (-1, -2 ** 63, 2 ** 63 - 1, 0):
        a = post(served, "/v1/completions", dict(body, seed=seed))
        b = post(served, "/v1/completions", dict(body, seed=seed))
        assert a[0] == b[0] == 200 and a[2]["choices"][0]["text"] == b[2]["choices"][0]["text"], (seed, a, b)
        texts[seed] = a[2]["choices"][0]["text"]
    for seed in (2 ** 63, -2 ** 63 - 1):
        st, _, b = post(served, "/v1/completions", dict(body, seed=seed))
        assert st == 400 and openai_error(b)["param"] == "seed"


def test_a_batch_that_can_never_be_admitted_is_400(served):
    eng = served.service.engines["smollm2"]
    assert eng.config.max_queued_requests == 8
    st, h, b = post(served, "/v1/completions", dict(BASE["/v1/completions"], prompt=["hi"] * 9))
    err = openai_error(b)
    assert st == 400 and err["param"] == "prompt" and err["code"] == "too_many_prompts" and "retry-after" not in h
    assert "at most 8" in err["message"]
    st, _, b = post(served, "/v1/completions", dict(BASE["/v1/completions"], prompt=["hi"] * 8))
    assert st == 200 and len(b["choices"]) == 8                     # as many as the queue holds: served


def test_refused_admin_actions_log_one_line_each(served, records):
    for path, body, status in (("/admin/reconfigure", {"set": ["models.smollm2.engine.max_num_seqs=8"]}, 400),
                               ("/admin/reconfigure", {"config": "server: {port: 1}"}, 400),
                               ("/admin/models/nope/fallback", {}, 404),
                               ("/admin/throttle", {"factor": 5}, 400)):
        before = len(records.records)
        st, _, b = post(served, path, body, "ops")
        assert st == status, b
        mine = records.records[before:]
        assert [r.getMessage() for r in mine] == [f"admin POST {path} refused ({status}): {b['error']['message']}"]
        assert mine[0].exc_info is None and mine[0].levelno == logging.WARNING
    before = len(records.records)                     # a tenant that is not the operator cannot flood the log
    for _ in range(20):
        st, _, b = post(served, "/admin/throttle", {"factor": 0.5}, "app")
        assert st == 403, b
    assert [r for r in records.records[before:] if r.levelno >= logging.INFO] == []
    assert records.tracebacks() == []


# ---------------------------------------------------------------------------------------------- dropped requests
def engine_counters(srv, model: str) -> dict[str, float]:
    """The engine's own token counters for ``model`` (/metrics: vLLM's prompt/generation token totals)."""
    req = urllib.request.Request(srv.url + "/metrics", headers={"Authorization": f"Bearer {KEYS['ops']}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read().decode()
    out = {}
    for kind in ("prompt", "generation"):
        m = re.search(rf'^vnpu:{kind}_tokens_total{{[^}}]*model_name="{model}"[^}}]*}} (\S+)$', text, re.M)
        out[kind] = float(m.group(1)) if m else 0.0
    return out


def usage(srv, who: str) -> dict:
    return post(srv, "/v1/usage", None, who)[2]


def send_raw(srv, path: str, body: dict, who: str) -> socket.socket:
    """A request on a socket of its own (the test closes it: the client goes away)."""
    u = urlparse(srv.url)
    s = socket.create_connection((u.hostname, u.port), timeout=120)
    data = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS.get(who, who)}\r\nContent-Type: "
              f"application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


@pytest.mark.parametrize("stream", [False, True])
def test_a_dropped_completion_is_charged_the_work_the_engine_did(served, stream):
    srv = served
    eng, quotas = srv.service.engines["smollm2"], srv.service.quotas
    prompt = "Once upon a time"
    before, used = engine_counters(srv, "smollm2"), usage(srv, "meter")
    steps0 = eng.snapshot().steps
    s = send_raw(srv, "/v1/completions", {"model": "smollm2", "prompt": prompt, "max_tokens": 60, "temperature": 0,
                                          "ignore_eos": True, "stream": stream}, "meter")
    try:
        assert eng.wait_until(lambda snap: snap.steps >= steps0 + 3, 120)    # prefill + 2 decodes: 3 tokens for it
    finally:
        s.close()                                                   # the client goes away
    assert quotas.wait_until("meter", lambda v: v["unsettled"] == 0 and v["in_flight"] == 0, 120)
    assert eng.wait_idle(120)
    after, now = engine_counters(srv, "smollm2"), usage(srv, "meter")
    done = after["generation"] - before["generation"]
    assert 3 <= done < 60                                           # aborted after it had produced tokens
    assert now["completion_tokens"] - used["completion_tokens"] == done
    assert now["prompt_tokens"] - used["prompt_tokens"] == after["prompt"] - before["prompt"] == \
        len(eng.encode(prompt))
    assert now["requests"] == used["requests"] + 1


def test_a_dropped_embedding_is_charged_when_its_batch_ran(served):
    srv = served
    emb, quotas, dev = srv.service.engines["minilm-l6"], srv.service.quotas, srv.service.rt.device(1)
    text = "a virtual NPU runs the encoder"
    n = emb.check([text])[0]
    body = {"model": "minilm-l6", "input": text}
    used = usage(srv, "emb")["prompt_tokens"]
    with emb.paused(60):                                            # not started when the client goes: free
        s = send_raw(srv, "/v1/embeddings", body, "emb")
        assert emb.wait_until(lambda e: e.waiting == 1, 60)
        s.close()
        assert quotas.wait_until("emb", lambda v: v["unsettled"] == 0 and v["in_flight"] == 0, 60)
    assert emb.wait_idle(60) and usage(srv, "emb")["prompt_tokens"] == used
    dev.handle.inject_fault("hang")                                 # its batch is on the device when the client goes
    try:
        s = send_raw(srv, "/v1/embeddings", body, "emb")
        assert emb.wait_until(lambda e: e.running == 1, 60)
        s.close()
        assert quotas.wait_until("emb", lambda v: v["in_flight"] == 0, 60)    # the slot is free at once ...
        assert quotas.wait_until("emb", lambda v: v["unsettled"] == 1, 0)     # ... the charge waits for the batch
    finally:
        dev.handle.clear_fault("hang")
    assert quotas.wait_until("emb", lambda v: v["unsettled"] == 0, 60)
    assert usage(srv, "emb")["prompt_tokens"] == used + n


# ---------------------------------------------------------------------------------------------- bench serve
def test_bench_serve_verifies_tokens_that_decode_only_together(served):
    """SmolLM2 writes the emoji of this prompt as three byte tokens each: 6 tokens arrive as 2 text pieces.
    The bench counts tokens by the server's usage and compares the text with the non-streamed answer."""
    prompt, mt = "Happy birthday! \U0001F389\U0001F389\U0001F389", 6
    url, key = served.url, KEYS["app"]
    tol = bench.tie_tolerance(served.service.engines["smollm2"].model_config)
    ref = bench.reference(url, "smollm2", prompt, mt, key)
    got = bench.stream_one(url, "smollm2", prompt, mt, key)
    assert got["tokens"] == ref["tokens"] == mt and got["chunks"] < mt      # (what the bench used to count)
    assert got["text"] == ref["text"] and "\U0001F389" in got["text"]
    assert bench.check(got, ref, mt, tol) == "ok"
    row = bench.load(url, "smollm2", 2, 2, mt, {prompt: ref}, tol, prompt=lambda i: prompt, api_key=key)
    assert (row["verified"], row["unverified"], row["output_tokens"]) == (2, 0, 2 * mt)
    cut = dict(got, tokens=mt - 1)
    assert bench.check(cut, ref, mt, tol) == "bad"                  # a lost token is still caught ...
    assert bench.check(dict(got, text=got["text"][:-1]), ref, mt, tol) == "bad"     # ... and a lost character


# ---------------------------------------------------------------------------------------------- SIGTERM
def test_sigterm_with_dropped_requests_in_flight_logs_no_traceback(tmp_path):
    """A real ``vnpu serve``: requests in flight (non-streamed and streamed), SIGTERM, every client goes away;
    the server drains, exits 0, and its log has no traceback."""
    env = dict(os.environ, VNPU_BACKEND="local", VNPU_DEVICES="1", OPENBLAS_NUM_THREADS="1",
               VNPU_HOME=str(tmp_path / "home"))
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("models:\n  - model: smollm2\n    engine: {max_num_seqs: 2, max_model_len: 512, "
                   "num_gpu_blocks_override: 64}\n")
    p = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config", str(cfg), "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines, err = [], []
    ready = threading.Event()

    def read_out():
        for ln in p.stdout:
            lines.append(ln.strip())
            if "vnpu serve: ready" in ln:
                ready.set()
        ready.set()
    readers = [threading.Thread(target=read_out, daemon=True),
               threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)]
    for t in readers:
        t.start()
    socks: list[socket.socket] = []
    try:
        assert ready.wait(180) and p.poll() is None, (lines, err)
        url = next(ln.split()[-1] for ln in lines if "listening on" in ln)
        srv = types.SimpleNamespace(url=url)
        body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 480, "temperature": 0,
                "ignore_eos": True}                                 # none ends before the clients go
        for i in range(8):
            socks.append(send_raw(srv, "/v1/completions", dict(body, stream=i >= 6), "open"))
        after = ""
        for _ in range(120):                                        # the sampler's ticks: all 8 in the engine
            st, _, latest = post(srv, f"/admin/history/latest?wait_s=10{after}", None, "any-key")
            assert st == 200, latest
            gauges = latest["server"]
            if gauges.get("running", [0, 0])[1] + gauges.get("queue_depth", [0, 0])[1] == 8:
                break
            if gauges:
                after = f"&after={max(t for t, _ in gauges.values())}"
        else:
            raise AssertionError(f"the 8 requests never were in the engine together: {gauges}")
        p.send_signal(signal.SIGTERM)
        for s in socks:
            s.close()                                               # every client goes away
        assert p.wait(180) == 0
    finally:
        for s in socks:
            s.close()
        if p.poll() is None:
            p.kill()
            p.wait()
    for t in readers:
        t.join(30)
    log = "".join(err)
    assert any(ln.endswith("vnpu serve: drained, bye") for ln in lines), lines
    for bad in ("Traceback", "Exception in ASGI application", "No response returned", "Task was destroyed"):
        assert bad not in log, log[-3000:]
