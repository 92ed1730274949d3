"""``vnpu bench serve``: the OpenAI server under concurrent streaming clients, against its baseline and
the machine's bound, in the same run.

- vnpu: the server ``vnpu serve`` starts -- the same engine configuration (``EngineConfig()``'s defaults:
  continuous batching, paged KV cache, decode graphs, async scheduling; prefix caching off unless
  ``--prefix-caching on``: the bench sends each prompt again for its references, warm-up and every level), on the same devices (the running cluster, else an
  embedded one: ``--backend cluster``, the default; ``local``: a device in this process) -- serving SmolLM2
  on one device; per concurrency C, ``--requests`` streamed completions (``ignore_eos``, ``--max-tokens``
  each, prompts of ``--prompt-tokens`` tokens) from C client threads over loopback HTTP: output tokens/s,
  requests/s, TTFT and inter-token latency p50/p99 as clients see them.
- baseline: the same engine with ``max_num_seqs=1`` (graphs on): one request at a time.
- bound: the same model in plain numpy (float32, one thread) in this process, measured in this run: C
  prompt prefills of the mean prompt length (every layer's matmuls, causal attention, the head's last
  row) plus ``--max-tokens`` decode steps at batch C over the mean context (prompt + half the output:
  embedding, norms, the weights' matmuls, rope, attention over the context, the LM head) -- output
  tokens/s of the math alone (no runtime, no HTTP, no scheduling).  The decode-only figure is shown too.
  Measured before the servers start and again after they stop; each figure keeps the faster of the two.
- CPU time (cluster backend on this node): the device process's CPU seconds per output token during each
  level against the bound's own CPU seconds per output token (the same prefills and steps timed by this
  process's CPU clock) -- on a shared machine wall time counts whatever else runs, CPU time less (shared
  caches and cores still slow it: the bound's CPU figure is the fastest of its runs, the device's the mean
  of a whole level); and
  how busy the device process was (its CPU seconds over the level's wall seconds: below 1, it waited for
  the host or for a core).  The bench process's own CPU (the server, its engine thread and the clients)
  is shown per token too; the bound does none of that work.  By phase (:mod:`.serve_phases`): the device's
  CPU per prompt token in the steps that computed prompt tokens against the bound's prefill per token, and
  per decode-only step at the level's full batch against the bound's decode step.
- peer (``--peer URL``, optional): an OpenAI-compatible server (a llama.cpp server on the same GGUF),
  driven by the same client with the same prompts; its rows are not verified (another engine).

Verified (exit 0) when every streamed request produced its ``--max-tokens`` tokens by the server's own count
(``stream_options.include_usage``) and streamed the text of the non-streamed greedy completion of its prompt
(:func:`check`) -- not by counting text-bearing chunks: tokens that decode to text only together (the bytes of
one emoji) arrive as one chunk.

With ``--load-step`` it compares scheduler modes and Ray Serve replicas under a light-to-heavy load step
instead (:mod:`runtime.bench.serve_load`).
"""
from __future__ import annotations

import http.client
import json
import math
import os
import threading
import time
from urllib.parse import urlparse

from runtime.cliargs import fail, int_list, int_range, positive_int

from .common import add_plot_arg, cpu_seconds, device_pids, write_plot
from .serve_phases import StepCpu, phase_ratios
from .serve_workload import NumpyDecode, pct as _pct, prompt as _prompt, sized_prompts


