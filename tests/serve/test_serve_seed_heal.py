"""The seed's self-healing, line by line (issue 28 item 5; serve tier): each trigger line of
``fixtures/seed_runtime_config.yaml`` (the CANN runtime article's ``runtime_config.yaml``), loaded through
the dialect with the seed's ``recovery`` section, acts on a live server as the seed says.  One stack for
the module: SmolLM2 on in-process device 0 (chain 0 -> 1 -> cpu) and a compiled CNN (``.om``, one
instance) on device 2, served on loopback; the sampler ticks on an injected clock (minutes of policy in
seconds, no sleeps).

- ``error_rate 5% 1m -> restart_worker``: the engine is restarted on the device it is on while a stream
  is in flight; the stream ends with every token, once, as greedy decoding gives it; 10 warm-up requests;
- ``memory_fragmentation 70% 5m -> trigger_defrag``: a 5-minute window of fragmented HBM, defragmented;
- ``device_temperature 85°C 30s -> throttle_requests`` and ``80°C -> throttle_requests_by 20%``;
- ``qps sudden_drop>40% in 1m -> scale_workers +2``: two more instances of the compiled model (the server
  has no Ray Serve replicas), which answer as onnxruntime does; removed again when the drop is over;
- ``network_latency 500ms -> cache_recent_results``: deterministic answers from a per-tenant cache with a
  TTL, never across tenants, never for sampled requests;
- recovery: a killed device is restarted and, in guardian mode, the engine moves back to it once the
  deep check (``/health?deep=true``) passed for ``return_after`` (a failed check starts the wait again),
  warmed with the seed's 10 real requests; a warm-up that fails there is rolled back;
- alerts in Slack's shape (``{"text": ...}``) reach a real receiver; ``--alert-channel`` and
  ``--guardian-mode`` as the CLI reads them.
"""
from __future__ import annotations

import argparse
import threading
from pathlib import Path

import numpy as np
import openai
import pytest
import tritonclient.http as th

from devices.device import DeviceConfig
from cli_checks import cli, tripwires  # noqa: F401 - a fixture
from onnx_models import cnn, images, ort_run
from runtime.api import Runtime
from runtime.atc import compile_model, make_options
from runtime.backend import LocalBackend
from runtime.observe.metrics_store import History
from runtime.serve.config import model_spec, parse_config
from runtime.serve.engine import EngineConfig
from runtime.serve.engine.placement import Placement
from runtime.serve.heal import SelfHealing
from runtime.serve.heal.guardian import guardian
from runtime.serve.metrics_sampler import Sampler
from runtime.serve.modelrepo import scan_repository
from runtime.serve.server import Server, Service
from runtime.serve.tenants import Tenant, key_digest
from serve_http import call, openai_client
from webhook_receiver import Receiver

pytestmark = pytest.mark.serve

SEED = Path(__file__).parent / "fixtures" / "seed_runtime_config.yaml"
ADMIN, USER, OTHER = "sk-ops-0123456789", "sk-app-0123456789", "sk-two-0123456789"


def seed_lines() -> tuple[list[str], str]:
    """The seed's trigger lines and its ``recovery:`` block, as written in the fixture."""
    lines = SEED.read_text().splitlines()
    trig = [ln for ln in lines if ln.strip().startswith("- {metric:")]
    i = lines.index("  recovery:")
    return trig, "\n".join(lines[i:i + 4]) + "\n"


TRIGGERS, RECOVERY = seed_lines()


