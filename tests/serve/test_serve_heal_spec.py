"""The ``self_healing`` section's grammar (no server): conditions, durations, fractions, hysteresis, the
issue's example config, and one-line errors that name the key and its line."""
from __future__ import annotations

import pytest

from runtime.serve.config import ConfigError, parse_config
from runtime.serve.heal.spec import Condition, SpecError, parse_condition, parse_duration, parse_fraction

EXAMPLE = """slo: {target_p99_ms: 800, availability: 99.5%}
self_healing:
  enabled: true
  triggers:
    - {name: thermal, metric: device_temperature_c, condition: "> 85", window: 10s, action: throttle, params: {by: 20%, for: 5m}}
    - {name: errors, metric: error_rate, condition: "> 5%", window: 30s, action: fallback}
    - {name: frag, metric: hbm_fragmentation, condition: "> 0.7", window: 1m, action: defragment}
    - {name: slow, metric: p99_latency_ms, condition: "> 2 * slo.target_p99_ms", window: 1m, action: scale_out, params: {replicas: +1}}
    - {name: dead, metric: device_health, condition: "== lost", action: restart_device}
  recovery: {warmup_requests: 3, health_check: true, rollback_on_failure: true, cooldown: 2m}
  alerts: [{kind: log}, {kind: file, path: alerts.jsonl}, {kind: webhook, url: "http://127.0.0.1:9000/hook"}]
"""


def test_conditions_resolve_numbers_percentages_health_words_and_the_slo():
    slo = {"target_p99_ms": 800.0, "availability": None}
    assert parse_condition("> 85") == Condition(">", 85.0, "> 85")
    assert parse_condition(">5%").threshold == pytest.approx(0.05)
    assert parse_condition("== lost").threshold == 4.0 and parse_condition(">= alarm").threshold == 2.0
    c = parse_condition("> 2 * slo.target_p99_ms", slo)
    assert (c.op, c.threshold) == (">", 1600.0) and c.holds(1601) and not c.holds(1600)
    assert parse_condition("<= slo.target_p99_ms", slo).threshold == 800.0
    for bad, words in (("85", "expected '<op> <value>'"), ("> hot", "not a number"), ("> slo.nope", "no key 'nope'"),
                       ("> slo.availability", "needs slo.availability"), (85, "expected text")):
        with pytest.raises(SpecError, match=words):
            parse_condition(bad, slo)


def test_release_conditions_move_away_from_the_threshold_by_the_hysteresis():
    r = parse_condition("> 85").released(0.1)
    assert (r.op, r.threshold) == ("<=", pytest.approx(76.5))
    assert not r.holds(84) and r.holds(76.5)
    r = parse_condition("< 10").released(0.2)
    assert (r.op, r.threshold) == (">=", pytest.approx(12.0))
    r = parse_condition("== lost").released(0.1)
    assert (r.op, r.threshold) == ("!=", 4.0) and r.holds(0) and not r.holds(4)


def test_durations_and_fractions():
    assert [parse_duration(x) for x in ("10s", "5m", "1h", "250ms", 3, "1.5m")] == [10, 300, 3600, 0.25, 3, 90]
    assert parse_fraction("20%") == pytest.approx(0.2) and parse_fraction(0.5) == 0.5
    for bad in ("10 parsecs", "-1s", True, "s"):
        with pytest.raises(SpecError):
            parse_duration(bad)
    for bad in ("120%", -0.1, "half", True):
        with pytest.raises(SpecError):
            parse_fraction(bad)


def test_the_issues_example_config_parses():
    sh = parse_config(EXAMPLE).self_healing
    assert sh.enabled and [t.name for t in sh.triggers] == ["thermal", "errors", "frag", "slow", "dead"]
    thermal, errors, frag, slow, dead = sh.triggers
    assert (thermal.window_s, thermal.params) == (10.0, {"by": pytest.approx(0.2), "for": 300.0})
    assert errors.condition.threshold == pytest.approx(0.05) and errors.window_s == 30.0
    assert slow.condition.threshold == 1600.0 and slow.params == {"replicas": 1, "model": None}
    assert dead.condition.threshold == 4.0 and dead.window_s == 0.0
    assert (sh.recovery.warmup_requests, sh.recovery.cooldown_s) == (3, 120.0)
    assert [a.kind for a in sh.alerts] == ["log", "file", "webhook"] and sh.alerts[2].url.endswith("/hook")
    assert parse_config("models: [smollm2]").self_healing.enabled is False


@pytest.mark.parametrize("bad, words", [
    ("self_healing: {triggers: [{name: a, metric: qpz, condition: '> 1', action: throttle}]}",
     "line 1: self_healing.triggers[0].metric: unknown metric 'qpz'"),
    ("self_healing:\n  triggers:\n    - {name: a, metric: qps, condition: '> 1', action: reboot}",
     "line 3: self_healing.triggers[0].action: unknown action 'reboot'"),
    ("self_healing:\n  triggers:\n    - {name: a, metric: qps, condition: '> 1', action: throttle, params: {by: 100%}}",
     "line 3: self_healing.triggers[0].params: throttle.by: must be in (0%, 100%)"),
    ("self_healing:\n  triggers:\n    - {name: a, metric: qps, condition: '> 1', action: throttle, params: {bye: 2}}",
     "action throttle takes by, for; not bye"),
    ("self_healing:\n  triggers:\n    - {name: a, metric: qps, condition: '> 1', action: restart_device}",
     "restart_device acts on the device whose metric fired; qps is server-wide"),
    ("self_healing:\n  triggers:\n    - {name: a, metric: qps, condition: '> 1', action: throttle}\n"
     "    - {name: a, metric: qps, condition: '> 2', action: throttle}", "the name 'a' is used twice"),
    ("self_healing:\n  triggers:\n    - {metric: qps, condition: '> 1', action: throttle}", "the key 'name' is required"),
    ("self_healing: {alerts: [{kind: webhook}]}", "a webhook sink needs 'url'"),
    ("self_healing: {alerts: [{kind: pager}]}", "unknown alert kind 'pager'"),
    ("self_healing:\n  alerts: [{kind: webhook, url: 'ftp://x'}]", "line 2: self_healing.alerts[0].url: expected an http"),
    ("self_healing: {recovery: {cooldown: -1}}", "self_healing.recovery.cooldown"),
    ("self_healing: {flapping: {max_fires: 0}}", "self_healing.flapping.max_fires: expected an integer >= 1"),
    ("self_healing: {bogus: 1}", "unknown key self_healing.bogus"),
    ("self_healing: [1]", "self_healing: expected a mapping"),
])
def test_bad_sections_name_the_key_and_line(bad, words):
    with pytest.raises(ConfigError) as e:
        parse_config(bad)
    msg = e.value.detail
    assert words in msg and "\n" not in msg