def register(bench_sub) -> None:
    p = bench_sub.add_parser("serve", help="vnpu serve under concurrent clients vs max_num_seqs=1 and numpy",
                             example=("vnpu bench serve --concurrency 1,4,16 --requests 32 --max-tokens 32",
                                      "vnpu bench serve --load-step --mode ultra_low_latency,adaptive --replicas 1,2",
                                      "vnpu bench serve --load-step --mode manual,hybrid,adaptive,auto --replicas 1"))
    p.add_argument("--model", default="smollm2", choices=["smollm2"], help="the generation model served")
    p.add_argument("--concurrency", type=int_list, default="1,4,16", help="comma-separated client counts")
    p.add_argument("--requests", type=positive_int, default=32, help="requests per concurrency level")
    p.add_argument("--max-tokens", type=positive_int, default=32, help="output tokens per request")
    p.add_argument("--backend", choices=["cluster", "local"], default="cluster",
                   help="cluster (default): the devices vnpu serve uses -- the running cluster, else an embedded "
                        "one (a Ray actor over gRPC); local: a device in this process")
    p.add_argument("--prompt-tokens", type=int_range, default="64-256", metavar="LO-HI",
                   help="prompt lengths in tokens, spread over the range (default 64-256)")
    p.add_argument("-q", "--quantization", choices=("none", "gguf"), default="none",
                   help="vnpu serve's --quantization: gguf keeps the GGUF's quantized blocks in HBM (the bound "
                        "stays float32 numpy)")
    p.add_argument("--async-scheduling", choices=["on", "off"], default="on",
                   help="the engine's async scheduling (vnpu serve's default: on; off: each step waits for the "
                        "last one's tokens on the host)")
    p.add_argument("--prefix-caching", choices=["on", "off"], default="off",
                   help="the engine's prefix cache (default off: the bench sends its prompts again -- references, "
                        "warm-up, every level -- and the bound prices whole prefills)")
    p.add_argument("--peer", default=None, metavar="URL",
                   help="also drive this OpenAI-compatible server (e.g. a llama.cpp server on the same GGUF)")
    p.add_argument("--peer-model", default=None, help="the model name the peer serves (default: its first)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    add_plot_arg(p, "output tokens/s and p99 latencies vs concurrency (the concurrency sweep)")
    from .serve_load import register_flags
    register_flags(p)
    p.set_defaults(fn=_run)


def _post(url: str, body: dict, api_key: str | None = None):
    """``(connection, response)`` of a POST /v1/completions (the caller closes the connection)."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    headers = {"Content-Type": "application/json"}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    r = conn.getresponse()
    if r.status != 200:
        conn.close()
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    return conn, r


def reference(url: str, model: str, prompt: str, max_tokens: int, api_key: str | None = None) -> dict:
    """The non-streamed greedy completion of ``prompt``: its text, its tokens (usage) and, per token, the
    gap between the two best logprobs (to tell a near tie from a defect, see :func:`check`)."""
    conn, r = _post(url, {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                          "ignore_eos": True, "logprobs": 2}, api_key)
    try:
        body = json.loads(r.read())
    finally:
        conn.close()
    c = body["choices"][0]
    lp = c["logprobs"]
    return {"text": c["text"], "tokens": body["usage"]["completion_tokens"], "offsets": lp["text_offset"],
            "gaps": [_top2_gap(top) for top in lp["top_logprobs"]]}


def _top2_gap(top: dict) -> float:
    """The gap between the two best logprobs of one token (inf when unknown: two tokens of the same text)."""
    v = sorted(top.values(), reverse=True)
    return v[0] - v[1] if len(v) >= 2 else math.inf


def stream_one(url: str, model: str, prompt: str, max_tokens: int, api_key: str | None = None,
               count_chunks: bool = False) -> dict:
    """One streamed greedy completion as its client sees it: ``ttft`` (s), ``gaps`` between the text pieces
    (s), ``chunks`` (pieces that carried text), ``text`` (all of them), ``tokens`` (the server's count: the
    usage chunk of ``stream_options.include_usage``; without one 0, or the text chunks with
    ``count_chunks`` -- a peer that sends no usage), ``prompt_tokens`` (the usage's) and ``finish``."""
    t0 = time.perf_counter()
    conn, r = _post(url, {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                          "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}, api_key)
    stamps, pieces, tokens, finish, ptoks = [], [], 0, None, 0
    try:
        for line in r:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            ev = json.loads(line[6:])
            for ch in ev.get("choices") or ():
                if ch.get("text"):
                    stamps.append(time.perf_counter())
                    pieces.append(ch["text"])
                finish = ch.get("finish_reason") or finish
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
                ptoks = ev["usage"].get("prompt_tokens", 0)
    finally:
        conn.close()
    return {"ttft": (stamps[0] - t0) if stamps else float("nan"), "gaps": [b - a for a, b in zip(stamps, stamps[1:])],
            "chunks": len(stamps), "text": "".join(pieces), "tokens": tokens or (len(stamps) if count_chunks else 0),
            "finish": finish, "prompt_tokens": ptoks}


def check(got: dict, ref: dict, max_tokens: int, tie_tol: float) -> str:
    """The verdict on one streamed request: ``ok``; ``near_tie`` (its text parts from the non-streamed one's
    where that one's top-2 logprobs were within ``tie_tol`` -- a batched step rounds differently from a solo
    one, so greedy may pick the other of two near-equal tokens); ``bad`` (tokens lost, cut short or doubled,
    or text that differs without a near tie).  Tokens are the server's usage count -- never text-bearing
    chunks: a multi-byte character split over several tokens arrives as one piece."""
    if got["tokens"] != max_tokens or got["finish"] != "length" or ref["tokens"] != max_tokens:
        return "bad"
    a, b = got["text"], ref["text"]
    if a == b:
        return "ok"
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    k = max([i for i, off in enumerate(ref["offsets"]) if off <= at] or [0])
    near = any(g < tie_tol for g in ref["gaps"][max(0, k - 1):k + 2])     # the token there (offsets are per token)
    return "near_tie" if near else "bad"


def tie_tolerance(cfg) -> float:
    """How far apart two logits may be and still swap between a batched and a solo step: float32 rounding
    of the longest reduction chain (n_layers reductions of d_ff terms), ~4 sigma for each of two runs,
    |logit| of SmolLM2 under ~30 (tests/serve/test_serve_engine.py derives the same bound)."""
    return 8 * math.sqrt(cfg.n_layers * cfg.d_ff) * 2.0 ** -24 * 30.0


def load(url: str, model: str, conc: int, n: int, max_tokens: int, refs: dict[str, dict] | None, tie_tol: float,
          prompt=_prompt, api_key: str | None = None) -> dict:
    """``n`` streamed requests (``prompt(i)``) from ``conc`` client threads; each checked against ``refs``
    (:func:`reference` of its prompt) by :func:`check` (None: not checked, tokens counted from the usage
    or the text chunks -- a peer server)."""
    nxt = iter(range(n))
    lock = threading.Lock()
    ttft, itl, toks, ptoks = [], [], [0], [0]
    verdicts = {"ok": 0, "near_tie": 0, "bad": 0}
    errors: list[str] = []

    def client():
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            try:
                p = prompt(i)
                got = stream_one(url, model, p, max_tokens, api_key, count_chunks=refs is None)
            except Exception as e:  # noqa: BLE001 - reported
                errors.append(str(e))
                return
            v = check(got, refs[p], max_tokens, tie_tol) if refs is not None else "ok"
            with lock:
                ttft.append(got["ttft"])
                itl.extend(got["gaps"])
                toks[0] += got["tokens"]
                ptoks[0] += got["prompt_tokens"]
                verdicts[v] += 1

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
            "itl_ms_p50": round(1e3 * _pct(itl, 50), 2), "itl_ms_p99": round(1e3 * _pct(itl, 99), 2),
            "prompt_tokens_mean": round(ptoks[0] / n, 1),
            "verified": verdicts["ok"] + verdicts["near_tie"], "near_ties": verdicts["near_tie"],
            "unverified": verdicts["bad"]}


def engine_config(max_num_seqs: int | None, n: int, longest: int, quantization: str = "none",
                  async_scheduling: bool = True, prefix_caching: bool = False):
    """``vnpu serve``'s engine configuration (``EngineConfig()``), with room for ``max_num_seqs`` sequences
    (None: the default, or more), ``n`` queued requests and ``longest`` tokens of prompt and output; prefix
    caching off unless asked (the bench repeats its prompts: cached prefills would beat the bound)."""
    from dataclasses import replace

    from runtime.serve.engine import EngineConfig
    d = EngineConfig()
    return replace(d, max_num_seqs=max_num_seqs or d.max_num_seqs, max_queued_requests=max(d.max_queued_requests, n),
                   max_model_len=max(d.max_model_len, longest), quantization=quantization,
                   async_scheduling=async_scheduling, enable_prefix_caching=prefix_caching)


def _serve(rt, model: str, cfg, levels: list[int], n: int, max_tokens: int,
           tie_tol: float, prompts: list[str]) -> tuple[list[dict], dict]:
    from runtime.serve.config import model_spec
    from runtime.serve.server import Server, Service
    svc = Service(rt, (model_spec(model, (0,), None, cfg),))
    steps = StepCpu(device_pids(rt))
    svc.stat_loggers.append(steps)
    srv = Server(svc).start()
    pick = prompts.__getitem__
    try:
        svc.load()
        refs = {p: reference(srv.url, model, p, max_tokens) for p in prompts}
        load(srv.url, model, 1, 1, max_tokens, refs, tie_tol, pick)          # warm up
        rows = [_cpu_load(rt, steps, c, lambda c=c: load(srv.url, model, c, n, max_tokens, refs, tie_tol, pick))
                for c in levels]
        snap = svc.engines[model].snapshot()
        info = {"kv_blocks": snap.num_blocks, "graphs": snap.graphs, "captures": snap.captures,
                "preemptions": snap.num_preemptions, "steps": snap.steps, "overlapped_steps": snap.overlapped_steps}
    finally:
        srv.stop()
    return rows, info


def _cpu_load(rt, steps: StepCpu, conc: int, run) -> dict:
    """``run()`` (one level's :func:`load`) with the CPU seconds the device processes (``device_cpu_s``: None
    for in-process devices) and this process (``bench_cpu_s``: the server and the clients) spent during it,
    and the device's CPU by phase (``phases``: :mod:`.serve_phases`; None for in-process devices)."""
    pids = device_pids(rt)
    steps.start()
    d0, h0 = cpu_seconds(pids), time.process_time()
    row = run()
    row["device_cpu_s"] = round(cpu_seconds(pids) - d0, 2) if pids else None
    row["bench_cpu_s"] = round(time.process_time() - h0, 2)
    row["phases"] = steps.phases(conc) if pids else None
    return row


def _runtime(backend: str):
    from devices.device import DeviceConfig
    from runtime.api import Runtime, runtime_scope
    from runtime.backend import LocalBackend
    from runtime.cluster import ClusterSpec, cluster_runtime
    if backend == "local":
        return runtime_scope(Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30))))
    return cluster_runtime(spec=ClusterSpec(devices=1, arena_bytes=1 << 30))


