"""vnpu stress-test: rate profiles and arrivals (pure), the open loop on an injectable clock, and a real
run: a 5-minute profile on a 60x clock against a real server (real HTTP, in-process devices) with faults
from the chaos injector, checked by the independent history checker."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.cluster.history_check import check
from runtime.stress.loadgen import OpenLoop, Outcome, ScaledClock
from runtime.stress.profiles import PROFILES, ProfileError, arrivals, builtin, from_doc


# ---------------------------------------------------------------------------------------------- profiles
@pytest.mark.parametrize("name", list(PROFILES))
def test_arrivals_follow_the_rate_curve(name):
    p = builtin(name, 20.0, 600.0)
    even = arrivals(p, poisson=False)
    assert abs(len(even) - p.expected()) <= 1.0
    assert even == sorted(even) and 0 <= even[0] and even[-1] < 600.0
    # in every minute the count follows the integral of the rate
    for k in range(10):
        got = sum(1 for t in even if 60 * k <= t < 60 * (k + 1))
        assert abs(got - p.expected(60 * k, 60 * (k + 1))) <= 1.5, (k, got)
    pois = arrivals(p, seed=3)
    n = p.expected()
    assert abs(len(pois) - n) <= 5 * np.sqrt(n)          # Poisson: within 5 sigma
    assert arrivals(p, seed=3) == pois and arrivals(p, seed=4) != pois


def test_profile_shapes():
    assert builtin("steady", 10, 100).rate(50) == 10
    b = builtin("burst", 40, 120)                         # period 20 s, bursts in its last 2 s
    assert b.rate(5) == 10 and b.rate(19) == 40
    d = builtin("diurnal", 10, 100)
    assert d.rate(0) == pytest.approx(1.0) and d.rate(50) == pytest.approx(10.0)
    s = builtin("spike", 8, 100)
    assert s.rate(10) == 2 and s.rate(47) == 8 and s.rate(60) == 2


def test_yaml_profiles_and_their_errors():
    p = from_doc({"points": [{"at": "0s", "rate": 2}, {"at": "1m", "rate": "50%"}]}, rate=40, duration_s=60)
    assert p.rate(0) == 2 and p.rate(60) == 20 and p.rate(30) == pytest.approx(11)
    st = from_doc({"step": True, "points": [{"at": 0, "rate": 2}, {"at": 30, "rate": 6}]}, 1, 60)
    assert st.rate(29) == 2 and st.rate(31) == 6
    for bad in ({"points": []}, {"points": [{"at": "5s", "rate": 1}]}, [{"at": 0, "rate": -1}],
                [{"at": 0, "rate": 0}], [{"at": 0, "rate": 1}, {"at": "bogus", "rate": 1}], "text"):
        with pytest.raises(ProfileError):
            from_doc(bad, 1, 60)
    with pytest.raises(ProfileError):
        builtin("nope", 1, 1)


# ---------------------------------------------------------------------------------------------- open loop
class FakeClock:
    """Time moves only when the generator waits (no real sleeping)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def wait_until(self, deadline):
        self.t = max(self.t, deadline)


def test_open_loop_sends_at_the_arrivals_whatever_the_server_does():
    clk = FakeClock()
    arr = [0.5 * i for i in range(40)]
    calls = {}

    def send(rid, key):
        calls[rid] = calls.get(rid, 0) + 1
        if rid % 10 == 3:
            return Outcome("shed", 429, error="rate_limit_exceeded")
        if rid % 10 == 5 and calls[rid] == 1:                # a 503 that succeeds on its retry
            return Outcome("retry", 503, error="service_unavailable", server_failure=True)
        if rid % 10 == 7:                                     # never works: given up after 3 tries
            return Outcome("retry", 500, error="boom", server_failure=True)
        return Outcome("ok", 200, digest=f"d{key}", value=key)

    g = OpenLoop(arr, send, lambda rid: str(rid % 4), clock=clk, wait_until=clk.wait_until, workers=4)
    g.run(drain_s=30)
    left = {r.rid: r.dispatched for r in g.records}
    assert [left[i] for i in range(40)] == pytest.approx(arr, abs=1e-9)      # open loop: on schedule
    assert all(r.sent >= r.intended for r in g.records)
    outs = {r.rid: r.outcome for r in g.records}
    assert sum(o == "shed" for o in outs.values()) == 4 and sum(o == "failed" for o in outs.values()) == 4
    assert calls[5] == 2 and calls[7] == 3 and calls[3] == 1                 # sheds are not retried
    res = check(g.history)
    assert res["counts"]["lost"] == 0 and res["counts"]["duplicated"] == 0
    assert res["by_kind"].get("failed") == 8                                 # the shed + the given-up
    r = g.rates()
    assert r["intended"] == r["sent"] == 40 and r["intended_rate"] == pytest.approx(2.0)


