"""Predictive scheduling: the seasonal forecast of the request rate from the metrics history, and a
``forecast_qps`` trigger that scales out ahead of a daily rise.

The history is a recorded daily pattern (a sinusoid plus a 09:00-17:00 step, multiplicative Gaussian
noise of known sigma, seeded) written into a real in-memory :class:`History` on an injectable clock; the
forecast is judged against held-out days generated the same way and never written.  In-process, no server.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from runtime.observe.forecast import ForecastOptions, Forecaster, forecast, model_scope
from runtime.observe.metrics_store import History
from runtime.serve.canonical import render
from runtime.serve.config import ConfigError, parse_config
from runtime.serve.heal.actions import Context
from runtime.serve.heal.policy import PolicyEngine
from runtime.serve.metrics import ForecastCollector

DAY = 86400.0
T0 = 19_000 * DAY                # a UTC midnight
TICK = 60.0                      # one sample a minute (the server samples every second; the model bins them)
SIGMA = 0.05                     # injected noise: 5 % multiplicative
RISE_AT = 9 * 3600.0


def truth(t: np.ndarray) -> np.ndarray:
    """The noise-free daily pattern (qps): 10 +- 6 over the day, +30 from 09:00 to 17:00."""
    tod = np.mod(t, DAY)
    return 10 + 6 * np.sin(2 * np.pi * tod / DAY) + 30 * ((tod >= RISE_AT) & (tod < 17 * 3600.0))


def observed(t: np.ndarray, seed: int) -> np.ndarray:
    return truth(t) * (1 + SIGMA * np.random.default_rng(seed).standard_normal(len(t)))


def record(h: History, start: float, end: float, seed: int, scope: str = "") -> None:
    ts = np.arange(start, end, TICK)
    for t, v in zip(ts, observed(ts, seed)):
        h.record_samples(float(t), {"qps": float(v)}, scope)


@pytest.fixture(scope="module")
def three_days():
    clock = [T0]
    h = History(":memory:", clock=lambda: clock[0])
    record(h, T0, T0 + 3 * DAY, seed=1, scope=model_scope("m"))
    record(h, T0 + 3 * DAY, T0 + 4.2 * DAY, seed=2, scope=model_scope("m"))     # day 4: the held-out truth
    yield h
    h.close()


def held_out_bins(start: float, end: float, b: float) -> dict[float, float]:
    """Day 4 as it happened (what the fixture recorded after day 3), averaged per forecast bin: a forecast
    issued at ``now`` reads only the bins before ``now``, so the bins it forecasts are held out."""
    ts = np.arange(start, end, TICK)
    ys = observed(ts, seed=2)
    return {float(k * b): float(ys[(ts // b) == k].mean()) for k in np.unique(ts // b)}


def mape(h: History, opts: ForecastOptions) -> float:
    """Mean absolute percentage error of 1 h forecasts issued every 2 h over day 4, against day 4."""
    truth4 = held_out_bins(T0 + 3 * DAY, T0 + 4.2 * DAY, opts.bucket_s)
    errs = []
    for now in np.arange(T0 + 3 * DAY, T0 + 4 * DAY, 7200.0):
        f = forecast(h, float(now), model_scope("m"), opts)
        assert len(f.points) == 12
        errs += [abs(v - truth4[t]) / truth4[t] for t, v in f.points]
    return float(np.mean(errs))


def test_the_seasonal_forecast_of_a_daily_pattern_is_as_accurate_as_its_noise_allows(three_days):
    opts = ForecastOptions()
    f = forecast(three_days, T0 + 3 * DAY, model_scope("m"), opts)
    assert f.seasonal and f.bins == 3 * 288 + 1            # 3 days and the current bin (its first sample)
    # the error budget follows the injected noise: a 5-min held-out bin averages 5 samples (sd sigma/sqrt(5)),
    # the profile adds that over sqrt(3 days), the level an EWMA of residuals (~0.3 of it): the expected
    # |error| is ~0.8 * sqrt(1 + 1/3 + 0.1) ~ 1.0 sigma_bin; twice that bounds it
    sigma_bin = SIGMA / math.sqrt(opts.bucket_s / TICK)
    bound = 2 * sigma_bin
    err = mape(three_days, opts)
    print(f"MAPE {err:.4f} (bound {bound:.4f})")
    assert err < bound, (err, bound)
    # negative control: without the season (history shorter than a day) a flat EWMA misses the pattern
    flat = mape(three_days, ForecastOptions(lookback_s=12 * 3600.0))
    print(f"flat MAPE {flat:.4f}")
    assert flat > 5 * err, (flat, err)
    # a scope with no history has no forecast; the cache answers within a bin
    assert forecast(three_days, T0 + 3 * DAY, "model:none").points == ()
    fc = Forecaster(three_days)
    assert fc.get(T0 + 3 * DAY + 10) is fc.get(T0 + 3 * DAY + 20)
    assert fc.scopes() == [model_scope("m")]
    # /metrics: the gauges read at scrape are the forecast's own points (08:00 on day 4: 1 h to the rise)
    now = T0 + 3 * DAY + 8 * 3600.0
    fams = {m.name: m for m in ForecastCollector(fc, lambda: now).collect()}
    at = {s.labels["horizon"]: s.value for s in fams["vnpu:forecast_requests_per_second"].samples}
    f = forecast(three_days, now, model_scope("m"), opts)
    assert at == {"15m": f.points[2][1], "30m": f.points[5][1], "1h": f.points[11][1]}
    assert at["15m"] < 30 < at["1h"]                 # the 09:00 rise is forecast, not yet happening
    peak = fams["vnpu:forecast_peak_requests_per_second"].samples
    assert [(s.labels["model_name"], s.value) for s in peak] == [("m", f.peak())]


POLICY = """
self_healing:
  enabled: true
  triggers:
    - {name: prescale, metric: forecast_qps, model: m, condition: "> 30", lead: 30m, action: scale_out,
       params: {replicas: 2}}
  recovery: {cooldown: 1m}
