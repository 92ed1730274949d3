"""``vnpu bench serve --load-step``: scheduler modes and Ray Serve replicas under a step from light to heavy
load, and what the Ray Serve path adds, all in one run.

- **Load step** (open loop: arrivals follow a schedule fixed in advance -- evenly spaced at the phase's
  rate, jittered by ``--seed`` -- whatever the server does; latency counts from the *intended* arrival, so
  a slow server cannot hide its queue): ``--light-s``
  seconds at the light rate, then ``--heavy-s`` at the heavy rate.  Rates and the SLO come from a
  calibration in the same run unless given: light = 0.5x and heavy = 2x the requests/s that
  ``ultra_low_latency`` sustains (a closed loop at its batch size), target p99 = 4x a solo request's
  latency.  Per mode and replica count: per phase, offered and achieved requests/s, output tokens/s,
  end-to-end p50/p99 against the target, TTFT p99, refusals.
- **Ray Serve path**: the same engine served in-process and by one Ray Serve replica, side by side with
  requests alternating between them: the added latency per request (one-token requests; the median of
  the paired differences) and per streamed token ((last - first token) / (tokens - 1); the replica sends
  tokens in batches of up to ``--stream-interval-ms``), and the bare Serve round trip (a no-op call on
  the replica's handle).
- **Bound**: the same decode forward in numpy at the largest batch (this machine's math alone).

``--replicas 1`` is the in-process server (no Serve hop); R > 1 runs R replicas, one device each.  On a
machine with fewer cores than replicas x device threads, more replicas add no compute: the figure shows
what they cost, not a speed-up.
"""
from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from urllib.parse import urlparse

import numpy as np

from .serve_workload import NumpyDecode, pct as _pct, prompt as _prompt


def mode_list(s: str) -> list[str]:
    """``type=``: comma-separated scheduler mode names."""
    import argparse

    from runtime.serve.engine.modes import MODES
    vals = [m.strip() for m in s.split(",") if m.strip()]
    bad = [m for m in vals if m not in MODES]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"takes modes among {', '.join(MODES)}; got {s!r}")
    return vals


def register_flags(p) -> None:
    from runtime.cliargs import float_in, int_list, nonneg_int, positive_int
    pos = float_in(0.0, lo_open=True)
    p.add_argument("--load-step", action="store_true", help="modes and replicas under a light-to-heavy load step")
    p.add_argument("--mode", type=mode_list, default="ultra_low_latency,adaptive",
                   help="scheduler modes to compare (--load-step): ultra_low_latency, conservative, adaptive, "
                        "and the seed's manual, hybrid, auto (auto picks its target from the runs before it)")
    p.add_argument("--replicas", type=int_list, default="1,2", help="replica counts (1 = in-process; --load-step)")
    p.add_argument("--light-s", type=pos, default=8.0, help="seconds of light load")
    p.add_argument("--heavy-s", type=pos, default=12.0, help="seconds of heavy load")
    p.add_argument("--light-rate", type=pos, default=None, help="requests/s of the light phase (default: calibrated)")
    p.add_argument("--heavy-rate", type=pos, default=None, help="requests/s of the heavy phase (default: calibrated)")
    p.add_argument("--slo-p99-ms", type=pos, default=None, help="the adaptive mode's target (default: calibrated)")
    p.add_argument("--stream-interval-ms", type=float_in(0.0, 1000.0), default=20.0,
                   help="replicas batch streamed tokens this long")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the arrivals and prompts (default 0)")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="load steps per (replicas, mode), modes alternating (a shared machine drifts; the "
                        "verdict takes the medians)")


