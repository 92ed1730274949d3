"""HTTP tenants (serve tier): API keys, quotas with Retry-After, tenant separation, priority classes --
a real server on loopback driven by the official ``openai`` client and plain HTTP.

Quotas run on an injectable clock (tokens per minute), so Retry-After values are checked exactly; the
concurrency quota is exercised with the client's own retry loop (it reads ``retry-after-ms``): it gets
through once the slot frees, or gives up after ``max_retries`` as its rules say."""
from __future__ import annotations

import json
import re
import math
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import openai
import pytest

from devices.device import DeviceConfig
from devices.errors import InvalidParamError
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.serve.config import model_spec
from runtime.serve.engine import EngineConfig
from runtime.serve.engine.modes import ModeConfig
from runtime.serve.server import Server, Service
from runtime.serve.tenants import Quota, Tenant, key_digest
from serve_http import openai_client

pytestmark = pytest.mark.serve

KEYS = {"premium": "sk-premium-0000000001", "batch": "sk-batch-000000000002", "bulk": "sk-bulk-0000000000003",
        "embed": "sk-embed-000000000004", "ops": "sk-ops-00000000000005", "share1": "sk-share-000000000006",
        "share2": "sk-share-000000000007"}


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def served():
    rt = Runtime(LocalBackend(2, DeviceConfig(arena_bytes=1 << 30)))
    clock = FakeClock()
    d = lambda n: (key_digest(KEYS[n]),)                                                        # noqa: E731
    tenants = (Tenant("premium", d("premium"), 0, Quota(concurrent_requests=4)),
               Tenant("batch", d("batch"), 10, Quota(concurrent_requests=1, tokens_per_minute=32, retry_after_s=0.05)),
               Tenant("bulk", d("bulk"), 10),
               Tenant("embed", d("embed"), 0, models=("minilm-l6",)),
               Tenant("ops", d("ops"), 0, admin=True),
               Tenant("share1", d("share1"), 0, share_prefix_cache=True),
               Tenant("share2", d("share2"), 0, share_prefix_cache=True))
    gen = model_spec("smollm2", (0,), 1, EngineConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=96,
                                                      num_gpu_blocks_override=32, scheduling_policy="priority"))
    svc = Service(rt, (gen, model_spec("minilm-l6", (1,), None)), tenants, clock=clock)
    srv = Server(svc).start()
    try:
        svc.load()
        yield srv, clock
    finally:
        srv.stop()
        rt.close()


def client(served, who, **kw):
    return openai_client(served[0].url, KEYS.get(who, who), **kw)


def raw(srv, path, body=None, key=None):
    data = None if body is None else json.dumps(body).encode()
    h = {"Content-Type": "application/json"}
    if key is not None:
        h["Authorization"] = key if " " in key else f"Bearer {key}"
    req = urllib.request.Request(srv.url + path, data=data, method="POST" if data else "GET", headers=h)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def complete(c, max_tokens=4, **kw):
    return c.completions.create(model="smollm2", prompt="one two three", max_tokens=max_tokens, temperature=0,
                                extra_body={"ignore_eos": True, **kw.pop("extra", {})}, **kw)


def test_bad_keys_are_401(served):
    srv = served[0]
    for key in (None, "Bearer sk-not-a-key-at-all", "Basic " + KEYS["premium"], "Bearer "):
        st, _, b = raw(srv, "/v1/models", key=key)
        err = json.loads(b)["error"]
        assert st == 401 and err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
    with pytest.raises(openai.AuthenticationError) as e:
        complete(client(served, "sk-wrong-key-123456"))
    assert e.value.code == "invalid_api_key" and "sk-wrong-key-123456" not in str(e.value)   # the key is masked
    assert raw(srv, "/health")[0] == 200                                                    # probes need no key


