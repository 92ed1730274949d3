"""``vnpu bench serve``: the OpenAI server under concurrent streaming clients, against its baseline and
the machine's bound, in the same run.

- vnpu: the server (continuous batching, paged KV cache, decode graphs) on one device; per concurrency
  C, ``--requests`` streamed completions (``ignore_eos``, ``--max-tokens`` each) from C client threads
  over loopback HTTP: output tokens/s, requests/s, TTFT and inter-token latency p50/p99 as clients see them.
- baseline: the same engine with ``max_num_seqs=1`` (graphs on): one request at a time.
- bound: the same decode forward in plain numpy in this process, batch B = C, at the same context
  length: tokens/s of the math alone (no runtime, no HTTP, no prefill).

With ``--load-step`` it compares scheduler modes and Ray Serve replicas under a light-to-heavy load step
instead (:mod:`runtime.bench.serve_load`).
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlparse

from runtime.cliargs import int_list, positive_int

from .serve_workload import NumpyDecode, pct as _pct, prompt as _prompt


def register(bench_sub) -> None:
    p = bench_sub.add_parser("serve", help="vnpu serve under concurrent clients vs max_num_seqs=1 and numpy")
    p.add_argument("--model", default="smollm2", choices=["smollm2"])
    p.add_argument("--concurrency", type=int_list, default="1,4,16", help="comma-separated client counts")
    p.add_argument("--requests", type=positive_int, default=32, help="requests per concurrency level")
    p.add_argument("--max-tokens", type=positive_int, default=32, help="output tokens per request")
    p.add_argument("--backend", choices=["cluster", "local"], default="cluster",
                   help="the device as a Ray actor over gRPC (default) or in this process")
    p.add_argument("--json", action="store_true")
    from .serve_load import register_flags
    register_flags(p)
    p.set_defaults(fn=_run)


def _one(url, model: str, prompt: str, max_tokens: int) -> tuple[float, list[float], int]:
    """One streamed completion: (TTFT s, inter-token gaps s, tokens)."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    stamps = []
    for line in r:
        if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
            if json.loads(line[6:])["choices"][0]["text"]:
                stamps.append(time.perf_counter())
    conn.close()
    return stamps[0] - t0, [b - a for a, b in zip(stamps, stamps[1:])], len(stamps)


def _load(url: str, model: str, conc: int, n: int, max_tokens: int) -> dict:
    nxt = iter(range(n))
    lock = threading.Lock()
    ttft, itl, toks = [], [], [0]
    errors: list[str] = []

    def client():
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            try:
                a, gaps, k = _one(url, model, _prompt(i), max_tokens)
            except Exception as e:  # noqa: BLE001 - reported
                errors.append(str(e))
                return
            with lock:
                ttft.append(a)
                itl.extend(gaps)
                toks[0] += k

    th = [threading.Thread(target=client) for _ in range(conc)]
    t0 = time.perf_counter()
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} request(s) failed: {errors[0]}")
    return {"concurrency": conc, "requests": n, "output_tokens": toks[0], "wall_s": round(wall, 3),
            "output_tokens_per_s": round(toks[0] / wall, 2), "requests_per_s": round(n / wall, 3),
            "ttft_ms_p50": round(1e3 * _pct(ttft, 50), 1), "ttft_ms_p99": round(1e3 * _pct(ttft, 99), 1),
            "itl_ms_p50": round(1e3 * _pct(itl, 50), 2), "itl_ms_p99": round(1e3 * _pct(itl, 99), 2)}


def _serve(rt, model: str, max_num_seqs: int, levels: list[int], n: int, max_tokens: int) -> tuple[list[dict], dict]:
    from runtime.serve.config import model_spec
    from runtime.serve.engine import EngineConfig
    from runtime.serve.server import Server, Service
    cfg = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max(256, max_num_seqs),
                       max_model_len=256, max_queued_requests=max(64, n))
    svc = Service(rt, (model_spec(model, (0,), None, cfg),))
    srv = Server(svc).start()
    try:
        svc.load()
        _load(srv.url, model, 1, 1, 4)                                   # warm up
        rows = [_load(srv.url, model, c, n, max_tokens) for c in levels]
        snap = svc.engines[model].snapshot()
        info = {"kv_blocks": snap.num_blocks, "graphs": snap.graphs, "captures": snap.captures,
                "preemptions": snap.num_preemptions, "steps": snap.steps}
    finally:
        srv.stop()
    return rows, info