def test_unfinished_requests_are_lost_in_the_check():
    import threading
    gate = threading.Event()

    def send(rid, key):
        if rid == 2:
            gate.wait(5)                                      # hangs past the drain
        return Outcome("ok", 200, digest="x")
    clk = FakeClock()
    g = OpenLoop([0.0, 0.1, 0.2, 0.3], send, str, clock=clk, wait_until=clk.wait_until, workers=4)
    g.run(drain_s=0.3)
    gate.set()
    res = check([h for h in g.history])
    assert res["counts"]["lost"] == 1


# ---------------------------------------------------------------------------------------------- real server
ADMIN = "sk-ops-stress-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """MiniLM-L3 on device 0 of two in-process devices, behind the real HTTP server, with the server's own
    sampler (a thread at 5 Hz) recording into its History: the stress test reads it through the
    /admin/history routes."""
    from devices.device import DeviceConfig
    from runtime.api import Runtime
    from runtime.backend import LocalBackend
    from runtime.observe.metrics_store import History
    from runtime.serve.config import model_spec
    from runtime.serve.metrics_sampler import Sampler
    from runtime.serve.server import Server, Service
    from runtime.serve.tenants import Tenant, key_digest
    rt = Runtime(LocalBackend(2, DeviceConfig(arena_bytes=256 << 20)))
    svc = Service(rt, (model_spec("minilm-l3", (0,), None),), (Tenant("ops", (key_digest(ADMIN),), admin=True),))
    hist = History(tmp_path_factory.mktemp("stress") / "history.sqlite")
    sampler = Sampler(svc, hist, rt, interval_s=0.2)
    srv = Server(svc).start()
    try:
        svc.load()
        sampler.start()
        yield rt, srv, hist, sampler
    finally:
        sampler.stop()
        srv.stop()
        hist.close()
        rt.close()


@pytest.mark.serve
def test_a_five_minute_profile_with_faults_runs_in_seconds_against_a_real_server(server):
    """burst, 5 min at 60x (about 5 s), an overheat at +100 s and a slow device at +200 s through the chaos
    injector; the server's events and samples come back through /admin/history."""
    from runtime.observe.source import HttpSource
    from runtime.stress.faults import DeviceInjector
    from runtime.stress.run import StressConfig, run_stress, summary_lines
    rt, srv, hist, _ = server
    clk = ScaledClock(60.0)
    prof = builtin("burst", 0.6, 300.0)
    cfg = StressConfig(url=srv.url, api_key=ADMIN, profile=prof, faults=("overheat", "slow"), every_s=100.0,
                       fault_devices=(0,), distinct_inputs=4, workers=16, target_p99_ms=10_000.0, drain_s=60)
    try:
        rep = run_stress(cfg, DeviceInjector(rt, seed=1), HttpSource(srv.url, ADMIN), clock=clk,
                         wait_until=clk.wait_until)
    finally:
        rt.devices()[0].handle.inject_fault("clear")
    text = "\n".join(summary_lines(rep))
    rq, r = rep["requests"], rep["rates"]
    assert r["intended"] == len(arrivals(prof)) and r["sent"] == r["intended"]
    assert rq["ok"] + rq["shed"] + rq["failed"] + rq["client_errors"] + rq["unfinished"] == rq["sent"]
    assert rq["lost"] == 0 and rq["duplicated"] == 0 and rep["check"]["counts"]["submitted"] == rq["sent"]
    assert rq["ok"] == rq["sent"], text                               # nothing here sheds or fails
    assert rq["differs_from_reference"] == 0                          # embeddings within tolerance
    faults = rep["faults"]
    assert [(f["kind"], f["device"], f["injected"]) for f in faults] == [("overheat", 0, True), ("slow", 0, True)]
    # the server saw the overheat itself (its sampler's fault event on device 0), not the stress test's note
    oh = faults[0]
    assert oh["detected_after_s"] is not None and 0 <= oh["detected_after_s"] < 30, text
    assert "fault" in oh["detected_by"] and "stress-test" not in oh["detected_by"]
    # no self-healing policy on this server: nothing recovered it, and the advice says so
    assert oh["recovered_after_s"] is None and rep["self_healing"] == []
    assert any(x["metric"] == "device_temperature_c" and x["scope"] == "npu:0" and x["peak"] >= 85
               for x in rep["risks"]), rep["risks"]
    assert "temperature on npu:0 reached" in text
    # the stress test's own notes are in the server's history (kind fault, injected_by), not manual
    mine = [e for e in hist.events(kinds=["fault"]) if e.detail.get("injected_by") == "stress-test"]
    assert [e.detail["fault"] for e in mine][-2:] == ["overheat", "slow"] and not any(e.manual for e in mine)
    assert rep["manual_interventions"] == []
    assert rep["capacity_rate"] is not None and rep["capacity_rate"] > 0
    assert "lost 0, duplicated 0" in text


