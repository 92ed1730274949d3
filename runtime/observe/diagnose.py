"""``vnpu diagnose``: anomalies in a server's history, lined up with its events, ranked as root-cause
candidates of what users felt, with evidence, a stated confidence and advice.

1. Every metric of the focus (:data:`FOCUS`) in every scope is searched for anomalies
   (:func:`runtime.observe.anomaly.detect`: spikes, bursts, level shifts, trends) over ``[since, until]``.
2. A statistical anomaly is not yet a finding: a finding must cross an absolute limit
   (:mod:`runtime.observe.thresholds`: the chip's specs, the SLO, npu-smi's health codes) in at least
   ``min_samples`` samples.  *Symptoms* are what users feel (:data:`SYMPTOMS`: latency over the SLO's p99
   target, errors or shed requests over its error budget) -- an anomaly of such a metric that crosses the
   limit, or a breach with no onset in the window.  With fewer than ``min_window_samples`` samples of the
   symptom metrics, nothing is judged.
3. *Candidates* are the anomalies of the metrics that can cause a symptom (:data:`CAUSES`, each with a prior
   weight per symptom) that crossed their own limit, and the events that can (faults, config changes,
   operator commands: :data:`EVENT_CAUSES`).  A candidate's *confidence* is ``prior x timing x support``:
   timing ``exp(-lag / tau)`` when it starts at most ``tolerance_s`` after the symptom and at most
   ``max_lag_s`` before it (a cause after its effect scores 0), support ``min(1, samples over the limit /
   full_support)`` (an event: 1); an event on the same device corroborates a metric anomaly (+25 %).
   Ranked by confidence: >= 0.6 high, >= 0.3 medium, else low.
4. Cause metrics over their limit with no symptom to explain are reported apart ("over a limit, no
   symptom"); with neither symptoms nor those, the verdict is "no significant anomaly".
5. Each finding gets advice from :data:`ADVICE` (by cause metric or event kind).

Pure over a :class:`~runtime.observe.source.HistorySource` (no clock: ``until`` defaults to the source's
``now``).  Blocks for the reads (one per metric and scope).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from dataclasses import replace

from devices.chip import ASCEND_910B3, ChipSpec

from .anomaly import Anomaly, Detection, detect
from .metrics_store import METRICS, Event
from .postmortem import Targets, targets_of
from .thresholds import Threshold, fmt_value, thresholds

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

#: the CANN article's focus names (``--focus latency_spike``) -> a key of :data:`FOCUS`; the one table
FOCUS_ALIASES: dict[str, str] = {
    "latency_spike": "latency", "slow_requests": "latency", "throughput_drop": "latency",
    "memory_leak": "memory", "mem_frag": "memory", "fragmentation": "memory", "oom": "memory",
    "error_spike": "errors", "error_burst": "errors", "error_rate": "errors", "device_failure": "errors",
    "overheat": "thermal", "thermal_throttle": "thermal", "temperature": "thermal",
}


def focus_name(s: str) -> str:
    """A key of :data:`FOCUS` for ``s`` (itself or an article alias); :class:`ValueError` (one line) if none."""
    k = s.strip().lower()
    k = FOCUS_ALIASES.get(k, k)
    if k not in FOCUS:
        raise ValueError(f"unknown focus {s!r} (known: {', '.join(FOCUS)}; aliases: {', '.join(FOCUS_ALIASES)})")
    return k

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
    "device_temperature_c": "a device ran over its throttle point: throttle on temperature (trigger action: throttle, e.g. by 20% "
                            "for 5m) and check the device's cooling / power cap",
    "device_power_w": "power rose with the load: check the power cap; throttle if it tracks temperature",
    "device_health": "a device failed: restart_device with a spare in the pool (trigger on device_health == "
                     "lost); keep a fallback entry in the engine's chain",
    "queue_depth": "requests queued: scale out (trigger on p99 > 2 * slo.target_p99_ms, action: scale_out) or "
                   "raise max_num_seqs if KV blocks allow",
    "kv_cache_usage": "the KV cache filled up (preemptions re-run prefills): more KV blocks "
                      "(gpu_memory_utilization) or a lower max_num_seqs",
    "qps": "the load rose beyond capacity: scale out, or admit less per tenant (quotas) so latency holds",
    "aicore_util": "the AI Cores ran at saturation: scale out to a spare device",
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

#: confidence -> word (the first bound it reaches)
CONFIDENCE_WORDS: tuple[tuple[float, str], ...] = ((0.6, "high"), (0.3, "medium"), (0.0, "low"))


def floor_of(metric: str) -> float:
    return UNIT_FLOOR.get(METRICS[metric][0], 0.0)


def is_device_metric(metric: str) -> bool:
    return METRICS[metric][1].startswith("per device")


def confidence_word(c: float) -> str:
    return next(w for lo, w in CONFIDENCE_WORDS if c >= lo)


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
    chip: ChipSpec = ASCEND_910B3       #: whose limits (thermal throttle point, TDP, saturation) apply
    targets: Targets | None = None      #: the SLO (None: the newest event that carries one, else defaults)
    min_samples: int = 3                #: samples over its limit a finding needs
    min_window_samples: int = 30        #: samples of the symptom metrics below which nothing is judged
    full_support: int = 10              #: samples over the limit that give a metric cause full support


@dataclass
class Candidate:
    """A root-cause candidate: a metric anomaly or an event, with its confidence (``score``) and evidence."""

    cause: str                          #: metric name or ``event:<kind>``
    scope: str
    score: float                        #: confidence, prior x timing x support (0..1)
    onset: float
    explains: list[str] = field(default_factory=list)    #: symptoms it explains
    evidence: list[str] = field(default_factory=list)
    anomaly: Anomaly | None = None
    event: Event | None = None
    advice: str = ""

    @property
    def confidence(self) -> str:
        return confidence_word(self.score)

    def to_dict(self) -> dict:
        return {"cause": self.cause, "scope": self.scope, "score": round(self.score, 4),
                "confidence": self.confidence, "onset": self.onset,
                "explains": list(self.explains), "evidence": list(self.evidence), "advice": self.advice,
                "anomaly": self.anomaly.to_dict() if self.anomaly else None,
                "event": self.event.to_dict() if self.event else None}


@dataclass
class Diagnosis:
    since: float
    until: float
    focus: str | None
    anomalies: list[Anomaly]            #: every statistical anomaly (most are not findings)
    symptoms: list[Anomaly]             #: symptom metrics over their SLO limit
    candidates: list[Candidate]         #: ranked causes of the symptoms
    events: list[Event]
    series: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict, repr=False)
    over_limit: list[Anomaly] = field(default_factory=list)      #: cause metrics over a limit, no symptom
    limits: dict[str, Threshold] = field(default_factory=dict)
    samples: int = 0                    #: samples of the symptom metrics in the window
    min_window_samples: int = 0

    @property
    def judged(self) -> bool:
        """Whether the window held enough samples to judge."""
        return self.samples >= self.min_window_samples

    @property
    def verdict(self) -> str:
        if not self.judged:
            return (f"not enough data: {self.samples} samples of latency/errors in the window, a verdict needs "
                    f"{self.min_window_samples} (widen --since)")
        if self.symptoms:
            top = self.candidates[0] if self.candidates else None
            return (f"{len(self.symptoms)} symptom(s); " + (
                f"most likely cause {top.cause}{' on ' + top.scope if top.scope else ''} (confidence "
                f"{top.score:.2f}, {top.confidence})" if top else "no cause lined up with them"))
        if self.over_limit:
            return f"no symptom, but {len(self.over_limit)} metric(s) over a limit (below)"
        return "no significant anomaly"

    def findings(self) -> int:
        return len(self.symptoms) + len(self.over_limit)

    def to_dict(self) -> dict:
        return {"since": self.since, "until": self.until, "focus": self.focus, "verdict": self.verdict,
                "samples": self.samples, "judged": self.judged,
                "limits": {m: t.to_dict() for m, t in self.limits.items()},
                "symptoms": [a.to_dict() for a in self.symptoms],
                "candidates": [c.to_dict() for c in self.candidates],
                "over_limit": [a.to_dict() for a in self.over_limit],
                "anomalies": [a.to_dict() for a in self.anomalies],
                "events": [e.to_dict() for e in self.events]}


_WORDS = {("spike", 1): "spiked", ("spike", -1): "dipped", ("burst", 1): "rose for a while",
          ("burst", -1): "dropped for a while", ("breach", 1): "stayed over", ("breach", -1): "stayed under"}


def describe(a: Anomaly) -> str:
    """One line about an anomaly: what moved, where, how much, when -- and, when it crossed its limit, the
    limit, its source, and in how many samples."""
    where = f" on {a.scope}" if a.scope else ""
    f = lambda v: fmt_value(a.metric, v)  # noqa: E731
    up = "up" if a.direction > 0 else "down"
    if a.kind == "shift":
        text = (f"{a.metric}{where} shifted {up} from {f(a.baseline)} to {f(a.peak)} at {_t(a.onset)} "
                f"({a.score:.1f} noise scales)")
    elif a.kind == "trend":
        text = f"{a.metric}{where} trended {up} from {f(a.baseline)} to {f(a.peak)} between {_t(a.onset)} and {_t(a.end)}"
    elif a.kind == "breach":
        text = f"{a.metric}{where} over its limit throughout, worst {f(a.peak)}, from {_t(a.onset)}"
    else:
        span = "" if a.end == a.onset else f"-{_t(a.end)}"
        text = (f"{a.metric}{where} {_WORDS[(a.kind, a.direction)]} to {f(a.peak)} (level {f(a.baseline)}, "
                f"robust z {a.score:.1f}) at {_t(a.onset)}{span}")
    lim = a.detail.get("limit")
    if lim:
        worst = "" if a.detail["worst"] == a.peak else f"worst {f(a.detail['worst'])} "
        text += (f": {worst}{'over' if lim['direction'] > 0 else 'under'} {lim['what']} ({lim['source']}) in "
                 f"{a.detail['over']} of {a.detail['of']} samples")
    return text


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


def _limit_of(metric: str, pts: list[tuple[float, float]], limits: dict[str, Threshold]) -> Threshold | None:
    """The limit of ``metric``: the table's; ``replicas``: the count at the window's start (a drop of a
    count is a fact, not a statistic)."""
    if metric == "replicas" and pts:
        n = pts[0][1]
        return Threshold("replicas", n, -1, f"the {n:.0f} replica(s) at the window's start", "history")
    return limits.get(metric)


def _over(a: Anomaly, pts: list[tuple[float, float]], lim: Threshold | None, o: Options) -> Anomaly | None:
    """``a`` with its limit's evidence in ``detail`` when at least ``min_samples`` of its samples (from its
    onset to its end) cross ``lim`` in the direction it moved; else None (not a finding)."""
    if lim is None or a.direction != lim.direction:
        return None
    span = [p for p in pts if a.onset <= p[0] <= a.end]
    over = [v for _, v in span if lim.crossed(v)]
    if len(over) < o.min_samples:
        return None
    worst = max(over) if lim.direction > 0 else min(over)
    return replace(a, detail={**a.detail, "limit": lim.to_dict(), "over": len(over), "of": len(span),
                              "worst": worst})


def _breach(metric: str, scope: str, pts: list[tuple[float, float]], lim: Threshold | None,
            o: Options) -> Anomaly | None:
    """A series over its limit in ``min_samples`` samples without an anomaly to account for it (over the
    limit from before the window): a finding with no onset in the window."""
    if lim is None:
        return None
    over = [(t, v) for t, v in pts if lim.crossed(v)]
    if len(over) < o.min_samples:
        return None
    worst = max(over, key=lambda p: p[1] * lim.direction)
    return Anomaly(metric, scope, "breach", over[0][0], over[-1][0], worst[0], worst[1], lim.limit, 0.0,
                   lim.direction, {"limit": lim.to_dict(), "over": len(over), "of": len(pts), "worst": worst[1]})


def _limits(src, until: float, o: Options) -> dict[str, Threshold]:
    tg = o.targets or targets_of(src.events(until=until))
    return thresholds(o.chip, tg.p99_ms, tg.availability, tg.origin)


def _scan(src, since: float, until: float, o: Options, limits: dict[str, Threshold]):
    """Read and search every series of the focus: (series, anomalies, symptoms, causes over their limit,
    samples of the symptom metrics)."""
    metrics = FOCUS[o.focus] if o.focus else ALL
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    anomalies: list[Anomaly] = []
    symptoms: list[Anomaly] = []
    causes: list[Anomaly] = []
    n_symptom = 0
    for m in metrics:
        for scope in (src.devices() if is_device_metric(m) else [""]):
            pts = src.samples(m, since, until, scope)
            if not pts:
                continue
            series[(m, scope)] = pts
            found = detect(pts, m, scope, floor_of(m), o.detection)
            anomalies += found
            lim = _limit_of(m, pts, limits)
            kept = [x for x in (_over(a, pts, lim, o) for a in found) if x is not None]
            if not kept:
                kept = [x for x in [_breach(m, scope, pts, lim, o)] if x is not None]
            if m in SYMPTOMS:
                n_symptom = max(n_symptom, len(pts))
                symptoms += [a for a in kept if _hurts(a, SYMPTOMS[m])]
            elif m in CAUSES:
                causes += [a for a in kept if _hurts(a, CAUSES[m][0])]
    symptoms.sort(key=lambda a: (a.onset, -a.score))
    return series, anomalies, symptoms, causes, n_symptom


def _rank(symptoms: list[Anomaly], causes: list[Anomaly], events: list[Event], o: Options) -> list[Candidate]:
    """The candidates that line up with a symptom, by confidence."""
    cands: dict[tuple, Candidate] = {}

    def consider(key, make, prior_of, onset: float, support: float, what: str) -> None:
        best = cands.get(key)
        for s in symptoms:
            prior = prior_of(s.metric)
            timing = _timing(onset, s.onset, o) if prior > 0 else 0.0
            if timing <= 0:
                continue
            if best is None:
                best = cands[key] = make()
            lag = s.onset - onset
            best.evidence.append(f"{what} {abs(lag):.0f} s {'before' if lag >= 0 else 'after'}: {describe(s)}")
            if s.metric not in best.explains:
                best.explains.append(s.metric)
            best.score = max(best.score, prior * timing * support)

    for a in causes:
        spec = CAUSES[a.metric]
        consider(("m", a.metric, a.scope, a.onset),
                 lambda a=a: Candidate(a.metric, a.scope, 0.0, a.onset, anomaly=a, evidence=[describe(a)],
                                       advice=ADVICE.get(a.metric, "")),
                 lambda sm, spec=spec: spec[1].get(sm, 0.0), a.onset,
                 min(1.0, a.detail["over"] / max(1, o.full_support)), "it began")
    for e in events:
        prior = EVENT_CAUSES.get(e.kind)
        if prior is None and not e.manual:
            continue
        prior = prior if prior is not None else EVENT_CAUSES["manual"]
        label = f"event #{e.id} {e.kind}" + (f" ({e.diagnosis})" if e.diagnosis else "")
        consider(("e", e.id), lambda e=e, label=label: Candidate(f"event:{e.kind}", _event_scope(e), 0.0, e.ts,
                                                                 event=e, evidence=[label],
                                                                 advice=ADVICE.get(f"event:{e.kind}", "")),
                 lambda sm, prior=prior: prior, e.ts, 1.0, "it happened")
    # events on the same device corroborate a metric anomaly near them
    for c in cands.values():
        near = [e for e in events if c.anomaly is not None and c.scope and _event_scope(e) == c.scope
                and abs(e.ts - c.onset) <= o.tau_s]
        if near:
            c.score = min(1.0, c.score * 1.25)
            c.evidence += [f"event #{e.id} {e.kind} on {c.scope} at {_t(e.ts)}: {e.diagnosis or e.kind}"
                           for e in near]
    return sorted(cands.values(), key=lambda c: (-c.score, c.onset))


def diagnose(src, opts: Options = Options()) -> Diagnosis:
    """Diagnose the history of ``src`` (a :class:`~runtime.observe.source.HistorySource`)."""
    until = opts.until if opts.until is not None else src.now()
    since = opts.since if opts.since is not None else until - opts.window_s
    limits = _limits(src, until, opts)
    series, anomalies, symptoms, causes, n = _scan(src, since, until, opts, limits)
    events = src.events(since, until)
    if n < opts.min_window_samples:
        symptoms, causes = [], []
    ranked = _rank(symptoms, causes, events, opts)
    explained = {id(c.anomaly) for c in ranked if c.anomaly is not None}
    over_limit = [a for a in causes if id(a) not in explained]
    anomalies.sort(key=lambda a: -a.score)
    return Diagnosis(since, until, opts.focus, anomalies, symptoms, ranked, events, series, over_limit, limits, n,
                     opts.min_window_samples)


def _limit_line(d: Diagnosis, metric: str, what: str) -> str:
    """How a symptom metric stayed within its limit: ``p99 latency within the 800 ms p99 target (SLO, ...)
    in all 600 samples``."""
    lim = d.limits.get(metric)
    pts = d.series.get((metric, ""), [])
    if lim is None or not pts:
        return ""
    n_over = lim.count(pts)
    return (f"{what} {'within' if not n_over else 'over'} {lim.what} ({lim.source}) in "
            f"{'all ' + str(len(pts)) if not n_over else f'{n_over} of {len(pts)}'} samples")


def summary_lines(d: Diagnosis, top: int = 5) -> list[str]:
    """The text a terminal shows: the verdict, symptoms, ranked candidates with evidence, confidence and
    advice, metrics over a limit without a symptom."""
    out = [f"diagnosis of {_t(d.since)} .. {_t(d.until)} UTC" + (f", focus {d.focus}" if d.focus else "")
           + f": {d.samples} samples, {len(d.symptoms)} symptom(s), {len(d.events)} event(s)",
           f"verdict: {d.verdict}"]
    if d.judged and not d.symptoms:
        out += [f"   - {ln}" for ln in (_limit_line(d, "p99_latency_ms", "p99 latency"),
                                        _limit_line(d, "error_rate", "errors")) if ln]
    for s in d.symptoms[:top]:
        out.append(f"symptom: {describe(s)}")
    for i, c in enumerate(d.candidates[:top], 1):
        where = f" on {c.scope}" if c.scope else ""
        out.append(f"#{i} {c.cause}{where} (confidence {c.score:.2f}, {c.confidence}; explains "
                   f"{', '.join(c.explains)})")
        out += [f"   - {ev}" for ev in c.evidence[:4]]
        if c.advice:
            out.append(f"   advice: {c.advice}")
    if d.over_limit:
        out.append("over a limit, no symptom to explain:")
        for a in d.over_limit[:top]:
            out.append(f"   - {describe(a)}")
            if ADVICE.get(a.metric):
                out.append(f"     advice: {ADVICE[a.metric]}")
    found = {(a.metric, a.scope, a.kind, a.onset) for a in [*d.symptoms, *d.over_limit,
                                                             *(c.anomaly for c in d.candidates if c.anomaly)]}
    rest = sum(1 for a in d.anomalies if (a.metric, a.scope, a.kind, a.onset) not in found)
    if rest:
        out.append(f"{rest} statistical anomal{'y' if rest == 1 else 'ies'} within every limit: not findings "
                   f"(--json lists them)")
    return out
