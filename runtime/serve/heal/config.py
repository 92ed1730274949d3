"""The ``self_healing`` section of ``serve.yaml``, checked key by key (every error names the key and its line):

    self_healing:
      enabled: true
      max_actions_per_hour: 20          # guardrail over all triggers
      hysteresis: 10%                   # default release threshold: the condition's opposite, moved by this
      risk: 90%                         # a "risk" event when a window reaches this share of a threshold
      flapping: {window: 10m, max_fires: 3, hold: 30m}
      triggers:
        - {name: thermal, metric: device_temperature_c, condition: "> 85", window: 10s, action: throttle,
           params: {by: 20%, for: 5m}}
        - {name: errors, metric: error_rate, condition: "> 5%", window: 30s, action: fallback}
        - {name: slow, metric: p99_latency_ms, condition: "> 2 * slo.target_p99_ms", window: 1m,
           action: scale_out, params: {replicas: +1}, release: "< 400", cooldown: 5m, aggregate: mean}
        - {name: dead, metric: device_health, condition: "== lost", action: restart_device}
      recovery: {warmup_requests: 3, health_check: true, rollback_on_failure: true, cooldown: 2m,
                 move_back: true, return_after: 30s}    # engines go back to a restarted device by themselves
      alerts: [{kind: log}, {kind: file, path: alerts.jsonl}, {kind: webhook, url: "http://127.0.0.1:9000/hook"},
               {kind: slack, url: "https://hooks.slack.com/services/...", channel: "#runtime-guard"}]
"""
from __future__ import annotations

from dataclasses import fields

from runtime.observe.forecast import FORECAST_METRICS, ForecastOptions
from runtime.observe.metrics_store import METRICS

from ..yamlnodes import items, keyed, load
from ..yamlnodes import line as _line
from .actions import ACTIONS
from .alerts import REQUIRED, SINKS
from .spec import (AGGREGATES, AlertSpec, FlappingSpec, RecoverySpec, SelfHealingSpec, SpecError, TriggerSpec,
                   parse_condition, parse_duration, parse_fraction)

TRIGGER_KEYS = ("name", "metric", "condition", "action", "window", "params", "release", "aggregate", "cooldown",
                "lead", "model")
ROOT_KEYS = ("enabled", "triggers", "recovery", "alerts", "max_actions_per_hour", "hysteresis", "flapping", "risk")
RECOVERY_KEYS = ("warmup_requests", "health_check", "rollback_on_failure", "cooldown", "move_back", "return_after")
FLAPPING_KEYS = ("window", "max_fires", "hold")
ALERT_KEYS = ("kind", "path", "url", "timeout", "channel")


def _mapping(node, known: tuple[str, ...], where: str, path: str) -> dict:
    """key -> (python value, value node) of a mapping node with only ``known`` keys."""
    keys = keyed(node, known, where, path, SpecError, f"a mapping ({', '.join(known)})")
    return {k: (load(v, where, f"{path}.{k}", SpecError), v) for k, (_, v) in keys.items()}


def _get(d: dict, key: str, read, where: str, path: str, default=None):
    if key not in d:
        return default
    value, node = d[key]
    try:
        return read(value)
    except SpecError as e:
        raise SpecError(f"{where}line {_line(node)}: {path}.{key}: {e.detail if hasattr(e, 'detail') else e}") from None


def _bool(v):
    if not isinstance(v, bool):
        raise SpecError(f"expected true or false, got {v!r}")
    return v


def _int(lo: int):
    def read(v):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise SpecError(f"expected an integer >= {lo}, got {v!r}")
        return v
    return read


def _str(v):
    if not isinstance(v, str) or not v:
        raise SpecError(f"expected a non-empty string, got {v!r}")
    return v


def _one_of(table, what: str):
    def read(v):
        if v not in table:
            raise SpecError(f"unknown {what} {v!r} (known: {', '.join(table)})")
        return v
    return read


