"""Self-healing end to end on a live server (serve tier, budget ~60 s on 2 cores): SmolLM2 on device 0 with
the chain 0 -> 1 -> cpu, served on loopback and driven by the official ``openai`` client; real device
faults (``overheat``, ``task-fail``, ``kill``); the sampler ticks on an injected clock, so minutes of
policy run in seconds (no sleeps).  Each test builds its own policy (a ``self_healing`` YAML section).

- overheat -> throttle (admission 0.5, requests still served) -> released after its hold once the window
  is cool; alerts reach a real webhook receiver on loopback and a JSON-lines file;
- task-fail bursts -> error rate over the window -> fallback to device 1 (probe passes) -> restored when the
  error rate stays low;
- a fallback whose health check fails (the fallback device fails its probe) is rolled back;
- device kill -> restart_device: the engine is moved off it, the device restarted, health-checked, warmed,
  kept as a spare; the engine goes back to it on ``restore`` and serves;
- hysteresis: a temperature wandering 84/86 around an 85 trigger fires once and is not released; wide
  swings with no hold are caught by the flapping guard (held, one alert), max actions per hour suppresses;
- fragmentation -> defragment (the memory pool's live defragmentation) while requests are served;
- scale_out on an in-process server: ``unavailable``, said clearly.
"""
from __future__ import annotations

import json
import threading

import numpy as np
import openai
import pytest

from devices.device import DeviceConfig
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.observe.metrics_store import History
from runtime.serve.config import model_spec, parse_config
from runtime.serve.engine import EngineConfig
from runtime.serve.engine.placement import Placement
from runtime.serve.heal import SelfHealing
from runtime.serve.metrics_sampler import Sampler
from runtime.serve.server import Server, Service
from runtime.serve.tenants import Tenant, key_digest
from serve_http import call, openai_client
from webhook_receiver import Receiver

pytestmark = pytest.mark.serve

ADMIN, USER = "sk-ops-0123456789", "sk-app-0123456789"


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    rt = Runtime(LocalBackend(3, DeviceConfig(arena_bytes=1 << 30)))
    spec = model_spec("smollm2", (0,), 1, EngineConfig(max_num_seqs=2, max_num_batched_tokens=32, max_model_len=64,
                                                       num_gpu_blocks_override=16),
                      fallback=(Placement((1,)), Placement(cpu=True)))
    svc = Service(rt, (spec,), (Tenant("ops", (key_digest(ADMIN),), admin=True), Tenant("app", (key_digest(USER),))))
    clk = Clock(50_000.0)
    hist = History(tmp_path_factory.mktemp("hist") / "history.sqlite", clock=clk)
    sampler = Sampler(svc, hist, rt, clock=clk)
    srv = Server(svc).start()
    try:
        svc.load()
        yield rt, srv, sampler, hist, clk
    finally:
        srv.stop()
        hist.close()
        rt.close()


@pytest.fixture
def env(served):
    """The served stack, its clock moved a day on (a fresh stretch of history), and a policy factory."""
    rt, srv, sampler, hist, clk = served
    clk.t += 86400.0
    made = []

    def policy(yaml_text: str, slo: str = "") -> SelfHealing:
        cfg = parse_config(slo + "self_healing:\n" + yaml_text)
        h = SelfHealing(srv.service, cfg.self_healing, hist, sampler, rt)
        made.append(h)
        return h
    yield rt, srv, sampler, hist, clk, policy
    for h in made:
        h.close()
    for i in range(rt.device_count()):
        if not rt.device(i).is_lost:
            rt.device(i).handle.clear_fault()
    eng = srv.service.engines["smollm2"]
    if eng.index != 0:
        srv.service.restore("smollm2")
    srv.service.throttle(1.0)


def tick_for(sampler, clk, seconds: int, every=None):
    """Tick once a second for ``seconds`` (``every(k)`` before tick k)."""
    for k in range(seconds):
        if every is not None:
            every(k)
        clk.t += 1.0
        sampler.tick(clk.t)


def ask(srv, key=USER, max_tokens=3):
    return openai_client(srv.url, key).completions.create(model="smollm2", prompt="Hello there", max_tokens=max_tokens,
                                                          temperature=0)


def since(hist, t0, kinds):
    return [e for e in hist.events(since=t0, kinds=kinds)]


