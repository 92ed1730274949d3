"""``memory:`` and per-tenant HBM quotas on a real server (issue 28 item 4): SmolLM2 on an in-process device
behind the real HTTP server, driven by the official ``openai`` client and by ``vnpu serve reconfigure``.

- The pool is capped and pre-warmed to ``pool_size`` once the engine is loaded.
- ``reconfigure`` grows and shrinks it while requests stream: every one of them finishes with all its
  tokens; a size below what the engine holds is refused (exit 2, one line) and nothing changes.
- A tenant over its ``hbm_quota`` gets 429 ``hbm_quota_exceeded`` (naming CANN's 207001) while another
  tenant's identical request is served; its quota frees as its requests finish."""
from __future__ import annotations

import subprocess
import sys
import threading

import openai
import pytest

from cli_checks import cli
from devices.device import DeviceConfig
from runtime.api import Runtime
from runtime.observe.metrics_store import History
from runtime.backend import LocalBackend
from runtime.serve.config import ConfigError, parse_config
from runtime.serve.engine.modes import ModeConfig
from runtime.serve.reconfigure import Reconfigurer
from runtime.serve.server import Server, Service

pytestmark = pytest.mark.serve

MB = 1 << 20
KEYS = {"small": "sk-small-000000000001", "big": "sk-big-00000000000002", "ops": "sk-ops-00000000000003"}
CONFIG = f"""
scheduler: {{mode: auto}}
memory:
  strategy: "fragmentation_aware"
  pool_size: "900MB"
  overflow_protection: true
tenants:
  - {{name: small, api_keys: [{KEYS['small']}], hbm_quota: "1MB"}}
  - {{name: big, api_keys: [{KEYS['big']}], hbm_quota: "1GB"}}
  - {{name: ops, api_keys: [{KEYS['ops']}], admin: true}}
models:
  - model: smollm2@0
    engine: {{max_num_seqs: 4, max_num_batched_tokens: 32, max_model_len: 96, num_gpu_blocks_override: 32}}
"""


@pytest.fixture(scope="module")
def served():
    cfg = parse_config(CONFIG, "serve.yaml")
    rt = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30)))
    svc = Service(rt, cfg.models, cfg.tenants)
    svc.manage_memory(cfg.memory)
    srv = Server(svc).start()
    try:
        svc.load()
        yield srv, Reconfigurer(svc, cfg, CONFIG, health_check=False)
    finally:
        srv.stop()
        rt.close()


def _complete(srv, who: str, max_tokens: int):
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEYS[who], max_retries=0)
    return c.completions.create(model="smollm2", prompt="one two three", max_tokens=max_tokens, temperature=0,
                                extra_body={"ignore_eos": True})


def test_the_pool_is_capped_and_pre_warmed_at_start(served):
    srv, _ = served
    pool = srv.service.rt.device(0).pool
    assert pool.limit == 900 * MB and pool.reserved() == 900 * MB
    st = srv.service.state_dict()["memory"]
    assert st["pools"]["npu:0"]["reserved"] == 900 * MB and st["strategy"] == "fragmentation_aware"


def test_auto_picks_its_slo_from_the_history_and_keeps_it_across_a_reconfigure(served):
    srv, rc = served
    eng = srv.service.engines["smollm2"]
    assert (eng.config.mode.mode, eng.config.mode.target_p99_ms) == ("auto", None)    # no slo, no history yet
    with History(":memory:") as h:
        for i in range(40):
            h.record_samples(1000.0 + i, {"p99_latency_ms": 100.0 + i})
        assert srv.service.pick_auto_slo(h, 1040.0) == {"smollm2": 135.0}          # nearest rank 36 of 40
        assert any("picked target_p99_ms=135" in e.diagnosis for e in h.events())
    assert eng.config.mode.target_p99_ms == 135.0
    assert rc.apply(sets=["memory.defrag_interval=10m"])["result"] == "ok"
    assert eng.config.mode.target_p99_ms == 135.0 and srv.service.memory.plan.defrag_interval_s == 600.0