def parse_self_healing(node, where: str, slo) -> SelfHealingSpec:
    """The spec of a ``self_healing`` YAML node (``slo``: the config's SloConfig, for ``slo.<key>``)."""
    slo_values = {f.name: getattr(slo, f.name) for f in fields(slo)}
    d = _mapping(node, ROOT_KEYS, where, "self_healing")
    p = "self_healing"
    rec = RecoverySpec()
    if "recovery" in d:
        r = _mapping(d["recovery"][1], RECOVERY_KEYS, where, f"{p}.recovery")
        rp = f"{p}.recovery"
        rec = RecoverySpec(_get(r, "warmup_requests", _int(0), where, rp, rec.warmup_requests),
                           _get(r, "health_check", _bool, where, rp, rec.health_check),
                           _get(r, "rollback_on_failure", _bool, where, rp, rec.rollback_on_failure),
                           _get(r, "cooldown", parse_duration, where, rp, rec.cooldown_s),
                           _get(r, "move_back", _bool, where, rp, rec.move_back),
                           _get(r, "return_after", parse_duration, where, rp, rec.return_after_s))
    fl = FlappingSpec()
    if "flapping" in d:
        f = _mapping(d["flapping"][1], FLAPPING_KEYS, where, f"{p}.flapping")
        fp = f"{p}.flapping"
        fl = FlappingSpec(_get(f, "window", parse_duration, where, fp, fl.window_s),
                          _get(f, "max_fires", _int(1), where, fp, fl.max_fires),
                          _get(f, "hold", parse_duration, where, fp, fl.hold_s))
    triggers: list[TriggerSpec] = []
    if "triggers" in d:
        tnode = d["triggers"][1]
        triggers = items(tnode, where, f"{p}.triggers", lambda n, at: _trigger(n, where, at, slo_values),
                         SpecError, "triggers")
        names = [t.name for t in triggers]
        dup = next((x for x in names if names.count(x) > 1), None)
        if dup:
            raise SpecError(f"{where}line {_line(tnode)}: {p}.triggers: the name {dup!r} is used twice")
    alerts: list[AlertSpec] = []
    if "alerts" in d:
        alerts = items(d["alerts"][1], where, f"{p}.alerts", lambda n, at: _alert(n, where, at), SpecError, "sinks")
    return SelfHealingSpec(
        enabled=_get(d, "enabled", _bool, where, p, bool(triggers)),
        triggers=tuple(triggers), recovery=rec, alerts=tuple(alerts),
        max_actions_per_hour=_get(d, "max_actions_per_hour", _int(1), where, p, 20),
        hysteresis=_get(d, "hysteresis", lambda v: parse_fraction(v, "hysteresis"), where, p, 0.1),
        flapping=fl, risk_ratio=_get(d, "risk", lambda v: parse_fraction(v, "risk"), where, p, 0.9))


def _trigger(node, where: str, path: str, slo: dict) -> TriggerSpec:
    d = _mapping(node, TRIGGER_KEYS, where, path)
    for req in ("name", "metric", "condition", "action"):
        if req not in d:
            raise SpecError(f"{where}line {_line(node)}: {path}: the key '{req}' is required")
    name = _get(d, "name", _str, where, path)
    metric = _get(d, "metric", _one_of({**METRICS, **FORECAST_METRICS}, "metric"), where, path)
    action = _get(d, "action", _one_of(ACTIONS, "action"), where, path)
    cond = _get(d, "condition", lambda v: parse_condition(v, slo), where, path)
    release = _get(d, "release", lambda v: parse_condition(v, slo), where, path)
    if action == "restart_device" and not METRICS[metric][1].startswith("per device"):
        raise SpecError(f"{where}line {_line(d['action'][1])}: {path}.action: restart_device acts on the device "
                        f"whose metric fired; {metric} is server-wide (use device_health or another per-device "
                        f"metric)")
    params = {}
    if "params" in d:
        raw, pnode = d["params"]
        if not isinstance(raw, dict):
            raise SpecError(f"{where}line {_line(pnode)}: {path}.params: expected a mapping")
        params = _get(d, "params", ACTIONS[action].read_params, where, path)
    else:
        params = ACTIONS[action].read_params({})
    lead, model = _forecast_keys(d, metric, where, path)
    return TriggerSpec(name, metric, cond, action, _get(d, "window", parse_duration, where, path, 0.0), params,
                       release, _get(d, "aggregate", _one_of(AGGREGATES, "aggregate"), where, path, "mean"),
                       _get(d, "cooldown", parse_duration, where, path), lead, model)


def _forecast_keys(d: dict, metric: str, where: str, path: str) -> tuple[float, str]:
    """``lead`` (how far ahead a forecast trigger looks; up to the forecast's horizon, default all of it) and
    ``model`` (whose rate; default the server's) -- only on a forecast metric."""
    horizon = ForecastOptions().horizon_s
    for k in ("lead", "model"):
        if k in d and metric not in FORECAST_METRICS:
            raise SpecError(f"{where}line {_line(d[k][1])}: {path}.{k}: only a forecast metric "
                            f"({', '.join(FORECAST_METRICS)}) takes '{k}'")
    lead = _get(d, "lead", parse_duration, where, path, horizon)
    if not 0 < lead <= horizon:
        raise SpecError(f"{where}line {_line(d['lead'][1])}: {path}.lead: must be > 0 and at most the forecast "
                        f"horizon ({horizon:g} s), got {lead:g} s")
    return lead, _get(d, "model", _str, where, path, "")


def _alert(node, where: str, path: str) -> AlertSpec:
    d = _mapping(node, ALERT_KEYS, where, path)
    if "kind" not in d:
        raise SpecError(f"{where}line {_line(node)}: {path}: the key 'kind' is required ({', '.join(SINKS)})")
    kind = _get(d, "kind", _one_of(SINKS, "alert kind"), where, path)
    for req in REQUIRED[kind]:
        if req not in d:
            raise SpecError(f"{where}line {_line(node)}: {path}: a {kind} sink needs '{req}'")
    url = _get(d, "url", _str, where, path)
    if url is not None and not url.startswith(("http://", "https://")):
        raise SpecError(f"{where}line {_line(d['url'][1])}: {path}.url: expected an http:// or https:// URL, "
                        f"got {url!r}")
    timeout = _get(d, "timeout", parse_duration, where, path, 5.0)
    channel = _get(d, "channel", _str, where, path)
    if channel is not None and kind != "slack":
        raise SpecError(f"{where}line {_line(d['channel'][1])}: {path}.channel: only a slack sink has a channel")
    return AlertSpec(kind, _get(d, "path", _str, where, path), url, timeout, channel)
