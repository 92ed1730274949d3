"""``vnpu bench kernels``: every hot kernel of a SmolLM2 decode and prefill step, in isolation, against its
numpy bound measured in the same run.

Each kernel runs the way a captured decode step runs it -- one call over the whole launch (a built-in
kernel's blocks are one call where they would run one after another, ``devices.device.LaunchPlan``) --
on plain numpy arrays in this process: no launch, no scheduler, no RPC.  Its bound is the least numpy
that computes the same result (for paged attention: attention over keys and values already contiguous,
no block-table gather, no masking beyond the causal one).  Shapes are SmolLM2-135M's (576 wide, 9 query
and 3 key-value heads of 64, FFN 1536, vocabulary 49152, paged KV blocks of 16) at decode batch B over a
context of ``--context`` tokens, and a prefill chunk of ``--prefill-tokens`` tokens of one sequence (its
LM head on the last row only, as the engine samples it).

Each row: median microseconds of the kernel and of its bound (alternated, so both see the same machine
load), the ratio, and whether the kernel's output matched the bound's within float32 rounding.  Matmuls
also show the cost of running the launch as 20 column slices one after another (one per emulated AI
Core: what a captured launch of block_dim 20 did before it ran as one call).  The step rows add a layer's
kernels times the layer count, plus the head.

Host-blocking; allocates a few hundred MiB (the LM head's weights and the KV caches).  Exit 1 when an
output differs from its bound.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from runtime.cliargs import int_list, positive_int

#: paged KV cache block size (the serve engine's default)
BLOCK = 16
#: emulated AI Cores of the default chip: the slices a matmul launch of block_dim 20 was cut into
CORES = 20


def register(bench_sub) -> None:
    p = bench_sub.add_parser("kernels", help="hot decode/prefill kernels in isolation vs their numpy bound",
                             example="vnpu bench kernels --batch 1,16 --context 256 --prefill-tokens 128")
    p.add_argument("--batch", type=int_list, default="1,16", help="decode batch sizes (comma-separated)")
    p.add_argument("--context", type=positive_int, default=256, help="decode context length (tokens)")
    p.add_argument("--prefill-tokens", type=positive_int, default=128, help="prefill chunk length (tokens)")
    p.add_argument("--repeat", type=positive_int, default=15, help="timed runs of each kernel and bound (median)")
    p.add_argument("-q", "--quantization", choices=("none", "gguf"), default="none",
                   help="gguf: the weights' kernels on SmolLM2's own GGUF blocks (weight_quant_matmul, "
                        "quant_embedding: layer 0's Q4_1 projections, the Q8_0 embedding and head); their bound "
                        "is the float32 matmul of the dequantised weights (what the float32 path runs)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="what the times are: wall (elapsed) or cpu (this process's CPU time: what a kernel costs "
                        "when other jobs share the cores; single-threaded BLAS, OPENBLAS_NUM_THREADS=1)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(fn=_run)


@dataclass(frozen=True)
class Case:
    """One kernel launch on numpy arrays and the numpy that bounds it."""
    name: str
    kernel: str
    inputs: tuple
    outputs: tuple
    attrs: dict
    bound: Callable[[], np.ndarray]          #: computes the same result in plain numpy, returns it
    per_layer: bool = True                    #: runs once per layer (else once per step)
    tol: float = 1e-5                         #: relative tolerance of the comparison (of the max magnitude)
    #: the result the kernel is checked against when it is not the bound's (the kernels on GGUF weights
    #: compute on 8-bit activations: the same matmul on the activations quantized as GGML's Q8_1)
    want: Callable[[], np.ndarray] | None = None


def _shapes():
    from runtime.models.weights import LlamaConfig
    c = LlamaConfig()
    return c, c.n_heads, c.n_kv_heads, c.head_dim, c.n_heads + 2 * c.n_kv_heads


def _rope_bound(x, pos, base):
    dh = x.shape[-1]
    inv = 1.0 / (base ** (np.arange(0, dh, 2, dtype=np.float64) / dh))
    ang = pos[..., None].astype(np.float64) * inv
    c, s = np.cos(ang).astype(np.float32)[:, :, None, :], np.sin(ang).astype(np.float32)[:, :, None, :]
    out = np.empty_like(x)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x2 * c + x1 * s
    return out


def _attention_bound(q, k, v, hkv, causal_from: int | None):
    """q [N, H, D] of one (causal_from: chunk of rows at positions causal_from..) or many sequences
    (k, v [N, Hkv, L, D] per row) -> [N, H, D]."""
    n, h, d = q.shape
    g = h // hkv
    qs = (q * np.float32(1 / math.sqrt(d))).reshape(n, hkv, g, d)
    if causal_from is None:
        s = qs @ k.swapaxes(-1, -2)                                   # [N, Hkv, g, L]
    else:                                                             # one sequence: k [Hkv, L, D]
        qs = qs.transpose(1, 0, 2, 3).reshape(hkv, n * g, d)
        s = (qs @ k.swapaxes(-1, -2)).reshape(hkv, n, g, -1)          # [Hkv, N, g, L]
        vis = np.arange(k.shape[1])[None, :] <= (causal_from + np.arange(n))[:, None]
        s = np.where(vis[None, :, None, :], s, np.float32(-np.inf))
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    if causal_from is None:
        return (s @ v).reshape(n, h, d)
    return (s.reshape(hkv, n * g, -1) @ v).reshape(hkv, n, g, d).transpose(1, 0, 2, 3).reshape(n, h, d)


def _cases(n: int, ctx: int | None, rng) -> list[Case]:
    """Decode (``ctx``: context of each of ``n`` sequences) or prefill (``ctx`` None: ``n`` rows of one
    sequence) kernels of one layer, and the step's embedding and head."""
    c, h, hkv, dh, W = _shapes()
    d, ff, V = c.d_model, c.d_ff, c.vocab

    def r(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    def o(*shape):
        return np.empty(shape, np.float32)

    E, ids = r(V, d), rng.integers(0, V, n).astype(np.int32)
    x, gam = r(n, d), (1 + 0.1 * r(d)).astype(np.float32)
    wqkv, wo, wgu, wd = r(W * dh, d) * 0.05, r(d, h * dh) * 0.05, r(2, ff, d) * 0.05, r(d, ff) * 0.05
    a, att = r(n, d), r(n, h * dh)
    gu, hh = r(2, n, ff), r(n, ff)
    C = W // hkv                                                      # q|k|v chunks of hkv heads
    rv, pos = r(n, C, hkv, dh), np.tile(np.arange(C, dtype=np.int32)[None, :] + 7, (n, 1)) * 3
    eps = float(c.eps)
    span = ctx if ctx is not None else n
    nb = n * (span + BLOCK - 1) // BLOCK + 1 if ctx is not None else (span + BLOCK - 1) // BLOCK + 1
    kc, vc = r(nb, BLOCK, hkv, dh), r(nb, BLOCK, hkv, dh)
    q = r(n, W, dh)
    if ctx is not None:                                               # each row its own sequence of ctx tokens
        per = (ctx + BLOCK - 1) // BLOCK
        bt = (1 + np.arange(n * per, dtype=np.int32)).reshape(n, per)
        lens = np.full(n, ctx, np.int32)
    else:                                                             # one sequence: row i sees i + 1 tokens
        per = (n + BLOCK - 1) // BLOCK
        bt = np.tile(1 + np.arange(per, dtype=np.int32), (n, 1))
        lens = np.arange(1, n + 1, dtype=np.int32)

    def kv_rows(cache, table):                                        # [Hkv, L, D] of one block table row
        return np.moveaxis(cache[table].reshape(-1, hkv, dh), 1, 0)

    if ctx is not None:
        K = np.stack([kv_rows(kc, bt[i])[:, :ctx] for i in range(n)])  # [N, Hkv, L, D], contiguous (not timed)
        Vv = np.stack([kv_rows(vc, bt[i])[:, :ctx] for i in range(n)])
        att_bound = lambda: _attention_bound(q[:, :h], K, Vv, hkv, None)     # noqa: E731
    else:
        K1, V1 = kv_rows(kc, bt[0])[:, :n].copy(), kv_rows(vc, bt[0])[:, :n].copy()
        att_bound = lambda: _attention_bound(q[:, :h], K1, V1, hkv, 0)       # noqa: E731
    S = max(2 * nb * BLOCK * hkv, 4 * n * hkv)                        # K and V rows of the caches
    krows = r(S, dh)
    upd, idx = r(n * 2 * hkv, dh), rng.permutation(S)[:n * 2 * hkv].astype(np.int32)

    def scatter_bound():
        krows[idx] = upd
        return krows

    res = o(n, d)

    def rms_bound():
        return x / np.sqrt(np.einsum("ij,ij->i", x, x)[:, None] / d + np.float32(eps)) * gam

    def swiglu_bound():
        g = gu[0]
        return g / (1 + np.exp(-g)) * gu[1]

    head_w = E
    xh = x if ctx is not None else x[-1:]              # the head runs on the sampled rows: a prefill's last

    def mm(a_, w_, out_):
        return lambda: np.matmul(a_, w_.T, out=out_)

    def gate_up(out_):
        def f():
            np.matmul(x, wgu[0].T, out=out_[0])
            np.matmul(x, wgu[1].T, out=out_[1])
            return out_
        return f

    return [
        Case("embedding", "embedding", (E, ids), (o(n, d),), {}, lambda: np.take(E, ids, axis=0), per_layer=False),
        Case("rmsnorm", "rmsnorm", (x, gam), (o(n, d),), {"eps": eps}, rms_bound),
        Case("matmul qkv", "matmul", (x, wqkv), (o(n, W * dh),), {"transpose_b": True}, mm(x, wqkv, o(n, W * dh))),
        Case("rope", "rope", (rv, pos), (o(*rv.shape),), {"base": float(c.rope_base), "style": "interleaved"},
             lambda: _rope_bound(rv, pos, float(c.rope_base))),
        Case("scatter_update (KV write)", "scatter_update", (upd, idx), (krows,), {}, scatter_bound),
        Case("paged_attention", "paged_attention", (q, kc, vc, bt, lens), (o(n, h, dh),),
             {"num_heads": h, "num_key_value_heads": hkv}, att_bound, tol=1e-4),
        Case("matmul o", "matmul", (att, wo), (o(n, d),), {"transpose_b": True}, mm(att, wo, o(n, d))),
        Case("add (residual)", "add", (x, a), (o(n, d),), {}, lambda: np.add(x, a, out=res)),
        Case("batch_matmul gate|up", "batch_matmul", (np.broadcast_to(x, (2, n, d)).copy(), wgu), (o(2, n, ff),),
             {"transpose_b": True}, gate_up(o(2, n, ff))),
        Case("swiglu", "swiglu", (gu[0], gu[1]), (o(n, ff),), {}, swiglu_bound),
        Case("matmul down", "matmul", (hh, wd), (o(n, d),), {"transpose_b": True}, mm(hh, wd, o(n, d))),
        Case("matmul head", "matmul", (xh, head_w), (o(len(xh), V),), {"transpose_b": True},
             mm(xh, head_w, o(len(xh), V)),
             per_layer=False),
    ]


def _q8_1(a: np.ndarray) -> np.ndarray:
    """``a [M, K]`` quantized per 32 values as GGML's Q8_1 (``rint(a * 127 / amax) * amax / 127``, float32
    steps): the activations the fused quantized loops compute on."""
    b = a.reshape(a.shape[0], -1, 32)
    amax = np.abs(b).max(axis=2, keepdims=True)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    return (np.rint(b * inv) * (amax / np.float32(127))).reshape(a.shape).astype(np.float32)


def _quant_cases(n: int, ctx: int | None, rng) -> list[Case]:
    """The weights' kernels on SmolLM2's GGUF blocks (layer 0, the token embedding as the head), repacked
    as ``vnpu serve -q gguf`` uploads them (:func:`devices.ops.qformats.repack`): each bound is the float32
    numpy matmul (or row gather) of the dequantised weight; the result is checked against the same matmul
    on the activations quantized to 8 bits (what the kernels on GGUF weights compute on)."""
    from devices.ops.qformats import dequantize, repack
    from runtime.models.weights import load_gguf_quantized, smollm2_gguf
    g = load_gguf_quantized(smollm2_gguf())
    t, qt = g.tensors, g.qtypes
    c, *_ = _shapes()
    d, ff, V = c.d_model, c.d_ff, c.vocab
    blk = "blk.0."
    wqkv = np.concatenate([np.asarray(t[blk + k]) for k in ("attn_q.weight", "attn_k.weight", "attn_v.weight")])
    wgu = np.stack([np.asarray(t[blk + "ffn_gate.weight"]), np.asarray(t[blk + "ffn_up.weight"])])
    wo, wd, emb = (np.asarray(t[blk + "attn_output.weight"]), np.asarray(t[blk + "ffn_down.weight"]),
                   np.asarray(t["token_embd.weight"]))
    f4, f8 = qt[blk + "attn_q.weight"], qt["token_embd.weight"]
    p4, p8 = f4 + "r", f8 + "r"

    def r(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    def o(*shape):
        return np.empty(shape, np.float32)

    x, att, hh = r(n, d), r(n, wo.shape[1] if f4 != "q4_k" else d), r(n, ff)
    xh = x if ctx is not None else x[-1:]
    ids = rng.integers(0, V, n).astype(np.int32)
    deq = {k: dequantize(f, w.reshape(-1, w.shape[-1])).reshape(w.shape[:-1] + (-1,))
           for k, f, w in (("qkv", f4, wqkv), ("o", f4, wo), ("gu", f4, wgu), ("down", f4, wd), ("emb", f8, emb))}

    def mm(a_, key, out_):
        w_ = deq[key]
        if w_.ndim == 3:
            return lambda: np.matmul(a_, w_.transpose(0, 2, 1), out=out_)
        return lambda: np.matmul(a_, w_.T, out=out_)

    def qmm(a_, key, out_):                                            # the fused loops' reference
        return mm(_q8_1(a_), key, np.empty_like(out_))

    def pk(fmt, w_):                                                   # as uploaded: repacked
        return np.stack([repack(fmt, m_)[1] for m_ in w_]) if w_.ndim == 3 else repack(fmt, w_)[1]

    pqkv, pwo, pgu, pwd, pemb = pk(f4, wqkv), pk(f4, wo), pk(f4, wgu), pk(f4, wd), pk(f8, emb)
    att = r(n, deq["o"].shape[1])
    return [
        Case(f"quant_embedding {p8}", "quant_embedding", (pemb, ids), (o(n, d),), {"qtype": p8},
             lambda: np.take(deq["emb"], ids, axis=0), per_layer=False),
        Case(f"wq_matmul qkv {p4}", "weight_quant_matmul", (x, pqkv), (o(n, wqkv.shape[0]),), {"qtype": p4},
             mm(x, "qkv", o(n, wqkv.shape[0])), tol=1e-4,
             want=qmm(x, "qkv", o(n, wqkv.shape[0]))),
        Case(f"wq_matmul o {p4}", "weight_quant_matmul", (att, pwo), (o(n, d),), {"qtype": p4},
             mm(att, "o", o(n, d)), tol=1e-4,
             want=qmm(att, "o", o(n, d))),
        Case(f"wq_matmul gate|up {p4}", "weight_quant_matmul", (x, pgu), (o(2, n, ff),), {"qtype": p4},
             mm(x, "gu", o(2, n, ff)), tol=1e-4,
             want=qmm(x, "gu", o(2, n, ff))),
        Case(f"wq_matmul down {p4}", "weight_quant_matmul", (hh, pwd), (o(n, d),), {"qtype": p4},
             mm(hh, "down", o(n, d)), tol=1e-4,
             want=qmm(hh, "down", o(n, d))),
        Case(f"wq_matmul head {p8}", "weight_quant_matmul", (xh, pemb), (o(len(xh), V),), {"qtype": p8},
             mm(xh, "emb", o(len(xh), V)), per_layer=False, tol=1e-4,
             want=qmm(xh, "emb", o(len(xh), V))),
    ]


#: the clocks ``--clock`` names
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _time_pair(fn_a, fn_b, repeat: int, clock=time.perf_counter) -> tuple[float, float]:
    """Median seconds of ``fn_a`` and ``fn_b`` by ``clock``, run alternately (one warm-up each)."""
    fn_a()
    fn_b()
    ta, tb = [], []
    for _ in range(repeat):
        t0 = clock()
        fn_a()
        t1 = clock()
        fn_b()
        t2 = clock()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return statistics.median(ta), statistics.median(tb)


def _measure(case: Case, repeat: int, clock=time.perf_counter) -> dict:
    from devices.kernel import BlockCtx, lookup
    k = lookup(case.kernel)
    ins, outs = list(case.inputs), list(case.outputs)
    whole = BlockCtx(0, 1, 0)
    t_k, t_b = _time_pair(lambda: k.run(whole, ins, outs, case.attrs), case.bound, repeat, clock)
    got, want = outs[0], (case.want or case.bound)()
    scale = float(np.abs(want).max()) or 1.0
    ok = bool(np.allclose(got, want, rtol=case.tol, atol=case.tol * scale))
    row = {"kernel": case.name, "shape": [list(np.shape(a)) for a in ins], "kernel_us": round(t_k * 1e6, 1),
           "bound_us": round(t_b * 1e6, 1), "ratio": round(t_k / t_b, 2) if t_b else None, "ok": ok,
           "per_layer": case.per_layer}
    if case.kernel == "matmul":              # the same launch as 20 column slices, one after another
        def sliced():
            for b in range(CORES):
                k.run(BlockCtx(b, CORES, 0), ins, outs, case.attrs)
        t_s, _ = _time_pair(sliced, lambda: None, max(3, repeat // 3), clock)
        row["sliced20_us"] = round(t_s * 1e6, 1)
    return row


def _step(rows: list[dict], layers: int) -> dict:
    k = sum(r["kernel_us"] * (layers if r["per_layer"] else 1) for r in rows)
    b = sum(r["bound_us"] * (layers if r["per_layer"] else 1) for r in rows)
    return {"kernels_ms": round(k / 1e3, 2), "bound_ms": round(b / 1e3, 2), "ratio": round(k / b, 2)}


#: the float32 weight kernels that ``--quantization gguf`` replaces by their quantized counterparts
_WEIGHT_KERNELS = ("embedding", "matmul qkv", "matmul o", "batch_matmul gate|up", "matmul down", "matmul head")


def bench(batches: list[int], context: int, prefill: int, repeat: int, quantization: str = "none",
          clock: str = "wall") -> dict:
    c, *_ = _shapes()
    rng = np.random.default_rng(0)
    out = {"layers": c.n_layers, "context": context, "quantization": quantization, "clock": clock, "sections": []}
    if quantization == "gguf":                  # the fused loops' first-call compile (or cache load)
        from devices.ops.qfused import compile_all
        out["jit_s"] = round(compile_all(), 2)
    for n, ctx, label in [(b, context, f"decode B={b}, context {context}") for b in batches] + \
                         [(prefill, None, f"prefill {prefill} tokens")]:
        cases = _cases(n, ctx, rng)
        if quantization == "gguf":
            cases = [cs for cs in cases if cs.name not in _WEIGHT_KERNELS] + _quant_cases(n, ctx, rng)
        rows = [_measure(cs, repeat, CLOCKS[clock]) for cs in cases]
        out["sections"].append({"label": label, "rows": rows, "step": _step(rows, c.n_layers)})
    out["verified"] = all(r["ok"] for s in out["sections"] for r in s["rows"])
    return out


def _run(a) -> int:
    from runtime.bench.bound import cores
    doc = bench(list(a.batch), a.context, a.prefill_tokens, a.repeat, getattr(a, "quantization", "none"),
                getattr(a, "clock", "wall"))
    doc["load"] = [round(x, 2) for x in os.getloadavg()]
    doc["cores"] = cores()
    if a.json:
        print(json.dumps(doc))
        return 0 if doc["verified"] else 1
    print(f"vnpu bench kernels: SmolLM2-135M kernels (weights: {doc['quantization']}) in isolation (one call each, this process) vs the least "
          f"numpy for the same result; medians of {a.repeat} ({doc['clock']} clock); load {doc['load']} on "
          f"{doc['cores']} cores")
    if "jit_s" in doc:
        print(f"compiled loops (numba) ready in {doc['jit_s']} s (compile on a first run, cache load after)")
    for s in doc["sections"]:
        print(f"\n{s['label']}")
        print(f"  {'kernel':<26} {'kernel us':>10} {'bound us':>9} {'ratio':>6}  {'20 slices us':>12}  ok")
        for r in s["rows"]:
            sl = f"{r['sliced20_us']:>12.1f}" if "sliced20_us" in r else f"{'':>12}"
            print(f"  {r['kernel']:<26} {r['kernel_us']:>10.1f} {r['bound_us']:>9.1f} {r['ratio']:>6.2f}  {sl}  "
                  f"{'yes' if r['ok'] else 'NO'}")
        st = s["step"]
        print(f"  one step ({doc['layers']} layers + embedding and head): kernels {st['kernels_ms']} ms, "
              f"bound {st['bound_ms']} ms, ratio {st['ratio']}")
    print(f"\nverified: {'yes' if doc['verified'] else 'NO: a kernel differs from its numpy bound'}")
    return 0 if doc["verified"] else 1