def test_resize_live_while_requests_stream(served):
    srv, rc = served
    eng, pool = srv.service.engines["smollm2"], srv.service.rt.device(0).pool
    eng.set_mode(ModeConfig("ultra_low_latency", low_latency_batch=1))   # a queue stays while we resize
    got: list = []
    lock = threading.Lock()

    def one():
        r = _complete(srv, "big", 8)
        with lock:
            got.append(r.usage.completion_tokens)
    threads = [threading.Thread(target=one) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        assert eng.wait_until(lambda s: s.running >= 1 and s.waiting >= 1, 120)
        out = rc.apply(sets=["memory.pool_size=960MB"])                    # grow, requests in flight
        assert out["result"] == "ok" and any(c.startswith("memory: pool_bytes") for c in out["changes"])
        assert pool.limit == 960 * MB and pool.reserved() == 960 * MB
        held = pool.memory_stats()["allocated_bytes.all.current"]
        with pytest.raises(ConfigError, match="below what device 0 holds"):
            rc.apply(sets=[f"memory.pool_size={held // 2}"])
        assert pool.limit == 960 * MB                                      # refused: nothing changed
        out = rc.apply(sets=[f"memory.pool_size={held + 32 * MB}"])        # shrink to just above what is held
        assert out["result"] == "ok" and pool.limit == held + 32 * MB
        assert pool.reserved() <= held + 32 * MB
        for t in threads:
            t.join(300)
    finally:
        eng.set_mode(ModeConfig())
    assert got == [8, 8]                                                   # no request dropped or cut short


def test_reconfigure_cli_memory_pool_size(served, capsys):
    """``vnpu serve reconfigure --memory-pool-size`` (``vnpu``'s main in this process) and the seed's
    ``vnpu reconfigure`` (a real client process: its refusal is one line) against the real server."""
    srv, _ = served
    pool = srv.service.rt.device(0).pool
    rc, out, err = cli(["serve", "reconfigure", "--memory-pool-size", "900MB", "--url", srv.url, "--api-key",
                        KEYS["ops"]], capsys)
    assert rc == 0, err
    assert "memory: pool_bytes" in out and pool.limit == 900 * MB
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "reconfigure", "--memory-pool-size", "1MB", "--url", srv.url,
                        "--api-key", KEYS["ops"]], capture_output=True, text=True, timeout=120)   # the seed's verb
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "below what device 0 holds" in r.stderr
    assert r.stderr.startswith("vnpu reconfigure: error: reconfigure: memory:")
    assert pool.limit == 900 * MB


def test_a_tenant_over_its_hbm_quota_is_refused_and_others_are_not(served):
    srv, _ = served
    # 3 + 14 tokens = 2 KV blocks of 720 KiB: more than small's 1 MB, whatever it holds
    with pytest.raises(openai.RateLimitError) as e:
        _complete(srv, "small", 14)
    err = e.value.body
    assert e.value.status_code == 429 and err["code"] == "hbm_quota_exceeded" and err["type"] == "hbm"
    assert "207001" in err["message"] and "Limit 1048576 B" in err["message"]
    assert "retry-after" not in {k.lower() for k in e.value.response.headers}   # it would never pass
    assert _complete(srv, "big", 14).usage.completion_tokens == 14           # the other tenant is unaffected
    # one small request (1 block) fits; a second one while it runs does not; after it, it does again
    eng, dev = srv.service.engines["smollm2"], srv.service.rt.device(0)
    done: list = []
    first = threading.Thread(target=lambda: done.append(_complete(srv, "small", 2).usage.completion_tokens))
    first.start()
    assert eng.wait_until(lambda s: s.running + s.waiting >= 1, 120)
    dev.handle.inject_fault("hang")
    try:
        with pytest.raises(openai.RateLimitError) as e2:
            _complete(srv, "small", 2)
        assert e2.value.body["code"] == "hbm_quota_exceeded" and "Held 737280 B" in e2.value.body["message"]
        assert srv.service.quotas.usage(srv.service.tenants.get("small"))["hbm_bytes"] == 737280
    finally:
        dev.handle.clear_fault("hang")
    first.join(120)
    assert done == [2]
    assert srv.service.quotas.usage(srv.service.tenants.get("small"))["hbm_bytes"] == 0
    assert _complete(srv, "small", 2).usage.completion_tokens == 2
