"""A stress test end to end: reference results, the open loop with faults, the independent check, the
server's own account (its events and samples), and the report.

1. *Reference*: each of ``distinct_inputs`` inputs once, one at a time, before any load: the fault-free
   result of every input (embeddings: the vector; generation: the greedy text).
2. *Load*: the profile's arrivals (:mod:`.loadgen`), with the scheduled faults (:mod:`.faults`) fired as
   the generator reaches their times, each recorded in the server's history (``POST /admin/events``,
   kind ``fault``, source ``stress-test``).
3. *Check*: the request history through :func:`runtime.cluster.history_check.check` (lost, duplicated,
   unexplained executions, acknowledgements); results against the reference with a tolerance
   (embeddings: cosine >= 1 - 1e-4, since batches of other shapes round differently; generation: equal
   text, differences are listed, not failed, as greedy near-ties may flip after a re-bind).
4. *Server's account* (admin key): its events in the run's window -- every self-healing trigger / action /
   recovery, every manual intervention -- and its samples, for the risks (a metric's peak against its
   trigger threshold, :data:`RISK_THRESHOLDS`).  Each injected fault is matched to the server's first
   event after it on the same device (detection) and the first ``recovery`` (or successful ``action``)
   after that (recovery).
5. *Figures*: admitted = sent - shed; success = ok / admitted; p50/p99 of the successful requests'
   latency; the capacity at which the p99 target holds: the highest achieved rate R of a 10 s window such
   that the successes of every window at or below R, pooled, have a p99 within target, shed < 5 % and
   number at least ``min_capacity_samples`` (pooled, so the capacity never contradicts the run's own p99:
   at the run's highest rate the pool is the whole run); advice.
"""
from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .faults import DeviceInjector, FaultDriver, schedule  # noqa: F401  (DeviceInjector: the CLI's)
from .loadgen import OpenLoop, Outcome
from .profiles import Profile, arrivals

INPUTS = ("The NPU ran the batch without a hitch.", "Latency rose after the device overheated.",
          "A spare device took over the shard.", "Fragmentation grew as the cache filled up.",
          "The operator throttled admission for five minutes.", "Requests were shed at the front door.",
          "HCCL all-reduce finished on every rank.", "The history store kept a week of samples.",
          "Self-healing restarted the lost device.", "Throughput doubled with a second replica.",
          "The KV cache held two hundred sequences.", "Temperature fell back under the threshold.",
          "An ECC error hit the upper half of HBM.", "The graph replayed the captured decode step.",
          "Tenants kept to their token quotas.", "Diagnose ranked the cause above the decoy.")

#: metric -> (threshold, what) for the risk list: the default triggers of the serve config's self_healing
RISK_THRESHOLDS: dict[str, tuple[float, str]] = {
    "hbm_fragmentation": (0.7, "fragmentation"), "pool_fragmentation": (0.7, "pool fragmentation"),
    "device_temperature_c": (85.0, "temperature"), "error_rate": (0.05, "error rate"),
    "kv_cache_usage": (0.95, "KV-cache use"), "queue_depth": (256.0, "queue depth")}


@dataclass(frozen=True)
class StressConfig:
    url: str
    api_key: str | None
    profile: Profile
    model: str | None = None
    faults: tuple[str, ...] = ()
    every_s: float = 30.0
    fault_devices: tuple[int, ...] = ()
    seed: int = 0
    poisson: bool = True
    distinct_inputs: int = 16
    max_tokens: int = 8
    timeout_s: float = 60.0
    max_attempts: int = 3
    workers: int = 64
    target_p99_ms: float | None = None
    drain_s: float = 120.0
    window_s: float = 10.0
    min_capacity_samples: int = 20      #: successful requests a capacity figure must rest on


class StressError(Exception):
    """The run cannot start (no server, no model); one line."""