def released(hist, t0):
    """The policy's releases (recovery events of the sampler -- a device healthy again -- left out)."""
    return [e for e in since(hist, t0, ["recovery"]) if e.source == "policy"]


def test_overheat_throttles_then_restores_and_alerts_reach_a_webhook(env, tmp_path):
    rt, srv, sampler, hist, clk, policy = env
    rx = Receiver()
    try:
        policy(f"""
  triggers:
    - {{name: thermal, metric: device_temperature_c, condition: "> 85", window: 10s, action: throttle,
       params: {{by: 50%, for: 30s}}}}
  alerts: [{{kind: log}}, {{kind: file, path: "{tmp_path / 'alerts.jsonl'}"}}, {{kind: webhook, url: "{rx.url}"}}]
""")
        t0 = clk.t
        rt.device(0).handle.inject_fault("overheat", celsius=60)
        onset = clk.t + 1
        tick_for(sampler, clk, 9)                                # 9 samples: the 10 s window is not covered yet
        assert srv.service.quotas.admission == 1.0
        tick_for(sampler, clk, 2)
        assert srv.service.quotas.admission == 0.5
        assert srv.service.engines["smollm2"].throttle == 0.5
        assert ask(srv).choices[0].finish_reason == "length"     # still served while throttled
        (trig,) = since(hist, t0, ["trigger"])
        (act,) = since(hist, t0, ["action"])
        assert (trig.trigger, act.trigger, act.result) == ("thermal", "thermal", "ok")
        assert act.value > 85 and act.detail["scope"] == "npu:0" and "device_temperature_c on npu:0" in act.diagnosis
        assert act.duration_s >= clk.t - onset                   # detection (first hot sample) to recovery
        rt.device(0).handle.clear_fault("overheat")
        tick_for(sampler, clk, 25)                               # cool, but the throttle holds for 30 s
        assert srv.service.quotas.admission == 0.5
        tick_for(sampler, clk, 10)
        assert srv.service.quotas.admission == 1.0 and srv.service.engines["smollm2"].throttle == 1.0
        (rec,) = released(hist, t0)
        assert rec.result == "ok" and "admission back to 1" in rec.diagnosis
        assert rec.duration_s >= 30
        with rx.cv:
            assert rx.cv.wait_for(lambda: len(rx.bodies) >= 2, 10)
        assert [b["action"] for b in rx.bodies] == ["throttle", "release"]
        assert rx.bodies[0]["trigger"] == "thermal" and rx.bodies[0]["result"] == "ok" and rx.bodies[0]["value"] > 85
        lines = [json.loads(x) for x in (tmp_path / "alerts.jsonl").read_text().splitlines()]
        assert [x["action"] for x in lines] == ["throttle", "release"]
        alerts = since(hist, t0, ["alert"])
        assert all(set(a.detail["sinks"].values()) == {"ok"} for a in alerts) and len(alerts) == 2
    finally:
        rx.close()


def fail_requests(srv, n):
    for _ in range(n):
        with pytest.raises(openai.InternalServerError):
            ask(srv)


def test_task_fail_bursts_fall_back_then_restore(env):
    rt, srv, sampler, hist, clk, policy = env
    policy("""
  triggers:
    - {name: errors, metric: error_rate, condition: "> 20%", window: 3s, action: fallback}
  recovery: {cooldown: 0s}
""")
    eng = srv.service.engines["smollm2"]
    t0 = clk.t
    rt.device(0).handle.inject_fault("task-fail", count=3)
    tick_for(sampler, clk, 4, every=lambda k: fail_requests(srv, 1) if k < 3 else ask(srv))
    assert eng.index == 1                                        # fell back to device 1
    (act,) = since(hist, t0, ["action"])
    assert act.result == "ok" and act.value > 0.2 and "npu 1" in act.detail["summary"]
    assert "smollm2 ok" in act.detail["health_check"]
    tick_for(sampler, clk, 4, every=lambda k: ask(srv))          # no errors over the window: released
    assert eng.index == 0
    (rec,) = released(hist, t0)
    assert rec.result == "ok" and "restored smollm2 -> npu 0" in rec.diagnosis
    assert ask(srv).choices[0].finish_reason == "length"


