"""``vnpu postmortem``: target vs actual over an incident (or a window) and its timeline, from the history.

The window: ``--since T`` (to now), or ``--event ID``: the incident that event belongs to -- the event and
every event that follows within ``gap_s`` of the previous one (a fault, the trigger it fires, the action,
the recovery), extended by each event's ``duration_s``, with ``margin_s`` on both sides.

Actual figures (server-wide samples, one a second):

- availability: ``1 - sum(error_rate * qps) / sum(qps)`` -- server-side failures only; shed requests are
  reported apart (``shed``), as the SLO counts what was admitted;
- p99: the 99th percentile of the per-second p99 samples, the worst second, and the share of seconds above
  the target;
- self-healing actions (``action`` events not manual), manual interventions (``manual`` events), their
  results and detection-to-recovery times;
- utilization: mean AI Core % over devices and time, mean KV-cache use, mean replicas.

Targets come from ``--target-p99-ms`` / ``--availability``, else from the history: the SLO in effect at
each moment -- the newest ``config``/``lifecycle`` event before it whose detail carries ``slo`` (``vnpu serve``
records its SLO at start, ``vnpu serve reconfigure`` the one it leaves in effect) --, else the defaults of the
serve config (800 ms, 99.5 %).  A window that a reconfiguration cut in parts is judged part by part, each
against the SLO of its own time (``segments``); a target is met when it is met in every part.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .metrics_store import Event

DEFAULT_TARGET_P99_MS = 800.0
DEFAULT_AVAILABILITY = 0.995


@dataclass(frozen=True)
class Targets:
    p99_ms: float = DEFAULT_TARGET_P99_MS
    availability: float = DEFAULT_AVAILABILITY
    origin: str = "default"


def _pct(s) -> float | None:
    if isinstance(s, (int, float)):
        return float(s) / 100.0 if s > 1 else float(s)
    if isinstance(s, str) and s.strip():
        t = s.strip()
        try:
            return float(t[:-1]) / 100.0 if t.endswith("%") else _pct(float(t))
        except ValueError:
            return None
    return None


def targets_of(events: list[Event], p99_ms: float | None = None, availability: float | None = None) -> Targets:
    """The SLO: explicit values, else the newest event with ``detail.slo``, else the defaults."""
    slo: dict = {}
    origin = "default"
    for e in reversed(events):
        d = (e.detail or {}).get("slo")
        if isinstance(d, dict):
            slo, origin = d, f"event #{e.id}"
            break
    tp = p99_ms if p99_ms is not None else slo.get("target_p99_ms")
    av = availability if availability is not None else _pct(slo.get("availability"))
    return Targets(float(tp) if isinstance(tp, (int, float)) else DEFAULT_TARGET_P99_MS,
                   float(av) if isinstance(av, (int, float)) else DEFAULT_AVAILABILITY,
                   "command line" if (p99_ms is not None or availability is not None) else origin)


def slo_segments(src, since: float, until: float, p99_ms: float | None = None,
                 availability: float | None = None) -> list[tuple[float, float, Targets]]:
    """``[(start, end, targets)]`` covering ``[since, until]``: the SLO in effect at ``since``, then a new part at
    every event inside the window that records an ``slo`` (a reconfiguration).  Explicit values override
    that field in every part (both given: one part)."""
    if p99_ms is not None and availability is not None:
        return [(since, until, targets_of([], p99_ms, availability))]
    out = [(since, targets_of(src.events(until=since), p99_ms, availability))]
    for e in src.events(since, until):
        if e.ts > since and isinstance((e.detail or {}).get("slo"), dict):
            out.append((e.ts, targets_of([e], p99_ms, availability)))
    return [(t, out[i + 1][0] if i + 1 < len(out) else until, tg) for i, (t, tg) in enumerate(out)]


def incident_window(src, event_id: int, gap_s: float = 120.0, margin_s: float = 60.0) -> tuple[float, float, list[Event]]:
    """(start, end, chain of events) of the incident ``event_id`` belongs to."""
    first = src.event(event_id)
    later = src.events(since=first.ts)
    chain, end = [first], first.ts + (first.duration_s or 0.0)
    for e in later:
        if e.id == first.id or e.ts < first.ts:
            continue
        if e.ts - end > gap_s:
            break
        chain.append(e)
        end = max(end, e.ts + (e.duration_s or 0.0))
    return first.ts - margin_s, end + margin_s, chain


def named_events(src, name: str) -> list[Event]:
    """The events recorded under the name ``name`` (``detail.event``: ``vnpu stress-test --profile NAME``
    records its start and end so, ``vnpu event mark NAME`` one mark), oldest first."""
    return [e for e in src.events() if isinstance(e.detail, dict) and e.detail.get("event") == name]


def named_window(src, name: str, margin_s: float = 60.0) -> tuple[float, float, list[Event]]:
    """(start, end, events) of the named event ``name``: from its first to its last record (a stress run's
    start and end), widened by ``margin_s``; the *latest* run when the name was recorded by several runs
    (a new run starts at a ``lifecycle`` record whose ``detail.phase`` is ``start``).  :class:`KeyError`
    (one line) if the history has no event of that name."""
    evs = named_events(src, name)
    if not evs:
        raise KeyError(f"no event named {name!r}")
    starts = [i for i, e in enumerate(evs) if e.detail.get("phase") == "start"]
    evs = evs[starts[-1]:] if starts else evs
    end = max(e.ts + (e.duration_s or 0.0) for e in evs)
    return evs[0].ts - margin_s, end + margin_s, evs


def metric_summary(src, metrics, since: float, until: float) -> dict:
    """``{metric: {scope: {samples, mean, p50, p99, min, max}}}`` over ``[since, until]`` for each of
    ``metrics`` (server-wide scope ``""`` and every device that has samples) -- ``--metrics all``."""
    out: dict = {}
    for m in metrics:
        per: dict = {}
        for scope in [""] + list(src.devices()):
            v = np.array([x for _, x in src.samples(m, since, until, scope)])
            if v.size:
                per[scope or "server"] = {"samples": int(v.size), "mean": float(v.mean()),
                                          "p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
                                          "min": float(v.min()), "max": float(v.max())}
        out[m] = per
    return out


def metric_lines(summary: dict) -> list[str]:
    """The terminal lines of :func:`metric_summary` (metrics without samples say so)."""
    out = ["metrics (samples, mean, p50, p99, min, max):"]
    for m, per in summary.items():
        if not per:
            out.append(f"  {m}: no samples")
        for scope, r in per.items():
            out.append(f"  {m} [{scope}]: {r['samples']}, {r['mean']:.4g}, {r['p50']:.4g}, {r['p99']:.4g}, "
                       f"{r['min']:.4g}, {r['max']:.4g}")
    return out


def _mean(xs) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


def _share(weights, values) -> float | None:
    w, v = np.asarray(weights, dtype=float), np.asarray(values, dtype=float)
    return float((w * v).sum() / w.sum()) if w.sum() > 0 else (float(v.mean()) if v.size else None)


def _judge(start: float, end: float, last: bool, tg: Targets, qps: dict, err, p99s) -> dict:
    """One part of the window against the SLO in effect then (samples at ``[start, end)``, the last part
    closed)."""
    inside = (lambda t: start <= t <= end) if last else (lambda t: start <= t < end)  # noqa: E731
    er = [(t, v) for t, v in err if inside(t)]
    p99 = np.array([v for t, v in p99s if inside(t)])
    failed = _share([qps.get(t, 0.0) for t, _ in er], [v for _, v in er])
    availability = None if failed is None else 1.0 - failed
    return {"since": start, "until": end,
            "target": {"p99_ms": tg.p99_ms, "availability": tg.availability, "from": tg.origin},
            "availability": availability,
            "availability_met": None if availability is None else availability >= tg.availability,
            "p99_ms": float(np.percentile(p99, 99)) if p99.size else None,
            "p99_met": None if not p99.size else bool(np.percentile(p99, 99) <= tg.p99_ms),
            "p99_above_target": int((p99 > tg.p99_ms).sum()), "samples": {"error_rate": len(er),
                                                                         "p99_latency_ms": int(p99.size)}}


def _all(flags) -> bool | None:
    known = [f for f in flags if f is not None]
    return None if not known else all(known)


def analyse(src, since: float, until: float, targets: Targets | None = None,
            p99_ms: float | None = None, availability: float | None = None) -> dict:
    """The postmortem of ``[since, until]`` as a dict (what ``--json`` prints).  ``targets``: one SLO for
    the whole window; otherwise each part of it is judged against the SLO in effect then
    (:func:`slo_segments`, ``p99_ms`` / ``availability`` overriding those fields)."""
    events = src.events(since, until)
    segs = [(since, until, targets)] if targets is not None else slo_segments(src, since, until, p99_ms, availability)
    tg = segs[-1][2]                                     # the SLO at the end of the window
    qps = dict(src.samples("qps", since, until))
    err = src.samples("error_rate", since, until)
    shed = src.samples("shed_rate", since, until)
    e = np.array([v for _, v in err])
    failed_share = _share([qps.get(t, 0.0) for t, _ in err], e)
    shed_share = _share([qps.get(t, 0.0) for t, _ in shed], [v for _, v in shed])
    p99s = src.samples("p99_latency_ms", since, until)
    p99 = np.array([v for _, v in p99s])
    parts = [_judge(a, b, i == len(segs) - 1, t, qps, err, p99s) for i, (a, b, t) in enumerate(segs)]
    above = sum(x["p99_above_target"] for x in parts)
    util = [v for d in src.devices() for _, v in src.samples("aicore_util", since, until, d)]
    actions = [x for x in events if x.kind == "action" and not x.manual]
    manual = [x for x in events if x.manual]
    recov = [x.duration_s for x in actions if x.duration_s is not None]
    availability_ = None if failed_share is None else 1.0 - failed_share
    one = len(parts) == 1
    out = {
        "window": {"since": since, "until": until, "seconds": until - since},
        "target": {"p99_ms": tg.p99_ms, "availability": tg.availability, "from": tg.origin},
        "segments": parts,
        "actual": {
            "availability": availability_,
            "availability_met": (None if availability_ is None else availability_ >= tg.availability) if one
            else _all(x["availability_met"] for x in parts),
            "requests": float(sum(qps.values())),
            "shed": shed_share,
            "p99_ms": float(np.percentile(p99, 99)) if p99.size else None,
            "p99_worst_second_ms": float(p99.max()) if p99.size else None,
            "p99_share_above_target": float(above / p99.size) if p99.size else None,
            "p99_met": _all(x["p99_met"] for x in parts),
            "self_heal_actions": len(actions),
            "self_heal_failed": sum(1 for x in actions if x.result not in ("ok", "")),   # failed, unavailable
            "recovery_s_max": max(recov) if recov else None,
            "recovery_s_mean": _mean(recov),
            "manual_interventions": len(manual),
            "faults": sum(1 for x in events if x.kind == "fault"),
            "aicore_util_mean": _mean(util),
            "kv_cache_usage_mean": _mean([v for _, v in src.samples("kv_cache_usage", since, until)]),
            "replicas_mean": _mean([v for _, v in src.samples("replicas", since, until)]),
        },
        # what each figure rests on: samples (one a second) and devices
        "samples": {"error_rate": int(e.size), "shed_rate": len(shed), "p99_latency_ms": int(p99.size),
                    "p99_above_target": above, "aicore_util": len(util), "devices": len(src.devices())},
        "timeline": [x.to_dict() for x in events],
    }
    return out


def _f(v, fmt: str, none: str = "n/a") -> str:
    return none if v is None else format(v, fmt)


def summary_lines(pm: dict) -> list[str]:
    """The text a terminal shows; every share says how many samples it rests on."""
    w, t, a = pm["window"], pm["target"], pm["actual"]
    n = pm.get("samples") or {}
    ts = lambda x: time.strftime("%H:%M:%S", time.gmtime(x))  # noqa: E731
    ok = lambda b: "n/a" if b is None else ("met" if b else "MISSED")  # noqa: E731
    out = [f"postmortem {ts(w['since'])} .. {ts(w['until'])} UTC ({w['seconds']:.0f} s); targets from {t['from']}",
           f"availability: target {t['availability']:.2%}, actual "
           f"{_f(a['availability'], '.3%')} ({ok(a['availability_met'])}) over {a['requests']:.0f} requests in "
           f"{n.get('error_rate', 0)} samples; shed {_f(a['shed'], '.2%')} ({n.get('shed_rate', 0)} samples)",
           f"p99 latency: target {t['p99_ms']:.0f} ms, actual {_f(a['p99_ms'], '.0f')} ms ({ok(a['p99_met'])}) "
           f"from {n.get('p99_latency_ms', 0)} per-second samples"
           + (" (under 100: the 99th percentile is about the worst one)" if 0 < n.get('p99_latency_ms', 0) < 100
              else "")
           + f", worst second {_f(a['p99_worst_second_ms'], '.0f')} ms, above target in "
           f"{_f(a['p99_share_above_target'], '.1%')} of the samples ({n.get('p99_above_target', 0)} of "
           f"{n.get('p99_latency_ms', 0)})",
           f"faults {a['faults']}, self-healing actions {a['self_heal_actions']} ({a['self_heal_failed']} not ok, "
           f"recovery max {_f(a['recovery_s_max'], '.1f')} s, mean {_f(a['recovery_s_mean'], '.1f')} s), "
           f"manual interventions {a['manual_interventions']}",
           f"utilization: AI Core {_f(a['aicore_util_mean'], '.0f')} % ({n.get('aicore_util', 0)} samples of "
           f"{n.get('devices', 0)} devices), KV cache "
           f"{_f(a['kv_cache_usage_mean'], '.0%')}, replicas {_f(a['replicas_mean'], '.1f')}",
           ]
    segs = pm.get("segments") or []
    if len(segs) > 1:
        out.append(f"the SLO changed {len(segs) - 1} time(s) in the window; each part judged against its own:")
        for g in segs:
            out.append(f"  {ts(g['since'])} .. {ts(g['until'])}: target p99 {g['target']['p99_ms']:.0f} ms, "
                       f"availability {g['target']['availability']:.2%} (from {g['target']['from']}); actual p99 "
                       f"{_f(g['p99_ms'], '.0f')} ms ({ok(g['p99_met'])}), availability "
                       f"{_f(g['availability'], '.3%')} ({ok(g['availability_met'])}), "
                       f"{g['samples']['p99_latency_ms']} p99 samples")
    out.append("timeline:")
    t0 = w["since"]
    for e in pm["timeline"]:
        extra = []
        if e["trigger"]:
            extra.append(f"trigger {e['trigger']}" + (f"={e['value']:.4g}" if e["value"] is not None else ""))
        if e["result"]:
            extra.append(e["result"])
        if e["duration_s"] is not None:
            extra.append(f"{e['duration_s']:.1f} s to recover")
        out.append(f"  +{e['ts'] - t0:7.1f} s  #{e['id']:<4} {e['kind']:<9}{' (manual)' if e['manual'] else ''} "
                   f"{e['source'] or '-'}: {e['diagnosis'] or '-'}" + (f"  [{'; '.join(extra)}]" if extra else ""))
    if not pm["timeline"]:
        out.append("  (no events)")
    return out
