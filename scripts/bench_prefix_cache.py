"""TTFT with and without prefix caching on a shared ~1k-token system prompt (issue 29, item 5).

Two SmolLM2 engines on in-process devices (one with ``enable_prefix_caching``, one without) serve the same
requests one at a time: a shared system prompt of about ``--system-tokens`` tokens plus a distinct short
question, one output token (greedy).  TTFT is measured from queueing to the first token, the engines
driven step by step in this process.  Printed against the baseline (the engine without the cache) and
against the machine's bound measured in the same run: numpy float32 on one thread computing the same
prefill (all prompt tokens without the cache; only the uncached tokens with it -- their attention over
themselves only, so that bound is a little optimistic).  The first request of the cached engine is the cold
miss that fills the cache; the p50 is over all requests.

    .venv/bin/python scripts/bench_prefix_cache.py [--requests 6] [--system-tokens 1024]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from devices.device import DeviceConfig
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.bench.serve_workload import NumpyDecode
from runtime.models.weights import LlamaConfig, load_gguf_cached, smollm2_gguf
from runtime.serve.engine import EngineConfig, GenerateEngine, SamplingParams

WORDS = ("the device runs matrix kernels on cube units while vector cores do norms and softmax across many "
         "streams of tokens in a busy serving system whose operators watch the latency of every request").split()


def ttfts(e: GenerateEngine, prompts: list[list[int]]) -> list[float]:
    out = []
    sp = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    for p in prompts:
        t0 = time.perf_counter()
        h = e.add_request(p, sp)
        while not h.done:
            e.step()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=1024)
    a = ap.parse_args()
    g = load_gguf_cached(str(smollm2_gguf()))
    cfg = LlamaConfig.from_gguf_meta(g.meta)
    rt = Runtime(LocalBackend(2, DeviceConfig(arena_bytes=1 << 31)))
    try:
        ec = dict(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=a.system_tokens + 256,
                  num_gpu_blocks_override=2 * (a.system_tokens + 256) // 16 + 8)
        on = GenerateEngine(rt, "smollm2", [0], EngineConfig(**ec, enable_prefix_caching=True))
        off = GenerateEngine(rt, "smollm2", [1], EngineConfig(**ec, enable_prefix_caching=False))
        words = " ".join(WORDS[k % len(WORDS)] for k in range(a.system_tokens))
        system = on.tok.encode(words)[:a.system_tokens]
        prompts = [system + on.tok.encode(f" Question {i}: which unit runs kernel number {i * 7}?")
                   for i in range(a.requests)]
        t_off = ttfts(off, prompts)
        t_on = ttfts(on, prompts)
        hits = on.blocks.hits
        on.shutdown()
        off.shutdown()
    finally:
        rt.close()
    ref = NumpyDecode(g, cfg)
    full = sum(len(p) for p in prompts) / len(prompts)
    rest = full - hits / len(prompts[1:]) if len(prompts) > 1 else full
    b_full, b_rest = ref.prefill_s(round(full)), ref.prefill_s(max(1, round(rest)))
    p_off, p_on = statistics.median(t_off), statistics.median(t_on)
    print(f"prompt {full:.0f} tokens ({len(system)} shared), {a.requests} requests one at a time, 1 output token; "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"{'':18} {'TTFT p50 ms':>11} {'min':>8} {'max':>8} | {'bound ms':>8} {'of bound':>8}")
    print(f"{'no prefix cache':18} {p_off * 1e3:>11.1f} {min(t_off) * 1e3:>8.1f} {max(t_off) * 1e3:>8.1f} | "
          f"{b_full * 1e3:>8.1f} {b_full / p_off:>8.2f}")
    print(f"{'prefix cache':18} {p_on * 1e3:>11.1f} {min(t_on) * 1e3:>8.1f} {max(t_on) * 1e3:>8.1f} | "
          f"{b_rest * 1e3:>8.1f} {b_rest / p_on:>8.2f}")
    print(f"TTFT p50: {p_off / p_on:.1f}x lower with the prefix cache (baseline: the same engine without it); "
          f"{hits} of {sum(len(p) for p in prompts)} prompt tokens hit; bound: numpy fp32 prefill of "
          f"{full:.0f} / {rest:.0f} tokens, one thread")


if __name__ == "__main__":
    main()