def test_a_fallback_that_fails_its_health_check_is_rolled_back(env):
    rt, srv, sampler, hist, clk, policy = env
    policy("""
  triggers:
    - {name: errors, metric: error_rate, condition: "> 20%", window: 2s, action: fallback}
  recovery: {health_check: true, rollback_on_failure: true}
""")
    eng = srv.service.engines["smollm2"]
    t0 = clk.t
    rt.device(0).handle.inject_fault("task-fail", count=2)
    rt.device(1).handle.inject_fault("task-fail", count=1)       # the fallback fails its probe
    tick_for(sampler, clk, 3, every=lambda k: fail_requests(srv, 1) if k < 2 else ask(srv))
    (act,) = since(hist, t0, ["action"])
    assert act.result.startswith("failed: health check: smollm2: probe failed on npu 1")
    assert "rolled back (restored smollm2 -> npu 0)" in act.result
    assert eng.index == 0 and ask(srv).choices[0].finish_reason == "length"


def test_a_killed_device_is_restarted_warmed_and_returned_as_a_spare(env):
    rt, srv, sampler, hist, clk, policy = env
    h = policy("""
  triggers:
    - {name: dead, metric: device_health, condition: "== lost", action: restart_device}
  recovery: {warmup_requests: 3}
""")
    eng = srv.service.engines["smollm2"]
    t0 = clk.t
    old = rt.device(0)
    old.handle.inject_fault("kill")
    assert old.is_lost
    tick_for(sampler, clk, 1)
    (fault,) = [e for e in since(hist, t0, ["fault"]) if e.source == "npu:0"]
    assert "device 0 is Lost" in fault.diagnosis
    (moved,) = [e for e in since(hist, t0, ["fault"]) if e.source == "engine" and "moved" in e.diagnosis]
    assert "device 0 is lost" in moved.diagnosis and "to npu 1" in moved.diagnosis and moved.result == "ok"
    (act,) = since(hist, t0, ["action"])
    assert act.result == "ok", act.result
    assert act.detail["device"] == 0 and act.detail["warmup_runs"] == 3 and act.detail["spares"] == [0]
    assert act.detail["engines_moved"] == {"smollm2": "npu 1"} and act.duration_s is not None
    assert h.ctx.spares == {0}
    assert srv.service.state_dict()["self_healing"] == {"enabled": True, "triggers": ["dead"], "active": {},
                                                        "spares": [0]}
    new = rt.device(0)
    assert new is not old and not new.is_lost and new.health()[0] == "OK"
    assert eng.index == 1 and ask(srv).choices[0].finish_reason == "length"     # served by the fallback
    srv.service.restore("smollm2")                               # the spare takes the model back
    assert eng.index == 0 and ask(srv).choices[0].finish_reason == "length"
    tick_for(sampler, clk, 2)                                    # healthy again: no second action
    assert len(since(hist, t0, ["action"])) == 1


def test_restart_after_the_engine_moved_itself_does_not_move_it_again(env):
    """The engine sees the loss first (a request's step) and re-binds to npu 1 by itself; the policy's
    restart_device, which then acts on device 0, must not push the engine one more step down its chain
    (to the CPU) -- it is already off device 0 (the cause of a spurious "npu 4 -> cpu (device 2 is lost)"
    re-bind in a stress run: the action read the placement before the engine's own re-bind)."""
    rt, srv, sampler, hist, clk, policy = env
    policy("""
  triggers:
    - {name: dead, metric: device_health, condition: "== lost", action: restart_device}
  recovery: {warmup_requests: 1}
""")
    eng = srv.service.engines["smollm2"]
    t0 = clk.t
    rt.device(0).handle.inject_fault("kill")
    assert ask(srv).choices[0].finish_reason == "length"            # the engine's own re-bind served it
    assert eng.index == 1
    tick_for(sampler, clk, 1)
    (act,) = since(hist, t0, ["action"])
    assert act.result == "ok", act.result
    assert act.detail["engines_moved"] == {} and eng.index == 1
    # the race itself: an action that read the placement (npu 0) just before the engine's own re-bind
    # asks for the move afterwards -- decided on the engine thread: nothing moves
    n = eng.rebinds
    res = srv.service.fallback("smollm2", "automatic: device 0 is lost", away_from=0)
    assert not res.moved and res.reason == "already off device 0" and res.placement == "npu 1"
    assert eng.index == 1 and eng.rebinds == n
    assert ask(srv).choices[0].finish_reason == "length"
    res = srv.service.fallback("smollm2", "requested", away_from=1)   # still on 1: moves (to the CPU)
    assert res.moved and eng.placement.cpu


