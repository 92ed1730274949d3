"""``vnpu diagnose``: anomalies in a server's history, lined up with its events, ranked as root-cause
candidates of what users felt, with evidence and advice.

1. Every metric of the focus (:data:`FOCUS`) in every scope is searched for anomalies
   (:func:`runtime.observe.anomaly.detect`: spikes, bursts, level shifts, trends) over ``[since, until]``.
2. *Symptoms* are the anomalies users feel (:data:`SYMPTOMS`: latency, errors, shed requests going up).
3. *Candidates* are anomalies of the metrics that can cause a symptom (:data:`CAUSES`, each with a prior
   weight per symptom) and the events that can (faults, config changes, operator commands:
   :data:`EVENT_CAUSES`).  A candidate scores ``prior x timing x strength`` against each symptom: timing
   ``exp(-lag / tau)`` when it starts at most ``tolerance_s`` after the symptom and at most ``max_lag_s``
   before it (a cause after its effect scores 0), strength ``min(1, score / (2 z))``; an event on the same
   device corroborates a metric anomaly (+25 %).  Candidates are ranked by their best score.
4. Each finding gets advice from :data:`ADVICE` (by cause metric or event kind).

Pure over a :class:`~runtime.observe.source.HistorySource` (no clock: ``until`` defaults to the source's
``now``).  Blocks for the reads (one per metric and scope).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .anomaly import Anomaly, Detection, detect
from .metrics_store import METRICS, Event

#: focus -> the metrics searched
FOCUS: dict[str, tuple[str, ...]] = {
    "latency": ("p99_latency_ms", "p95_latency_ms", "ttft_p99_ms", "queue_depth", "running", "kv_cache_usage",
                "qps", "replicas", "throttle", "aicore_util"),
    "memory": ("hbm_fragmentation", "pool_fragmentation", "hbm_used_bytes", "kv_cache_usage",
               "p99_latency_ms", "error_rate"),
    "errors": ("error_rate", "shed_rate", "device_health", "replicas", "p99_latency_ms"),
    "thermal": ("device_temperature_c", "device_power_w", "aicore_util", "throttle", "p99_latency_ms"),
}
ALL = tuple(dict.fromkeys(m for ms in FOCUS.values() for m in ms))

#: metric -> the direction users feel (+1: up is bad)
SYMPTOMS: dict[str, int] = {"p99_latency_ms": 1, "p95_latency_ms": 1, "ttft_p99_ms": 1, "error_rate": 1,
                            "shed_rate": 1}

_LAT = ("p99_latency_ms", "p95_latency_ms", "ttft_p99_ms")


def _w(w: float, *symptoms: str) -> dict[str, float]:
    return {s: w for s in symptoms}


#: cause metric -> (direction that hurts, {symptom: prior weight})
CAUSES: dict[str, tuple[int, dict[str, float]]] = {
    "hbm_fragmentation": (1, {**_w(0.9, *_LAT), "error_rate": 0.7, "shed_rate": 0.6}),
    "pool_fragmentation": (1, {**_w(0.9, *_LAT), "error_rate": 0.7, "shed_rate": 0.6}),
    "device_temperature_c": (1, {**_w(0.8, *_LAT), "error_rate": 0.5, "shed_rate": 0.4}),
    "device_power_w": (1, {**_w(0.5, *_LAT)}),
    "device_health": (1, {**_w(0.9, *_LAT), "error_rate": 0.95, "shed_rate": 0.6}),
    "queue_depth": (1, {**_w(0.7, *_LAT), "shed_rate": 0.7}),
    "kv_cache_usage": (1, {**_w(0.6, *_LAT), "shed_rate": 0.5, "error_rate": 0.3}),
    "qps": (1, {**_w(0.6, *_LAT), "shed_rate": 0.8}),
    "aicore_util": (1, {**_w(0.5, *_LAT)}),
    "hbm_used_bytes": (1, {**_w(0.4, *_LAT), "error_rate": 0.5}),
    "replicas": (-1, {**_w(0.8, *_LAT), "shed_rate": 0.8, "error_rate": 0.5}),
    "throttle": (-1, {**_w(0.4, *_LAT), "shed_rate": 0.9}),
}

#: event kind -> prior weight as a cause of any symptom
EVENT_CAUSES: dict[str, float] = {"fault": 0.95, "config": 0.7, "manual": 0.6, "risk": 0.5}

#: cause (metric or ``event:<kind>``) -> advice
ADVICE: dict[str, str] = {
    "hbm_fragmentation": "HBM is fragmented: run the pool's live defragmentation (self_healing trigger with "
                         "action: defragment below the peak seen), or allocate the KV cache in fewer sizes",
    "pool_fragmentation": "the caching pool is fragmented: defragment (trigger action: defragment) or cap "
                          "max_split_size so large blocks are not split",
    "device_temperature_c": "a device ran hot: throttle on temperature (trigger action: throttle, e.g. by 20% "
                            "for 5m) and check the device's cooling / power cap",
    "device_power_w": "power rose with the load: check the power cap; throttle if it tracks temperature",
    "device_health": "a device failed: restart_device with a spare in the pool (trigger on device_health == "
                     "lost); keep a fallback entry in the engine's chain",
    "queue_depth": "requests queued: scale out (trigger on p99 > 2 * slo.target_p99_ms, action: scale_out) or "
                   "raise max_num_seqs if KV blocks allow",
    "kv_cache_usage": "the KV cache filled up (preemptions re-run prefills): more KV blocks "
                      "(gpu_memory_utilization) or a lower max_num_seqs",
    "qps": "the load rose beyond capacity: scale out, or admit less per tenant (quotas) so latency holds",
    "aicore_util": "the AI Cores saturated: scale out to a spare device",
    "hbm_used_bytes": "HBM use grew: look for a leak (vnpu prof memory) or a larger batch than planned",
    "replicas": "a replica went away: keep a spare device so scale_out can replace it",
    "throttle": "admission was throttled (by a trigger or an operator): shed requests follow; check the "
                "throttle trigger's threshold and duration",
    "event:fault": "a device fault: check the self-healing actions that followed (restart_device, fallback) "
                   "and their recovery times",
    "event:config": "a config change preceded it: roll back (vnpu serve reconfigure -f <previous>.yaml, or the "
                    "rollback action)",
    "event:manual": "an operator's command preceded it: review it (manual interventions count against the SLO)",
    "event:risk": "a risk was reported before it: act on the warning's threshold earlier",
}

#: unit -> the smallest noise scale of a metric in that unit (a flat series is not infinitely sensitive)
UNIT_FLOOR: dict[str, float] = {"ratio": 0.01, "ms": 2.0, "C": 0.5, "W": 1.0, "%": 1.0, "bytes": float(1 << 20),
                                "requests": 1.0, "1/s": 0.5, "code": 0.5, "replicas": 0.5}


def floor_of(metric: str) -> float:
    return UNIT_FLOOR.get(METRICS[metric][0], 0.0)


def is_device_metric(metric: str) -> bool:
    return METRICS[metric][1].startswith("per device")


@dataclass(frozen=True)
class Options:
    since: float | None = None          #: start of the window (ts); default: ``until - window_s``
    until: float | None = None          #: end (default: the source's now)
    window_s: float = 3600.0
    focus: str | None = None            #: a key of FOCUS (None: all)
    tau_s: float = 60.0                 #: timing decay of a candidate before its symptom
    max_lag_s: float = 600.0
    tolerance_s: float = 5.0            #: a candidate may start this much after the symptom (sampling)
    detection: Detection = Detection()


@dataclass
class Candidate:
    """A root-cause candidate: a metric anomaly or an event, with its score and evidence."""

    cause: str                          #: metric name or ``event:<kind>``
    scope: str
    score: float
    onset: float
    explains: list[str] = field(default_factory=list)    #: symptoms it explains
    evidence: list[str] = field(default_factory=list)
    anomaly: Anomaly | None = None
    event: Event | None = None
    advice: str = ""

    def to_dict(self) -> dict:
        return {"cause": self.cause, "scope": self.scope, "score": round(self.score, 4), "onset": self.onset,
                "explains": list(self.explains), "evidence": list(self.evidence), "advice": self.advice,
                "anomaly": self.anomaly.to_dict() if self.anomaly else None,
                "event": self.event.to_dict() if self.event else None}


@dataclass
class Diagnosis:
    since: float
    until: float
    focus: str | None
    anomalies: list[Anomaly]
    symptoms: list[Anomaly]
    candidates: list[Candidate]
    events: list[Event]
    series: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        return {"since": self.since, "until": self.until, "focus": self.focus,
                "symptoms": [a.to_dict() for a in self.symptoms],
                "candidates": [c.to_dict() for c in self.candidates],
                "anomalies": [a.to_dict() for a in self.anomalies],
                "events": [e.to_dict() for e in self.events]}


def describe(a: Anomaly) -> str:
    """One line about an anomaly: what moved, where, how much, when."""
    unit = METRICS[a.metric][0]
    where = f" on {a.scope}" if a.scope else ""
    f = _fmt(unit)
    if a.kind == "shift":
        return (f"{a.metric}{where} shifted {'up' if a.direction > 0 else 'down'} from {f(a.baseline)} to "
                f"{f(a.peak)} at {_t(a.onset)} ({a.score:.1f} noise scales)")
    if a.kind == "trend":
        return (f"{a.metric}{where} trended {'up' if a.direction > 0 else 'down'} from {f(a.baseline)} to "
                f"{f(a.peak)} between {_t(a.onset)} and {_t(a.end)}")
    span = "" if a.end == a.onset else f"-{_t(a.end)}"
    return (f"{a.metric}{where} {a.kind} to {f(a.peak)} (level {f(a.baseline)}, robust z {a.score:.1f}) at "
            f"{_t(a.onset)}{span}")


def _fmt(unit: str):
    if unit == "ratio":
        return lambda v: f"{v:.3g}"
    if unit == "bytes":
        return lambda v: f"{v / 2**20:.0f} MiB"
    return lambda v: f"{v:.4g} {unit}" if unit not in ("code",) else f"{v:.0f}"


def _t(ts: float) -> str:
    import time as _time
    return _time.strftime("%H:%M:%S", _time.gmtime(ts)) + f".{int((ts % 1) * 10)}"


def _hurts(a: Anomaly, direction: int) -> bool:
    return a.direction == direction


def _timing(cause_onset: float, symptom_onset: float, o: Options) -> float:
    lag = symptom_onset - cause_onset
    if lag < -o.tolerance_s or lag > o.max_lag_s:
        return 0.0
    return math.exp(-max(lag, 0.0) / o.tau_s)


def _event_scope(e: Event) -> str:
    d = e.detail or {}
    for k in ("device", "npu", "physical"):
        if isinstance(d.get(k), int):
            return f"npu:{d[k]}"
    for s in (d.get("scope"), e.source):
        if isinstance(s, str) and s.startswith("npu:"):
            return s
    return ""


def diagnose(src, opts: Options = Options()) -> Diagnosis:
    """Diagnose the history of ``src`` (a :class:`~runtime.observe.source.HistorySource`)."""
    until = opts.until if opts.until is not None else src.now()
    since = opts.since if opts.since is not None else until - opts.window_s
    metrics = FOCUS[opts.focus] if opts.focus else ALL
    scopes = src.devices()
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    anomalies: list[Anomaly] = []
    for m in metrics:
        for scope in (scopes if is_device_metric(m) else [""]):
            pts = src.samples(m, since, until, scope)
            if not pts:
                continue
            series[(m, scope)] = pts
            anomalies += detect(pts, m, scope, floor_of(m), opts.detection)
    events = src.events(since, until)
    symptoms = [a for a in anomalies if a.metric in SYMPTOMS and _hurts(a, SYMPTOMS[a.metric])]
    symptoms.sort(key=lambda a: (a.onset, -a.score))

    z = opts.detection.z
    cands: dict[tuple, Candidate] = {}

    def consider(key, make, prior_of, onset: float, strength: float, scope: str, what: str) -> None:
        best = cands.get(key)
        for s in symptoms:
            prior = prior_of(s.metric)
            if prior <= 0:
                continue
            timing = _timing(onset, s.onset, opts)
            if timing <= 0:
                continue
            sc = prior * timing * strength
            if best is None:
                best = cands[key] = make()
            lag = s.onset - onset
            best.evidence.append(f"{what} {abs(lag):.0f} s {'before' if lag >= 0 else 'after'} {describe(s)}")
            if s.metric not in best.explains:
                best.explains.append(s.metric)
            best.score = max(best.score, sc)

    for a in anomalies:
        spec = CAUSES.get(a.metric)
        if spec is None or not _hurts(a, spec[0]):
            continue
        if a.metric in SYMPTOMS:
            continue
        consider(("m", a.metric, a.scope, a.onset),
                 lambda a=a: Candidate(a.metric, a.scope, 0.0, a.onset, anomaly=a, evidence=[describe(a)],
                                       advice=ADVICE.get(a.metric, "")),
                 lambda sm, spec=spec: spec[1].get(sm, 0.0), a.onset, min(1.0, a.score / (2 * z)), a.scope,
                 "it began")
    for e in events:
        prior = EVENT_CAUSES.get(e.kind)
        if prior is None and not e.manual:
            continue
        prior = prior if prior is not None else EVENT_CAUSES["manual"]
        label = f"event #{e.id} {e.kind}" + (f" ({e.diagnosis})" if e.diagnosis else "")
        consider(("e", e.id), lambda e=e, label=label: Candidate(f"event:{e.kind}", _event_scope(e), 0.0, e.ts,
                                                                 event=e, evidence=[label],
                                                                 advice=ADVICE.get(f"event:{e.kind}", "")),
                 lambda sm, prior=prior: prior, e.ts, 1.0, _event_scope(e), "it happened")
    # events on the same device corroborate a metric anomaly near them
    for c in cands.values():
        if c.anomaly is None or not c.scope:
            continue
        near = [e for e in events if _event_scope(e) == c.scope and abs(e.ts - c.onset) <= opts.tau_s]
        if near:
            c.score = min(1.0, c.score * 1.25)
            c.evidence += [f"event #{e.id} {e.kind} on {c.scope} at {_t(e.ts)}: {e.diagnosis or e.kind}"
                           for e in near]
    ranked = sorted(cands.values(), key=lambda c: (-c.score, c.onset))
    anomalies.sort(key=lambda a: -a.score)
    return Diagnosis(since, until, opts.focus, anomalies, symptoms, ranked, events, series)


def summary_lines(d: Diagnosis, top: int = 5) -> list[str]:
    """The text a terminal shows: symptoms, ranked candidates with evidence and advice, other anomalies."""
    out = [f"diagnosis of {_t(d.since)} .. {_t(d.until)} UTC"
           + (f", focus {d.focus}" if d.focus else "") + f": {len(d.anomalies)} anomalies, "
           f"{len(d.symptoms)} symptom(s), {len(d.events)} event(s)"]
    if not d.symptoms:
        out.append("no symptom (latency, errors and shed requests stayed at their levels)")
    for s in d.symptoms[:top]:
        out.append(f"symptom: {describe(s)}")
    for i, c in enumerate(d.candidates[:top], 1):
        where = f" on {c.scope}" if c.scope else ""
        out.append(f"#{i} {c.cause}{where} (score {c.score:.2f}, explains {', '.join(c.explains)})")
        out += [f"   - {ev}" for ev in c.evidence[:4]]
        if c.advice:
            out.append(f"   advice: {c.advice}")
    others = [a for a in d.anomalies if a.metric not in SYMPTOMS
              and not any(c.anomaly is a for c in d.candidates)]
    if others:
        out.append("other anomalies (not lined up with a symptom):")
        out += [f"   - {describe(a)}" for a in others[:top]]
    return out
