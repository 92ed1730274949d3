"""Diagnostics a user can trust: ``vnpu diagnose`` findings cross a limit from the chip's specs or the SLO in
a minimum number of samples and state a confidence; a healthy history (which has statistical wiggles: a
52.5 C step, 6.9 % AI Core bursts, a latency dip) produces no finding and the verdict "no significant
anomaly"; ``postmortem`` says how many samples each share rests on; ``stress-test``'s capacity never
contradicts its own p99.  Histories are recorded into the SQLite store the tools read (no cluster)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from devices.chip import ASCEND_910B3
from runtime.cli import main
from runtime.observe.diagnose import Options, describe, diagnose, summary_lines
from runtime.observe.metrics_store import History, device_scope
from runtime.observe.postmortem import analyse, summary_lines as pm_lines, targets_of
from runtime.observe.source import FileSource

T0 = 1_800_000_000.0
N = 600


def record(path, n=N, temp=None, p99=None, util=None, seed=3) -> History:
    """``n`` seconds of a 2-device server at 1 Hz.  ``temp(i, d)``, ``p99(i)``, ``util(i, d)`` override the
    healthy defaults: temperature 50 C, p99 120 ms, AI Core 5 %, each with noise; nothing else moves."""
    rng = np.random.default_rng(seed)
    h = History(path)
    for i in range(n):
        t = T0 + i
        lat = p99(i) if p99 else 120 + rng.normal(0, 5)
        tick = {"": {"p99_latency_ms": lat, "p95_latency_ms": 0.8 * lat, "qps": 2 + rng.normal(0, 0.1),
                     "error_rate": 0.0, "shed_rate": 0.0, "queue_depth": 0.0, "kv_cache_usage": 0.2,
                     "throttle": 1.0, "replicas": 1}}
        for d in range(2):
            tick[device_scope(d)] = {"device_temperature_c": temp(i, d) if temp else 50 + rng.normal(0, 0.3),
                                     "aicore_util": util(i, d) if util else 5 + rng.normal(0, 0.3),
                                     "device_power_w": 95 + rng.normal(0, 1), "hbm_fragmentation": 0.1,
                                     "device_health": 0}
        h.record_tick(t, tick)                                  # one transaction a second, as the sampler
    return h


def healthy(path) -> History:
    """The issue's healthy traffic: npu:1 steps from 50 to 52.5 C at +300 s, npu:0's AI Cores burst from 2 to 6.9 %
    for 20 s at +400 s, p99 latency dips to 60 ms for 3 s at +200 s and steps from 120 to 160 ms at +302 s
    (2 s after the temperature step) -- all statistically anomalous, none near a limit."""
    rng = np.random.default_rng(11)
    return record(path,
                  temp=lambda i, d: 50 + rng.normal(0, 0.3) + (2.5 if d == 1 and i >= 300 else 0),
                  util=lambda i, d: 2 + rng.normal(0, 0.3) + (4.9 if d == 0 and 400 <= i < 420 else 0),
                  p99=lambda i: 60.0 if 200 <= i < 203 else 120 + rng.normal(0, 5) + (40 if i >= 302 else 0))


def test_a_healthy_history_has_no_finding_although_it_has_anomalies(tmp_path):
    h = healthy(":memory:")
    d = diagnose(FileSource(h))
    # the detector does see the step, the burst and the dip: only the limits keep them from being findings
    seen = {(a.metric, a.scope, a.direction) for a in d.anomalies}
    assert {("device_temperature_c", "npu:1", 1), ("aicore_util", "npu:0", 1), ("p99_latency_ms", "", -1),
            ("p99_latency_ms", "", 1)} <= seen
    assert d.symptoms == [] and d.candidates == [] and d.over_limit == [] and d.findings() == 0
    assert d.judged and d.verdict == "no significant anomaly"
    text = "\n".join(summary_lines(d))
    assert "verdict: no significant anomaly" in text
    assert "p99 latency within the 800 ms p99 target (SLO, serve config default) in all 600 samples" in text
    for word in ("ran hot", "saturat", "scale out", "advice"):
        assert word not in text, text
    # a dip is called a dip
    dip = next(a for a in d.anomalies if a.metric == "p99_latency_ms" and a.direction < 0)
    assert "dipped to 60 ms" in describe(dip) and "spike" not in describe(dip)
    h.close()


def test_a_healthy_history_through_the_cli(tmp_path, capsys):
    healthy(tmp_path / "h.sqlite").close()
    assert main(["diagnose", "--history", str(tmp_path / "h.sqlite"), "--since", "1h"]) == 0
    out = capsys.readouterr().out
    assert "verdict: no significant anomaly" in out and "#1" not in out
    assert main(["diagnose", "--history", str(tmp_path / "h.sqlite"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "no significant anomaly" and doc["candidates"] == [] and doc["over_limit"] == []
    assert doc["limits"]["device_temperature_c"]["limit"] == ASCEND_910B3.temp_throttle_c


def hot_device(path, over_from=300, over_for=40, lat_from=305, n=N):
    """npu:1 heats from 60 to 91 C over [over_from, over_from + over_for) (its fan failed), p99 latency rises
    to 1500 ms over the 800 ms target from ``lat_from`` for 40 s; npu:0 stays at 60 C."""
    rng = np.random.default_rng(5)

    def temp(i, d):
        if d == 1 and over_from <= i < over_from + over_for:
            return 91 + rng.normal(0, 0.3)
        return 60 + rng.normal(0, 0.3)
    return record(path, n, temp=temp, p99=lambda i: (1500 if lat_from <= i < lat_from + 40 else 120) + rng.normal(0, 5))


def test_an_unhealthy_history_names_the_limit_its_source_the_samples_and_a_confidence(tmp_path):
    h = hot_device(":memory:")
    d = diagnose(FileSource(h))
    assert [s.metric for s in d.symptoms][:1] == ["p99_latency_ms"]
    top = d.candidates[0]
    assert (top.cause, top.scope) == ("device_temperature_c", "npu:1"), [c.to_dict() for c in d.candidates]
    # independent count: the samples of npu:1 over 85 C in the anomaly's span
    pts = h.samples("device_temperature_c", scope="npu:1")
    a = top.anomaly
    span = [v for t, v in pts if a.onset <= t <= a.end]
    over = sum(1 for v in span if v >= 85.0)
    assert over == 40
    text = "\n".join(summary_lines(d))
    assert (f"over the chip's 85 °C throttle point (chip spec Ascend910B3) in {over} of {len(span)} samples"
            in text), text
    assert "over the 800 ms p99 target (SLO, serve config default) in 40 of" in text
    # 5 s before the symptom, 40 samples over: prior 0.8 x exp(-5/60) x 1
    assert top.score == pytest.approx(0.8 * np.exp(-5 / 60), rel=1e-6) and top.confidence == "high"
    assert "(confidence 0.74, high; explains" in text
    assert text.splitlines()[1].startswith("verdict: 2 symptom(s); most likely cause device_temperature_c on npu:1")
    h.close()


@pytest.mark.parametrize("over_for,finding", [(2, False), (3, True)])
def test_a_finding_needs_a_minimum_number_of_samples_over_the_limit(tmp_path, over_for, finding):
    h = hot_device(":memory:", over_for=over_for, lat_from=10_000)    # no symptom
    d = diagnose(FileSource(h), Options(min_samples=3))
    hot = [a for a in d.over_limit if a.metric == "device_temperature_c"]
    assert bool(hot) is finding
    if finding:
        assert hot[0].detail["over"] == 3 and d.verdict == "no symptom, but 1 metric(s) over a limit (below)"
        assert "over a limit, no symptom to explain:" in "\n".join(summary_lines(d))
    else:
        assert d.verdict == "no significant anomaly"
    h.close()


def test_the_slo_from_the_history_sets_the_latency_limit(tmp_path):
    h = record(":memory:")                                           # p99 120 ms +- 5 all along
    h.record_event("config", ts=T0 - 10, source="serve", detail={"slo": {"target_p99_ms": 100}})
    d = diagnose(FileSource(h))
    lim = d.limits["p99_latency_ms"]
    assert lim.limit == 100.0 and lim.source.startswith("SLO, event #")
    assert d.symptoms and d.symptoms[0].kind == "breach"           # over 100 ms all along: no onset
    assert "over its limit throughout" in describe(d.symptoms[0])
    assert d.symptoms[0].detail["over"] == sum(1 for _, v in h.samples("p99_latency_ms") if v >= 100.0)
    h.close()


def test_too_few_samples_is_no_verdict(tmp_path):
    h = hot_device(":memory:")
    d = diagnose(FileSource(h), Options(since=T0 + 300, until=T0 + 320))
    assert not d.judged and d.symptoms == [] and d.candidates == []
    assert d.verdict.startswith("not enough data: 21 samples")
    h.close()


def test_postmortem_says_what_each_share_rests_on(tmp_path):
    h = hot_device(":memory:", n=120, over_from=30, lat_from=50)
    src = FileSource(h)
    pm = analyse(src, T0, T0 + 119, targets_of([]))
    assert pm["samples"]["p99_latency_ms"] == 120 and pm["samples"]["p99_above_target"] == 40
    assert pm["samples"]["aicore_util"] == 240 and pm["samples"]["devices"] == 2
    text = "\n".join(pm_lines(pm))
    assert "from 120 per-second samples" in text and "above target in 33.3% of the samples (40 of 120)" in text
    assert "(240 samples of 2 devices)" in text
    short = analyse(src, T0, T0 + 29, targets_of([]))
    assert "from 30 per-second samples (under 100: the 99th percentile is about the worst one)" in \
        "\n".join(pm_lines(short))
    h.close()


# ------------------------------------------------------------------------------------------ stress-test
def _records(rates_and_latency):
    """Records of a stress run: per 10 s window, (requests, latency s)."""
    from runtime.stress.loadgen import Record
    recs, rid = [], 0
    for k, (n, lat) in enumerate(rates_and_latency):
        for j in range(n):
            t = k * 10.0 + j * 10.0 / n
            recs.append(Record(rid, t, sent=t, done=t + lat, latency_s=lat, outcome="ok"))
            rid += 1
    return recs


def _cap(shape, target=800.0, min_samples=20):
    from runtime.stress.profiles import builtin
    from runtime.stress.run import StressConfig, _capacity, _capacity_text, _windows
    cfg = StressConfig(url="http://127.0.0.1:9", api_key=None, profile=builtin("steady", 1.0, 10.0 * len(shape)),
                       min_capacity_samples=min_samples)
    recs = _records(shape)
    cap = _capacity(_windows(cfg, recs), recs, cfg, target)
    return cap, _capacity_text({"target_p99_ms": target, "capacity": cap})


def test_stress_capacity_never_contradicts_the_runs_p99():
    # 0.5 req/s throughout; one window's few requests were fast, the run's p99 is over the target
    cap, text = _cap([(5, 0.1), (5, 2.0), (5, 2.0), (5, 2.0), (5, 2.0)])
    assert cap["rate"] is None and "held up to" not in text
    assert text == "; target p99 800 ms not held at any measured rate (p99 2000 ms of 25 requests)"
    # too few requests for any claim
    cap, text = _cap([(5, 0.1), (5, 0.1)])
    assert cap["rate"] is None and "too few successful requests (10, need 20)" in text
    # held at the low rates (pooled), not at the top one
    cap, text = _cap([(10, 0.1), (10, 0.1), (20, 0.1), (40, 2.0)])
    assert cap["rate"] == pytest.approx(2.0) and cap["samples"] == 40
    assert text.startswith("; target p99 800 ms held up to 2.0 req/s (p99 100 ms of 40 requests at <= 2.0 req/s)")


# ------------------------------------------------------------------------------------------ chaos output
RAY_DEATH = ("\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task by an unexpected system "
             "error. To troubleshoot the problem, check the logs for the dead worker. Worker PID: {pid} Worker exit "
             "type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2.")


def test_chaos_noise_is_captured_matched_to_the_faults_and_summarised(capsys, caplog):
    """Ray's coloured worker-death paragraph (written by another thread, as Ray's error listener does) and
    the driver's lost-device warnings (one per client) never reach stdout/stderr raw; what the faults
    explain is one line, what they do not is one line each; every other line passes through."""
    import logging
    import threading
    from runtime.cluster import chaos_noise
    faults = [{"kind": "kill", "device": 0, "params": {"pid": 4242}}, {"kind": "hang", "device": 1, "params": {}}]
    log = logging.getLogger(chaos_noise.DRIVER_LOGGER)
    caplog.set_level(logging.WARNING, chaos_noise.DRIVER_LOGGER)
    with chaos_noise.NoiseCapture() as noise:
        th = threading.Thread(target=lambda: (print(RAY_DEATH.format(pid=4242)), print(RAY_DEATH.format(pid=777))))
        th.start()
        th.join()
        print("  t=  5.0s  kill      device 0  detected after 9 ms (stream)")
        for dev, n in ((0, 1), (1, 3), (5, 1)):            # device 1's three clients; device 5: no fault hit it
            for _ in range(n):
                log.warning("device %d at %s lost: %s", dev, "127.0.0.1:1", "no heartbeat for 0.4 s")
        log.warning("device 3 reconnected")                  # not a lost warning: passes through
        print("no newline at the end", end="")
    out, err = capsys.readouterr()
    assert out == "  t=  5.0s  kill      device 0  detected after 9 ms (stream)\nno newline at the end"
    assert "raylet" not in err and "\x1b[" not in out + err and " lost: " not in err
    assert [r.getMessage() for r in caplog.records] == ["device 3 reconnected"]     # the rest never emitted
    log.warning("device %d at %s lost: %s", 0, "x", "after the campaign")           # the filter is gone
    assert caplog.records[-1].getMessage().endswith("after the campaign")
    s = noise.summary({"faults": faults})
    assert (s["worker_deaths"], s["lost_warnings"]) == (2, 5)
    assert [m["pid"] for m in s["worker_deaths_unexplained"]] == [777]
    assert [w["device"] for w in s["lost_unexplained"]] == [5]
    text = chaos_noise.lines(s)
    assert text[0].startswith("expected noise: 1 worker death(s) reported by Ray and 4 lost-device warning(s) of "
                              "the driver (each client of a device warns once) came from the 2 fault(s) above")
    assert text[1:] == ["ray: worker pid 777 died (SYSTEM_ERROR) and no fault of this campaign killed it",
                        "device 5 lost (no heartbeat for 0.4 s) and no fault of this campaign hit it"]


def test_chaos_leaks_and_hbm_read_as_sentences():
    from runtime.cluster.chaos import failures, hbm_text, leaks_text
    assert leaks_text({"actors": [], "processes": [], "segments": []}) == "none"
    assert leaks_text({"actors": ["vnpu_dev_1"], "processes": [4242, 4343],
                       "segments": ["vnpu_1_2_0_ab"]}) == ("1 actor (vnpu_dev_1), 2 processes (pid 4242, pid 4343), "
                                                            "1 shared-memory segment (vnpu_1_2_0_ab)")
    assert hbm_text({"hbm_back_to_baseline": True, "hbm_used_end": {0: 0, 1: 0, 2: 0}}) == \
        "HBM back to baseline on all 3 devices (0 B in use)"
    bad = {"hbm_back_to_baseline": False, "hbm_not_back": {1: {"start": 0, "end": 3 << 20}}, "hbm_used_end": {}}
    assert hbm_text(bad) == "HBM NOT back to baseline on device 1 (start 0 B, end 3.0 MiB)"
    rep = {"check": {"ok": True}, "correct": True, "clean": False, "leaks": {"processes": [4242]}, **bad}
    assert failures(rep) == [hbm_text(bad), "left behind 1 process (pid 4242)"]
    assert not any("{" in x for x in failures(rep))


def test_cli_slo_flags_set_the_limits_and_the_html_report_states_the_verdict(tmp_path, capsys):
    hot_device(tmp_path / "h.sqlite", n=120, over_from=30, lat_from=50).close()
    rep = tmp_path / "r.html"
    assert main(["diagnose", "--history", str(tmp_path / "h.sqlite"), "--target-p99-ms", "2000", "--json",
                 "--output", str(rep)]) == 0
    doc = json.loads(capsys.readouterr().out)
    # 1500 ms is within a 2000 ms target: no symptom; the hot device is over its limit on its own
    assert doc["limits"]["p99_latency_ms"]["limit"] == 2000.0 and doc["limits"]["p99_latency_ms"]["source"] == \
        "SLO, command line"
    assert doc["symptoms"] == [] and [a["metric"] for a in doc["over_limit"]] == ["device_temperature_c"]
    page = rep.read_text()
    assert "verdict: no symptom, but 1 metric(s) over a limit" in page and "85 °C throttle point" in page