def _runtime(backend: str):
    from devices.device import DeviceConfig
    from runtime.api import Runtime, runtime_scope
    from runtime.backend import LocalBackend
    from runtime.cluster import ClusterSpec, cluster_runtime
    if backend == "local":
        return runtime_scope(Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30))))
    return cluster_runtime(spec=ClusterSpec(devices=1, arena_bytes=1 << 30))


def _run(a) -> int:
    if a.load_step:
        from .serve_load import run
        return run(a)
    from runtime.models.weights import LlamaConfig, load_gguf_cached, smollm2_gguf
    levels = list(a.concurrency)                      # checked by argparse (runtime.cliargs.int_list)
    g = load_gguf_cached(str(smollm2_gguf()))
    ref = NumpyDecode(g, LlamaConfig.from_gguf_meta(g.meta))
    with _runtime(a.backend) as rt:
        vnpu, info = _serve(rt, a.model, max(levels), levels, a.requests, a.max_tokens)
        base, binfo = _serve(rt, a.model, 1, levels, a.requests, a.max_tokens)
    ctx = 16 + a.max_tokens // 2
    bound = {c: round(ref.tokens_per_s(c, ctx), 1) for c in levels}
    rows = []
    for v, b in zip(vnpu, base):
        c = v["concurrency"]
        rows.append({**v, "baseline": b, "numpy_bound_tokens_per_s": bound[c],
                     "x_baseline": round(v["output_tokens_per_s"] / b["output_tokens_per_s"], 2),
                     "of_bound": round(v["output_tokens_per_s"] / bound[c], 3)})
    top = rows[-1]
    # every streamed request gave max_tokens tokens (ignore_eos): nothing lost, cut short or doubled
    ok = all(r["output_tokens"] == r["requests"] * a.max_tokens and
             r["baseline"]["output_tokens"] == r["baseline"]["requests"] * a.max_tokens for r in rows)
    doc = {"model": a.model, "backend": a.backend, "max_tokens": a.max_tokens, "engine": info,
           "baseline_engine": binfo, "levels": rows,
           "bar": {"concurrency": top["concurrency"], "x_baseline": top["x_baseline"], "target": 4.0,
                   "met": top["x_baseline"] >= 4.0}, "verified": ok}
    if a.json:
        print(json.dumps(doc))
        return 0 if ok else 1
    print(f"vnpu bench serve: {a.model} on one device ({a.backend}), {a.requests} streamed requests x "
          f"{a.max_tokens} tokens per level; baseline = same engine with max_num_seqs=1; bound = numpy decode "
          f"at batch = concurrency")
    print(f"{'conc':>4} | {'out tok/s':>9} {'req/s':>6} {'TTFT p50/p99 ms':>16} {'ITL p50/p99 ms':>15} | "
          f"{'baseline tok/s':>14} {'x':>5} | {'numpy bound':>11} {'of bound':>8}")
    for r in rows:
        print(f"{r['concurrency']:>4} | {r['output_tokens_per_s']:>9.1f} {r['requests_per_s']:>6.2f} "
              f"{r['ttft_ms_p50']:>7.0f}/{r['ttft_ms_p99']:<8.0f} {r['itl_ms_p50']:>6.1f}/{r['itl_ms_p99']:<8.1f} | "
              f"{r['baseline']['output_tokens_per_s']:>14.1f} {r['x_baseline']:>5.2f} | "
              f"{r['numpy_bound_tokens_per_s']:>11.1f} {r['of_bound']:>8.2f}")
    print(f"engine: {info['kv_blocks']} KV blocks, {info['graphs']} decode graphs (captured {info['captures']}, "
          f"constant), {info['steps']} steps, {info['preemptions']} preemptions")
    print(f"bar: concurrency {top['concurrency']} = {top['x_baseline']:.2f}x the baseline's output tokens/s "
          f"(target >= 4x): {'met' if top['x_baseline'] >= 4 else 'NOT met'}")
    print(f"verified: {'yes' if ok else 'NO: a request did not stream its max_tokens tokens'}")
    return 0 if ok else 1
