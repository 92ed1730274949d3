"""diagnose: anomaly detection on synthetic series (pure functions, checked symbolically) and root-cause
ranking over a recorded History: the injected true cause ranks above a larger decoy anomaly."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.observe.anomaly import Detection, change_points, detect, robust_scale, robust_z
from runtime.observe.diagnose import Options, diagnose, summary_lines
from runtime.observe.metrics_store import History, device_scope
from runtime.observe.source import FileSource

N = 600


def noise(seed=0, sd=1.0, n=N):
    return np.random.default_rng(seed).normal(0.0, sd, n)


def pts(v, t0=0.0):
    return [(t0 + i, float(x)) for i, x in enumerate(v)]


# ---------------------------------------------------------------------------------------------- pure
def test_robust_scale_is_the_sd_of_normal_noise_and_ignores_outliers():
    x = noise(1, sd=2.0, n=20000)
    assert robust_scale(x) == pytest.approx(2.0, rel=0.05)
    x[:500] = 1e6                                    # 2.5 % outliers barely move it
    assert robust_scale(x) == pytest.approx(2.0, rel=0.1)
    assert robust_scale(np.zeros(10), floor=0.01) == 0.01
    assert robust_z([1.0, 1.0, 1.0, 4.0], floor=1.0)[-1] == pytest.approx(3.0)


@pytest.mark.parametrize("seed", range(3))
def test_a_spike_is_one_short_run_at_its_place(seed):
    v = 50 + noise(seed)
    v[300] += 20
    a = detect(pts(v), "p99_latency_ms")
    assert [(x.kind, x.onset, x.peak_ts) for x in a] == [("spike", 300.0, 300.0)]
    assert a[0].score > 10 and a[0].direction == 1 and a[0].baseline == pytest.approx(50, abs=0.5)


@pytest.mark.parametrize("seed", range(3))
def test_a_burst_is_a_long_run_that_returns(seed):
    v = 50 + noise(seed)
    v[200:230] += 10
    a = detect(pts(v))
    bursts = [x for x in a if x.kind == "burst"]
    assert len(bursts) == 1 and not [x for x in a if x.kind == "shift"]
    b = bursts[0]
    assert 198 <= b.onset <= 202 and 227 <= b.end <= 231


@pytest.mark.parametrize("seed", range(3))
def test_a_level_shift_is_a_change_point(seed):
    v = 50 + noise(seed)
    v[400:] += 8
    assert change_points(v) in ([399], [400], [401])
    a = detect(pts(v))
    assert [x.kind for x in a] == ["shift"]
    assert 399 <= a[0].onset <= 401
    assert a[0].baseline == pytest.approx(50, abs=0.5) and a[0].peak == pytest.approx(58, abs=0.5)


@pytest.mark.parametrize("seed", range(3))
def test_a_ramp_is_a_trend_not_a_staircase(seed):
    v = 50 + noise(seed) + 0.05 * np.arange(N)
    a = detect(pts(v))
    assert [x.kind for x in a] == ["trend"]
    assert a[0].detail["slope_per_s"] == pytest.approx(0.05, rel=0.1)


@pytest.mark.parametrize("seed", range(3))
def test_noise_alone_and_sub_floor_wiggles_are_not_anomalies(seed):
    assert detect(pts(50 + noise(seed))) == []
    z = np.zeros(N)
    z[100] = 0.001                               # 0.1 % error rate once: below the 1 % floor
    assert detect(pts(z), floor=0.01) == []
    z[100:140] = 0.2                             # a 20 % error burst on a flat zero series
    a = detect(pts(z), floor=0.01)
    assert [(x.kind, x.onset, x.end) for x in a] == [("burst", 100.0, 139.0)]


def test_detection_thresholds_are_options():
    v = 50 + noise(0)
    v[300] += 6                                   # ~6 sigma
    assert detect(pts(v), opts=Detection(z=8.0)) == []
    assert [x.kind for x in detect(pts(v), opts=Detection(z=4.0))] == ["spike"]


# ---------------------------------------------------------------------------------------------- ranking
T0 = 1_700_000_000.0


def recorded_incident(path, decoy_z=40.0, cause_at=590, symptom_at=600):
    """Ten minutes of a 4-device server: p99 latency shifts up at +600 s over the 800 ms SLO target (the
    symptom); the true cause is npu:1's HBM fragmentation rising over 0.7 at +590 s; the decoy is a huge
    temperature spike on npu:2 at +300 s over the chip's 85 C throttle point (far stronger as an anomaly,
    but five minutes before the symptom), plus a config event at +100 s and a power spike on npu:3 after
    the symptom (+620 s: a cause cannot follow its effect; under the TDP anyway)."""
    rng = np.random.default_rng(7)
    h = History(path)
    for i in range(N + 60):
        t = T0 + i
        p99 = 40 + rng.normal(0, 2) + (1000 if i >= symptom_at else 0)
        h.record_samples(t, {"p99_latency_ms": p99, "qps": 20 + rng.normal(0, 0.5),
                             "error_rate": 0.0, "queue_depth": max(0.0, rng.normal(2, 0.5))})
        for d in range(4):
            temp = 55 + rng.normal(0, 0.5) + (decoy_z if d == 2 and 300 <= i < 303 else 0)
            frag = 0.2 + rng.normal(0, 0.02) + (0.6 if d == 1 and i >= cause_at else 0)
            power = 80 + rng.normal(0, 1) + (30 if d == 3 and 620 <= i < 622 else 0)
            h.record_samples(t, {"device_temperature_c": temp, "hbm_fragmentation": frag,
                                 "device_power_w": power, "device_health": 0}, scope=device_scope(d))
    h.record_event("config", ts=T0 + 100, source="operator", manual=True, diagnosis="max_num_seqs 64 -> 32")
    return h


def test_diagnose_ranks_the_true_cause_above_a_stronger_decoy(tmp_path):
    h = recorded_incident(tmp_path / "h.sqlite")
    d = diagnose(FileSource(h))
    kinds = {(a.metric, a.scope, a.kind) for a in d.anomalies}
    # the detector sees all three: the symptom, the cause and the decoy (stronger than the cause)
    assert ("p99_latency_ms", "", "shift") in kinds
    assert ("hbm_fragmentation", "npu:1", "shift") in kinds
    decoy = next(a for a in d.anomalies if a.metric == "device_temperature_c")
    cause = next(a for a in d.anomalies if a.metric == "hbm_fragmentation")
    assert decoy.scope == "npu:2" and decoy.score > cause.score
    assert [s.metric for s in d.symptoms][:1] == ["p99_latency_ms"]
    top = d.candidates[0]
    assert (top.cause, top.scope) == ("hbm_fragmentation", "npu:1"), [c.to_dict() for c in d.candidates]
    assert "defragment" in top.advice and "p99_latency_ms" in top.explains
    assert any("10 s before" in ev for ev in top.evidence), top.evidence
    ranks = {(c.cause, c.scope): i for i, c in enumerate(d.candidates)}
    # the decoy and the power spike after the symptom cannot outrank it (if listed at all)
    assert ranks.get(("device_temperature_c", "npu:2"), 99) > 0
    assert ("device_power_w", "npu:3") not in ranks
    text = "\n".join(summary_lines(d))
    assert "#1 hbm_fragmentation on npu:1" in text
    h.close()


def test_without_the_cause_the_decoy_still_does_not_explain_the_symptom(tmp_path):
    h = recorded_incident(tmp_path / "h.sqlite", cause_at=10_000)
    d = diagnose(FileSource(h))
    assert not any(c.cause == "hbm_fragmentation" for c in d.candidates)
    assert all(c.score < 0.05 for c in d.candidates if c.cause == "device_temperature_c")
    h.close()


def test_focus_restricts_the_metrics_and_a_quiet_history_has_no_symptom(tmp_path):
    h = recorded_incident(tmp_path / "h.sqlite")
    d = diagnose(FileSource(h), Options(focus="thermal"))
    assert {a.metric for a in d.anomalies} <= {"device_temperature_c", "device_power_w", "aicore_util",
                                                "throttle", "p99_latency_ms"}
    assert not any(c.cause == "hbm_fragmentation" for c in d.candidates)
    q = diagnose(FileSource(h), Options(since=T0, until=T0 + 250))
    assert q.symptoms == [] and "verdict: no significant anomaly" in "\n".join(summary_lines(q))
    h.close()