# ---------------------------------------------------------------------------------------------- clients
def _stream(url: str, model: str, prompt: str, max_tokens: int, stream: bool = True) -> dict:
    """One completion: status, time of each streamed text piece (perf_counter), tokens, the finish reason
    (``"length"``: all ``max_tokens`` tokens came -- ``ignore_eos`` -- anything else: cut short)."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": stream, "ignore_eos": True})
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            r.read()
            return {"status": r.status, "t0": t0, "stamps": [], "tokens": 0, "end": time.perf_counter(),
                    "finish": None}
        stamps, finish = [], None
        if stream:
            for line in r:
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                    ch = json.loads(line[6:]).get("choices")      # an error event has none: cut short
                    if ch and ch[0]["text"]:
                        stamps.append(time.perf_counter())
                    if ch and ch[0].get("finish_reason"):
                        finish = ch[0]["finish_reason"]
            n = max_tokens if finish == "length" else 0
        else:
            body = json.loads(r.read())
            n, finish = body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"]
            stamps.append(time.perf_counter())
        return {"status": 200, "t0": t0, "stamps": stamps, "tokens": n, "end": time.perf_counter(), "finish": finish}
    finally:
        conn.close()


def _schedule(phases: list[tuple[str, float, float]], seed: int) -> list[tuple[float, str]]:
    """Arrival times (s from the start) of each phase ``(name, rate, seconds)``: evenly spaced at the rate,
    each shifted by up to a quarter gap (seeded), so that every mode sees the same arrivals and rounds
    differ only by the machine (Poisson counts over a few seconds vary too much to compare modes)."""
    rng = np.random.default_rng(seed)
    out, t0 = [], 0.0
    for name, rate, dur in phases:
        gap = 1.0 / rate
        n = int(dur * rate)
        out += [(t0 + (i + 0.5) * gap + rng.uniform(-0.25, 0.25) * gap, name) for i in range(n)]
        t0 += dur
    return out


def load_step(url: str, model: str, phases, max_tokens: int, seed: int) -> dict:
    """Run the open-loop schedule; per phase: offered/achieved rates, throughput, latency percentiles."""
    sched = _schedule(phases, seed)
    recs: list[dict] = []
    lock = threading.Lock()
    start = time.perf_counter() + 0.2
    tick = threading.Event()

    def one(at: float, phase: str, i: int):
        r = _stream(url, model, _prompt(i), max_tokens)
        r.update(intended=start + at, phase=phase)
        with lock:
            recs.append(r)

    threads = []
    for i, (at, phase) in enumerate(sched):
        left = start + at - time.perf_counter()
        if left > 0:
            tick.wait(left)                          # open loop: requests leave on schedule, not on replies
        th = threading.Thread(target=one, args=(at, phase, i), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    out, t_phase = {}, 0.0
    for name, rate, dur in phases:
        rs = [r for r in recs if r["phase"] == name]
        ok = [r for r in rs if r["status"] == 200]
        lat = [r["end"] - r["intended"] for r in ok]
        ttft = [r["stamps"][0] - r["intended"] for r in ok if r["stamps"]]
        p0 = start + t_phase
        last = max((r["end"] for r in ok), default=p0 + dur)
        toks = sum(r["tokens"] for r in ok)
        out[name] = {"offered_rps": rate, "arrivals": len(rs), "arrival_rps": round(len(rs) / dur, 2),
                     "completed": len(ok), "refused": len(rs) - len(ok),
                     # verification: a completed request that was cut short; a failure that is no refusal
                     "cut_short": sum(1 for r in ok if r["finish"] != "length" or not r["stamps"]),
                     "errors": sum(1 for r in rs if r["status"] not in (200, 429, 503)),
                     "achieved_rps": round(len(ok) / max(last - p0, 1e-9), 2),
                     "output_tokens_per_s": round(toks / max(last - p0, 1e-9), 1),
                     "e2e_ms_p50": round(1e3 * _pct(lat, 50), 1), "e2e_ms_p99": round(1e3 * _pct(lat, 99), 1),
                     "ttft_ms_p99": round(1e3 * _pct(ttft, 99), 1)}
        t_phase += dur
    return out


def probe(urls: dict[str, str], model: str, n: int = 40, streams: int = 8, stream_tokens: int = 32) -> dict:
    """The servers of ``urls`` (name -> URL) side by side, requests alternating between them (one at a time,
    so that each sees the same machine): one-token request latency, and per streamed token
    ((last - first) / (tokens - 1)); medians per server and of the paired differences against the first."""
    names = list(urls)
    for u in urls.values():
        _stream(u, model, _prompt(0), 2)                                        # warm up
    one: dict[str, list[float]] = {k: [] for k in names}
    tok: dict[str, list[float]] = {k: [] for k in names}
    for i in range(n):
        for k in (names if i % 2 == 0 else names[::-1]):
            r = _stream(urls[k], model, _prompt(i), 1, stream=False)
            one[k].append(r["end"] - r["t0"])
    for i in range(streams):
        for k in (names if i % 2 == 0 else names[::-1]):
            s = _stream(urls[k], model, _prompt(i), stream_tokens)["stamps"]
            tok[k].append((s[-1] - s[0]) / max(1, len(s) - 1))
    base = names[0]
    out = {k: {"request_ms_p50": round(1e3 * statistics.median(one[k]), 2),
               "per_token_ms_p50": round(1e3 * statistics.median(tok[k]), 3)} for k in names}
    for k in names[1:]:
        out[k]["added_ms_per_request"] = round(1e3 * statistics.median(
            [b - a for a, b in zip(one[base], one[k])]), 2)
        out[k]["added_ms_per_token"] = round(1e3 * statistics.median(
            [b - a for a, b in zip(tok[base], tok[k])]), 3)
    return out


# ---------------------------------------------------------------------------------------------- the run
def run(a) -> int:
    import sys

    from runtime.cluster import ClusterSpec, cluster_runtime
    from runtime.models.weights import LlamaConfig, load_gguf_cached, smollm2_gguf
    from runtime.serve.config import model_spec
    from runtime.serve.engine import EngineConfig
    from runtime.serve.engine.modes import ModeConfig
    from runtime.serve.replicas import ReplicaOptions, ReplicaService
    from runtime.serve.server import Server, Service

    modes, reps = list(a.mode), sorted(set(a.replicas))           # checked by argparse
    if a.backend == "local":
        print("vnpu bench serve: error: --load-step compares Ray Serve replicas: it needs --backend cluster",
              file=sys.stderr)
        return 2
    T = a.max_tokens
    # a fixed KV cache (not "all the HBM left"): the Ray Serve replica that the probe runs next to the
    # in-process engine may land on the same device
    ecfg = EngineConfig(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=64 + T, max_queued_requests=1024,
                        num_gpu_blocks_override=16 * -(-(64 + T) // 16) + 1)
    spec = model_spec(a.model, (0,), 1, ecfg)
    doc: dict = {"model": a.model, "max_tokens": T, "engine": {"max_num_seqs": 16}, "runs": []}
    with cluster_runtime(spec=ClusterSpec(devices=max(reps), arena_bytes=2 << 30)) as rt:
        svc = Service(rt, (spec,))
        srv = Server(svc).start()
        try:
            svc.load()
            solo, cap = _calibrate(svc, srv.url, a.model, T)
            target = a.slo_p99_ms or round(4e3 * solo)
            light, heavy = a.light_rate or round(0.5 * cap, 2), a.heavy_rate or round(2.0 * cap, 2)
            doc.update(solo_ms=round(1e3 * solo, 1), ull_capacity_rps=round(cap, 2), target_p99_ms=target,
                       light_rps=light, heavy_rps=heavy)
            phases = [("light", light, a.light_s), ("heavy", heavy, a.heavy_s)]
            print(f"vnpu bench serve --load-step: {a.model}, {T} tokens per request; solo {1e3 * solo:.0f} ms; "
                  f"ultra_low_latency sustains {cap:.2f} req/s; light {light} req/s x {a.light_s:g} s -> heavy "
                  f"{heavy} req/s x {a.heavy_s:g} s; slo.target_p99_ms = {target}", flush=True)
            if 1 in reps:
                _run_modes(doc, svc, srv.url, 1, a, modes, phases, target)
            svc.set_mode(a.model, ModeConfig())
            opts = ReplicaOptions(stream_interval_ms=a.stream_interval_ms)
            one = ReplicaService((spec,), 1, options=opts)            # the Ray Serve path, next to the in-process one
            osrv = Server(one).start()
            try:
                one.load()
                one.set_mode(a.model, ModeConfig())
                paths = probe({"in_process": srv.url, "one_replica": osrv.url}, a.model)
                paths["serve_round_trip_ms_p50"] = round(1e3 * one.ping(30), 2)
            finally:
                osrv.stop()
        finally:
            srv.stop()
        for r in [r for r in reps if r > 1]:
            rsvc = ReplicaService((spec,), r, options=opts)
            rsrv = Server(rsvc).start()
            try:
                rsvc.load()
                _run_modes(doc, rsvc, rsrv.url, r, a, modes, phases, target)
            finally:
                rsrv.stop()
    doc["ray_serve_path"] = dict(paths, stream_interval_ms=a.stream_interval_ms)
    g = load_gguf_cached(str(smollm2_gguf()))
    ref = NumpyDecode(g, LlamaConfig.from_gguf_meta(g.meta))
    doc["numpy_bound_tokens_per_s"] = {b: round(ref.tokens_per_s(b, 16 + T // 2), 1) for b in (2, 16)}
    _comparisons(doc, modes)
    doc["verified"] = verified(doc)
    if a.json:
        print(json.dumps(doc))
    else:
        _print_summary(doc, paths, a.stream_interval_ms)
    return 0 if doc["verified"] else 1


def _calibrate(svc, url: str, model: str, T: int) -> tuple[float, float]:
    """One warm-up request, then a lone request's median latency (s, over 3) and how many requests per
    second ultra_low_latency sustains (12 requests, one stream per slot of its batch; leaves the model in
    that mode).  Blocks the host while the requests run."""
    from runtime.serve.engine.modes import ModeConfig
    _stream(url, model, _prompt(0), 4)
    solo = statistics.median([(lambda r: r["end"] - r["t0"])(_stream(url, model, _prompt(i), T))
                              for i in range(3)])
    svc.set_mode(model, ModeConfig("ultra_low_latency"))
    n, c = 12, ModeConfig().low_latency_batch
    t0 = time.perf_counter()
    th = [threading.Thread(target=lambda k=k: [_stream(url, model, _prompt(j), T)
                                               for j in range(k, n, c)]) for k in range(c)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return solo, n / (time.perf_counter() - t0)


def _run_modes(doc: dict, svc, url: str, replicas: int, a, modes: list[str], phases: list, target) -> None:
    """``a.rounds`` rounds of the load step in each mode against ``url`` (served by ``svc`` on ``replicas``
    replicas): each run added to ``doc["runs"]`` and printed.  Blocks the host for every phase.

    ``auto`` picks its target from a history: the heavy-phase p99 of the runs before it in this bench,
    recorded into a scratch (in-memory) metrics store (:func:`runtime.serve.auto_slo.pick_target`, one sample per run;
    with none yet -- auto listed first -- it runs as manual)."""
    from runtime.observe.metrics_store import History
    from runtime.serve.auto_slo import AutoSlo, pick_target
    from runtime.serve.engine.modes import ModeConfig
    with History(":memory:") as hist:
        for k in range(a.rounds):
            for m in modes:
                t = target
                if m == "auto":
                    t = pick_target(hist, float(len(doc["runs"]) + 1), AutoSlo(lookback_s=1e9, min_samples=1))
                svc.set_mode(a.model, ModeConfig(m, target_p99_ms=t))
                doc["runs"].append({"replicas": replicas, "mode": m, "round": k, "target_p99_ms": t,
                                    "phases": load_step(url, a.model, phases, a.max_tokens, a.seed + k)})
                hist.record_samples(float(len(doc["runs"])),
                                    {"p99_latency_ms": doc["runs"][-1]["phases"]["heavy"]["e2e_ms_p99"]})
                _print_run(doc["runs"][-1], target)


def _print_summary(doc: dict, paths: dict, stream_interval_ms: float) -> None:
    """The text report's closing lines: the Ray Serve path's cost, the numpy bound, adaptive vs
    ultra_low_latency."""
    ip, sv = paths["in_process"], paths["one_replica"]
    print(f"Ray Serve path (1 replica vs in-process, same engine, requests alternating): "
          f"{sv['added_ms_per_request']:+.1f} ms per request ({ip['request_ms_p50']:.1f} -> "
          f"{sv['request_ms_p50']:.1f} ms for one token), {sv['added_ms_per_token']:+.2f} ms per streamed token "
          f"({ip['per_token_ms_p50']:.2f} -> {sv['per_token_ms_p50']:.2f}; tokens batched up to "
          f"{stream_interval_ms:g} ms); a bare Serve call: {paths['serve_round_trip_ms_p50']:.1f} ms")
    print(f"bound: numpy decode {doc['numpy_bound_tokens_per_s'][2]} tok/s at batch 2, "
          f"{doc['numpy_bound_tokens_per_s'][16]} tok/s at batch 16")
    for line in doc["comparisons"]:
        print(line)
    print("verified: yes (every completed request streamed its max_tokens tokens; the others were refused)"
          if doc["verified"] else "verified: NO: a request was cut short, failed, or a phase completed nothing")


def verified(doc: dict) -> bool:
    """Every phase of every run completed requests, each of them streamed all its max_tokens tokens (finish
    "length"), and every other request was refused (429/503), never failed."""
    phs = [ph for run in doc["runs"] for ph in run["phases"].values()]
    return bool(phs) and all(ph["completed"] > 0 and ph["cut_short"] == 0 and ph["errors"] == 0 for ph in phs)


def _print_run(run: dict, target: float) -> None:
    if run["mode"] == "auto":
        picked = run.get("target_p99_ms")
        print(f"  replicas={run['replicas']} auto: target p99 picked from the runs before it: "
              f"{'none yet (runs as manual)' if picked is None else f'{picked:.0f} ms'}", flush=True)
    for ph, s in run["phases"].items():
        ok = "within" if s["e2e_ms_p99"] <= target else "OVER"
        print(f"  replicas={run['replicas']} {run['mode']:<18} {ph:<5}: offered {s['offered_rps']:>5.2f} req/s "
              f"(arrived {s['arrival_rps']:.2f}) achieved {s['achieved_rps']:>5.2f} req/s "
              f"{s['output_tokens_per_s']:>6.1f} tok/s | e2e p50 {s['e2e_ms_p50']:>7.0f} p99 {s['e2e_ms_p99']:>7.0f} ms "
              f"({ok} {target:.0f}) | TTFT p99 {s['ttft_ms_p99']:>6.0f} ms | refused {s['refused']}", flush=True)


def _comparisons(doc: dict, modes: list[str]) -> None:
    lines = []
    t = doc["target_p99_ms"]
    for r in sorted({x["replicas"] for x in doc["runs"]}):
        by = {}
        for m in modes:                                   # medians over the rounds
            hv = [x["phases"]["heavy"] for x in doc["runs"] if x["replicas"] == r and x["mode"] == m]
            if hv:
                by[m] = {k: statistics.median(h[k] for h in hv) for k in ("e2e_ms_p99", "output_tokens_per_s")}
        ul = by.get("ultra_low_latency")
        for m, ad in by.items():
            if ul is None or m == "ultra_low_latency":
                continue
            ratio = ad["output_tokens_per_s"] / max(ul["output_tokens_per_s"], 1e-9)
            lines.append(f"replicas={r}, heavy phase: {m} p99 {ad['e2e_ms_p99']:.0f} ms (target {t:.0f}) at "
                         f"{ad['output_tokens_per_s']:.0f} tok/s = {ratio:.2f}x ultra_low_latency's "
                         f"{ul['output_tokens_per_s']:.0f} tok/s (p99 {ul['e2e_ms_p99']:.0f} ms)")
    doc["comparisons"] = lines