def seed_policy(k: int, extra: str = "") -> str:
    """``self_healing`` with the seed's trigger line ``k`` and its recovery section (``extra``: more keys)."""
    return "self_healing:\n  enabled: true\n  triggers:\n" + TRIGGERS[k] + "\n" + RECOVERY + extra


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seedheal")
    root = tmp / "models"
    (root / "cnn" / "1").mkdir(parents=True)
    (root / "cnn" / "config.yaml").write_text("max_batch_size: 8\ninstance_group: [{count: 1, devices: [2]}]\n")
    onnx = cnn(seed=4)
    blob = compile_model(onnx, make_options("x:-1,3,16,16", "1,2,4,8")).to_bytes()
    (root / "cnn" / "1" / "model.om").write_bytes(blob)
    rt = Runtime(LocalBackend(3, DeviceConfig(arena_bytes=1 << 30)))
    spec = model_spec("smollm2", (0,), 1, EngineConfig(max_num_seqs=2, max_num_batched_tokens=32, max_model_len=64,
                                                       num_gpu_blocks_override=16),
                      fallback=(Placement((1,)), Placement(cpu=True)))
    tenants = (Tenant("ops", (key_digest(ADMIN),), admin=True), Tenant("app", (key_digest(USER),)),
               Tenant("two", (key_digest(OTHER),)))
    svc = Service(rt, (spec,), tenants, repositories=(scan_repository(root),))
    clk = Clock(50_000.0)
    hist = History(tmp / "history.sqlite", clock=clk)
    sampler = Sampler(svc, hist, rt, clock=clk)
    srv = Server(svc).start()
    try:
        svc.load()
        yield rt, srv, sampler, hist, clk, onnx
    finally:
        srv.stop()
        hist.close()
        rt.close()


@pytest.fixture
def env(served):
    """The stack, its clock a day on, and a policy factory (a seed YAML, optionally in guardian mode)."""
    rt, srv, sampler, hist, clk, onnx = served
    clk.t += 86400.0
    made = []

    def policy(yaml_text: str, guard: bool = False) -> SelfHealing:
        sh = parse_config(yaml_text, "runtime_config.yaml").self_healing
        h = SelfHealing(srv.service, guardian(sh) if guard else sh, hist, sampler, rt)
        made.append(h)
        return h
    yield rt, srv, sampler, hist, clk, policy
    for h in made:
        h.close()
    svc = srv.service
    for i in range(rt.device_count()):
        if rt.device(i).is_lost:
            rt.restart_device(i)
        rt.device(i).handle.clear_fault()
    if svc.engines["smollm2"].index != 0:
        svc.restore("smollm2")
    svc.throttle(1.0)
    svc.result_cache.disable()


def tick_for(sampler, clk, seconds: int, every=None):
    for k in range(seconds):
        if every is not None:
            every(k)
        clk.t += 1.0
        sampler.tick(clk.t)


def client(srv, key=USER):
    return openai_client(srv.url, key)


def ask(srv, key=USER, max_tokens=3, **kw):
    return client(srv, key).completions.create(model="smollm2", prompt="Hello there", max_tokens=max_tokens,
                                               temperature=kw.pop("temperature", 0), **kw)


def since(hist, t0, kinds):
    return list(hist.events(since=t0, kinds=kinds))


def policy_events(hist, t0, kind):
    return [e for e in since(hist, t0, [kind]) if e.source == "policy"]