def _pin_temperature(dev, celsius_wanted: float, base: float) -> None:
    dev.handle.inject_fault("overheat", celsius=max(0.0, celsius_wanted - base))


def test_approaching_a_threshold_is_a_risk_event_once(env):
    rt, srv, sampler, hist, clk, policy = env
    dev = rt.device(2)
    dev.handle.inject_fault("overheat", celsius=50)
    base = dev.telemetry()["temperature_c"] - 50
    policy("""
  triggers:
    - {name: thermal, metric: device_temperature_c, condition: "> 85", action: throttle, aggregate: last}
""")
    t0 = clk.t
    tick_for(sampler, clk, 3, every=lambda k: _pin_temperature(dev, 80.0, base))
    (risk,) = since(hist, t0, ["risk"])
    assert risk.detail["scope"] == "npu:2" and risk.value == pytest.approx(80.0, abs=0.2)
    assert "device_temperature_c on npu:2 reached 80" in risk.diagnosis and "0.94 of the 85 threshold" in risk.diagnosis
    tick_for(sampler, clk, 1, every=lambda k: _pin_temperature(dev, 60.0, base))     # below the release: re-armed
    tick_for(sampler, clk, 1, every=lambda k: _pin_temperature(dev, 81.0, base))
    assert len(since(hist, t0, ["risk"])) == 2 and since(hist, t0, ["action"]) == []


def test_oscillation_around_the_threshold_does_not_flap(env):
    rt, srv, sampler, hist, clk, policy = env
    dev = rt.device(2)
    dev.handle.inject_fault("overheat", celsius=50)
    base = dev.telemetry()["temperature_c"] - 50                 # the overheat fault sets the die at once
    policy("""
  triggers:
    - {name: thermal, metric: device_temperature_c, condition: "> 85", action: throttle, aggregate: last,
       params: {by: 10%, for: 0s}}
  hysteresis: 10%
  recovery: {cooldown: 0s}
""")
    t0 = clk.t
    tick_for(sampler, clk, 12, every=lambda k: _pin_temperature(dev, 86.0 if k % 2 else 84.0, base))
    acts = since(hist, t0, ["action"])
    assert len(acts) == 1 and acts[0].detail["scope"] == "npu:2"  # fired once, not released at 84 (> 76.5)
    assert released(hist, t0) == []
    assert srv.service.quotas.admission == pytest.approx(0.9)


def test_wide_swings_are_held_by_the_flapping_guard_and_the_hourly_cap(env):
    rt, srv, sampler, hist, clk, policy = env
    dev = rt.device(2)
    policy("""
  triggers:
    - {name: thermal, metric: device_temperature_c, condition: "> 85", action: throttle, aggregate: last,
       params: {by: 10%, for: 0s}}
  recovery: {cooldown: 0s}
  flapping: {window: 1m, max_fires: 3, hold: 10m}
""")
    t0 = clk.t

    def swing(k):
        if k % 2 == 0:
            dev.handle.inject_fault("overheat", celsius=70)
        else:
            dev.handle.clear_fault("overheat")
    tick_for(sampler, clk, 12, every=swing)
    assert len(since(hist, t0, ["action"])) == 3                 # fire, release, x3, then held
    assert len(released(hist, t0)) == 3
    held = [a for a in since(hist, t0, ["alert"]) if a.detail.get("flapping")]
    assert len(held) == 1 and "flapping" in held[0].diagnosis and held[0].result == "held"
    assert srv.service.quotas.admission == 1.0
    t1 = clk.t
    policy("""
  triggers:
    - {name: thermal2, metric: device_temperature_c, condition: "> 85", action: throttle, aggregate: last,
       params: {by: 10%, for: 0s}}
  recovery: {cooldown: 0s}
  max_actions_per_hour: 2
  flapping: {max_fires: 100}
""")
    tick_for(sampler, clk, 12, every=swing)
    acts = [a for a in since(hist, t1, ["action"]) if a.trigger == "thermal2"]
    assert len(acts) == 2
    sup = [a for a in since(hist, t1, ["alert"]) if a.result == "suppressed"]
    assert len(sup) >= 1 and "max 2" in sup[0].diagnosis


