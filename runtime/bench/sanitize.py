"""``vnpu bench sanitize``: what the runtime sanitizer costs, against the same runs without it.

Workloads (one in-process device each): SmolLM2-135M greedy decode -- each step one captured-graph
replay, and the same job with every kernel launched eagerly (~300 launches per token) -- and MiniLM-L6
embedding (eager launches, batches of 8).  Three runtimes live side by side, one per mode: sanitizer off,
racecheck alone, every tool.  Rounds alternate the modes workload by workload, so they share the machine's
load as it drifts; each figure is the median over all samples (decode: every step).  The physical bound is
the same forward in plain numpy in this process, measured in the same rounds.

What every mode computed is verified (``verified``; the command exits 1 otherwise): greedy tokens equal
the numpy forward's (graph and eager, every mode), embeddings within ``EMBED_ATOL`` of numpy's, the tiny
launches' result exact, and no finding on these correct programs (a finding here is a false positive).

"Off costs nothing": with no session the runtime has no layer at all -- its only extra work is one
``is not None`` test per enqueued op.  The bench times that test against the host cost of one launch,
and a second runtime with the sanitizer off shows the noise floor the ratios should be read against.
"""
from __future__ import annotations

import contextlib
import io
import json
import statistics
import time
import timeit

import numpy as np

#: mode -> tools (None: no session)
MODES = {"off": None, "racecheck": ("racecheck",), "all": ("memcheck", "racecheck", "initcheck", "leakcheck"),
         "off (again)": None}
#: what each mode measures: wall figures, and the calling thread's CPU time (the sanitizer runs on it)
SAMPLES = ("decode_graph_ms", "decode_eager_ms", "embed_s_per_sentence", "launch_us", "decode_graph_cpu_ms",
           "decode_eager_cpu_ms", "embed_cpu_ms", "launch_cpu_us")
WORDS = "the a npu runs matrix kernels on cube units while vector cores do norms and softmax quickly".split()


def register(bench_sub) -> None:
    p = bench_sub.add_parser("sanitize", help="sanitizer slowdown on SmolLM2 decode and MiniLM embedding",
                             example="vnpu bench sanitize --tokens 12 --rounds 3")
    from runtime.cliargs import int_at_least
    # a decode step is timed between two tokens after the prefill's: at least 3 tokens
    p.add_argument("--tokens", type=int_at_least(3), default=12, help="tokens generated per round and mode (>= 3)")
    p.add_argument("--rounds", type=int_at_least(1), default=3, help="rounds (every mode once per round)")
    p.add_argument("--sentences", type=int_at_least(1), default=32, help="sentences embedded per round and mode")
    p.add_argument("--launches", type=int_at_least(1), default=1000, help="launches of the host-path micro benchmark")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(fn=_run)


