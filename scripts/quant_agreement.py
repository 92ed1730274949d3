"""Greedy agreement of SmolLM2 with its GGUF blocks in HBM (``quantization="gguf"``) against the same model
dequantised to float32, on a fixed prompt set; also the weights' HBM bytes and the decode time of both.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/quant_agreement.py [--tokens 32] [--json]

One in-process device; each prompt generated alone (batch 1), greedy, stopping at EOS like a chat turn.
A pair of sequences agrees up to its first differing token; the tokens after it are counted as differing
(the runs condition on different histories from there).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain gravity in one sentence.",
    "Translate 'good morning' into Spanish.",
    "Give me a tip for learning to code.",
    "What does a CPU do?",
    "Name a famous painting and its painter.",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from devices.device import DeviceConfig
    from runtime.api import Runtime
    from runtime.backend import LocalBackend
    from runtime.models import GenerateJob
    rt = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30)))
    out: dict = {"prompts": len(PROMPTS), "max_new_tokens": a.tokens}
    try:
        for q in ("none", "gguf"):
            job = GenerateJob(rt, quantization=q)
            try:
                toks, dec_s, steps = [], 0.0, 0
                for p in PROMPTS:
                    toks.append(job.generate([p], max_new_tokens=a.tokens)[0].token_ids)
                    dec_s += job.last_stats.decode_s
                    steps += job.last_stats.decode_steps
                out[q] = {"weight_bytes": sum(r.weight_bytes() for r in job.ranks), "tokens": toks,
                          "decode_ms_per_step": round(1e3 * dec_s / max(1, steps), 1)}
            finally:
                job.close()
    finally:
        rt.close()
    same = total = identical = 0
    for x, y in zip(out["none"]["tokens"], out["gguf"]["tokens"]):
        k = next((i for i, (p, r) in enumerate(zip(x, y)) if p != r), min(len(x), len(y)))
        same += k
        total += max(len(x), len(y))
        identical += x == y
    out.update(agree_tokens=same, total_tokens=total, identical_sequences=identical,
               hbm_ratio=round(out["none"]["weight_bytes"] / out["gguf"]["weight_bytes"], 2),
               load=[round(v, 2) for v in os.getloadavg()])
    if a.json:
        print(json.dumps(out))
    else:
        print(f"SmolLM2, {len(PROMPTS)} prompts x up to {a.tokens} greedy tokens (load {out['load']})")
        print(f"  weights in HBM: float32 {out['none']['weight_bytes']} B, GGUF blocks {out['gguf']['weight_bytes']} B "
              f"({out['hbm_ratio']}x fewer)")
        print(f"  greedy agreement: {same}/{total} tokens before the first difference; "
              f"{identical}/{len(PROMPTS)} sequences identical")
        print(f"  decode ms/step (batch 1, in-process device): float32 {out['none']['decode_ms_per_step']}, "
              f"gguf {out['gguf']['decode_ms_per_step']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