def test_tenant_separation(served):
    srv = served[0]
    emb = client(served, "embed")
    assert [m.id for m in emb.models.list().data] == ["minilm-l6"]
    with pytest.raises(openai.NotFoundError) as e:                  # no access = does not exist, as OpenAI says
        complete(emb)
    assert e.value.code == "model_not_found"
    assert len(emb.embeddings.create(model="minilm-l6", input="hello").data[0].embedding) == 384
    prem = client(served, "premium")
    assert sorted(m.id for m in prem.models.list().data) == ["minilm-l6", "smollm2"]
    before = json.loads(raw(srv, "/v1/usage", key=KEYS["bulk"])[2])
    r = complete(prem, max_tokens=3)
    mine = json.loads(raw(srv, "/v1/usage", key=KEYS["premium"])[2])
    after = json.loads(raw(srv, "/v1/usage", key=KEYS["bulk"])[2])
    assert mine["tenant"] == "premium" and mine["completion_tokens"] >= r.usage.completion_tokens
    assert after == before and "premium" not in json.dumps(after)   # another tenant sees none of it
    st, _, b = raw(srv, "/metrics", key=KEYS["premium"])            # all tenants' series: admin only
    assert st == 403 and json.loads(b)["error"]["code"] == "insufficient_permissions"
    st, _, b = raw(srv, "/metrics", key=KEYS["ops"])
    text = b.decode()
    assert st == 200 and 'vnpu:tenant_tokens_total{kind="generation",model_name="smollm2",tenant="premium"}' in text
    assert 'vnpu:tenant_requests_total{status="404",tenant="embed"}' in text
    st, _, b = raw(srv, "/admin/state", key=KEYS["ops"])
    assert st == 200 and json.loads(b)["models"]["smollm2"]["policy"] == "priority"


def _prefix_hits(srv) -> float:
    text = raw(srv, "/metrics", key=KEYS["ops"])[2].decode()
    m = re.search(r'^vnpu:prefix_cache_hits_total\{[^}]*model_name="smollm2"[^}]*\} (\S+)$', text, re.M)
    assert m is not None, "no vnpu:prefix_cache_hits_total for smollm2 in /metrics"
    return float(m.group(1))


def test_prefix_cache_is_per_tenant_unless_shared(served):
    """A tenant's cached KV blocks serve its own later requests only; tenants configured with
    ``share_prefix_cache`` share theirs with each other (and with no one else).  Hits in /metrics are the
    full 16-token blocks of the prompt short of its last token."""
    srv = served[0]
    text = ("Tenants of this server ask about the prefix cache: a block of sixteen tokens is reused only when "
            "every token before it is the same, and only inside one namespace of tenants.")

    def ask(who):
        r = client(served, who).completions.create(model="smollm2", prompt=text, max_tokens=2, temperature=0,
                                                   extra_body={"ignore_eos": True})
        return r.choices[0].text, r.usage.prompt_tokens
    first, n = ask("premium")
    full = (n - 1) // 16 * 16
    assert full >= 32
    h = _prefix_hits(srv)
    seq = [("bulk", 0), ("premium", full), ("share1", 0), ("share2", full), ("share1", full), ("bulk", full)]
    for who, gain in seq:
        out, _ = ask(who)
        assert out == first
        now = _prefix_hits(srv)
        assert now - h == gain, f"{who}: {now - h} tokens hit, expected {gain}"
        h = now


def test_tokens_per_minute_429_with_exact_retry_after(served):
    srv, clock = served
    c = client(served, "batch")
    body = lambda n: {"model": "smollm2", "prompt": "one two three", "max_tokens": n, "temperature": 0,   # noqa: E731
                      "ignore_eos": True}
    clock.t += 61                                                   # an empty window
    t0 = clock.t
    complete(c, max_tokens=10)                                      # charged prompt + 10 (settled to the same)
    clock.t += 10
    complete(c, max_tokens=5)
    clock.t += 5
    st, h, b = raw(srv, "/v1/completions", body(15), key=KEYS["batch"])     # 13 + 8 charged, 3 + 15 more > 32
    err = json.loads(b)["error"]
    assert st == 429 and err["code"] == "rate_limit_exceeded" and err["type"] == "tokens"
    wait = t0 + 60 - clock.t                                        # the first charge leaves the window then
    assert h["retry-after-ms"] == str(math.ceil(wait * 1000)) and h["retry-after"] == str(math.ceil(wait))
    assert int(h["x-ratelimit-limit-tokens"]) == 32
    clock.t += wait                                                 # exactly then, the same request passes
    assert raw(srv, "/v1/completions", body(15), key=KEYS["batch"])[0] == 200
    clock.t += 61
    limited = json.loads(raw(srv, "/v1/usage", key=KEYS["batch"])[2])["rate_limited"]
    with pytest.raises(openai.RateLimitError) as e:                 # larger than the quota itself: never retried
        complete(client(served, "batch", max_retries=3), max_tokens=35)
    assert e.value.response.headers["x-should-retry"] == "false" and "retry-after" not in e.value.response.headers
    assert json.loads(raw(srv, "/v1/usage", key=KEYS["batch"])[2])["rate_limited"] == limited + 1   # one attempt