class Client:
    """The HTTP side: one request per call (urllib, a fresh connection each: no client-side pooling to
    hide server behaviour), classified as :class:`~.loadgen.Outcome`."""

    def __init__(self, url: str, key: str | None, timeout_s: float):
        self.url, self.key, self.timeout_s = url.rstrip("/"), key, timeout_s

    def call(self, method: str, path: str, body: dict | None = None, timeout: float | None = None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.key:
            req.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout_s) as r:
                return r.status, json.loads(r.read().decode() or "{}")
        except urllib.error.HTTPError as e:
            try:
                doc = json.loads(e.read().decode() or "{}")
            except ValueError:
                doc = {}
            return e.code, doc

    def outcome(self, status: int, doc: dict, kind: str) -> Outcome:
        if status == 200:
            if kind == "embed":
                v = np.asarray(doc["data"][0]["embedding"], dtype=np.float64)
                return Outcome("ok", 200, hashlib.sha256(v.astype(np.float32).tobytes()).hexdigest()[:16], v)
            text = doc["choices"][0].get("text")
            if text is None:
                text = doc["choices"][0]["message"]["content"]
            return Outcome("ok", 200, hashlib.sha256(text.encode()).hexdigest()[:16], text)
        code = ((doc or {}).get("error") or {}).get("code")
        msg = ((doc or {}).get("error") or {}).get("message", "")
        if status == 429 or (status == 503 and code == "server_overloaded"):
            return Outcome("shed", status, error=f"{status} {code}: {msg}"[:200])
        if status >= 500:
            return Outcome("retry", status, error=f"{status} {code}: {msg}"[:200], server_failure=True)
        return Outcome("client-error", status, error=f"{status} {code}: {msg}"[:200])


def _model_of(client: Client, want: str | None) -> tuple[str, str, dict]:
    """(model, kind, the server's state) from ``/admin/state``."""
    st, doc = client.call("GET", "/admin/state", timeout=30)
    if st != 200:
        raise StressError(f"{client.url}/admin/state: HTTP {st} (an admin key is needed: --api-key or "
                          f"VNPU_API_KEY)" if st in (401, 403) else f"{client.url}: HTTP {st}")
    models = doc.get("models", {})
    if not models:
        raise StressError(f"{client.url} serves no model (state {doc.get('state')})")
    name = want or next(iter(models))
    if name not in models:
        raise StressError(f"{client.url} does not serve {name!r} (it serves {', '.join(models)})")
    return name, models[name].get("kind", "generate"), doc


