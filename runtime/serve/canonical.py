"""The canonical vnpu form of a loaded ``serve.yaml`` (``vnpu serve config --print``): every section in
vnpu's own names and units, whatever dialect the file was written in (:mod:`runtime.serve.dialect`),
followed by what was accepted but is not acted on, as YAML comments -- so the output loads again as it is.
API keys are shown as their ``sha256:`` digests."""
from __future__ import annotations

from dataclasses import asdict, fields

from runtime.observe.forecast import FORECAST_METRICS

from .config import ServeConfig
from .engine.config import EngineConfig


def canonical(cfg: ServeConfig) -> dict:
    """The config as a plain ``serve.yaml`` document in vnpu's names (defaults of empty sections left out)."""
    doc: dict = {"server": {"host": cfg.host, "port": cfg.port, "allow_unauthenticated": cfg.allow_unauthenticated,
                            "replicas": cfg.replicas},
                 "http": asdict(cfg.http)}
    slo = {k: v for k, v in asdict(cfg.slo).items() if v is not None}
    if "availability" in slo:
        slo["availability"] = f"{slo['availability'] * 100:g}%"
    if slo:
        doc["slo"] = slo
    if cfg.devices:
        doc["devices"] = dict(cfg.devices)
    d = cfg.defaults
    dflt = {k: v for k, v in (("placement", d.placement), ("fallback", list(d.fallback)),
                              ("scheduler", dict(d.scheduler)), ("engine", dict(d.engine)),
                              ("batching", dict(d.batching))) if v}
    if dflt:
        doc["defaults"] = dflt
    if cfg.tags:
        doc["tags"] = dict(cfg.tags)
    mem = {k: v for k, v in asdict(cfg.memory).items() if v is not None}
    if mem:
        doc["memory"] = mem
    if cfg.tenants:
        doc["tenants"] = [_tenant(t) for t in cfg.tenants]
    if cfg.models:
        doc["models"] = [_model(m) for m in cfg.models]
    sh = cfg.self_healing
    if sh.enabled or sh.triggers:
        doc["self_healing"] = _healing(sh)
    return doc


def render(cfg: ServeConfig) -> str:
    """:func:`canonical` as YAML, then one ``# accepted, not acted on`` comment per kept-but-idle setting."""
    import yaml
    text = yaml.safe_dump(canonical(cfg), sort_keys=False, allow_unicode=True, width=110)
    if cfg.not_acted_on:
        text += "# accepted, not acted on:\n" + "".join(f"#   {n}\n" for n in cfg.not_acted_on)
    return text


def _tenant(t) -> dict:
    out = {"name": t.name, "api_keys": [f"sha256:{k}" for k in t.key_digests], "priority": t.priority,
           "quota": {k: v for k, v in asdict(t.quota).items() if v is not None}, "admin": t.admin}
    if t.models is not None:
        out["models"] = list(t.models)
    b = t.circuit_breaker
    if b is not None:
        out["circuit_breaker"] = {"error_rate": f"{b.error_rate * 100:g}%", "window": f"{b.window_s:g}s",
                                  "open_for": f"{b.open_for_s:g}s", "min_requests": b.min_requests}
    return out


def _model(m) -> dict:
    out: dict = {"model": f"{m.name}@{','.join(map(str, m.devices))}" if m.devices else m.name}
    if m.fallback:
        out["fallback"] = ["cpu" if p.cpu else ",".join(map(str, p.devices)) for p in m.fallback]
    if m.kind == "generate":
        out["tp"] = m.tp
        eng = {f.name: getattr(m.engine, f.name) for f in fields(EngineConfig) if f.name != "mode"}
        out["engine"] = eng
        mode = m.engine.mode
        out["scheduler"] = {"mode": mode.mode, "low_latency_batch": mode.low_latency_batch,
                            "max_wait_ms": mode.max_wait_ms}
    else:
        out["batching"] = asdict(m.batching)
    return out


def _healing(sh) -> dict:
    r = sh.recovery
    return {"enabled": sh.enabled, "max_actions_per_hour": sh.max_actions_per_hour,
            "hysteresis": sh.hysteresis, "risk": sh.risk_ratio,
            "flapping": {"window": sh.flapping.window_s, "max_fires": sh.flapping.max_fires,
                         "hold": sh.flapping.hold_s},
            "triggers": [_trigger(t) for t in sh.triggers],
            "recovery": {"warmup_requests": r.warmup_requests, "health_check": r.health_check,
                         "rollback_on_failure": r.rollback_on_failure, "cooldown": r.cooldown_s,
                         "move_back": r.move_back, "return_after": r.return_after_s},
            **({"alerts": [{k: v for k, v in (("kind", a.kind), ("path", a.path), ("url", a.url),
                                              ("channel", a.channel), ("timeout", a.timeout_s)) if v is not None}
                           for a in sh.alerts]}
               if sh.alerts else {})}


def _trigger(t) -> dict:
    out = {"name": t.name, "metric": t.metric, "condition": str(t.condition), "window": t.window_s,
           "action": t.action}
    params = {k: v for k, v in t.params.items() if v is not None}
    if params:
        out["params"] = params
    if t.release is not None:
        out["release"] = str(t.release)
    if t.aggregate != "mean":
        out["aggregate"] = t.aggregate
    if t.cooldown_s is not None:
        out["cooldown"] = t.cooldown_s
    if t.metric in FORECAST_METRICS:
        out["lead"] = t.lead_s
        if t.model:
            out["model"] = t.model
    return out


__all__ = ["canonical", "render"]
