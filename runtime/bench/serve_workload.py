"""What the serve benchmarks share: the prompts they send, the percentile they report, and the bound they
compare against (:class:`NumpyDecode`: SmolLM2 decode steps and prompt prefills in plain numpy, float32,
one thread: the math alone)."""
from __future__ import annotations

import math
import statistics
import time

import numpy as np

WORDS = ("the npu runs matrix kernels on cube units while vector cores do norms and softmax quickly across many "
         "small streams of tokens").split()


def prompt(i: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(6 + i % 9))


def sized_prompts(tokenizer, lo: int, hi: int, n: int) -> list[str]:
    """``n`` prompts of ``lo``..``hi`` tokens (spread evenly over the range, in a shuffled order; each the
    benchmark's words from its own starting word), as ``tokenizer`` counts them."""
    out = []
    for i in range(n):
        want = lo + ((i * 7919) % n) * (hi - lo) // max(1, n - 1) if n > 1 else lo
        words = [WORDS[(i + k) % len(WORDS)] for k in range(want)]
        text = " ".join(words)
        while len(tokenizer.encode(text)) > want and len(words) > 1:
            words.pop()
            text = " ".join(words)
        out.append(text)
    return out


def pct(xs: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (NaN for no samples)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


class NumpyDecode:
    """SmolLM2 decode steps for a batch of B sequences in plain numpy (the bound: the fastest of its timed
    steps, so that a moment of load on a shared machine does not lower it)."""

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

    def _attention(self, q, k, v, causal: bool):
        """q [B, H, S, D] over k, v [B, Hkv, L, D] (GQA); ``causal``: query i sees keys j <= L - S + i."""
        c = self.cfg
        B, H, S, dh = q.shape
        g = H // c.n_kv_heads
        s = q.reshape(B, c.n_kv_heads, g * S, dh) @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(dh))
        if causal:
            L = k.shape[2]
            vis = np.arange(L)[None, :] <= (L - S + np.arange(S))[:, None]
            s = np.where(np.tile(vis, (g, 1))[None, None], s, np.float32(-np.inf))
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        return (s @ v).reshape(B, H, S, dh)

    def prefill_s(self, P: int, steps: int = 3) -> float:
        """Seconds of one prompt's prefill (the fastest of ``steps``: a bound is what the math can reach) of ``P`` tokens (every layer's matmuls over the P rows,
        causal attention over them, the head for the last row)."""
        return self.prefill_times(P, steps)[0]

    def prefill_times(self, P: int, steps: int = 3) -> tuple[float, float]:
        """(wall, CPU) seconds of :meth:`prefill_s`'s prefill: the fastest of ``steps`` by each clock (CPU:
        this process's, one thread)."""
        c = self.cfg
        dh, hkv = c.head_dim, c.n_kv_heads
        ids = np.random.default_rng(1).integers(0, c.vocab, P)
        pos = np.arange(P)
        times, cpus = [], []
        for _ in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            x = self.E[ids]
            for L in self.L:
                h = self._rms(x, L["attn_norm"])
                q = self._rope((h @ L["attn_q"].T).reshape(P, c.n_heads, dh), pos).transpose(1, 0, 2)[None]
                k = self._rope((h @ L["attn_k"].T).reshape(P, hkv, dh), pos).transpose(1, 0, 2)[None]
                v = (h @ L["attn_v"].T).reshape(P, hkv, dh).transpose(1, 0, 2)[None]
                a = self._attention(q, k, v, True)[0].transpose(1, 0, 2).reshape(P, -1)
                x = x + a @ L["attn_output"].T
                h = self._rms(x, L["ffn_norm"])
                gg = h @ L["ffn_gate"].T
                x = x + ((gg / (1 + np.exp(-gg))) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T
            self._rms(x[-1:], self.ON) @ self.E.T
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        return min(times), min(cpus)

    def workload_tokens_per_s(self, B: int, prompt_tokens: float, max_tokens: int, steps: int = 3) -> dict:
        """Output tokens/s of the math alone for ``B`` concurrent requests of ``prompt_tokens`` prompt
        tokens (their mean) and ``max_tokens`` output tokens each: ``B`` prefills plus ``max_tokens`` decode
        steps at batch ``B`` over the mean context (prompt + half the output).  Also the decode-only figure,
        and the same by CPU time (``cpu_*``: this process's CPU seconds, the fastest step by that clock -- what
        a loaded machine inflates less than wall time; comparable with the device process's CPU time)."""
        P = max(1, round(prompt_tokens))
        step, step_cpu = self.step_times(B, P + max_tokens // 2, steps)
        pre, pre_cpu = self.prefill_times(P, steps)
        t = B * pre + max_tokens * step
        tc = B * pre_cpu + max_tokens * step_cpu
        return {"tokens_per_s": B * max_tokens / t, "decode_tokens_per_s": B / step, "prefill_ms": 1e3 * pre,
                "context": P + max_tokens // 2, "cpu_tokens_per_s": B * max_tokens / tc,
                "cpu_prefill_ms": 1e3 * pre_cpu, "cpu_step_ms": 1e3 * step_cpu}

    def step_times(self, B: int, ctx: int, steps: int = 3) -> tuple[float, float]:
        """(wall, CPU) seconds of :meth:`tokens_per_s`'s decode step at batch ``B`` over ``ctx`` tokens: the
        fastest of ``steps`` by each clock."""
        times = self._steps(B, ctx, steps, (time.perf_counter, time.process_time))
        return min(t[0] for t in times), min(t[1] for t in times)

    def tokens_per_s(self, B: int, ctx: int, steps: int = 3, clock=time.perf_counter) -> float:
        """Tokens/s of the fastest of ``steps`` decode steps at batch ``B`` over ``ctx`` tokens, timed by
        ``clock`` (wall time; ``time.process_time`` for CPU time)."""
        return B / min(t[0] for t in self._steps(B, ctx, steps, (clock,)))

    def _steps(self, B: int, ctx: int, steps: int, clocks) -> list[tuple[float, ...]]:
        """Each of ``steps`` decode steps timed by every clock of ``clocks``."""
        c = self.cfg
        dh, hkv, g = c.head_dim, c.n_kv_heads, c.n_heads // c.n_kv_heads
        rng = np.random.default_rng(0)
        kc = rng.standard_normal((c.n_layers, B, hkv, ctx, dh), dtype=np.float32)
        vc = rng.standard_normal((c.n_layers, B, hkv, ctx, dh), dtype=np.float32)
        ids = rng.integers(0, c.vocab, B)
        pos = np.full(B, ctx - 1)
        times = []
        for _ in range(steps):
            t0 = [k() for k in clocks]
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
            times.append(tuple(k() - a for k, a in zip(clocks, t0)))
        return times