class _Mode:
    """One runtime (one device) with its jobs, watched by a session or not."""

    def __init__(self, name: str, stack: contextlib.ExitStack):
        from devices.device import DeviceConfig
        from runtime.api import Runtime
        from runtime.backend import LocalBackend
        from runtime.models.bert import EmbedJob
        from runtime.models.llama import GenerateJob
        from runtime.sanitize import SanitizeOptions, Session
        tools = MODES[name]
        self.name = name
        self.session = Session(SanitizeOptions(tools=tools), out=io.StringIO()) if tools else None
        self.rt = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30)), sanitizer=self.session)
        stack.callback(self.close)
        self.gen = GenerateJob(self.rt, "smollm2", devices=1, parallel="none", max_len=512)
        self.emb = EmbedJob(self.rt, "minilm-l6", devices=1, parallel="dp", batch_size=8)
        self.samples: dict[str, list[float]] = {k: [] for k in SAMPLES}
        #: what the mode computed (checked against numpy): decode tokens per run, embeddings per run,
        #: whether every launch loop's result was exact
        self.tokens: list[list[int]] = []
        self.embeddings: list[np.ndarray] = []
        self.launches_exact: list[bool] = []

    def decode(self, prompt: str, tokens: int, graphs: bool) -> None:
        self.gen.graphs = graphs
        stamps: list[tuple[float, float]] = []
        gens = self.gen.generate([prompt], max_new_tokens=tokens, stop_at_eos=False,
                                 on_token=lambda b, t, p: stamps.append((time.perf_counter(), time.thread_time())))
        self.tokens.append(list(gens[0].token_ids))
        key = "decode_graph" if graphs else "decode_eager"
        steps = list(zip(stamps[1:], stamps[2:]))                     # decode steps (the first token is prefill's)
        self.samples[key + "_ms"] += [(b[0] - a[0]) * 1e3 for a, b in steps]
        self.samples[key + "_cpu_ms"] += [(b[1] - a[1]) * 1e3 for a, b in steps]

    def embed(self, texts: list[str]) -> None:
        t0, cpu = time.perf_counter(), time.thread_time()
        self.embeddings.append(self.emb.embed(texts))
        self.samples["embed_s_per_sentence"].append((time.perf_counter() - t0) / len(texts))
        self.samples["embed_cpu_ms"].append((time.thread_time() - cpu) * 1e3 / len(texts))

    def launches(self, n: int) -> None:
        """Microseconds per launch of a tiny kernel, queued and then synchronized."""
        d = self.rt.device(0)
        s = d.stream()
        x0 = np.linspace(-1.0, 1.0, 16, dtype=np.float32)
        x = d.from_numpy(x0)
        try:
            t0, cpu = time.perf_counter(), time.thread_time()
            for _ in range(n):
                s.launch("relu", [x], [x])
            s.synchronize()
            self.samples["launch_us"].append((time.perf_counter() - t0) / n * 1e6)
            self.samples["launch_cpu_us"].append((time.thread_time() - cpu) / n * 1e6)
            self.launches_exact.append(bool(np.array_equal(x.numpy(), np.maximum(x0, 0))))
        finally:
            x.free()
            s.destroy()

    def close(self) -> None:
        for job in (getattr(self, "gen", None), getattr(self, "emb", None)):
            if job is not None:
                job.close()
        self.rt.close()
        if self.session is not None:
            self.session.finish()


def _guard_ns() -> float:
    """What the off path adds per enqueued op: ``dev.sanitizer is not None`` (nanoseconds)."""
    class D:
        sanitizer = None
    g = {"d": D()}
    n = 1_000_000
    t = min(timeit.repeat("d.sanitizer is not None", globals=g, number=n, repeat=5))
    base = min(timeit.repeat("d", globals=g, number=n, repeat=5))
    return max(0.0, (t - base) / n * 1e9)


def _numpy_bounds(prompt_ids: list[int], tok, texts: list[str], tokens: int, out: dict) -> None:
    """The same decode steps and embedding batches in plain numpy (appends samples to ``out``)."""
    from runtime.models.bench import NumpyLlama, numpy_bert
    from runtime.models.bert import load_encoder
    from runtime.models.weights import LlamaConfig, load_gguf_cached, smollm2_gguf
    if "llama" not in out:
        g = load_gguf_cached(str(smollm2_gguf()))
        out["llama"] = NumpyLlama(g, LlamaConfig.from_gguf_meta(g.meta))
        out["bert"] = load_encoder("minilm-l6")
        out["decode_ms"], out["embed_s_per_sentence"] = [], []
    ref = out["llama"]
    logits = ref.forward(prompt_ids, 0)
    pos = len(prompt_ids)
    greedy = [int(np.argmax(logits[-1]))]
    for _ in range(tokens):
        t0 = time.perf_counter()
        logits = ref.forward([greedy[-1]], pos)
        out["decode_ms"].append((time.perf_counter() - t0) * 1e3)
        greedy.append(int(np.argmax(logits[-1])))
        pos += 1
    out["tokens"] = greedy                                 # the greedy reference (the same every round)
    cfg, w = out["bert"]
    ids, mask = tok.encode_batch(texts)
    lens = mask.sum(1)
    order = np.argsort(-lens, kind="stable")
    emb = np.zeros((len(texts), 384), np.float32)
    t0 = time.perf_counter()
    for i in range(0, len(texts), 8):
        idx = order[i:i + 8]
        s = int(lens[idx].max())
        emb[idx] = numpy_bert(w, cfg.n_layers, ids[idx, :s], mask[idx, :s], cfg.normalize)
    out["embed_s_per_sentence"].append((time.perf_counter() - t0) / len(texts))
    out["embeddings"] = emb