"""


class ReplicaLedger:
    """A front with replicas, as the scale_out action sees one: it counts them and notes when they came."""

    def __init__(self, clock):
        self.clock = clock
        self.replicas = 1
        self.added_at: list[float] = []

    def scale_out(self, n: int) -> dict:
        self.replicas += n
        self.added_at.append(self.clock())
        return {"added": [f"r{self.replicas - i}" for i in range(n)]}

    def scale_in(self, n: int) -> dict:
        self.replicas -= n
        return {"removed": [f"r{self.replicas + i + 1}" for i in range(n)]}

    def health(self) -> tuple[int, dict]:
        return 200, {}


def test_a_forecast_trigger_scales_out_before_the_daily_rise_not_after():
    clock = [T0]
    h = History(":memory:", clock=lambda: clock[0])
    try:
        record(h, T0, T0 + 3 * DAY, seed=3, scope=model_scope("m"))
        ledger = ReplicaLedger(lambda: clock[0])
        pe = PolicyEngine(parse_config(POLICY).self_healing, Context(service=ledger, clock=lambda: clock[0]), h)
        onset = T0 + 3 * DAY + RISE_AT
        for t, v in zip(np.arange(T0 + 3 * DAY + 6 * 3600.0, onset + 3600.0, TICK),
                        observed(np.arange(T0 + 3 * DAY + 6 * 3600.0, onset + 3600.0, TICK), seed=4)):
            clock[0] = float(t)
            h.record_samples(float(t), {"qps": float(v)}, model_scope("m"))
            pe.on_tick(float(t), {"qps": float(v)}, {})
        acts = [e for e in h.events(kinds=["action"]) if e.trigger == "prescale"]
        assert len(acts) == 1 and acts[0].result == "ok" and acts[0].value > 30
        assert ledger.replicas == 3 and ledger.added_at == [acts[0].ts]
        first_high = next(t for t, v in h.samples("qps", scope=model_scope("m"), since=T0 + 3 * DAY) if v > 30)
        assert first_high >= onset                       # the rise itself came at 09:00 ...
        assert acts[0].ts < onset                        # ... and the replicas before it,
        assert onset - acts[0].ts <= 1800.0              # within the lead, not hours early
        assert list(pe.active()) == ["prescale on model:m"]
        print(f"scaled out {onset - acts[0].ts:.0f} s before the rise")
    finally:
        h.close()


def test_config_print_keeps_a_forecast_trigger_and_reads_back_the_same():
    sh = parse_config(POLICY).self_healing
    printed = render(parse_config(POLICY))
    assert "lead: 1800.0" in printed and "model: m" in printed
    assert parse_config(printed).self_healing == sh
    assert sh.triggers[0].lead_s == 1800.0 and sh.triggers[0].model == "m"
    assert parse_config(POLICY.replace(" lead: 30m,", "")).self_healing.triggers[0].lead_s == 3600.0   # the horizon


def test_a_seed_style_forecast_trigger_means_the_same():
    seed = """
self_healing:
  enabled: true
  triggers:
    - {metric: forecast_qps, threshold: "30", lead: 30m, model: m, action: "scale_workers +2", name: prescale}
  recovery: {cooldown: 1m}
"""
    t, = parse_config(seed).self_healing.triggers
    assert t == parse_config(POLICY).self_healing.triggers[0]


@pytest.mark.parametrize("bad, words", [
    ("{name: x, metric: qps, condition: '> 3', lead: 5m, action: scale_out}", "only a forecast metric"),
    ("{name: x, metric: forecast_qps, condition: '> 3', lead: 2h, action: scale_out}", "at most the forecast horizon"),
    ("{name: x, metric: forecast_qpz, condition: '> 3', action: scale_out}", "unknown metric 'forecast_qpz'"),
])
def test_bad_forecast_triggers_name_the_key_and_line(bad, words):
    with pytest.raises(ConfigError, match=words) as e:
        parse_config(f"self_healing:\n  triggers:\n    - {bad}\n")
    assert "line 3" in str(e.value)