def test_concurrency_quota_client_retries_then_gets_through_or_gives_up(served):
    """The tenant's only slot is held by a stream whose device is hung (so it cannot end by itself)."""
    srv, clock = served
    clock.t += 61
    quotas, dev = srv.service.quotas, srv.service.rt.device(0)
    usage = lambda: json.loads(raw(srv, "/v1/usage", key=KEYS["batch"])[2])                   # noqa: E731
    hold = complete(client(served, "batch"), max_tokens=20, stream=True)
    it = iter(hold)
    next(it)
    dev.handle.inject_fault("hang")
    try:
        base = usage()["rate_limited"]
        with pytest.raises(openai.RateLimitError):                  # max_retries=2: three attempts, then it gives up
            complete(client(served, "batch", max_retries=2), max_tokens=2)
        assert usage()["rate_limited"] == base + 3
        got: dict = {}

        def patient():
            got["r"] = complete(client(served, "batch", max_retries=1000), max_tokens=2)
        th = threading.Thread(target=patient)
        th.start()
        assert quotas.wait_until("batch", lambda v: v["rate_limited"] >= base + 4, 60)   # being refused ...
        hold.close()                                                # ... until the slot frees
        assert quotas.wait_until("batch", lambda v: v["in_flight"] == 1 and v["requests"] >= 2, 60)
    finally:
        dev.handle.clear_fault("hang")
    th.join(120)
    assert not th.is_alive() and got["r"].usage.completion_tokens == 2
    assert quotas.wait_until("batch", lambda v: v["in_flight"] == 0, 60)


def test_priority_classes_under_contention(served):
    """Batch of one (ultra_low_latency); the device is hung while the contenders queue up, so that the
    order is decided by the scheduler alone."""
    srv = served[0]
    eng, dev = srv.service.engines["smollm2"], srv.service.rt.device(0)
    eng.set_mode(ModeConfig("ultra_low_latency", low_latency_batch=1))
    done: list[str] = []
    lock = threading.Lock()

    def run(who, n, **extra):
        complete(client(served, who), max_tokens=n, extra=extra)
        with lock:
            done.append(who)

    def race(first: list, later: list, queued: int):
        ths = [threading.Thread(target=run, args=a, kwargs=k) for a, k in first]
        for t in ths:
            t.start()
        assert eng.wait_until(lambda s: s.running == 1, 60)
        dev.handle.inject_fault("hang")                             # nothing finishes while the others queue
        try:
            more = [threading.Thread(target=run, args=a, kwargs=k) for a, k in later]
            for t in more:
                t.start()
            assert eng.wait_until(lambda s: s.waiting == queued, 60)
        finally:
            dev.handle.clear_fault("hang")
        for t in ths + more:
            t.join(120)
    try:
        race([(("bulk", 8), {}), (("bulk", 8), {})], [(("premium", 3), {})], 2)
        assert done == ["premium", "bulk", "bulk"]                  # the high class first, the low still finishes
        done.clear()                                                # a request may ask to run later than its class
        race([(("bulk", 4), {})], [(("premium", 2), {"priority": 20}), (("bulk", 2), {"priority": -5})], 2)
        assert done == ["bulk", "bulk", "premium"]                  # premium at 20 after bulk; bulk's -5 stays 10
    finally:
        eng.set_mode(ModeConfig())
    assert Tenant("x", (), 10).effective_priority(-5) == 10 and Tenant("x", (), 0).effective_priority(20) == 20