def verify(modes: list, bound: dict) -> dict:
    """What each mode computed against the numpy reference: tokens differing from numpy's greedy ones (a
    common prefix: each run against as many reference tokens as it has), the largest embedding difference,
    launch loops with a wrong result, findings on these correct programs."""
    from runtime.bench.infer import EMBED_ATOL
    ref, emb = bound["tokens"], bound["embeddings"]
    out: dict = {}
    for m in modes:
        differ = sum(sum(1 for a, b in zip(t, ref) if a != b) + (0 if t else 1) for t in m.tokens)
        diff = max(float(np.abs(e - emb).max()) for e in m.embeddings)
        out[m.name] = {"decode_runs": len(m.tokens), "tokens_differing_from_numpy": differ,
                       "max_abs_diff_vs_numpy": diff, "wrong_launch_loops": m.launches_exact.count(False),
                       "findings": m.session.errors if m.session is not None else 0}
    ok = all(v["decode_runs"] > 0 and v["tokens_differing_from_numpy"] == 0 and v["max_abs_diff_vs_numpy"] <= EMBED_ATOL
             and v["wrong_launch_loops"] == 0 and v["findings"] == 0 for v in out.values())
    return {"per_mode": out, "embed_atol": EMBED_ATOL, "ok": ok}


def _run(a) -> int:
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(12, 28)))) for _ in range(a.sentences)]
    bound: dict = {}
    with contextlib.ExitStack() as stack:
        modes = [_Mode(name, stack) for name in MODES]
        prompt = modes[0].gen.tok.chat_prompt("Write a short story about a robot learning to paint.")   # ids
        for m in modes:                                   # warm up: captures, plans, page faults
            m.decode(prompt, 2, True)
            m.decode(prompt, 2, False)
            m.embed(texts[:8])
            m.launches(50)
            for v in m.samples.values():
                v.clear()
            m.tokens.clear()
            m.embeddings.clear()
            m.launches_exact.clear()
        for _ in range(a.rounds):
            for m in modes:
                m.decode(prompt, a.tokens, True)
            for m in modes:
                m.decode(prompt, max(4, a.tokens // 2), False)
            for m in modes:
                m.embed(texts)
            for m in modes:
                m.launches(a.launches)
            _numpy_bounds(prompt, modes[0].emb.tok, texts, max(4, a.tokens // 2), bound)
        res: dict = {"rounds": a.rounds, "tokens": a.tokens, "sentences": a.sentences, "modes": {}}
        check = verify(modes, bound)
        for m in modes:
            med = {k: statistics.median(v) for k, v in m.samples.items()}
            res["modes"][m.name] = {"decode_graph_ms": round(med["decode_graph_ms"], 2),
                                    "decode_eager_ms": round(med["decode_eager_ms"], 2),
                                    "embed_sentences_per_s": round(1.0 / med["embed_s_per_sentence"], 1),
                                    "launch_us": round(med["launch_us"], 2),
                                    "host_cpu": {"decode_graph_ms_per_token": round(med["decode_graph_cpu_ms"], 3),
                                                 "decode_eager_ms_per_token": round(med["decode_eager_cpu_ms"], 3),
                                                 "embed_ms_per_sentence": round(med["embed_cpu_ms"], 3),
                                                 "launch_us": round(med["launch_cpu_us"], 2)}}
            if m.session is not None:
                res["modes"][m.name]["findings"] = m.session.errors
                res["modes"][m.name]["checked"] = m.session.counts()
    off = res["modes"]["off"]
    for name in ("racecheck", "all", "off (again)"):
        m = res["modes"][name]
        m["slowdown"] = {"decode_graph": round(m["decode_graph_ms"] / off["decode_graph_ms"], 3),
                         "decode_eager": round(m["decode_eager_ms"] / off["decode_eager_ms"], 3),
                         "embed": round(off["embed_sentences_per_s"] / m["embed_sentences_per_s"], 3),
                         "launch": round(m["launch_us"] / off["launch_us"], 3)}
    res["numpy_bound"] = {"decode_ms": round(statistics.median(bound["decode_ms"]), 2),
                          "embed_sentences_per_s": round(1.0 / statistics.median(bound["embed_s_per_sentence"]), 1)}
    g = _guard_ns()
    res["off_path"] = {"guard_ns_per_op": round(g, 1), "share_of_a_launch": round(g / (off["launch_us"] * 1e3), 5)}
    res["verification"], res["embed_atol"] = check["per_mode"], check["embed_atol"]
    res["verified"] = check["ok"]
    if a.json:
        print(json.dumps(res))
        return 0 if res["verified"] else 1
    _print(res)
    return 0 if res["verified"] else 1


def _print(res: dict) -> None:
    nb = res["numpy_bound"]
    print(f"vnpu bench sanitize: 1 in-process device per mode, {res['rounds']} round(s) alternating the modes; "
          f"medians")
    print(f"{'mode':<12} {'decode graph':>13} {'decode eager':>13} {'MiniLM embed':>14} {'tiny launch':>12}   "
          f"slowdown: decode graph / eager / embed / launch")
    for name, m in res["modes"].items():
        sl = m.get("slowdown")
        txt = "(baseline)" if sl is None else " / ".join(f"{sl[k]:.2f}x" for k in ("decode_graph", "decode_eager",
                                                                                  "embed", "launch"))
        print(f"{name:<12} {m['decode_graph_ms']:>10.1f} ms {m['decode_eager_ms']:>10.1f} ms "
              f"{m['embed_sentences_per_s']:>9.1f} sent/s {m['launch_us']:>9.1f} us   {txt}")
    print("host CPU of the calling thread (where the sanitizer runs; robust to the machine's other load):")
    for name, m in res["modes"].items():
        c, c0 = m["host_cpu"], res["modes"]["off"]["host_cpu"]
        print(f"  {name:<12} decode graph {c['decode_graph_ms_per_token']:.2f} ms/token, eager "
              f"{c['decode_eager_ms_per_token']:.2f} ms/token, embed {c['embed_ms_per_sentence']:.2f} ms/sentence, "
              f"launch {c['launch_us']:.1f} us" + ("" if name == "off" else
                                                  f"  (+{c['launch_us'] - c0['launch_us']:.1f} us per op)"))
    print(f"numpy bound (the same forwards in this process): decode {nb['decode_ms']} ms/token, embed "
          f"{nb['embed_sentences_per_s']} sentences/s")
    for name in ("racecheck", "all"):
        m = res["modes"][name]
        c = m["checked"]
        print(f"{name}: {m['findings']} finding(s) on these correct programs; checked {c['tasks']} device tasks "
              f"({c['replays']} graph replays) and {c['host_accesses']} host accesses")
    o = res["off_path"]
    print(f"off: no layer; the one test per enqueued op costs {o['guard_ns_per_op']} ns = "
          f"{100 * o['share_of_a_launch']:.3f}% of a tiny launch; a second off runtime measured "
          + " / ".join(f"{v:.2f}x" for v in res["modes"]["off (again)"]["slowdown"].values())
          + " (the noise floor)")
    bad = {k: v for k, v in res["verification"].items() if v["tokens_differing_from_numpy"] or v["wrong_launch_loops"]
           or v["findings"] or v["max_abs_diff_vs_numpy"] > res["embed_atol"] or not v["decode_runs"]}
    print(f"verified: yes (tokens equal numpy's greedy ones in every mode, embeddings within {res['embed_atol']:g}, "
          "launches exact, no findings)" if res["verified"] else f"verified: NO: {bad}")