def peer_model(url: str) -> str:
    """The first model a peer OpenAI-compatible server lists (GET /v1/models)."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.request("GET", "/v1/models")
        r = conn.getresponse()
        body = json.loads(r.read())
    finally:
        conn.close()
    data = body.get("data") or []
    if r.status != 200 or not data:
        raise RuntimeError(f"peer {url}: GET /v1/models gave HTTP {r.status} with no model")
    return str(data[0]["id"])


def _peer(a, levels: list[int], pick) -> list[dict]:
    """The same load against the peer server (not verified: another engine)."""
    model = a.peer_model or peer_model(a.peer)
    load(a.peer, model, 1, 1, a.max_tokens, None, 0.0, pick)                 # warm up
    return [load(a.peer, model, c, a.requests, a.max_tokens, None, 0.0, pick) for c in levels]


def _faster(x: dict, y: dict) -> dict:
    """The faster of two bound measurements, figure by figure (prefill: the shorter time)."""
    return {"tokens_per_s": max(x["tokens_per_s"], y["tokens_per_s"]),
            "decode_tokens_per_s": max(x["decode_tokens_per_s"], y["decode_tokens_per_s"]),
            "prefill_ms": min(x["prefill_ms"], y["prefill_ms"]), "context": y["context"],
            "cpu_tokens_per_s": max(x["cpu_tokens_per_s"], y["cpu_tokens_per_s"]),
            "cpu_prefill_ms": min(x["cpu_prefill_ms"], y["cpu_prefill_ms"]),
            "cpu_step_ms": min(x["cpu_step_ms"], y["cpu_step_ms"])}


def cpu_figures(row: dict, bound: dict) -> dict:
    """A level's CPU-time figures (module doc): per output token, the device processes' and the bound's CPU
    milliseconds, their ratio (``of_bound_cpu``: bound / device, as ``of_bound``), the device's busy share of
    the wall time, and the bench process's CPU per token.  Device figures are None for in-process devices."""
    tok = max(1, row["output_tokens"])
    dev = row["device_cpu_s"]
    bound_ms = 1e3 / bound["cpu_tokens_per_s"]
    out = {"bound_cpu_ms_per_token": round(bound_ms, 2), "bench_cpu_ms_per_token": round(1e3 * row["bench_cpu_s"] / tok, 2),
           "bound_cpu_prefill_ms": round(bound["cpu_prefill_ms"], 1), "bound_cpu_step_ms": round(bound["cpu_step_ms"], 1),
           "device_cpu_ms_per_token": None, "of_bound_cpu": None, "device_busy": None}
    if dev is not None and dev > 0:
        out.update(device_cpu_ms_per_token=round(1e3 * dev / tok, 2), of_bound_cpu=round(bound_ms / (1e3 * dev / tok), 3),
                   device_busy=round(dev / row["wall_s"], 3))
    if row.get("phases"):
        p = max(1.0, round(row["prompt_tokens_mean"]))
        out.update(phase_ratios(row["phases"], bound["cpu_prefill_ms"] / p, bound["cpu_step_ms"]))
    return out