def test_throttle_scales_quotas_and_engine_admission(served):
    """The admin throttle (self-healing's action) halves every tenant's quotas and the engines' limits;
    1 restores them.  The tokens-per-minute quota of "batch" is 32: throttled to 16, a request of 3 + 20
    tokens is over it."""
    srv, clock = served
    clock.t += 61
    st, _, b = raw(srv, "/admin/throttle", {"factor": 0.5}, key=KEYS["premium"])
    assert st == 403
    st, _, b = raw(srv, "/admin/throttle", {"factor": 0.5}, key=KEYS["ops"])
    assert st == 200 and json.loads(raw(srv, "/admin/state", key=KEYS["ops"])[2])["throttle"] == 0.5
    eng = srv.service.engines["smollm2"]
    try:
        assert eng.throttle == 0.5 and eng.current_limits().max_num_seqs == 2
        st, h, b = raw(srv, "/v1/completions", {"model": "smollm2", "prompt": "one two three", "max_tokens": 20},
                       key=KEYS["batch"])
        assert st == 429 and h["x-ratelimit-limit-tokens"] == "16"
    finally:
        assert raw(srv, "/admin/throttle", {"factor": 1}, key=KEYS["ops"])[0] == 200
    assert eng.throttle == 1.0
    assert raw(srv, "/v1/completions", {"model": "smollm2", "prompt": "one two three", "max_tokens": 20},
               key=KEYS["batch"])[0] == 200
    assert raw(srv, "/admin/throttle", {"factor": 0}, key=KEYS["ops"])[0] == 400


def test_open_server_refuses_non_loopback_without_keys(served):
    rt = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=64 << 20)))
    try:
        svc = Service(rt, (model_spec("smollm2", (0,), 1),))
        with pytest.raises(InvalidParamError, match="refusing to serve without API keys"):
            Server(svc, host="0.0.0.0")
        Server(svc, host="0.0.0.0", allow_unauthenticated=True)     # asked for: allowed (not started here)
        Server(svc, host="::1")
    finally:
        rt.close()
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "refusing to serve without API keys" in p.stderr and len(p.stderr.splitlines()) == 1


def test_a_failing_tenants_circuit_breaker_opens_alone(served):
    """A tenant whose embeddings keep failing (real task faults on the encoder's device, 500) is refused 503
    ``circuit_open`` with Retry-After the time left (the clock is injected) while another tenant on the same
    model is served; after ``open_for`` one probe is let through: a failing probe opens it again, a good one
    closes it."""
    from runtime.serve.circuit import BreakerSpec
    srv, clock = served
    svc = srv.service
    before = svc.tenants.tenants
    flaky_key = "sk-flaky-000000000006"
    svc.set_tenants(before + (Tenant("flaky", (key_digest(flaky_key),), models=("minilm-l6",),
                                     circuit_breaker=BreakerSpec(0.5, 30.0, 60.0, 2)),))
    fault = svc.rt.device(1).handle                                   # the encoder's device (the fixture)

    def embed(key):
        st, h, body = raw(srv, "/v1/embeddings", {"model": "minilm-l6", "input": "hello"}, key)
        return st, h, json.loads(body)
    try:
        fault.inject_fault("task-fail", count=2)
        assert [embed(flaky_key)[0] for _ in range(2)] == [500, 500]
        st, h, body = embed(flaky_key)
        assert st == 503 and body["error"]["code"] == "circuit_open", body
        assert h["retry-after"] == "60" and h["retry-after-ms"] == "60000"
        assert embed(KEYS["embed"])[0] == 200                         # the other tenant, same model: served
        clock.t += 45
        assert embed(flaky_key)[1]["retry-after"] == "15"
        state = json.loads(raw(srv, "/admin/state", key=KEYS["ops"])[2])
        (mine,) = [t for t in state["tenants"] if t["tenant"] == "flaky"]
        assert mine["circuit_breaker"] == {"state": "open", "opened": 1, "retry_after_s": 15.0}
        clock.t += 15
        fault.inject_fault("task-fail", count=1)
        assert embed(flaky_key)[0] == 500                             # the probe fails: open again
        assert embed(flaky_key)[1]["retry-after"] == "60"
        clock.t += 60
        st, _, body = embed(flaky_key)                                 # a good probe closes it
        assert st == 200 and len(body["data"][0]["embedding"]) == 384
        assert embed(flaky_key)[0] == 200
    finally:
        svc.set_tenants(before)