# ---------------------------------------------------------------------------------------------- trigger lines
def test_error_rate_restarts_the_worker_in_place_and_replays_the_stream_in_flight(env):
    """``{metric: error_rate, threshold: 5%, window: 1m, action: restart_worker}``."""
    rt, srv, sampler, hist, clk, policy = env
    assert "restart_worker" in TRIGGERS[0]
    policy(seed_policy(0))
    eng = srv.service.engines["smollm2"]
    prompt = "Once upon a time"
    want = client(srv).completions.create(model="smollm2", prompt=prompt, max_tokens=6, temperature=0,
                                          extra_body={"ignore_eos": True}).choices[0].text
    n0, t0 = eng.rebinds, clk.t
    rt.device(0).handle.inject_fault("task-fail", count=2)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            ask(srv)
    tick_for(sampler, clk, 60)                                # the 1 m window is not covered yet
    assert policy_events(hist, t0, "action") == []
    s = client(srv).completions.create(model="smollm2", prompt=prompt, max_tokens=6, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
    text, usage = [], None
    for ch in s:
        if ch.choices:
            text.append(ch.choices[0].text)
            if len(text) == 1:                                # mid-stream: a request ends (a sample), then the
                ask(srv, max_tokens=1)                        # tick that covers the window, while the engine is
                with eng.paused(60):                          # held: the restart runs before its next step
                    th = threading.Thread(target=tick_for, args=(sampler, clk, 1))
                    th.start()
                    assert eng.wait_until(lambda _: eng.pending_rebinds == 1, 60)
                th.join(300)
                assert not th.is_alive()
        if ch.usage is not None:
            usage = ch.usage.completion_tokens
    (act,) = policy_events(hist, t0, "action")
    assert act.result == "ok", act.result
    assert act.detail["action"] == "restart_engine" and act.value > 0.05
    assert act.detail["restarted"]["smollm2"] == {"placement": "npu 0", "replayed": 1}   # same device; the stream
    assert act.detail["restarted"]["cnn"]["placement"] == "npu 2"
    assert act.detail["warmup"][0] == "smollm2: 10 warm-up request(s) served"
    assert eng.rebinds == n0 + 1 and eng.index == 0
    assert "".join(text) == want and usage == 6                 # every token, once, as greedy decoding gives it
    assert ask(srv).choices[0].finish_reason == "length"


def test_fragmentation_over_five_minutes_defragments(env):
    """``{metric: memory_fragmentation, threshold: 70%, window: 5m, action: trigger_defrag}``."""
    rt, srv, sampler, hist, clk, policy = env
    policy(seed_policy(1))
    dev = rt.device(0)
    size = 12 << 20
    ts = [dev.from_numpy(np.full(size // 4, k, np.float32)) for k in range(dev.mem_info()[0] // size - 2)]
    kept = ts[1::2]
    try:
        for t in ts[0::2]:
            t.free()
        dev.empty_cache()
        assert dev.telemetry()["fragmentation"] > 0.7
        t0 = clk.t
        tick_for(sampler, clk, 300)                           # the first 300 s: the window is not covered
        assert policy_events(hist, t0, "action") == []
        tick_for(sampler, clk, 1)
        (act,) = policy_events(hist, t0, "action")
        assert act.result == "ok" and act.detail["action"] == "defragment", act.result
        b, a = act.detail["fragmentation"]["npu:0"]
        assert b > 0.7 and a < 0.7
        assert all(np.all(t.numpy() == k) for k, t in zip(range(1, len(ts), 2), kept))
        assert ask(srv).choices[0].finish_reason == "length"
    finally:
        for t in kept:
            t.free()
        dev.empty_cache()


def _hot(dev, celsius: float) -> None:
    """Pin ``dev``'s die at about ``celsius`` (the overheat fault adds to the thermal model's base)."""
    dev.handle.clear_fault("overheat")
    base = dev.telemetry()["temperature_c"]
    dev.handle.inject_fault("overheat", celsius=max(0.0, celsius - base))


def test_temperature_over_thirty_seconds_throttles_requests(env):
    """``{metric: device_temperature, threshold: 85°C, window: 30s, action: throttle_requests}``."""
    rt, srv, sampler, hist, clk, policy = env
    policy(seed_policy(2))
    _hot(rt.device(1), 90.0)
    t0 = clk.t
    tick_for(sampler, clk, 30)
    assert srv.service.quotas.admission == 1.0
    tick_for(sampler, clk, 1)
    (act,) = policy_events(hist, t0, "action")
    assert act.detail["scope"] == "npu:1" and act.value > 85
    assert srv.service.quotas.admission == pytest.approx(0.8)         # the seed gives no amount: vnpu's 20 %
    assert ask(srv).choices[0].finish_reason == "length"


def test_temperature_over_eighty_throttles_by_twenty_percent_at_once(env):
    """``{metric: device_temperature, threshold: 80°C, action: throttle_requests_by 20%}``."""
    rt, srv, sampler, hist, clk, policy = env
    h = policy(seed_policy(4))
    _hot(rt.device(1), 82.0)
    t0 = clk.t
    tick_for(sampler, clk, 1)
    (act,) = policy_events(hist, t0, "action")
    assert act.value == pytest.approx(82.0, abs=1.0) and srv.service.quotas.admission == pytest.approx(0.8)
    assert h.active() == {"device_temperature_throttle_requests_by on npu:1": act.detail["summary"]}


def _infer(srv, onnx, n=2):
    c = th.InferenceServerClient(srv.url.removeprefix("http://"))
    try:
        x = images(n, seed=n)
        inp = th.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = c.infer("cnn", [inp], headers={"authorization": f"Bearer {ADMIN}"}).as_numpy("probs")
    finally:
        c.close()
    np.testing.assert_allclose(got, ort_run(onnx, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_a_sudden_qps_drop_adds_two_instances_of_the_compiled_model(env, served):
    """``{metric: qps, threshold: "sudden_drop>40% in 1m", action: "scale_workers +2"}``: no Ray Serve
    replicas here, so the compiled model gets two more instances; removed once the drop is out of the
    window."""
    rt, srv, sampler, hist, clk, policy = env
    onnx = served[5]
    policy(seed_policy(3))
    svc = srv.service
    assert len(svc.compiled.instances("cnn")) == 1
    t0 = clk.t
    tick_for(sampler, clk, 60)                                # a quiet minute: qps 0, no drop
    tick_for(sampler, clk, 1, every=lambda k: [ask(srv) for _ in range(3)])     # 3 requests/s
    assert policy_events(hist, t0, "action") == []
    tick_for(sampler, clk, 1, every=lambda k: ask(srv))       # 1 request/s: 67 % below the peak
    (act,) = policy_events(hist, t0, "action")
    assert act.result == "ok" and act.value == pytest.approx(2 / 3)
    assert act.detail["added"] == ["cnn/1#1", "cnn/1#2"]
    insts = svc.compiled.instances("cnn")
    assert [str(e.placement) for e in insts] == ["npu 2"] * 3
    _infer(srv, onnx, 4)                                       # served, as onnxruntime computes it
    tick_for(sampler, clk, 59)                                 # the peak is still in the window
    assert len(svc.compiled.instances("cnn")) == 3
    tick_for(sampler, clk, 3)                                  # the peak and the requests after it are out
    (rec,) = policy_events(hist, t0, "recovery")
    assert "removed 2 instance(s)" in rec.diagnosis and len(svc.compiled.instances("cnn")) == 1
    _infer(srv, onnx, 2)


def test_high_latency_turns_on_a_per_tenant_result_cache(env):
    """``{metric: network_latency, threshold: 500ms, action: cache_recent_results}``: the server's p99
    latency (reported by the HTTP layer through ``observe``, as a request of 900 ms would be)."""
    rt, srv, sampler, hist, clk, policy = env
    policy(seed_policy(5))
    svc = srv.service
    t0 = clk.t
    svc.observe("ok", 0.9)
    tick_for(sampler, clk, 1)
    (act,) = policy_events(hist, t0, "action")
    assert act.result == "ok" and act.detail["ttl_s"] == 60.0 and svc.result_cache.enabled

    def raw(key, max_tokens=2, **body):
        return client(srv, key).completions.with_raw_response.create(model="smollm2", prompt="Hello there",
                                                                     max_tokens=max_tokens, **body)
    first = raw(USER, temperature=0)
    again = raw(USER, temperature=0)
    assert first.headers.get("x-vnpu-cache") is None and again.headers.get("x-vnpu-cache") == "hit"
    assert again.parse().model_dump() == first.parse().model_dump()      # the same answer, its id included
    other = raw(OTHER, temperature=0)                         # another tenant: never the first one's entry
    assert other.headers.get("x-vnpu-cache") is None and other.parse().id != first.parse().id
    sampled = [raw(USER, temperature=1.0) for _ in range(2)]  # not deterministic: never cached
    assert all(r.headers.get("x-vnpu-cache") is None for r in sampled)
    seeded = [raw(USER, temperature=1.0, seed=7) for _ in range(2)]
    assert seeded[1].headers.get("x-vnpu-cache") == "hit"
    assert raw(USER, temperature=0, max_tokens=3).headers.get("x-vnpu-cache") is None   # another request
    clk.t += 61.0                                             # past the TTL
    assert raw(USER, temperature=0).headers.get("x-vnpu-cache") is None
    tick_for(sampler, clk, 1)                                 # the requests above: whatever their latency
    svc.observe("ok", 0.01)
    tick_for(sampler, clk, 1)                                 # latency down: released, cache off and empty
    (rec,) = policy_events(hist, t0, "recovery")
    assert "result cache off" in rec.diagnosis and not svc.result_cache.enabled
    assert raw(USER, temperature=0).headers.get("x-vnpu-cache") is None


# ---------------------------------------------------------------------------------------------- recovery
class _OnRestore:
    """An observer that injects ``fault`` on device ``i`` once an engine has moved back there (the warm-up
    then runs into it)."""

    def __init__(self, rt, i: int, history):
        self.rt, self.i, self.history, self.armed = rt, i, history, True

    def engine_event(self, ev: dict) -> None:
        if self.armed and ev.get("kind") == "restore" and ev.get("ok") and ev.get("placement") == f"npu {self.i}":
            self.armed = False
            self.rt.device(self.i).handle.inject_fault("task-fail", count=1)

    def observe(self, *a) -> None:
        pass

    def record(self, *a) -> None:
        pass


def test_guardian_restarts_a_killed_device_and_moves_back_with_hysteresis_and_rollback(env):
    rt, srv, sampler, hist, clk, policy = env
    h = policy(seed_policy(2, "    return_after: 30s\n"), guard=True)     # guardian adds the lost-device trigger
    assert h.engine.spec.recovery.move_back and "guardian_device_lost" in h.state()["triggers"]
    svc, eng = srv.service, srv.service.engines["smollm2"]
    t0 = clk.t
    rt.device(0).handle.inject_fault("kill")
    tick_for(sampler, clk, 1)
    (act,) = [a for a in policy_events(hist, t0, "action") if a.trigger == "guardian_device_lost"]
    assert act.result == "ok" and act.detail["engines_moved"] == {"smollm2": "npu 1"}
    assert eng.index == 1 and ask(srv).choices[0].finish_reason == "length"
    tick_for(sampler, clk, 20)
    rt.device(0).handle.inject_fault("ecc", offset=0, length=64)  # Alarm: the deep check fails, the wait restarts
    tick_for(sampler, clk, 1)
    rt.device(0).handle.clear_fault("ecc")
    tick_for(sampler, clk, 25)
    assert eng.index == 1 and policy_events(hist, t0, "recovery") == []     # 25 s of passing < 30 s
    watcher = _OnRestore(rt, 0, hist)
    svc.observers.append(watcher)
    try:
        tick_for(sampler, clk, 6)                              # 30 s passed: back, the warm-up fails: rolled back
    finally:
        svc.observers.remove(watcher)
    assert not watcher.armed
    (failed,) = policy_events(hist, t0, "recovery")
    assert failed.result.startswith("failed:") and "rolled back (smollm2 -> npu 1)" in failed.result
    assert "warm-up request 1/10" in failed.result and eng.index == 1
    tick_for(sampler, clk, 31)                                 # passes again for 30 s: back for good
    rec = [e for e in policy_events(hist, t0, "recovery") if e.result == "ok"]
    assert len(rec) == 1 and "moved back: smollm2 -> npu 0; smollm2: 10 warm-up request(s) served" in rec[0].diagnosis
    assert eng.index == 0 and h.ctx.spares == set() and ask(srv).choices[0].finish_reason == "length"


def test_deep_health_runs_work_on_every_device_and_model(env):
    rt, srv, sampler, hist, clk, policy = env
    st, body = call(srv.url, "/health?deep=true", None, timeout=120.0)
    assert st == 200 and body["deep"] is True
    assert set(body["devices"]) == {"0", "1", "2"} and all(d["ok"] for d in body["devices"].values())
    assert body["models"]["smollm2"] == {"ok": True, "detail": "smollm2 serves on npu 0"}
    assert call(srv.url, "/health", None)[1] == {"status": "ok"}       # shallow: no work
    st, err = call(srv.url, "/health?deep=maybe", None)
    assert st == 400 and "deep" in str(err), err
    rt.device(1).handle.inject_fault("task-fail", count=1)             # the tiny add fails there
    st, body = call(srv.url, "/health?deep=true", None, timeout=120.0)
    assert st == 503 and body["status"] == "degraded"
    assert not body["devices"]["1"]["ok"] and "tiny add failed" in body["devices"]["1"]["detail"]
    assert body["devices"]["0"]["ok"] and body["models"]["smollm2"]["ok"]


# ---------------------------------------------------------------------------------------------- alerts, CLI
def test_alerts_reach_slack_as_text(env):
    rt, srv, sampler, hist, clk, policy = env
    from runtime.cli.serve import healing_of
    rx = Receiver()
    try:
        a = argparse.Namespace(alert_channel=["slack:#runtime-guard"], alert_webhook_url=rx.url, guardian_mode=True)
        sh = healing_of(a, parse_config(seed_policy(4), "runtime_config.yaml").self_healing)
        assert [(x.kind, x.channel) for x in sh.alerts] == [("slack", "#runtime-guard")] and sh.enabled
        assert sh.recovery.move_back and [t.name for t in sh.triggers][-1] == "guardian_device_lost"
        h = SelfHealing(srv.service, sh, hist, sampler, rt, adjust=lambda s: healing_of(a, s))
        try:
            _hot(rt.device(2), 82.0)
            tick_for(sampler, clk, 1)
            with rx.cv:
                assert rx.cv.wait_for(lambda: len(rx.bodies) >= 1, 10)
        finally:
            h.close()
    finally:
        rx.close()
    plain = parse_config("self_healing: {enabled: false}\n").self_healing
    h.update(plain)                                            # a reconfigure keeps what the command line added
    assert h.engine.spec.enabled and h.state()["triggers"] == ["guardian_device_lost"]
    assert [(x.kind, x.url) for x in h.engine.spec.alerts] == [("slack", rx.url)]
    (body,) = rx.bodies
    assert set(body) == {"text", "channel"} and body["channel"] == "#runtime-guard"
    assert body["text"].startswith("[warning] vnpu: device_temperature_throttle_requests_by (value 8")
    assert "throttle: device_temperature_c on npu:2" in body["text"] and body["text"].endswith("(ok)")
    assert rx.content_types == ["application/json"]


@pytest.mark.parametrize("args, words", [
    (["--alert-channel", "slack:#runtime-guard"], "a Slack channel needs its incoming-webhook URL"),
    (["--alert-channel", "slack:runtime-guard", "--alert-webhook-url", "http://127.0.0.1:9/x"],
     "expected slack:#channel"),
    (["--alert-channel", "pager:ops"], "expected slack:#channel, webhook:URL, file:PATH or log"),
    (["--guardian-mode", "maybe"], "expected true or false"),
])
def test_bad_alert_channels_and_guardian_flags_exit_2_with_one_line(args, words, tripwires, capsys, monkeypatch):
    """In-process, with tripwires: refused before any device or cluster starts."""
    monkeypatch.delenv("VNPU_SLACK_WEBHOOK_URL", raising=False)
    rc, out, err = cli(["serve", "--model", "smollm2", "--port", "0", *args], capsys)
    assert rc == 2 and out == "", err
    assert err.count("\n") == 1 and words in err
