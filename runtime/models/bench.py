"""Measurements of the model jobs against plain numpy forwards run in the same process (the
baseline of the report: decode ms/token and sentences/s).  ``python -m runtime.models.bench``.

The numpy forwards here are the *baselines* (what the same math costs without the runtime); the tests
have their own independent references.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np


# ---------------------------------------------------------------------------------------------- numpy llama
class NumpyLlama:
    """Llama forward with a KV cache in numpy (GGUF layout, interleaved rope), batch 1."""

    def __init__(self, g, cfg, max_len: int = 512):
        self.cfg = c = cfg
        t = g.tensors
        self.L = [{k: t[f"blk.{i}.{k}.weight"] for k in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                          "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")}
                  for i in range(c.n_layers)]
        self.E, self.ON = t["token_embd.weight"], t["output_norm.weight"]
        self.inv = 1.0 / (c.rope_base ** (np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim))
        self.kc = np.zeros((c.n_layers, max_len, c.n_kv_heads, c.head_dim), np.float32)
        self.vc = np.zeros_like(self.kc)

    def _rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(self.cfg.eps)) * w

    def _rope(self, x, pos):
        ang = pos[:, None].astype(np.float64) * self.inv
        c, s = np.cos(ang).astype(np.float32)[:, None, :], np.sin(ang).astype(np.float32)[:, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x1 * c - x2 * s
        out[..., 1::2] = x2 * c + x1 * s
        return out

    def forward(self, ids, pos0: int) -> np.ndarray:
        c = self.cfg
        S, dh, g = len(ids), c.head_dim, c.n_heads // c.n_kv_heads
        x = self.E[np.asarray(ids)]
        pos = np.arange(pos0, pos0 + S)
        for i, L in enumerate(self.L):
            h = self._rms(x, L["attn_norm"])
            q = self._rope((h @ L["attn_q"].T).reshape(S, c.n_heads, dh), pos)
            self.kc[i, pos0:pos0 + S] = self._rope((h @ L["attn_k"].T).reshape(S, c.n_kv_heads, dh), pos)
            self.vc[i, pos0:pos0 + S] = (h @ L["attn_v"].T).reshape(S, c.n_kv_heads, dh)
            K, V = self.kc[i, :pos0 + S], self.vc[i, :pos0 + S]                 # [T, Hkv, D]
            qg = q.reshape(S, c.n_kv_heads, g, dh).transpose(1, 2, 0, 3).reshape(c.n_kv_heads, g * S, dh)
            s = qg @ K.transpose(1, 2, 0) / np.float32(math.sqrt(dh))         # [Hkv, g*S, T]
            if S > 1:
                s = s.reshape(c.n_kv_heads, g, S, -1) + np.triu(np.full((S, S + pos0), -np.inf, np.float32),
                                                                 1 + pos0)
                s = s.reshape(c.n_kv_heads, g * S, -1)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = (s @ V.transpose(1, 0, 2)).reshape(c.n_kv_heads, g, S, dh).transpose(2, 0, 1, 3).reshape(S, -1)
            x = x + o @ L["attn_output"].T
            h = self._rms(x, L["ffn_norm"])
            gg = h @ L["ffn_gate"].T
            x = x + ((gg / (1 + np.exp(-gg))) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T
        return self._rms(x[-1:], self.ON) @ self.E.T


def bench_decode(tokens: int = 32, rounds: int = 3, block_dim: int | None = None,
                 batch_size: int | None = None, cores: int | None = None) -> dict:
    """Decode ms/token of a 1-device GenerateJob vs :class:`NumpyLlama`, interleaved token by token in
    one process (each emulator step is followed by the same step of the numpy forward, so both see the
    same machine load): medians over ``rounds x tokens`` steps."""
    from devices.device import DeviceConfig
    from runtime.api import Runtime
    from runtime.backend import LocalBackend

    from .llama import GenerateJob
    from .weights import LlamaConfig, load_gguf_cached, smollm2_gguf
    g = load_gguf_cached(str(smollm2_gguf()))
    ref = NumpyLlama(g, LlamaConfig.from_gguf_meta(g.meta))
    rt = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30, cores=cores)), batch_size=batch_size)
    job = GenerateJob(rt, "smollm2", devices=1, max_len=512, block_dim=block_dim)
    prompt = job.tok.chat_prompt("Write a short story about a robot learning to paint.")
    emu, base, lpt = [], [], 0.0
    try:
        for _ in range(rounds):
            ref.forward(prompt, 0)
            stamps, spent = [], []
            pos = [len(prompt)]

            def on_token(b, tok, piece):
                t0 = time.perf_counter()
                stamps.append(t0)
                ref.forward([tok], pos[0])                  # the same step in numpy, timed apart
                pos[0] += 1
                spent.append(time.perf_counter() - t0)

            job.generate([prompt], max_new_tokens=tokens, stop_at_eos=False, on_token=on_token)
            lpt = job.last_stats.launches_per_token
            emu += [(stamps[i + 1] - stamps[i] - spent[i]) * 1e3 for i in range(len(stamps) - 1)]
            base += [x * 1e3 for x in spent]
    finally:
        job.close()
        rt.close()
    e, b = float(np.median(emu)), float(np.median(base))
    return {"emulator_ms_per_token": round(e, 2), "numpy_ms_per_token": round(b, 2),
            "speed_vs_numpy": round(b / e, 3), "launches_per_token": lpt,
            "overhead_us_per_launch": round((e - b) / lpt * 1e3, 1) if lpt else None,
            "block_dim": "auto" if block_dim is None else block_dim, "launch_batch": rt.batch_size,
            "device_cores": cores or "chip default"}


# ---------------------------------------------------------------------------------------------- numpy bert
def _ln(x, g, b, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps) * g + b


def numpy_bert(w: dict, n_layers: int, ids: np.ndarray, mask: np.ndarray, normalize: bool) -> np.ndarray:
    """Batched, padded BERT + masked mean pooling in numpy (erf gelu via the same kernel code path is
    not used: ``math.erf`` vectorised would dominate, so this uses the tanh-free exact formula below)."""
    from devices.ops.activations import gelu_erf
    B, S = ids.shape
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:S] \
        + w["embeddings.token_type_embeddings.weight"][0]
    x = _ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    add = np.where(mask > 0, 0.0, -np.inf).astype(np.float32)[:, None, None, :]
    for i in range(n_layers):
        p = f"encoder.layer.{i}."
        lin = lambda h, n: h @ w[p + n + ".weight"].T + w[p + n + ".bias"]  # noqa: E731
        q, k, v = (lin(x, "attention.self." + n).reshape(B, S, 12, 32).transpose(0, 2, 1, 3)
                   for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(32)) + add
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(0, 2, 1, 3).reshape(B, S, 384)
        x = _ln(x + lin(a, "attention.output.dense"), w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"])
        f = lin(x, "intermediate.dense")
        gelu_erf(f.copy(), f)
        x = _ln(x + lin(f, "output.dense"), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    m = mask[..., None].astype(np.float32)
    e = (x * m).sum(1) / m.sum(1)
    return e / np.linalg.norm(e, axis=1, keepdims=True) if normalize else e


def bench_texts(n: int) -> list[str]:
    """The ``n`` sentences (12 to 27 words, seeded) every embedding benchmark encodes."""
    rng = np.random.default_rng(0)
    words = "the a npu runs matrix kernels on cube units while vector cores do norms and softmax quickly".split()
    return [" ".join(rng.choice(words, size=int(rng.integers(12, 28)))) for _ in range(n)]


def bench_embed(model: str = "minilm-l6", n: int = 64, batch: int = 8, rounds: int = 3, devices: int = 1,
                block_dim: int = 0, rt=None, parallel: str = "dp") -> dict:
    """Sentences/s of an EmbedJob vs :func:`numpy_bert` (same batches), interleaved in one process.
    ``rt``: the runtime to use (default: a fresh in-process one, closed afterwards)."""
    from devices.device import DeviceConfig
    from runtime.api import Runtime
    from runtime.backend import LocalBackend

    from .bert import EmbedJob, load_encoder
    cfg, w = load_encoder(model)
    texts = bench_texts(n)
    own_rt = rt is None
    if own_rt:
        rt = Runtime(LocalBackend(devices, DeviceConfig(arena_bytes=512 << 20)))
    job = EmbedJob(rt, model, devices=devices, parallel=parallel, batch_size=batch, block_dim=block_dim)
    emu, base = [], []
    diff = 0.0
    try:
        job.embed(texts[:batch])
        for _ in range(rounds):
            t0 = time.perf_counter()
            got = job.embed(texts)
            emu.append(time.perf_counter() - t0)
            ids, mask = job.tok.encode_batch(texts)
            lens = mask.sum(1)
            order = np.argsort(-lens, kind="stable")
            refs = []
            t0 = time.perf_counter()
            for i in range(0, n, batch):
                idx = order[i:i + batch]
                s = int(lens[idx].max())
                refs.append((idx, numpy_bert(w, cfg.n_layers, ids[idx, :s], mask[idx, :s], cfg.normalize)))
            base.append(time.perf_counter() - t0)
            diff = max([diff] + [float(np.abs(got[idx] - ref).max()) for idx, ref in refs])
    finally:
        job.close()
        if own_rt:
            rt.close()
    e, b = float(np.min(emu)), float(np.min(base))
    return {"model": model, "devices": devices, "parallel": parallel, "emulator_sentences_per_s": round(n / e, 1),
            "numpy_sentences_per_s": round(n / b, 1), "speed_vs_numpy": round(b / e, 3),
            "max_abs_diff_vs_numpy": diff}


def main(argv=None) -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    p = argparse.ArgumentParser(description="model jobs vs plain numpy in one process")
    p.add_argument("what", choices=["decode", "embed", "all"], nargs="?", default="all")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--block-dim", type=int, default=None, help="decode: default 1; embed: default 0 (auto)")
    p.add_argument("--launch-batch", type=int, default=0)
    p.add_argument("--cores", type=int, default=0, help="emulated AI Core threads per device (default: chip's)")
    a = p.parse_args(argv)
    out = {}
    if a.what in ("decode", "all"):
        out["decode"] = bench_decode(a.tokens, a.rounds, a.block_dim, a.launch_batch or None, a.cores or None)
    if a.what in ("embed", "all"):
        bd = a.block_dim or 0
        out["embed_l6"] = bench_embed("minilm-l6", rounds=a.rounds, block_dim=bd)
        out["embed_l6_dp2"] = bench_embed("minilm-l6", rounds=a.rounds, devices=2, block_dim=bd)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