def _run(a) -> int:
    if a.load_step:
        if a.plot:
            fail("argument --plot: draws the concurrency sweep; not with --load-step", "vnpu bench serve")
        from .serve_load import run
        return run(a)
    from runtime.models.tokenizer import gguf_tokenizer
    from runtime.models.weights import LlamaConfig, load_gguf_cached, smollm2_gguf
    levels = list(a.concurrency)                      # checked by argparse (runtime.cliargs.int_list)
    g = load_gguf_cached(str(smollm2_gguf()))
    cfg = LlamaConfig.from_gguf_meta(g.meta)
    lo, hi = a.prompt_tokens
    prompts = sized_prompts(gguf_tokenizer(str(smollm2_gguf())), lo, hi, a.requests)
    ref = NumpyDecode(g, cfg)
    tol = tie_tolerance(cfg)
    longest = hi + a.max_tokens + 8
    # the bound is measured before the servers and again after them; each level keeps the faster of the two
    # (the machine's load drifts over a run: the bound is what the math alone reached in this run)
    est = (lo + hi) / 2 + 1
    first = {c: ref.workload_tokens_per_s(c, est, a.max_tokens) for c in levels}
    on, pc = a.async_scheduling == "on", a.prefix_caching == "on"
    with _runtime(a.backend) as rt:
        q = getattr(a, "quantization", "none")
        vnpu, info = _serve(rt, a.model, engine_config(max(max(levels), 16), a.requests, longest, q, on, pc), levels,
                            a.requests, a.max_tokens, tol, prompts)
        base, binfo = _serve(rt, a.model, engine_config(1, a.requests, longest, q, on, pc), levels, a.requests,
                             a.max_tokens, tol, prompts)
    peer = _peer(a, levels, prompts.__getitem__) if a.peer else None
    ptok = sum(r["prompt_tokens_mean"] for r in vnpu) / len(vnpu) or est
    bounds = {c: _faster(first[c], ref.workload_tokens_per_s(c, ptok, a.max_tokens)) for c in levels}
    rows = []
    for i, (v, b) in enumerate(zip(vnpu, base)):
        c = v["concurrency"]
        bd = bounds[c]
        row = {**v, "baseline": b, "numpy_bound_tokens_per_s": round(bd["tokens_per_s"], 1),
               "numpy_decode_bound_tokens_per_s": round(bd["decode_tokens_per_s"], 1),
               "bound_context": bd["context"], "bound_prefill_ms": round(bd["prefill_ms"], 1),
               "x_baseline": round(v["output_tokens_per_s"] / b["output_tokens_per_s"], 2),
               "of_bound": round(v["output_tokens_per_s"] / bd["tokens_per_s"], 3), **cpu_figures(v, bd)}
        if peer is not None:
            row["peer"] = peer[i]
            row["x_peer"] = round(v["output_tokens_per_s"] / peer[i]["output_tokens_per_s"], 2)
        rows.append(row)
    top = rows[-1]
    # every streamed request: max_tokens tokens by the server's usage count (ignore_eos), and the text of the
    # non-streamed request of its prompt (but for a near tie): nothing lost, cut short or doubled
    ok = all(x["unverified"] == 0 and x["verified"] == x["requests"] for r in rows for x in (r, r["baseline"]))
    doc = {"model": a.model, "backend": a.backend, "quantization": getattr(a, "quantization", "none"),
           "max_tokens": a.max_tokens, "prompt_tokens": [lo, hi], "async_scheduling": on, "prefix_caching": pc,
           "engine": info, "baseline_engine": binfo, "levels": rows, "peer": a.peer,
           "top": {"concurrency": top["concurrency"], "x_baseline": top["x_baseline"], "of_bound": top["of_bound"]},
           "load": [round(x, 2) for x in os.getloadavg()], "verified": ok}
    if a.json:
        print(json.dumps(doc))
        return write_plot(a, "serve", doc) or (0 if ok else 1)
    _print(a, doc, tol)
    return write_plot(a, "serve", doc) or (0 if ok else 1)


