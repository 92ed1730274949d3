"""The serve engine's decode step (one captured-graph replay) against the numpy bound of the same step.

SmolLM2 on an in-process device, the serve engine's :class:`ModelRunner` with its default configuration
(paged KV cache, decode graphs per batch bucket): a decode step of B sequences, each over a context of
``--context`` tokens (``--spread S``: lengths spread over context +- S, mean ``--context``), its KV blocks
drawn at random from the whole cache (as after many requests came and went; ``--blocks consecutive``:
consecutive ids per sequence, as a fresh pool hands them out).  Its bound is
:class:`runtime.bench.serve_workload.NumpyDecode`, the figure ``vnpu bench serve`` prints: the same step in
plain numpy (float32, one thread, contiguous caches) at batch B over the mean context.  Step and bound are
alternated round by round; each prints the fastest of its rounds as wall time and the median CPU time of
the process per step (less sensitive to other work on a shared machine; the device's threads and the
host's waiting included).  No HTTP, scheduling or sampling on the host: the step as the device runs it.

    .venv/bin/python scripts/bench_decode_step.py [--batch 1,16] [--context 192] [--spread 0] [--blocks random] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from devices.device import DeviceConfig
from runtime.api import Runtime, runtime_scope
from runtime.backend import LocalBackend
from runtime.bench.serve_workload import NumpyDecode
from runtime.models.weights import LlamaConfig, load_gguf_cached, smollm2_gguf
from runtime.serve.engine.config import EngineConfig
from runtime.serve.engine.runner import ModelRunner, StepInputs


def step_inputs(runner: ModelRunner, ecfg: EngineConfig, lens: list[int], rng, consecutive: bool) -> StepInputs:
    """A decode step of ``len(lens)`` sequences of these lengths over blocks drawn at random (or, with
    ``consecutive``, each sequence's blocks consecutive ids, as a fresh block pool hands them out)."""
    bs, b = ecfg.block_size, len(lens)
    mb = -(-ecfg.max_model_len // bs)
    need = [-(-n // bs) for n in lens]
    blocks = np.arange(1, 1 + sum(need)) if consecutive else \
        rng.permutation(np.arange(1, runner.num_blocks))[:sum(need)]
    tables = np.zeros((b, mb), np.int64)
    o = 0
    for i, k in enumerate(need):
        tables[i, :k] = blocks[o:o + k]
        o += k
    ln = np.array(lens, np.int64)
    slots = tables[np.arange(b), (ln - 1) // bs] * bs + (ln - 1) % bs
    return StepInputs(ids=rng.integers(0, 49152, b), positions=ln - 1, slots=slots, tables=tables, lens=ln,
                      rows=np.arange(b), decode=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="1,16", help="decode batch sizes (comma-separated)")
    ap.add_argument("--context", type=int, default=192, help="mean context length (tokens)")
    ap.add_argument("--spread", type=int, default=0, help="lengths spread over context +- spread")
    ap.add_argument("--blocks", choices=("random", "consecutive"), default="random",
                    help="each sequence's KV blocks: drawn at random from the cache, or consecutive ids")
    ap.add_argument("--rounds", type=int, default=5, help="alternated rounds (each: 3 steps, 2 bound steps)")
    a = ap.parse_args()
    g = load_gguf_cached(str(smollm2_gguf()))
    cfg, ecfg = LlamaConfig.from_gguf_meta(g.meta), EngineConfig()
    ref = NumpyDecode(g, cfg)
    rng = np.random.default_rng(0)
    print(f"decode step (graph replay, in-process device) vs the numpy bound; load {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    with runtime_scope(Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30)))) as rt:
        runner = ModelRunner([rt.device(0)], g, cfg, ecfg)
        try:
            for b in (int(x) for x in a.batch.split(",")):
                lens = [int(x) for x in np.linspace(a.context - a.spread, a.context + a.spread, b).round()] \
                    if b > 1 else [a.context]
                s = step_inputs(runner, ecfg, lens, rng, a.blocks == "consecutive")
                runner.execute(s)                                     # warm-up
                walls, cpus, bwalls, bcpus = [], [], [], []
                for _ in range(a.rounds):
                    c0 = time.process_time()
                    for _ in range(3):
                        t0 = time.perf_counter()
                        runner.execute(s)
                        walls.append(time.perf_counter() - t0)
                    cpus.append((time.process_time() - c0) / 3)
                    bwalls.append(b / ref.tokens_per_s(b, a.context, 1))
                    bcpus.append(b / ref.tokens_per_s(b, a.context, 1, clock=time.process_time))
                w, bw = min(walls), min(bwalls)
                c, bc = statistics.median(cpus), statistics.median(bcpus)
                print(f"B={b:>2} context {a.context} (+-{a.spread if b > 1 else 0}): step {w * 1e3:7.2f} ms wall, "
                      f"{c * 1e3:7.2f} ms CPU | bound {bw * 1e3:7.2f} ms wall, {bc * 1e3:7.2f} ms CPU | "
                      f"step/bound {w / bw:.3f} wall, {c / bc:.3f} CPU | load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            runner.close()


if __name__ == "__main__":
    main()
