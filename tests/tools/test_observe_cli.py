"""The operator's commands over a history: the same answers from a History file and from a live server's
/admin/history routes (real HTTP, the server's own sampler ticking on explicit times); monitor, diagnose,
postmortem from the command line; bad input is one line and exit 2."""
from __future__ import annotations

import json

import numpy as np
import pytest

from runtime.cli import main
from runtime.observe.metrics_store import History, device_scope
from runtime.observe.postmortem import analyse, incident_window, targets_of
from runtime.observe.source import FileSource, HttpSource, SourceError, open_source

ADMIN, USER = "sk-ops-observe-0123456789", "sk-app-observe-0123456789"
T0 = 1_800_000_000.0


def _cli(argv, capsys):
    rc = main([str(x) for x in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """MiniLM-L3 on 2 in-process devices behind the real HTTP server; its sampler ticks on explicit times."""
    from devices.device import DeviceConfig
    from runtime.api import Runtime
    from runtime.backend import LocalBackend
    from runtime.serve.config import model_spec
    from runtime.serve.metrics_sampler import Sampler
    from runtime.serve.server import Server, Service
    from runtime.serve.tenants import Tenant, key_digest
    rt = Runtime(LocalBackend(2, DeviceConfig(arena_bytes=256 << 20)))
    svc = Service(rt, (model_spec("minilm-l3", (0,), None),),
                  (Tenant("ops", (key_digest(ADMIN),), admin=True), Tenant("app", (key_digest(USER),))))
    path = tmp_path_factory.mktemp("live") / "history.sqlite"
    hist = History(path)
    sampler = Sampler(svc, hist, rt)
    srv = Server(svc).start()
    try:
        svc.load()
        for i in range(20):
            sampler.tick(T0 + i)
        hist.record_event("fault", ts=T0 + 5, source="npu:1", diagnosis="device 1 is Alarm", detail={"device": 1})
        hist.record_event("action", ts=T0 + 6, source="heal", trigger="thermal", value=91.0,
                          diagnosis="throttle by 20%", result="ok", duration_s=4.0)
        yield srv, hist, path
    finally:
        srv.stop()
        hist.close()
        rt.close()


@pytest.mark.serve
def test_file_and_http_sources_give_the_same_answers(live):
    srv, hist, path = live
    f, h = FileSource(hist), HttpSource(srv.url, ADMIN)
    for m, scope in (("qps", ""), ("throttle", ""), ("device_temperature_c", "npu:0"), ("device_health", "npu:1")):
        assert h.samples(m, T0 + 2, T0 + 12, scope) == f.samples(m, T0 + 2, T0 + 12, scope) != []
    assert h.latest() == f.latest()
    assert h.devices() == f.devices() == ["npu:0", "npu:1"]
    # the forecast: 20 s of history, less than a day: the level only (the mean qps), the same both ways
    fh, ff = h.forecasts(), f.forecasts()
    assert [x.to_dict() for x in fh] == [x.to_dict() for x in ff] and [x.model for x in ff] == ["*"]
    qps = [v for _, v in hist.samples("qps", T0, T0 + 19)]
    assert not ff[0].seasonal and ff[0].peak() == pytest.approx(sum(qps) / len(qps))
    assert [e.to_dict() for e in h.events(kinds=["fault", "action"])] == \
        [e.to_dict() for e in f.events(kinds=["fault", "action"])]
    assert [e.id for e in h.events(until=T0 + 5.5)] == [e.id for e in f.events(until=T0 + 5.5)]
    with pytest.raises(SourceError, match="admin key"):
        HttpSource(srv.url, USER).latest()                    # a user key is not enough: 403
    with pytest.raises(SourceError, match="unknown metric"):
        h.samples("qpz")
    eid = h.record_event("manual", diagnosis="operator note", manual=True)
    assert hist.event(eid).manual and hist.event(eid).diagnosis == "operator note"


@pytest.mark.serve
def test_monitor_once_json_and_text_through_the_routes(live, capsys):
    srv, hist, _ = live
    rc, out, err = _cli(["monitor", "--once", "--json", "--url", srv.url, "--api-key", ADMIN,
                         "--metrics", "qps,temp,mem_frag"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    assert set(doc["devices"]) == {"npu:0", "npu:1"} and "device_temperature_c" in doc["devices"]["npu:0"]
    rows = {(m["metric"], m["scope"]) for m in doc["metrics"]}
    assert rows == {("qps", ""), ("device_temperature_c", "npu:0"), ("device_temperature_c", "npu:1"),
                    ("hbm_fragmentation", "npu:0"), ("hbm_fragmentation", "npu:1")}
    temp = hist.latest("npu:0")["device_temperature_c"][1]
    assert next(m for m in doc["metrics"] if m["metric"] == "device_temperature_c" and m["scope"] == "npu:0"
                )["latest"] == pytest.approx(temp)
    assert [e["kind"] for e in doc["events"]][-2:] in (["fault", "action"], ["action", "manual"])
    assert [(x["model"], len(x["points"])) for x in doc["forecasts"]] == [("*", 12)]
    rc, out, err = _cli(["monitor", "--once", "--url", srv.url, "--api-key", ADMIN], capsys)
    assert rc == 0 and "device_temperature_c" in out and "npu:1" in out and "recent events" in out
    assert "forecast requests/s (next hour)" in out and "level only" in out


def incident_history(path):
    """Two minutes: 20 req/s, errors 10 % during [40, 60) s, p99 above 800 ms during [45, 55) s; a fault at
    40 s, a self-healing action at 41 s (recovered in 15 s), an operator's throttle at 70 s."""
    h = History(path)
    for i in range(120):
        t = T0 + i
        h.record_samples(t, {"qps": 20.0, "error_rate": 0.1 if 40 <= i < 60 else 0.0,
                             "p99_latency_ms": 1500.0 if 45 <= i < 55 else 100.0, "kv_cache_usage": 0.5,
                             "replicas": 1, "shed_rate": 0.0})
        for d in range(2):
            h.record_samples(t, {"aicore_util": 30.0 + 20 * d, "device_health": 0}, scope=device_scope(d))
    fid = h.record_event("fault", ts=T0 + 40, source="npu:1", diagnosis="device 1 lost", detail={"device": 1})
    h.record_event("action", ts=T0 + 41, source="heal", trigger="dead", diagnosis="restart_device npu:1",
                   result="ok", duration_s=15.0)
    h.record_event("manual", ts=T0 + 70, source="admin ops", manual=True, diagnosis="throttle 0.5")
    h.record_event("config", ts=T0 - 600, source="serve", detail={"slo": {"target_p99_ms": 1000,
                                                                          "availability": "99.9%"}})
    return h, fid


def test_postmortem_figures_follow_the_samples(tmp_path):
    h, fid = incident_history(tmp_path / "h.sqlite")
    src = FileSource(h)
    tg = targets_of(src.events(until=T0 + 200))
    assert (tg.p99_ms, tg.availability) == (1000.0, pytest.approx(0.999)) and tg.origin.startswith("event #")
    pm = analyse(src, T0, T0 + 119, tg)
    a = pm["actual"]
    # independent reference: 20 s of 10 % errors at equal qps out of 120 s
    assert a["availability"] == pytest.approx(1 - 20 * 0.1 / 120) and a["availability_met"] is False
    assert a["p99_share_above_target"] == pytest.approx(10 / 120)
    assert a["p99_worst_second_ms"] == 1500.0
    assert a["p99_ms"] == pytest.approx(float(np.percentile([1500.0] * 10 + [100.0] * 110, 99)))
    assert (a["self_heal_actions"], a["manual_interventions"], a["faults"]) == (1, 1, 1)
    assert a["recovery_s_max"] == 15.0 and a["aicore_util_mean"] == pytest.approx(40.0)
    lo, hi, chain = incident_window(src, fid)
    assert [e.kind for e in chain] == ["fault", "action", "manual"]          # within 2 min of each other
    assert lo == T0 + 40 - 60 and hi == pytest.approx(T0 + 70 + 60)
    h.close()


def test_diagnose_postmortem_cli_on_a_history_file(tmp_path, capsys):
    h, fid = incident_history(tmp_path / "h.sqlite")
    h.close()
    f = tmp_path / "h.sqlite"
    rc, out, err = _cli(["postmortem", "--history", f, "--event", fid, "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["actual"]["self_heal_actions"] == 1 and doc["target"]["p99_ms"] == 1000.0
    assert [e["kind"] for e in doc["timeline"]] == ["fault", "action", "manual"]
    rc, out, err = _cli(["postmortem", "--history", f, "--since", "1h"], capsys)
    assert rc == 0 and "availability: target 99.90%" in out and "manual interventions 1" in out
    report = tmp_path / "r.html"
    rc, out, err = _cli(["diagnose", "--history", f, "--since", "1h", "--output", report, "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    assert {s["metric"] for s in doc["symptoms"]} >= {"error_rate", "p99_latency_ms"}
    assert doc["candidates"][0]["cause"] == "event:fault", doc["candidates"][:2]
    page = report.read_text()
    assert "<svg" in page and "<script" not in page
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")      # loads nothing from anywhere
    md = tmp_path / "r.md"
    rc, out, err = _cli(["diagnose", "--history", f, "--output", md], capsys)
    assert rc == 0 and md.read_text().startswith("# vnpu diagnose") and "#1 event:fault" in out


BAD = [
    (["diagnose", "--output", "{d}/x.txt", "--history", "{h}"], "--output"),
    (["diagnose", "--focus", "nope"], "--focus"),
    (["diagnose", "--since", "yesterday"], "--since"),
    (["diagnose", "--history", "{d}/missing.sqlite"], "no history file"),
    (["diagnose", "--history", "{d}/notdb.sqlite"], "not a vnpu history"),
    (["monitor", "--metrics", "bogus"], "--metrics"),
    (["monitor", "--interval", "0s"], "--interval"),
    (["postmortem", "--history", "{h}", "--event", "999"], "no event 999"),
    (["postmortem", "--event", "1", "--since", "1h"], "not allowed"),
    (["postmortem", "--availability", "1.5"], "--availability"),
    (["stress-test", "--faults", "bogus"], "bogus"),
    (["stress-test", "--profile", "nope", "--url", "http://127.0.0.1:9"], "--profile"),
    (["stress-test", "--url", "http://127.0.0.1:9", "--api-key", "k", "--duration", "1s"], "cannot reach"),
    (["monitor", "--once", "--url", "ftp://x"], "bad server URL"),
]


@pytest.mark.parametrize("argv,word", BAD, ids=[" ".join(b[0][:3]) for b in BAD])
def test_bad_input_is_one_line_and_exit_2(argv, word, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VNPU_HOME", str(tmp_path / "home"))
    h = History(tmp_path / "h.sqlite")
    h.record_samples(T0, {"qps": 1.0})
    h.close()
    (tmp_path / "notdb.sqlite").write_bytes(b"not a database at all" * 100)
    argv = [a.format(d=tmp_path, h=tmp_path / "h.sqlite") for a in argv]
    rc, out, err = _cli(argv, capsys)
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err and err.count("\n") == 1 and word in err, err


def test_open_source_finds_the_server_file_and_the_history(tmp_path, monkeypatch):
    import os
    from runtime.observe import serverfile
    monkeypatch.delenv("VNPU_API_KEY", raising=False)
    with pytest.raises(SourceError, match="no running server"):
        open_source(tmp_path)
    hp = tmp_path / "serve" / "history.sqlite"
    History(hp).close()
    assert isinstance(open_source(tmp_path), FileSource)                  # a stopped server's history
    serverfile.write(tmp_path, "http://127.0.0.1:9", str(hp), pid=os.getpid())
    s = open_source(tmp_path)
    assert isinstance(s, FileSource) and s.where == str(hp)               # no key: its file
    doc = json.loads(serverfile.path(tmp_path).read_text())
    serverfile.path(tmp_path).write_text(json.dumps({**doc, "admin_key": "sk-planted", "api_key": "sk-planted"}))
    s = open_source(tmp_path)
    assert isinstance(s, FileSource) and s.where == str(hp)               # a key in the file is not used
    assert open_source(tmp_path, url="http://127.0.0.1:9").key is None    # (nor with --url)
    monkeypatch.setenv("VNPU_API_KEY", "sk-x")
    s = open_source(tmp_path)
    assert isinstance(s, HttpSource) and s.url == "http://127.0.0.1:9" and s.key == "sk-x"