def _phase_line(r: dict) -> str:
    """One level's device CPU by phase against the bound's (:mod:`.serve_phases`)."""
    ph, out = r["phases"], []
    if r.get("prefill_of_bound") is not None:
        out.append(f"{ph['prefill_steps']} steps with prompt tokens, {r['prefill_cpu_ms_per_token']:.2f} ms device CPU "
                   f"per prompt token (bound {r['bound_cpu_prefill_ms'] / max(1.0, round(r['prompt_tokens_mean'])):.2f}: "
                   f"{r['prefill_of_bound']:.2f} of it)")
    if r.get("decode_of_bound") is not None:
        out.append(f"{ph['decode_steps']} decode steps at batch {r['concurrency']}, {r['decode_cpu_ms_per_step']:.1f} ms "
                   f"each (bound {r['bound_cpu_step_ms']:.1f}: {r['decode_of_bound']:.2f} of it)")
    return "; ".join(out) + f"; {ph['steps']} steps in all"


def _print(a, doc: dict, tol: float) -> None:
    rows, info, top = doc["levels"], doc["engine"], doc["top"]
    lo, hi = doc["prompt_tokens"]
    print(f"vnpu bench serve: {a.model} (weights: {doc['quantization']}) on one device ({a.backend}: vnpu serve's "
          f"engine), {a.requests} streamed "
          f"requests x {a.max_tokens} tokens per level, prompts of {lo}-{hi} tokens; baseline = same engine with "
          f"max_num_seqs=1; bound = numpy fp32 prefills + decode steps at batch = concurrency "
          f"(load {doc['load']})")
    peer_h = f" | {'peer tok/s':>10} {'x':>5}" if doc["peer"] else ""
    print(f"{'conc':>4} | {'out tok/s':>9} {'req/s':>6} {'TTFT p50/p99 ms':>16} {'ITL p50/p99 ms':>15} | "
          f"{'baseline tok/s':>14} {'x':>5} | {'bound':>7} {'of bound':>8} {'decode bound':>12}{peer_h}")
    for r in rows:
        peer = f" | {r['peer']['output_tokens_per_s']:>10.1f} {r['x_peer']:>5.2f}" if "peer" in r else ""
        print(f"{r['concurrency']:>4} | {r['output_tokens_per_s']:>9.1f} {r['requests_per_s']:>6.2f} "
              f"{r['ttft_ms_p50']:>7.0f}/{r['ttft_ms_p99']:<8.0f} {r['itl_ms_p50']:>6.1f}/{r['itl_ms_p99']:<8.1f} | "
              f"{r['baseline']['output_tokens_per_s']:>14.1f} {r['x_baseline']:>5.2f} | "
              f"{r['numpy_bound_tokens_per_s']:>7.1f} {r['of_bound']:>8.2f} {r['numpy_decode_bound_tokens_per_s']:>12.1f}"
              f"{peer}")
    if any(r["of_bound_cpu"] is not None for r in rows):
        print(f"{'conc':>4} | {'device CPU ms/token':>19} {'bound CPU ms/token':>18} {'of bound (CPU)':>14} "
              f"{'device busy':>11} | {'server+clients CPU ms/token':>27}")
        for r in rows:
            dv = "-" if r["of_bound_cpu"] is None else f"{r['device_cpu_ms_per_token']:.2f}"
            ob = "-" if r["of_bound_cpu"] is None else f"{r['of_bound_cpu']:.2f}"
            bz = "-" if r["device_busy"] is None else f"{r['device_busy']:.2f}"
            print(f"{r['concurrency']:>4} | {dv:>19} {r['bound_cpu_ms_per_token']:>18.2f} {ob:>14} {bz:>11} | "
                  f"{r['bench_cpu_ms_per_token']:>27.2f}")
        for r in rows:
            if r.get("prefill_of_bound") is not None or r.get("decode_of_bound") is not None:
                print(f"  c={r['concurrency']}: {_phase_line(r)}")
    r0 = rows[0]
    print(f"bound: per request a prefill of {round(r0['prompt_tokens_mean'])} tokens ({r0['bound_prefill_ms']} ms) and "
          f"{a.max_tokens} decode steps over a {r0['bound_context']}-token context, numpy float32, one thread; CPU "
          f"time: prefill {r0['bound_cpu_prefill_ms']} ms, a step at batch {r0['concurrency']} {r0['bound_cpu_step_ms']} ms"
          + (" (CPU rows: the device process's CPU time; load inflates it less than wall time, but does inflate it)"
             if any(r["of_bound_cpu"] is not None for r in rows) else ""))
    print(f"engine: {info['kv_blocks']} KV blocks, {info['graphs']} decode graphs (captured {info['captures']}, "
          f"constant), {info['steps']} steps ({info['overlapped_steps']} queued behind the step before them: async "
          f"scheduling {'on' if doc['async_scheduling'] else 'off'}), {info['preemptions']} preemptions, prefix "
          f"caching {'on (cached prefills beat the bound)' if doc['prefix_caching'] else 'off'}")
    print(f"concurrency {top['concurrency']}: {top['x_baseline']:.2f}x the baseline's output tokens/s, "
          f"{top['of_bound']:.2f} of the numpy bound")
    ties = sum(x["near_ties"] for r in rows for x in (r, r["baseline"]))
    print(f"verified: {'yes' if doc['verified'] else 'NO: a streamed request lost, cut short or changed its tokens or text'}"
          + (f" ({ties} near tie(s): text parted from the non-streamed one at a top-2 logprob gap < {tol:.1e})"
             if ties else ""))
