"""What the serve benchmarks share: the prompts they send, the percentile they report, and the bound they
compare against (:class:`NumpyDecode`: SmolLM2 decode steps in plain numpy, the math alone)."""
from __future__ import annotations

import math
import statistics
import time

import numpy as np

WORDS = ("the npu runs matrix kernels on cube units while vector cores do norms and softmax quickly across many "
         "small streams of tokens").split()


def prompt(i: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(6 + i % 9))


def pct(xs: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (NaN for no samples)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


class NumpyDecode:
    """SmolLM2 decode steps for a batch of B sequences in plain numpy (the bound)."""

    def __init__(self, g, cfg):
        t = g.tensors
        self.cfg = cfg
        self.L = [{k: t[f"blk.{i}.{k}.weight"] for k in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                          "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")}
                  for i in range(cfg.n_layers)]
        self.E, self.ON = t["token_embd.weight"], t["output_norm.weight"]
        self.inv = 1.0 / (cfg.rope_base ** (np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim))

    def _rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(self.cfg.eps)) * w

    def _rope(self, x, pos):
        ang = pos[:, None].astype(np.float64) * self.inv
        c, s = np.cos(ang).astype(np.float32)[:, None, :], np.sin(ang).astype(np.float32)[:, None, :]
        out = np.empty_like(x)
        out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
        out[..., 1::2] = x[..., 1::2] * c + x[..., 0::2] * s
        return out

    def tokens_per_s(self, B: int, ctx: int, steps: int = 3) -> float:
        c = self.cfg
        dh, hkv, g = c.head_dim, c.n_kv_heads, c.n_heads // c.n_kv_heads
        rng = np.random.default_rng(0)
        kc = rng.standard_normal((c.n_layers, B, hkv, ctx, dh), dtype=np.float32)
        vc = rng.standard_normal((c.n_layers, B, hkv, ctx, dh), dtype=np.float32)
        ids = rng.integers(0, c.vocab, B)
        pos = np.full(B, ctx - 1)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            x = self.E[ids]
            for i, L in enumerate(self.L):
                h = self._rms(x, L["attn_norm"])
                q = self._rope((h @ L["attn_q"].T).reshape(B, c.n_heads, dh), pos)
                kc[i, :, :, -1] = self._rope((h @ L["attn_k"].T).reshape(B, hkv, dh), pos)
                vc[i, :, :, -1] = (h @ L["attn_v"].T).reshape(B, hkv, dh)
                s = q.reshape(B, hkv, g, dh) @ kc[i].transpose(0, 1, 3, 2) / np.float32(math.sqrt(dh))
                s = np.exp(s - s.max(-1, keepdims=True))
                s /= s.sum(-1, keepdims=True)
                x = x + (s @ vc[i]).reshape(B, -1) @ L["attn_output"].T
                h = self._rms(x, L["ffn_norm"])
                gg = h @ L["ffn_gate"].T
                x = x + ((gg / (1 + np.exp(-gg))) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T
            self._rms(x, self.ON) @ self.E.T
            times.append(time.perf_counter() - t0)
        return B / statistics.median(times)