def test_unavailable_actions_say_why(env):
    rt, srv, sampler, hist, clk, policy = env
    policy("""
  triggers:
    - {name: slow, metric: p99_latency_ms, condition: "> 2 * slo.target_p99_ms", action: scale_out,
       params: {replicas: +1}}
""", slo="slo: {target_p99_ms: 0.001}\n")
    t0 = clk.t
    ask(srv)
    tick_for(sampler, clk, 1)
    acts = {a.trigger: a for a in since(hist, t0, ["action"])}
    assert acts["slow"].result.startswith("unavailable: this server runs its engines in-process")
    assert acts["slow"].value > 0.002


def test_fragmentation_defragments_while_serving(env):
    """Fragmentation -> defragment: 12 MiB tensors fill device 0's free HBM below SmolLM2's weights, every
    other one is freed and the pool's cache emptied (holes all over the arena: hbm_fragmentation well
    above the 0.7 trigger); once the whole window is above it (aggregate min), the policy runs the pool's live defragmentation
    while a request is in flight: the event reports the bytes moved and the fragmentation before/after,
    the sampled fragmentation drops below the trigger, the kept tensors hold their values, and the
    server answers the in-flight and later requests exactly as before (greedy)."""
    rt, srv, sampler, hist, clk, policy = env
    policy("""
  triggers:
    - {name: frag, metric: hbm_fragmentation, condition: "> 0.7", window: 3s, aggregate: min,
       action: defragment}
""")
    dev = rt.device(0)
    before = ask(srv, max_tokens=8).choices[0].text
    tick_for(sampler, clk, 1)
    assert sampler.history.latest("npu:0")["pool_fragmentation"][1] >= 0.0
    size = 12 << 20
    free = dev.mem_info()[0]
    ts = [dev.from_numpy(np.full(size // 4, k, np.float32)) for k in range(free // size - 2)]
    kept = ts[1::2]
    try:
        for t in ts[0::2]:
            t.free()
        dev.empty_cache()
        frag0 = dev.telemetry()["fragmentation"]
        assert frag0 > 0.7
        t0 = clk.t
        tick_for(sampler, clk, 3)                                     # the window still has a cold sample
        assert since(hist, t0, ["action"]) == []
        result: dict = {}
        th = threading.Thread(target=lambda: result.setdefault("text", ask(srv, max_tokens=8).choices[0].text))
        th.start()
        tick_for(sampler, clk, 1)
        th.join(120)
        acts = since(hist, t0, ["action"])
        assert len(acts) == 1 and acts[0].trigger == "frag" and acts[0].result == "ok", acts
        d = acts[0].detail
        assert acts[0].value > 0.7 and d["bytes_moved"] >= size and d["pause_s"] > 0
        b, a = d["fragmentation"]["npu:0"]
        assert b == pytest.approx(frag0) and a < 0.7 and a < b
        assert "fragmentation" in d["summary"] and "ok" in d["health_check"]
        tick_for(sampler, clk, 1)
        assert hist.latest("npu:0")["hbm_fragmentation"][1] == pytest.approx(dev.telemetry()["fragmentation"])
        assert hist.latest("npu:0")["hbm_fragmentation"][1] < 0.7
        for k, t in zip(range(1, len(ts), 2), kept):
            assert np.all(t.numpy() == k)
        assert result.get("text") == before
        assert ask(srv, max_tokens=8).choices[0].text == before
        tick_for(sampler, clk, 4)
        assert len(since(hist, t0, ["action"])) == 1                 # below the trigger: nothing more to do
    finally:
        for t in kept:
            t.free()
        dev.empty_cache()


# ---------------------------------------------------------------------------------------------- reconfigure
CONFIG = f"""
models:
  - model: smollm2@0
    fallback: [1, cpu]
    engine: {{max_num_seqs: 2, max_num_batched_tokens: 32, max_model_len: 64, num_gpu_blocks_override: 16}}
tenants:
  - {{name: ops, api_keys: [{ADMIN}], admin: true}}
  - {{name: app, api_keys: [{USER}]}}
"""


def post(srv, path, body, key=ADMIN):
    return call(srv.url, path, key, body)


@pytest.fixture
def reconf(env):
    from runtime.serve.reconfigure import Reconfigurer
    rt, srv, sampler, hist, clk, policy = env
    rc = Reconfigurer(srv.service, parse_config(CONFIG), CONFIG, None, hist)
    yield rc
    srv.service.reconfigurer = None
    srv.service.set_mode("smollm2", parse_config(CONFIG).models[0].engine.mode)


def test_reconfigure_applies_mid_stream_without_dropping_it_and_is_a_manual_intervention(env, reconf):
    rt, srv, sampler, hist, clk, policy = env
    eng = srv.service.engines["smollm2"]
    assert eng.config.mode.mode == "conservative"
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key=USER, max_retries=0)
    s = c.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=12, temperature=0, stream=True,
                             extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
    chunks, answer = 0, None
    for ch in s:
        if ch.choices:
            chunks += 1
        if chunks == 1 and answer is None:                      # mid-stream
            answer = post(srv, "/admin/reconfigure", {"set": ["models.smollm2.scheduler.mode=ultra_low_latency",
                                                              "models.smollm2.scheduler.low_latency_batch=1"]})
        if ch.usage is not None:
            assert ch.usage.completion_tokens == 12             # every token of the stream arrived
    st, body = answer
    assert st == 200 and body["result"] == "ok", body
    assert eng.config.mode.mode == "ultra_low_latency" and eng.config.mode.low_latency_batch == 1
    ev = hist.event(body["event_id"])
    assert (ev.kind, ev.manual, ev.source, ev.result) == ("config", True, "admin ops", "ok")
    assert "mode 'conservative' -> 'ultra_low_latency'" in ev.diagnosis
    assert post(srv, "/admin/reconfigure", {"set": ["slo.target_p99_ms=1"]}, key=USER)[0] == 403
    assert reconf.rollback("operator").startswith("rolled back: smollm2 scheduler")
    assert eng.config.mode.mode == "conservative"


def get(srv, path, key=ADMIN):
    return call(srv.url, path, key, timeout=60.0)


def test_admin_state_has_the_running_slo(env, reconf):
    """``/admin/state`` carries the server's ``slo`` (what stress-test and postmortem hold it to), and a
    reconfigured one from then on."""
    rt, srv, sampler, hist, clk, policy = env
    st, body = get(srv, "/admin/state")
    assert st == 200 and body["slo"] == {"target_p99_ms": None, "availability": None}
    st, ans = post(srv, "/admin/reconfigure", {"set": ["slo.target_p99_ms=750", "slo.availability=99.5%"]})
    assert st == 200 and ans["result"] == "ok", ans
    body = get(srv, "/admin/state")[1]
    assert body["slo"]["target_p99_ms"] == 750 and body["slo"]["availability"] == pytest.approx(0.995)
    assert hist.event(ans["event_id"]).detail["slo"] == body["slo"]     # postmortem judges from here on by it
    reconf.rollback("operator")
    assert get(srv, "/admin/state")[1]["slo"]["target_p99_ms"] is None
    assert hist.events(kinds=["config"])[-1].detail["slo"] == {"target_p99_ms": None, "availability": None}


def test_reconfigure_refuses_bad_or_restart_only_changes_and_rolls_back_a_failed_health_check(env, reconf):
    rt, srv, sampler, hist, clk, policy = env
    eng = srv.service.engines["smollm2"]
    n0 = len(hist.events(kinds=["config"]))
    for body, words in (({"set": ["models.smollm2.scheduler.mode=fastest"]}, "scheduler"),
                        ({"set": ["models.smollm2.engine.max_num_seqs=4"]}, "max_num_seqs 4 is above the 2 the engine "
                                                                            "was built with; that needs a restart"),
                        ({"set": ["models.smollm2.engine.max_model_len=128"]},
                         "engine.max_model_len cannot change without a restart"),
                        ({"set": ["models.llama.engine.max_num_seqs=4"]}, "no item named 'llama'"),
                        ({"set": ["nonsense"]}, "expected key=value"),
                        ({"config": "models: [minilm-l6]"}, "the models served cannot change"),
                        ({"config": "server: {port: 1}"}, "server.port cannot change")):
        st, err = post(srv, "/admin/reconfigure", body)
        assert st == 400 and words in err["error"]["message"], err
    assert eng.config.mode.mode == "conservative" and len(hist.events(kinds=["config"])) == n0   # nothing changed
    rt.device(0).handle.inject_fault("task-fail", count=1)     # the new config's probe fails
    st, body = post(srv, "/admin/reconfigure", {"set": ["models.smollm2.scheduler.mode=ultra_low_latency"]})
    assert st == 200 and body["result"].startswith("failed: health check: smollm2: probe failed") and \
        body["result"].endswith("rolled back")
    assert eng.config.mode.mode == "conservative"
    assert hist.event(body["event_id"]).result == body["result"]
    assert ask(srv).choices[0].finish_reason == "length"


def test_reconfigure_changes_engine_limits_live_with_requests_in_flight(env, reconf):
    """``engine.max_num_seqs`` / ``max_num_batched_tokens`` / ``max_queued_requests`` / ``scheduling_policy``
    change between two steps while a stream runs: every token of it arrives, requests queued under the
    narrower batch complete with the same text, and the change is a manual intervention in the history."""
    rt, srv, sampler, hist, clk, policy = env
    eng = srv.service.engines["smollm2"]
    want = ask(srv, max_tokens=4).choices[0].text
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key=USER, max_retries=0)
    s = c.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=12, temperature=0, stream=True,
                             extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
    chunks, answer = 0, None
    for ch in s:
        if ch.choices:
            chunks += 1
        if chunks == 1 and answer is None:                      # mid-stream
            answer = post(srv, "/admin/reconfigure", {"set": ["models.smollm2.engine.max_num_seqs=1",
                                                              "models.smollm2.engine.max_num_batched_tokens=16",
                                                              "models.smollm2.engine.max_queued_requests=8",
                                                              "models.smollm2.engine.scheduling_policy=priority"]})
        if ch.usage is not None:
            assert ch.usage.completion_tokens == 12             # every token of the stream arrived
    st, body = answer
    assert st == 200 and body["result"] == "ok", body
    c = eng.config
    assert (c.max_num_seqs, c.max_num_batched_tokens, c.max_queued_requests, c.scheduling_policy) == \
        (1, 16, 8, "priority") and c.mode.mode == "conservative"
    assert eng.current_limits().max_num_seqs == 1
    out: list = []
    threads = [threading.Thread(target=lambda: out.append(ask(srv, max_tokens=4).choices[0].text)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [want] * 3                                    # one at a time now, none dropped, same text
    ev = hist.event(body["event_id"])
    assert ev.manual and "smollm2 engine: max_num_seqs 2 -> 1, max_num_batched_tokens 32 -> 16" in ev.diagnosis
    reconf.rollback("operator")
    assert (eng.config.max_num_seqs, eng.config.scheduling_policy) == (2, "fcfs")


def test_throttles_of_two_hot_devices_compose(env):
    rt, srv, sampler, hist, clk, policy = env
    policy("""
  triggers:
    - {name: thermal, metric: device_temperature_c, condition: "> 85", action: throttle, aggregate: last,
       params: {by: 50%, for: 0s}}
  recovery: {cooldown: 0s}
""")
    t0 = clk.t
    rt.device(1).handle.inject_fault("overheat", celsius=70)
    rt.device(2).handle.inject_fault("overheat", celsius=70)
    tick_for(sampler, clk, 1)
    assert len(since(hist, t0, ["action"])) == 2 and srv.service.quotas.admission == 0.5
    rt.device(1).handle.clear_fault("overheat")
    tick_for(sampler, clk, 1)
    (rec,) = released(hist, t0)
    assert "npu:1" in rec.diagnosis and "admission back to 0.5" in rec.diagnosis     # device 2 is still hot
    assert srv.service.quotas.admission == 0.5
    rt.device(2).handle.clear_fault("overheat")
    tick_for(sampler, clk, 1)
    assert srv.service.quotas.admission == 1.0 and len(released(hist, t0)) == 2


def test_closing_a_service_whose_device_was_killed_closes_the_rest(tmp_path):
    """SIGTERM after a device kill: the service shuts down what it can -- the encoder whose device is lost
    has nothing left to free there -- without an error (``vnpu serve`` then exits 0 and removes
    server.json); the other device's memory is all given back."""
    rt = Runtime(LocalBackend(2, DeviceConfig(arena_bytes=256 << 20)))
    try:
        svc = Service(rt, (model_spec("minilm-l3", (1,), None), model_spec("minilm-l6", (0,), None)))
        svc.load()
        rt.device(1).handle.inject_fault("kill")
        assert rt.device(1).is_lost
        svc.close()                                                   # no error raised
        assert svc.state == "stopped" and svc.engines == {}
        free, total = rt.device(0).mem_info()
        assert free == total
    finally:
        rt.close()
