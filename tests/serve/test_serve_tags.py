"""Request tags -> priority classes (issue 28 item 2; serve tier): a real server on loopback loaded from the
seed's dialect (its ``stream_priority`` rules), driven by the official ``openai`` client.  A tag in the
``x-vnpu-tag`` header or the ``vnpu_tag`` body field gets the class its rule maps it to, combined with the
tenant's class (the stricter wins); an unknown tag gets the tenant's; the priority a request was queued at
comes back in ``x-vnpu-priority``; a tagged batch job runs after an untagged request of the same tenant
when the scheduler has to choose; the rules change live with ``reconfigure``."""
from __future__ import annotations

import threading

import openai
import pytest

from devices.device import DeviceConfig
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.serve.config import ConfigError, parse_config
from runtime.serve.engine.modes import ModeConfig
from runtime.serve.reconfigure import Reconfigurer
from runtime.serve.server import Server, Service

pytestmark = pytest.mark.serve

KEYS = {"app": "sk-app-00000000000001", "bulk": "sk-bulk-0000000000002"}
CONFIG = f"""
scheduler:
  strategies:
    - name: stream_priority
      rules:
        - {{tag: premium_user, priority: high}}
        - {{tag: batch_job, priority: low}}
tenants:
  - {{name: app, api_keys: [{KEYS['app']}], priority: 0}}
  - {{name: bulk, api_keys: [{KEYS['bulk']}], priority: 5}}
models:
  - model: smollm2@0
    engine: {{max_num_seqs: 4, max_num_batched_tokens: 32, max_model_len: 96, num_gpu_blocks_override: 32}}
"""


@pytest.fixture(scope="module")
def served():
    cfg = parse_config(CONFIG, "serve.yaml")
    assert cfg.models[0].engine.scheduling_policy == "priority"        # stream_priority implies it
    rt = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30)))
    svc = Service(rt, cfg.models, cfg.tenants, tags=cfg.tags)
    srv = Server(svc).start()
    try:
        svc.load()
        yield srv, Reconfigurer(svc, cfg, CONFIG, health_check=False)
    finally:
        srv.stop()
        rt.close()


def _queued_at(srv, who: str, tag_header: str | None = None, **extra) -> int:
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEYS[who], max_retries=0)
    r = c.completions.with_raw_response.create(
        model="smollm2", prompt="one two three", max_tokens=2, temperature=0, extra_body={"ignore_eos": True, **extra},
        extra_headers={"x-vnpu-tag": tag_header} if tag_header else None)
    assert r.parse().usage.completion_tokens == 2
    return int(r.headers["x-vnpu-priority"])


def test_a_tag_gets_its_rules_class_beside_the_tenants(served):
    srv = served[0]
    assert _queued_at(srv, "app") == 0                                   # no tag: the tenant's class
    assert _queued_at(srv, "app", vnpu_tag="batch_job") == 10            # body field
    assert _queued_at(srv, "app", tag_header="batch_job") == 10          # header
    assert _queued_at(srv, "app", tag_header="batch_job", vnpu_tag="batch_job") == 10
    assert _queued_at(srv, "app", vnpu_tag="premium_user") == 0
    assert _queued_at(srv, "app", vnpu_tag="no_such_tag") == 0           # unknown: the default (tenant's class)
    assert _queued_at(srv, "bulk", vnpu_tag="premium_user") == 5         # never earlier than the tenant's class
    assert _queued_at(srv, "bulk", vnpu_tag="batch_job") == 10
    assert _queued_at(srv, "app", vnpu_tag="premium_user", priority=7) == 7   # the stricter of all three
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEYS["app"], max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:                      # header and body disagree: 400
        c.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                  extra_body={"vnpu_tag": "premium_user"}, extra_headers={"x-vnpu-tag": "batch_job"})
    assert "differ" in str(e.value)


def test_a_tagged_batch_job_runs_after_an_untagged_request(served):
    """Batch of one; the device is hung while the contenders queue, so the scheduler alone decides."""
    srv = served[0]
    eng, dev = srv.service.engines["smollm2"], srv.service.rt.device(0)
    eng.set_mode(ModeConfig("ultra_low_latency", low_latency_batch=1))
    done: list[str] = []
    lock = threading.Lock()

    def run(name, **extra):
        _queued_at(srv, "app", **extra)
        with lock:
            done.append(name)
    first = threading.Thread(target=run, args=("first",))
    try:
        first.start()
        assert eng.wait_until(lambda s: s.running == 1, 60)
        dev.handle.inject_fault("hang")
        try:
            tagged = threading.Thread(target=run, args=("batch_job",), kwargs={"vnpu_tag": "batch_job"})
            tagged.start()
            assert eng.wait_until(lambda s: s.waiting == 1, 60)            # the tagged one queued first ...
            plain = threading.Thread(target=run, args=("plain",))
            plain.start()
            assert eng.wait_until(lambda s: s.waiting == 2, 60)
        finally:
            dev.handle.clear_fault("hang")
        for t in (first, tagged, plain):
            t.join(120)
    finally:
        eng.set_mode(ModeConfig())
    assert done == ["first", "plain", "batch_job"]                         # ... and runs after the untagged one


def test_tag_rules_change_live(served):
    srv, rc = served
    out = rc.apply(sets=["tags.batch_job=3"])
    assert out["result"] == "ok" and any(c.startswith("tags:") for c in out["changes"])
    assert _queued_at(srv, "app", vnpu_tag="batch_job") == 3


def test_the_seeds_dynamic_batching_changes_live(served):
    """The seed's ``dynamic_batching`` strategy (max_batch, timeout_ms) applied by ``reconfigure`` to the
    running server: the engine's batch and the mode's wait change from its next step, no restart.  (The
    model's own ``engine.max_num_seqs`` is dropped from the text: a model's own value wins over a strategy's.)"""
    srv, rc = served
    eng = srv.service.engines["smollm2"]
    seed = CONFIG.replace("  strategies:\n", "  strategies:\n    - {name: dynamic_batching, enabled: true, min_batch: 1, "
                                             "max_batch: 2, timeout_ms: 7}\n").replace("max_num_seqs: 4, ", "")
    out = rc.apply(seed)
    try:
        assert out["result"] == "ok", out
        assert any(c.startswith("smollm2 engine: max_num_seqs 4 -> 2") for c in out["changes"]), out["changes"]
        assert eng.config.max_num_seqs == 2 and eng.config.mode.max_wait_ms == 7
        assert eng.config.scheduling_policy == "priority"                # stream_priority still implies it
        assert _queued_at(srv, "app") == 0                               # it serves on
        with pytest.raises(ConfigError, match="max_num_seqs 8 is above the 4 the engine was built with"):
            rc.apply(seed.replace("max_batch: 2", "max_batch: 8"))
    finally:
        rc.rollback()
    assert eng.config.max_num_seqs == 4
