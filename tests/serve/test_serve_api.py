"""``vnpu serve`` over HTTP (serve tier): the official ``openai`` client against a real uvicorn server on
loopback (port 0) in this process, every error status in OpenAI's error shape, cancellation freeing
KV blocks, /metrics and /health; and the ``vnpu serve`` command in a subprocess drained by SIGTERM."""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest

from devices.device import DeviceConfig
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.serve.config import model_spec
from runtime.serve.engine import EngineConfig
from runtime.serve.server import Server, Service

pytestmark = pytest.mark.serve

CHAT = [{"role": "user", "content": "Name a color."}]


@pytest.fixture(scope="module")
def server():
    rt = Runtime(LocalBackend(2, DeviceConfig(arena_bytes=1 << 30)))
    svc = Service(rt, (model_spec("smollm2", None, None, EngineConfig(max_num_seqs=4, max_num_batched_tokens=64,
                                                                      max_model_len=128, max_queued_requests=2)),
                       model_spec("minilm-l6", None, None)))
    srv = Server(svc).start()
    status, body = svc.health()
    assert (status, body["status"]) == (503, "starting")        # bound before the engines are up
    try:
        svc.load()
        yield srv
    finally:
        srv.stop()
        rt.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def raw(server, path, body=None, method=None):
    """(status, headers, body bytes) of one plain HTTP request."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method or ("POST" if data else "GET"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_models_and_health(server, client):
    ids = sorted(m.id for m in client.models.list().data)
    assert ids == ["minilm-l6", "smollm2"]
    assert raw(server, "/health")[0] == 200
    assert client.models.retrieve("smollm2").id == "smollm2"


def test_completion_and_chat(server, client):
    eng = server.service.engines["smollm2"]
    r = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length" and r.choices[0].text
    assert r.usage.prompt_tokens == len(eng.encode("The capital of France is")) and r.usage.completion_tokens == 5
    c = client.chat.completions.create(model="smollm2", messages=CHAT, max_tokens=6, temperature=0)
    assert c.object == "chat.completion" and c.choices[0].message.role == "assistant" and c.choices[0].message.content
    assert c.usage.prompt_tokens == len(eng.encode_chat(CHAT)) and c.usage.total_tokens == c.usage.prompt_tokens + \
        c.usage.completion_tokens
    lp = client.completions.create(model="smollm2", prompt="1, 2, 3,", max_tokens=2, temperature=0, logprobs=2)
    assert len(lp.choices[0].logprobs.token_logprobs) == 2 and len(lp.choices[0].logprobs.top_logprobs[0]) == 2


def test_streaming_equals_plain_and_reports_usage(client):
    kw = dict(model="smollm2", messages=CHAT, max_tokens=8, temperature=0)
    plain = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1]) and len({c.id for c in chunks}) == 1


def test_stream_wire_format_and_stop_strings(server, client):
    full = client.completions.create(model="smollm2", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0).choices[0].text
    assert ", 7," in full
    st, hdr, body = raw(server, "/v1/completions", {"model": "smollm2", "prompt": "1, 2, 3, 4,", "max_tokens": 12,
                                                   "temperature": 0, "stream": True, "stop": [", 7,"]})
    assert st == 200 and hdr["content-type"].startswith("text/event-stream")
    events = [e for e in body.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    pieces = [json.loads(e[6:]) for e in events[:-1]]
    assert "".join(p["choices"][0]["text"] for p in pieces) == full[:full.index(", 7,")]
    assert all(", 7," not in p["choices"][0]["text"] for p in pieces)
    assert pieces[-1]["choices"][0]["finish_reason"] == "stop"


def test_embeddings_float_and_base64(client, server):
    texts = ["a virtual NPU runs kernels", "bread smells good"]
    f = client.embeddings.create(model="minilm-l6", input=texts, encoding_format="float")
    b = client.embeddings.create(model="minilm-l6", input=texts)          # the client asks for base64
    one = client.embeddings.create(model="minilm-l6", input=texts[1], encoding_format="float")
    vf, vb = np.array([d.embedding for d in f.data]), np.array([d.embedding for d in b.data])
    assert vf.shape == (2, 384) and np.array_equal(vf, vb)
    np.testing.assert_allclose(one.data[0].embedding, vf[1], rtol=1e-5, atol=2e-6)
    assert np.allclose(np.linalg.norm(vf, axis=1), 1, atol=1e-4) and f.usage.prompt_tokens > 0
    st, _, body = raw(server, "/v1/embeddings", {"model": "minilm-l6", "input": "x y", "encoding_format": "base64"})
    emb = json.loads(body)["data"][0]["embedding"]
    assert st == 200 and np.frombuffer(base64.b64decode(emb), "<f4").shape == (384,)


@pytest.mark.parametrize("body,param", [
    ({"prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 10 ** 6}, "max_tokens"),
    ({"prompt": "word " * 200, "max_tokens": 4}, "prompt"),
    ({"prompt": "hi", "n": 2}, "n"),
    ({"prompt": "hi", "temperature": 3}, "temperature"),
    ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": 5}, "prompt"),
])
def test_bad_parameters_are_400(server, body, param):
    st, hdr, b = raw(server, "/v1/completions", dict(model="smollm2", **body))
    err = json.loads(b)["error"]
    assert st == 400 and err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    assert "x-request-id" in hdr


def test_error_statuses_through_the_client(server, client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="x")
    assert e.value.code == "model_not_found" and e.value.status_code == 404
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="smollm2", input="x")            # not an embedding model
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=CHAT, n=3)
    assert e.value.param == "n"
    st, _, b = raw(server, "/v1/chat/completions", b'{"model": "smollm2", "messages": [')
    assert st == 400 and json.loads(b)["error"]["code"] == "invalid_json"
    st, _, b = raw(server, "/v1/nothing-here")
    assert st == 404 and "error" in json.loads(b)


def test_queue_full_is_503_with_retry_after(server, client):
    eng = server.service.engines["smollm2"]
    long = dict(max_tokens=100, temperature=0, ignore_eos=True)
    from runtime.serve.engine import SamplingParams
    hs = []
    try:
        for k in range(4):                                            # the batch fills up ...
            hs.append(eng.add_request([1, 2, 3], SamplingParams(**long)))
            assert eng.wait_until(lambda s, k=k: s.running == k + 1, 60)
        hs += [eng.add_request([1, 2, 3], SamplingParams(**long)) for _ in range(2)]   # ... and the queue
        st, hdr, b = raw(server, "/v1/completions", {"model": "smollm2", "prompt": "hi", "max_tokens": 2})
        err = json.loads(b)["error"]
        assert st == 503 and hdr["retry-after"] == "1" and err["type"] == "server_error"
        with pytest.raises(openai.InternalServerError):
            client.completions.create(model="smollm2", prompt="hi", max_tokens=2)
    finally:
        for h in hs:
            eng.abort(h.request_id)
        assert eng.wait_idle(60)
    assert all(h.result(0).finish_reason == "abort" for h in hs)


def test_disconnect_cancels_and_frees_kv_blocks(server, client):
    eng = server.service.engines["smollm2"]
    total = eng.snapshot().num_blocks - 1
    stream = client.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=100, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    it = iter(stream)
    got = [next(it).choices[0].text for _ in range(3)]
    assert eng.snapshot().free_blocks < total and "".join(got)
    stream.close()                                                  # the client goes away mid-stream
    assert eng.wait_idle(60)
    s = eng.snapshot()
    assert s.free_blocks == total and s.running == 0
    _, _, m = raw(server, "/metrics")
    assert 'vnpu:request_success_total{engine="0",finished_reason="abort",model_name="smollm2"}' in m.decode()


def test_metrics_names(server, client):
    client.completions.create(model="smollm2", prompt="hello", max_tokens=2, temperature=0)
    st, hdr, body = raw(server, "/metrics")
    text = body.decode()
    assert st == 200 and hdr["content-type"].startswith("text/plain")
    for name in ("vnpu:num_requests_running", "vnpu:num_requests_waiting", "vnpu:kv_cache_usage_perc",
                 "vnpu:time_to_first_token_seconds_bucket", "vnpu:inter_token_latency_seconds_bucket",
                 "vnpu:e2e_request_latency_seconds_bucket", "vnpu:prompt_tokens_total",
                 "vnpu:generation_tokens_total", "vnpu:num_preemptions", "npu_chip_info_health_status",
                 "npu_chip_info_hbm_used_memory", "npu_chip_info_hbm_total_memory", "npu_chip_info_utilization",
                 "npu_chip_info_temperature", "npu_chip_info_power", "vnpu:hbm_fragmentation",
                 "vnpu:memory_pool_reserved_bytes", "vnpu:memory_pool_fragmentation", "vnpu:memory_pool_ooms_total",
                 "vnpu:memory_pool_defragmentations_total"):
        assert name in text, name
    gen = [ln for ln in text.splitlines() if ln.startswith("vnpu:generation_tokens_total{")]
    assert float(gen[0].split()[-1]) >= 2
    used = [ln for ln in text.splitlines() if ln.startswith("npu_chip_info_hbm_used_memory{") and 'id="0"' in ln]
    assert float(used[0].split()[-1]) > 500                         # SmolLM2's weights + KV cache, in MB
    pool = [ln for ln in text.splitlines() if ln.startswith('vnpu:memory_pool_allocated_bytes{id="0"}')]
    assert float(pool[0].split()[-1]) > 500 * 2 ** 20               # they come from the server's caching pool


def test_admin_defragment_while_serving(server, client):
    """``POST /admin/defragment``: the engines hold between two steps, every device they run on is
    compacted once (a hole left below a tensor of this test's: that tensor moves, its bytes intact),
    the server answers as before, and /metrics counts the defragmentation."""
    dev = server.service.rt.device(0)
    greedy = dict(model="smollm2", prompt="The capital of France is", max_tokens=5, temperature=0)
    before = client.completions.create(**greedy).choices[0].text
    hole = dev.empty((12 << 20,), "uint8")
    data = np.arange(3 << 20, dtype=np.float32)
    t = dev.from_numpy(data)                                        # 12 MiB just above the hole
    old = t.ptr
    hole.free()
    st, _, body = raw(server, "/admin/defragment", b"{}")
    assert st == 200, body
    reps = {r["device"]: r for r in json.loads(body)["devices"]}
    assert "npu:0" in reps and reps["npu:0"]["bytes_moved"] >= 12 << 20
    assert reps["npu:0"]["arena_fragmentation_after"] <= reps["npu:0"]["arena_fragmentation_before"]
    assert t.ptr != old
    np.testing.assert_array_equal(t.numpy(), data)
    t.free()
    assert client.completions.create(**greedy).choices[0].text == before
    text = raw(server, "/metrics")[2].decode()
    n = [ln for ln in text.splitlines() if ln.startswith('vnpu:memory_pool_defragmentations_total{id="0"}')]
    assert float(n[0].split()[-1]) >= 1
    assert any(ev["kind"] == "defragment" for ev in server.service.state_dict()["events"])


def test_sigterm_drains_then_exits(tmp_path):
    env = dict(os.environ, VNPU_BACKEND="local", VNPU_DEVICES="1", OPENBLAS_NUM_THREADS="1")
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("models:\n  - model: smollm2\n    engine: {max_num_seqs: 2, max_model_len: 128, "
                   "num_gpu_blocks_override: 16}\n")
    p = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config", str(cfg), "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    ready = threading.Event()

    def read():
        for ln in p.stdout:
            lines.append(ln.strip())
            if "vnpu serve: ready" in ln:
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(120) and p.poll() is None, (lines, p.stderr.read() if p.poll() is not None else "")
        url = next(ln.split()[-1] for ln in lines if "listening on" in ln)
        assert url.startswith("http://127.0.0.1:")
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        stream = c.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=20, temperature=0,
                                      stream=True, extra_body={"ignore_eos": True})
        it = iter(stream)
        first = next(it)
        p.send_signal(signal.SIGTERM)                               # drain: this stream finishes ...
        with pytest.raises(openai.InternalServerError):             # ... new requests are refused
            c.completions.create(model="smollm2", prompt="hi", max_tokens=2)
        rest = list(it)
        assert rest[-1].choices[0].finish_reason == "length"
        assert p.wait(60) == 0
        assert any(ln.endswith("vnpu serve: drained, bye") for ln in lines), lines
        assert sum(1 for ch in [first] + rest if ch.choices and ch.choices[0].text) >= 10
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
