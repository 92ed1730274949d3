"""CPU time per decode token of SmolLM2 at batch 1 on an in-process device, by weights (float32 or the
GGUF blocks): robust to other work on a shared machine, unlike wall time.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/decode_cpu.py [--quantization gguf,none] [--tokens 64] [--runs 3]

Per run: the process CPU time (``time.process_time``: the device's thread and the host's) of a greedy
generation of ``tokens + 1`` tokens minus that of a 1-token generation of the same prompt (the same
prefill), divided by ``tokens``.
"""
from __future__ import annotations

import argparse
import os
import time

PROMPT = "Tell me a long story about a dragon who learns to fly over the mountains and the sea, in detail."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quantization", default="gguf,none", help="comma-separated: gguf, none")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    from devices.device import DeviceConfig
    from runtime.api import Runtime
    from runtime.backend import LocalBackend
    from runtime.models import GenerateJob
    rt = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30)))
    try:
        for q in a.quantization.split(","):
            job = GenerateJob(rt, quantization=q)
            try:
                job.generate([PROMPT], max_new_tokens=4, stop_at_eos=False)          # warm-up
                ms = []
                for _ in range(a.runs):
                    c0 = time.process_time()
                    job.generate([PROMPT], max_new_tokens=1, stop_at_eos=False)
                    c1 = time.process_time()
                    job.generate([PROMPT], max_new_tokens=a.tokens + 1, stop_at_eos=False)
                    c2 = time.process_time()
                    ms.append(((c2 - c1) - (c1 - c0)) / a.tokens * 1e3)
            finally:
                job.close()
            print(f"{q}: CPU ms per decode token (batch 1): {' '.join(f'{x:.1f}' for x in ms)} "
                  f"(load {[round(v, 1) for v in os.getloadavg()]})", flush=True)
    finally:
        rt.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