def test_faults_follow_the_schedule_and_skip_lost_victims():
    from runtime.stress.faults import FaultDriver, Scheduled, schedule
    plan = schedule(("kill", "hang", "overheat"), 20.0, 120.0, (0, 1, 2, 3), seed=0)
    assert [(f.at, f.kind) for f in plan] == [(20.0, "kill"), (40.0, "hang"), (60.0, "overheat"), (80.0, "kill"),
                                              (100.0, "hang")]
    assert schedule(("kill",), 20.0, 120.0, (0, 1, 2, 3), seed=0) == schedule(("kill",), 20.0, 120.0, (0, 1, 2, 3))

    class Injector:
        def __init__(self):
            self.lost, self.calls = set(), []

        def alive(self, d):
            return d not in self.lost

        def __call__(self, kind, d):
            self.calls.append((kind, d))
            if kind == "kill":
                self.lost.add(d)
            return {"kind": kind, "device": d, "t": 0.0, "params": {}}

    inj = Injector()
    drv = FaultDriver([Scheduled(1.0, "kill", 0), Scheduled(2.0, "hang", 0), Scheduled(3.0, "ecc", 1)], inj,
                      clock=lambda: 0.0)
    for t in (1.0, 2.0, 3.0):
        drv.on_arrival(t)
        drv.join()
    assert inj.calls == [("kill", 0), ("hang", 1), ("ecc", 1)]        # the lost device 0 is not hit again
    assert [f["device"] for f in drv.fired] == [0, 1, 1]


def test_faults_are_matched_to_the_servers_detection_and_recovery(tmp_path):
    """The report's detection/recovery of each fault comes from the server's events: the first event about
    the device before the next fault (the stress test's own notes do not count), and the first recovery,
    successful action or engine re-bind away from the device."""
    from runtime.observe.metrics_store import History
    from runtime.observe.source import FileSource
    from runtime.stress.run import StressConfig, build_report
    clk = FakeClock()
    g = OpenLoop([0.0, 1.0], lambda rid, key: Outcome("ok", 200, digest="d", value="x"), str, clock=clk,
                 wait_until=clk.wait_until, workers=1)
    g.run(drain_s=5)
    h = History(tmp_path / "h.sqlite")
    w = 1000.0
    h.record_event("fault", ts=w + 0.1, source="stress-test", detail={"device": 2, "injected_by": "stress-test"})
    h.record_event("fault", ts=w + 0.5, source="npu:2", diagnosis="device 2 is Lost", detail={"device": 2})
    h.record_event("fault", ts=w + 3.0, source="engine", diagnosis="smollm2 moved from npu 0-2 to npu 4",
                   result="ok", detail={"kind": "fallback", "ok": True, "previous": "npu 0-2 (tp=3)"})
    h.record_event("fault", ts=w + 20.4, source="npu:0", diagnosis="device 0 is Critical", detail={"device": 0})
    h.record_event("action", ts=w + 22.0, source="policy", trigger="thermal", diagnosis="throttle", result="ok",
                   duration_s=2.5, detail={"scope": "npu:0"})
    h.record_event("fault", ts=w + 45.0, source="npu:1", diagnosis="device 1 is Alarm", detail={"device": 1})
    # a recovery on device 1 after the next fault on device 1 belongs to that fault, not to the hang
    h.record_event("recovery", ts=w + 85.0, source="policy", diagnosis="released", result="ok",
                   detail={"scope": "npu:1"})
    fired = [{"kind": "kill", "device": 2, "at": 20.0, "wall": w, "ok": True},
             {"kind": "overheat", "device": 0, "at": 40.0, "wall": w + 20.0, "ok": True},
             {"kind": "hang", "device": 1, "at": 60.0, "wall": w + 40.0, "ok": True},
             {"kind": "ecc", "device": 3, "at": 80.0, "wall": w + 60.0, "ok": False, "error": "lost"},
             {"kind": "slow", "device": 1, "at": 100.0, "wall": w + 80.0, "ok": True}]
    cfg = StressConfig(url="http://127.0.0.1:9", api_key=None, profile=builtin("steady", 1, 100))
    rep = build_report(cfg, "m", "generate", g, fired, [], {"0": "x", "1": "x"}, FileSource(h), w - 5, w + 70)
    f = {x["kind"]: x for x in rep["faults"]}
    assert f["kill"]["detected_after_s"] == pytest.approx(0.5) and "Lost" in f["kill"]["detected_by"]
    assert f["kill"]["recovered_after_s"] == pytest.approx(3.0) and "moved" in f["kill"]["recovered_by"]
    assert f["overheat"]["detected_after_s"] == pytest.approx(0.4)
    assert f["overheat"]["recovered_after_s"] == pytest.approx(0.4 + 2.5)          # onset + the action's duration
    assert f["hang"]["detected_after_s"] == pytest.approx(5.0) and f["hang"]["recovered_after_s"] is None
    assert f["ecc"]["injected"] is False and f["ecc"]["detected_after_s"] is None
    assert f["slow"]["detected_after_s"] is None                     # the recovery is no detection
    assert [e["id"] for e in rep["self_healing"]] == [5, 7]          # the policy's action and release
    h.close()