def _body(kind: str, model: str, text: str, max_tokens: int) -> tuple[str, dict]:
    if kind == "embed":
        return "/v1/embeddings", {"model": model, "input": text, "encoding_format": "float"}
    return "/v1/completions", {"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0}


def _pct(xs, q: float) -> float | None:
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if len(xs) else None


def run_stress(cfg: StressConfig, inject: Callable[[str, int], dict] | None = None, source=None,
               clock: Callable[[], float] = time.monotonic, wait_until: Callable[[float], None] | None = None,
               out: Callable[[str], None] = lambda s: None) -> dict:
    """Run the stress test (blocks for the profile's duration plus the drain) and return the report."""
    client = Client(cfg.url, cfg.api_key, cfg.timeout_s)
    try:
        model, kind, state = _model_of(client, cfg.model)
    except OSError as e:
        raise StressError(f"cannot reach the server at {cfg.url}: {getattr(e, 'reason', e)}") from None
    inputs = [INPUTS[i % len(INPUTS)] + ("" if i < len(INPUTS) else f" ({i})") for i in range(cfg.distinct_inputs)]

    # 1. the fault-free reference
    reference: dict[str, object] = {}
    for i, text in enumerate(inputs):
        path, body = _body(kind, model, text, cfg.max_tokens)
        st, doc = client.call("POST", path, body)
        o = client.outcome(st, doc, kind)
        if o.kind != "ok":
            raise StressError(f"the reference request {i} failed before any fault: {o.error or st}")
        reference[str(i)] = o.value
    out(f"stress-test: {model} ({kind}) at {cfg.url}, profile {cfg.profile.name} peak {cfg.profile.peak:g}/s for "
        f"{cfg.profile.duration_s:g} s" + (f", faults {','.join(cfg.faults)} every {cfg.every_s:g} s"
                                            if cfg.faults else ", no faults"))

    def send(rid: int, key: str) -> Outcome:
        path, body = _body(kind, model, inputs[int(key)], cfg.max_tokens)
        try:
            st, doc = client.call("POST", path, body)
        except (OSError, urllib.error.URLError) as e:       # connection refused/reset, timeout
            return Outcome("retry", 0, error=f"{type(e).__name__}: {getattr(e, 'reason', e)}", server_failure=True)
        return client.outcome(st, doc, kind)

    arr = arrivals(cfg.profile, cfg.seed, cfg.poisson)
    gen = OpenLoop(arr, send, lambda rid: str(rid % len(inputs)), clock=clock, wait_until=wait_until,
                   workers=cfg.workers, max_attempts=cfg.max_attempts)

    def record_fault(f: dict) -> None:
        if source is not None:
            source.record_event("fault", source="stress-test",
                                diagnosis=f"stress-test injected {f['kind']} on npu:{f['device']}",
                                detail={"device": f["device"], "fault": f["kind"], "injected_by": "stress-test",
                                        "ok": f.get("ok", True)})

    plan = schedule(tuple(cfg.faults), cfg.every_s, cfg.profile.duration_s, cfg.fault_devices, cfg.seed) \
        if inject is not None and cfg.faults else []
    driver = FaultDriver(plan, inject or (lambda k, d: {}), clock, record_fault, cfg.seed)
    wall0 = time.time()
    if source is not None:
        _safe(lambda: source.record_event("lifecycle", source="stress-test",
                                          diagnosis=f"stress-test started: profile {cfg.profile.name}",
                                          detail={"profile": cfg.profile.name, "faults": list(cfg.faults),
                                                  "event": cfg.profile.name, "phase": "start"}))
    gen.run(cfg.drain_s, on_arrival=driver.on_arrival)
    driver.join()
    wall1 = time.time()
    if source is not None:
        _safe(lambda: source.record_event("lifecycle", source="stress-test", diagnosis="stress-test ended",
                                          detail={"event": cfg.profile.name, "phase": "end"}))
    slo = state.get("slo") if isinstance(state.get("slo"), dict) else {}
    return build_report(cfg, model, kind, gen, driver.fired, plan, reference, source, wall0, wall1, slo)


def _safe(fn) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - the server's event log is best effort for the generator
        pass


def _same(kind: str, a, b) -> bool:
    if kind == "embed":
        na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
        return na > 0 and nb > 0 and float(np.dot(a, b)) / (na * nb) >= 1.0 - 1e-4
    return a == b


def build_report(cfg: StressConfig, model: str, kind: str, gen: OpenLoop, fired: list[dict], plan, reference: dict,
                 source, wall0: float, wall1: float, slo: dict | None = None) -> dict:
    """The report (see the module doc); the p99 target: ``cfg.target_p99_ms``, else the server's ``slo``
    (from ``/admin/state``, else from the newest event that carries one)."""
    from runtime.cluster.history_check import check
    chk = check(gen.history)
    recs = gen.records
    events, samples_peak, slo = _server_account(source, wall0, wall1, dict(slo or {}))
    target = cfg.target_p99_ms
    if target is None and isinstance(slo.get("target_p99_ms"), (int, float)):
        target = float(slo["target_p99_ms"])
    # the policy engine's triggers, actions and releases; a device's own return to health (the sampler's
    # recovery event, source npu:<id>) recovers a fault but is no self-healing action
    actions = [e for e in events if e.kind in ("trigger", "action", "recovery") and not e.manual
               and e.source == "policy"]
    manual = [e for e in events if e.manual and not _own(e)]
    windows = _windows(cfg, recs)
    capacity = _capacity(windows, recs, cfg, target)
    rep = {
        "model": model, "kind": kind, "url": cfg.url,
        "profile": {"name": cfg.profile.name, "peak_rate": cfg.profile.peak, "duration_s": cfg.profile.duration_s,
                    "poisson": cfg.poisson},
        "rates": gen.rates(),
        "requests": _request_counts(kind, recs, reference, chk), "latency_ms": _latency_ms(recs),
        "target_p99_ms": target, "capacity": capacity, "capacity_rate": (capacity or {}).get("rate"),
        "check": {"ok": chk["ok"], "counts": chk["counts"], "by_kind": chk["by_kind"],
                  "violations": chk["violations"][:20]},
        "faults": _fault_timeline(fired, events, wall1), "planned_faults": len(plan),
        "self_healing": [e.to_dict() for e in actions],
        "manual_interventions": [e.to_dict() for e in manual],
        "risks": _risks(samples_peak), "windows": windows,
        "server_side": source is not None, "history": gen.history,
    }
    rep["advice"] = advice(rep)
    return rep


def _request_counts(kind: str, recs, reference: dict, chk: dict) -> dict:
    """The report's ``requests``: by outcome, admitted (sent - shed), the checker's lost and duplicated, and
    the successful results that differ from the reference."""
    by = {k: [r for r in recs if r.outcome == k] for k in ("ok", "shed", "failed", "client-error", "")}
    sent = len(recs)
    admitted = sent - len(by["shed"])
    differs = [r.rid for r in by["ok"] if not _same(kind, r.value, reference[r.key])]
    return {"sent": sent, "admitted": admitted, "ok": len(by["ok"]), "shed": len(by["shed"]),
            "failed": len(by["failed"]), "client_errors": len(by["client-error"]),
            "unfinished": len(by[""]), "retried_ok": sum(1 for r in by["ok"] if r.attempts > 1),
            "success_of_admitted": len(by["ok"]) / admitted if admitted else None,
            "shed_share": len(by["shed"]) / sent if sent else None,
            "lost": chk["counts"].get("lost", 0), "duplicated": chk["counts"].get("duplicated", 0),
            "differs_from_reference": len(differs)}


def _latency_ms(recs) -> dict:
    """p50/p95/p99/max of the successful requests' latency, in ms."""
    lat_ms = [r.latency_s * 1e3 for r in recs if r.outcome == "ok" and r.latency_s is not None]
    return {"p50": _pct(lat_ms, 50), "p95": _pct(lat_ms, 95), "p99": _pct(lat_ms, 99),
            "max": max(lat_ms) if lat_ms else None, "n": len(lat_ms)}


def _server_account(source, wall0: float, wall1: float, slo: dict) -> tuple[list, dict, dict]:
    """The server's events in the run's window, each :data:`RISK_THRESHOLDS` metric's peak ``(value,
    scope)`` over the run, and the slo (``slo`` when given, else the newest event's that carries one).  No
    source: nothing; a source that fails: no events and the error under ``"_error"`` (a report without the
    server's side says so)."""
    events, samples_peak = [], {}
    if source is not None:
        try:
            events = [e for e in source.events(wall0 - 1.0, None) if e.ts <= wall1 + 60.0]
            for m in RISK_THRESHOLDS:
                peak = None
                for scope in ([""] + source.devices()):
                    pts = source.samples(m, wall0, wall1, scope)
                    if pts:
                        v = max(p[1] for p in pts)
                        if peak is None or v > peak[0]:
                            peak = (v, scope)
                if peak is not None:
                    samples_peak[m] = peak
            for e in ([] if slo else reversed(source.events(until=wall1))):
                if isinstance((e.detail or {}).get("slo"), dict):
                    slo = e.detail["slo"]
                    break
        except Exception as e:  # noqa: BLE001 - a report without the server's side says so
            events = []
            samples_peak["_error"] = (0.0, str(e))
    return events, samples_peak, slo


def _own(e) -> bool:
    """An event the stress test itself wrote (its fault notes)."""
    return e.source == "stress-test" or (e.detail or {}).get("injected_by") == "stress-test"


def _fault_timeline(fired: list[dict], events: list, wall1: float) -> list[dict]:
    """Each injected fault with its detection and recovery from the server's events."""
    faults = []
    order = sorted(fired, key=lambda f: f["at"])
    for i, f in enumerate(order):
        t = f["wall"]
        dev = f["device"]
        # detection: the server's first event about this device before the next fault was injected (an
        # event that names no device counts only then too); recovery: its first recovery / successful action
        # on the device after that, at any later time
        t_next = order[i + 1]["wall"] if i + 1 < len(order) else wall1 + 60.0
        mine = [e for e in events if e.ts >= t and not _own(e) and _dev(e) in (dev, None)]
        det = next((e for e in mine if e.ts < t_next and e.kind in ("fault", "trigger", "action", "alert")), None)
        # recovery: before the next fault on the same device (a later fault's recovery is not this one's)
        t_same = next((g["wall"] for g in order[i + 1:] if g["device"] == dev), wall1 + 60.0)
        rec = None
        if det is not None:
            rec = next((e for e in events if det.ts <= e.ts < t_same and not _own(e) and
                        ((_dev(e) in (dev, None) and (e.kind == "recovery" or (e.kind == "action" and
                                                                             e.result == "ok")))
                         or (e.ts < t_next and _rebound_from(e, dev)))), None)
        faults.append({"at_s": f["at"], "kind": f["kind"], "device": dev, "injected": f.get("ok", True),
                       "error": f.get("error"),
                       "detected_after_s": None if det is None else det.ts - t,
                       "detected_by": None if det is None else f"#{det.id} {det.kind}: {det.diagnosis}",
                       "recovered_after_s": None if rec is None else _recovered_at(det, rec) - t,
                       "recovered_by": None if rec is None else f"#{rec.id} {rec.kind}: {rec.diagnosis}"})
    return faults


def _windows(cfg: StressConfig, recs) -> list[dict]:
    """Per ``cfg.window_s`` window of the profile: intended and achieved rate, p99 of the successes, shed share."""
    windows = []
    w = cfg.window_s
    nwin = max(1, int(math.ceil(cfg.profile.duration_s / w)))
    for k in range(nwin):
        rs = [r for r in recs if r.sent is not None and k * w <= r.sent < (k + 1) * w]
        ok = [r.latency_s * 1e3 for r in rs if r.outcome == "ok" and r.latency_s is not None]
        shed = sum(1 for r in rs if r.outcome == "shed")
        windows.append({"start_s": k * w, "intended_rate": cfg.profile.expected(k * w, min((k + 1) * w,
                                                                                          cfg.profile.duration_s)) / w,
                        "achieved_rate": len(rs) / w, "p99_ms": _pct(ok, 99), "shed": shed / len(rs) if rs else 0.0})
    return windows


def _capacity(windows: list[dict], recs, cfg: StressConfig, target: float | None) -> dict | None:
    """The capacity at which the p99 ``target`` holds (module doc, 5.): ``{"rate", "samples", "p99_ms"}``
    with ``rate`` None when no rate qualifies (then ``samples`` / ``p99_ms`` are the whole run's); None
    without a target."""
    if target is None:
        return None
    w = cfg.window_s
    lat: list[list[float]] = [[] for _ in windows]
    for r in recs:
        if r.sent is not None and r.outcome == "ok" and r.latency_s is not None and 0 <= r.sent // w < len(windows):
            lat[int(r.sent // w)].append(r.latency_s * 1e3)
    best = None
    for rate in sorted({x["achieved_rate"] for x in windows}):
        ks = [k for k, x in enumerate(windows) if x["achieved_rate"] <= rate]
        pool = [v for k in ks for v in lat[k]]
        shed = sum(windows[k]["shed"] * windows[k]["achieved_rate"] for k in ks)
        sent = sum(windows[k]["achieved_rate"] for k in ks)
        p99 = _pct(pool, 99)
        if (len(pool) >= cfg.min_capacity_samples and p99 is not None and p99 <= target
                and (shed / sent if sent else 0.0) < 0.05):
            best = {"rate": rate, "samples": len(pool), "p99_ms": p99}
    if best is None:
        pool = [v for x in lat for v in x]
        best = {"rate": None, "samples": len(pool), "p99_ms": _pct(pool, 99)}
    return {**best, "min_samples": cfg.min_capacity_samples}


def _capacity_text(rep: dict) -> str:
    """``; target p99 800 ms held up to 4.0 req/s (p99 612 ms of 380 requests at <= 4.0 req/s)``, or why
    no rate qualifies."""
    tgt, cap = rep["target_p99_ms"], rep.get("capacity")
    if tgt is None or cap is None:
        return ""
    f = lambda v: "n/a" if v is None else f"{v:.0f}"  # noqa: E731
    if cap["rate"] is not None:
        return (f"; target p99 {tgt:.0f} ms held up to {cap['rate']:.1f} req/s (p99 {f(cap['p99_ms'])} ms of "
                f"{cap['samples']} requests at <= {cap['rate']:.1f} req/s)")
    if cap["samples"] < cap["min_samples"]:
        return (f"; too few successful requests ({cap['samples']}, need {cap['min_samples']}) to say at which rate "
                f"the {tgt:.0f} ms p99 target holds")
    return (f"; target p99 {tgt:.0f} ms not held at any measured rate (p99 {f(cap['p99_ms'])} ms of "
            f"{cap['samples']} requests)")


def _risks(samples_peak: dict) -> list[dict]:
    """The metrics whose peak reached 80 % of their trigger threshold."""
    risks = []
    for m, (v, scope) in samples_peak.items():
        if m == "_error":
            continue
        thr, what = RISK_THRESHOLDS[m]
        if v >= 0.8 * thr:
            where = f" on {scope}" if scope else ""
            risks.append({"metric": m, "scope": scope, "peak": v, "threshold": thr,
                          "text": f"{what}{where} reached {v:.3g} of the {thr:g} threshold"
                                  + (" (crossed)" if v >= thr else "")})
    return risks


def _rebound_from(e, dev: int) -> bool:
    """An engine's automatic re-bind away from a placement that held ``dev`` (the sampler's ``fault`` event
    from the engine, ``ok``): the engine serves again elsewhere -- the fault's recovery for the requests."""
    d = e.detail or {}
    if e.source != "engine" or d.get("kind") != "fallback" or not d.get("ok"):
        return False
    import re
    held: set[int] = set()
    for a, b in re.findall(r"(\d+)(?:-(\d+))?", str(d.get("previous", "")).split("(")[0]):
        held.update(range(int(a), int(b or a) + 1))
    return dev in held


def _recovered_at(det, rec) -> float:
    """When ``rec`` recovered the fault ``det`` detected: a ``recovery`` event's time; an ``action`` event is
    recorded when its trigger fires and its ``duration_s`` runs from the condition's onset (the detection,
    for a device trigger) to the end of the action -- so ``det.ts + duration_s``, and never before ``rec.ts``."""
    if rec.kind == "action" and rec.duration_s is not None:
        return max(rec.ts, det.ts + rec.duration_s)
    return rec.ts


def _dev(e) -> int | None:
    """The device an event is about: ``detail.device`` (the sampler), else a ``npu:<id>`` scope (the policy
    engine's ``detail.scope``) or source; None when it names none."""
    d = e.detail or {}
    for k in ("device", "npu", "physical"):
        if isinstance(d.get(k), int):
            return d[k]
    for s in (d.get("scope"), e.source):
        if isinstance(s, str) and s.startswith("npu:") and s[4:].isdigit():
            return int(s[4:])
    return None


def advice(rep: dict) -> list[str]:
    out = []
    rq, lat = rep["requests"], rep["latency_ms"]
    r = rep["rates"]
    if r["intended"] and r["sent"] < r["intended"]:
        out.append(f"the generator sent {r['sent']} of {r['intended']} intended requests: give it more workers "
                   f"or run it on another machine")
    if rq["shed_share"] and rq["shed_share"] >= 0.05:
        out.append(f"{rq['shed_share']:.1%} shed: admission is the bottleneck at this rate -- scale out or raise "
                   f"the queue bound / tenant quotas")
    if rq["success_of_admitted"] is not None and rq["success_of_admitted"] < 0.995:
        out.append(f"only {rq['success_of_admitted']:.2%} of admitted requests succeeded: look at the failed "
                   f"requests' errors and the self-healing actions' results (vnpu postmortem)")
    if rq["lost"] or rq["duplicated"]:
        out.append(f"{rq['lost']} lost / {rq['duplicated']} duplicated requests: exactly-once broke "
                   f"(vnpu chaos check on the --json report's history)")
    tgt = rep["target_p99_ms"]
    if tgt is None:
        out.append("no p99 target known (the server's state names no slo): give --target-p99-ms for the "
                   "capacity figure")
    if tgt is not None and lat["p99"] is not None and lat["p99"] > tgt:
        cap = rep["capacity_rate"]
        out.append(f"p99 {lat['p99']:.0f} ms is above the {tgt:.0f} ms target" +
                   (f"; the target held up to {cap:.1f} req/s" if cap is not None else "")
                   + ": add a scale_out trigger on p99")
    for f in rep["faults"]:
        if f["injected"] and f["detected_after_s"] is None:
            out.append(f"{f['kind']} on npu:{f['device']} at +{f['at_s']:.0f} s was not detected by the server "
                       f"(no event): enable a self_healing trigger for it")
        elif f["injected"] and f["recovered_after_s"] is None:
            out.append(f"{f['kind']} on npu:{f['device']} at +{f['at_s']:.0f} s was detected but no recovery was "
                       f"recorded: check its trigger's action (vnpu postmortem --since ...)")
    failed = [e for e in rep["self_healing"] if e["kind"] == "action" and e["result"] not in ("ok", "")]
    if failed:
        out.append(f"{len(failed)} self-healing action(s) did not succeed, e.g. {failed[0]['diagnosis']}: "
                   f"{failed[0]['result']}")
    for rk in rep["risks"]:
        out.append(f"risk: {rk['text']}: act before the threshold (lower it, or defragment/throttle earlier)")
    if rep["manual_interventions"]:
        out.append(f"{len(rep['manual_interventions'])} manual intervention(s) during the run: automate them "
                   f"as self_healing triggers")
    return out or ["nothing to fix at this load"]


def summary_lines(rep: dict) -> list[str]:
    rq, lat, r = rep["requests"], rep["latency_ms"], rep["rates"]
    f = lambda v, fmt: "n/a" if v is None else format(v, fmt)  # noqa: E731
    lines = [f"profile {rep['profile']['name']} ({rep['profile']['duration_s']:g} s, peak "
             f"{rep['profile']['peak_rate']:g}/s): intended {r['intended']} requests ({r['intended_rate']:.2f}/s), "
             f"sent {r['sent']} ({r['achieved_rate']:.2f}/s achieved; send lag p99 "
             f"{f(r['send_lag_p99_s'], '.3f')} s)",
             f"requests: {rq['ok']} ok, {rq['shed']} shed ({f(rq['shed_share'], '.2%')}), {rq['failed']} failed, "
             f"{rq['client_errors']} client errors, {rq['unfinished']} unfinished; success of admitted "
             f"{f(rq['success_of_admitted'], '.3%')}; {rq['retried_ok']} succeeded on a retry",
             f"check (independent): lost {rq['lost']}, duplicated {rq['duplicated']}, "
             f"{'ok' if rep['check']['ok'] else 'violations: ' + json.dumps(rep['check']['by_kind'])}; "
             f"results differing from the fault-free reference: {rq['differs_from_reference']}",
             f"latency ms: p50 {f(lat['p50'], '.0f')}, p95 {f(lat['p95'], '.0f')}, p99 {f(lat['p99'], '.0f')}, "
             f"max {f(lat['max'], '.0f')} ({lat.get('n', 0)} successful requests)" + _capacity_text(rep)]
    for x in rep["faults"]:
        lines.append(f"fault {x['kind']} on npu:{x['device']} at +{x['at_s']:.0f} s: "
                     + ("NOT INJECTED: " + str(x["error"]) if not x["injected"] else
                        f"detected after {f(x['detected_after_s'], '.2f')} s"
                        + (f" ({x['detected_by']})" if x["detected_by"] else "")
                        + f", recovered after {f(x['recovered_after_s'], '.2f')} s"
                        + (f" ({x['recovered_by']})" if x["recovered_by"] else "")))
    if not rep["server_side"]:
        lines.append("the server's events were not read (no admin key): self-healing actions unknown")
    lines.append(f"self-healing actions: {len(rep['self_healing'])}; manual interventions: "
                 f"{len(rep['manual_interventions'])}")
    lines += [f"  {e['kind']} {e['trigger'] or ''} {e['diagnosis']} -> {e['result'] or 'pending'}".replace("  ", " ")
              for e in rep["self_healing"][:20]]
    lines += [f"risk: {x['text']}" for x in rep["risks"]]
    lines += [f"advice: {a}" for a in rep["advice"]]
    return lines