def test_a_hang_that_clears_is_recovered_by_the_devices_own_recovery_event(tmp_path):
    """The sampler's ``recovery`` event (source ``npu:<id>``: the device's health back to OK) recovers a hang
    that no policy acted on; it is listed with the fault but is no self-healing action."""
    from runtime.observe.metrics_store import History
    from runtime.observe.source import FileSource
    from runtime.stress.run import StressConfig, build_report
    clk = FakeClock()
    g = OpenLoop([0.0], lambda rid, key: Outcome("ok", 200, digest="d", value="x"), str, clock=clk,
                 wait_until=clk.wait_until, workers=1)
    g.run(drain_s=5)
    h = History(tmp_path / "h.sqlite")
    w = 1000.0
    fid = h.record_event("fault", ts=w + 0.7, source="npu:0", diagnosis="device 0 is Critical: cores hung",
                         detail={"device": 0, "level": "Critical"})
    h.record_event("recovery", ts=w + 2.9, source="npu:0", diagnosis="device 0 is OK again (was Critical)",
                   result="ok", duration_s=2.2, detail={"device": 0, "level": "OK", "fault_event": fid})
    fired = [{"kind": "hang", "device": 0, "at": 40.0, "wall": w, "ok": True}]
    cfg = StressConfig(url="http://127.0.0.1:9", api_key=None, profile=builtin("steady", 1, 100))
    rep = build_report(cfg, "m", "generate", g, fired, [], {"0": "x"}, FileSource(h), w - 5, w + 10)
    (f,) = rep["faults"]
    assert f["detected_after_s"] == pytest.approx(0.7)
    assert f["recovered_after_s"] == pytest.approx(2.9) and "OK again" in f["recovered_by"]
    assert rep["self_healing"] == []
    h.close()


@pytest.mark.serve
def test_the_black_friday_preset_runs_and_postmortem_reads_it_by_name(server, capsys):
    """The article's `stress-test --profile black_friday_2024 --duration 30m` (its rate shape at a small peak,
    30 min on a 600x clock, no faults: this server is in-process) records its run in the server's history as
    the named event; `postmortem --event black_friday_2024 --metrics all` finds the run's window by that
    name and summarises the metrics the server sampled during it."""
    from runtime.cli import main
    from runtime.observe.source import HttpSource
    from runtime.stress.presets import load
    from runtime.stress.run import StressConfig, run_stress
    rt, srv, hist, sampler = server
    prof = load()["black_friday_2024"].profile(rate=0.05, duration_s=1800.0)     # 39 requests
    clk = ScaledClock(600.0)
    cfg = StressConfig(url=srv.url, api_key=ADMIN, profile=prof, distinct_inputs=4, workers=16,
                       target_p99_ms=10_000.0, drain_s=60)
    rep = run_stress(cfg, None, HttpSource(srv.url, ADMIN), clock=clk, wait_until=clk.wait_until)
    assert rep["requests"]["lost"] == 0 and rep["rates"]["sent"] == len(arrivals(prof)) > 0
    marks = [e for e in hist.events(kinds=["lifecycle"]) if e.detail.get("event") == "black_friday_2024"]
    assert [e.detail["phase"] for e in marks][-2:] == ["start", "end"]
    start, end = marks[-2].ts, marks[-1].ts
    sampler.stop()           # the window reaches 60 s past the run: no sample may land between the two reads
    try:
        rc = main(["postmortem", "--history", str(hist.path), "--event", "black_friday_2024", "--metrics", "all",
                   "--json"])
        qps = [v for t, v in hist.samples("qps", start - 60.0, end + 60.0)]
    finally:
        sampler.start()
    out = capsys.readouterr().out
    assert rc == 0
    import json
    pm = json.loads(out)
    assert pm["window"]["since"] == pytest.approx(start - 60.0) and pm["window"]["until"] == pytest.approx(end + 60.0)
    assert pm["metrics"]["qps"]["server"]["samples"] == len(qps) > 0
    assert pm["metrics"]["qps"]["server"]["max"] == pytest.approx(max(qps))
