"""``vnpu bench infer``: SmolLM2 decode tokens/s and MiniLM-L6 sentences/s through the emulator, side by
side with the same forward in plain numpy in this process, in the same run; then multi-device modes.

Decode steps of the emulator and of numpy alternate token by token (both see the same machine load);
the overhead breakdown per token comes from the runtime's host counters (queuing launches, copies,
waiting for the device) and the device's own busy time (kernels running on its AI Core threads).

Verified (the command exits 1 otherwise): every token the emulator generates is numpy's greedy choice
after the same tokens, the multi-device modes generate the single device's tokens, and the embeddings
match numpy's within float32 rounding.
"""
from __future__ import annotations

import json
import time

import numpy as np

from runtime.cliargs import positive_int


SHM_DIR_NOTE = ("/dev/shm is mounted huge=never; numpy's heap gets 2 MiB pages. With "
                "`mount -o remount,huge=advise /dev/shm` a decode step's kernels match numpy's time")


def register(bench_sub) -> None:
    p = bench_sub.add_parser("infer", help="inference jobs vs plain numpy (decode tokens/s, sentences/s)",
                             example="vnpu bench infer --tokens 24 --rounds 2 --backend local")
    p.add_argument("--tokens", type=positive_int, default=24, help="decode steps per round")
    p.add_argument("--rounds", type=positive_int, default=2,
                   help="alternated rounds of each job and its baseline (medians)")
    p.add_argument("--backend", choices=["cluster", "local"], default="cluster",
                   help="devices as Ray actors over gRPC (default) or in this process")
    p.add_argument("--no-multi", action="store_true", help="skip the 2+ device runs")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(fn=_run)


def _runtime(backend: str, devices: int):
    from devices.device import DeviceConfig
    from runtime.api import Runtime, runtime_scope
    from runtime.backend import LocalBackend
    from runtime.cluster import ClusterSpec, cluster_runtime
    if backend == "local":
        return runtime_scope(Runtime(LocalBackend(devices, DeviceConfig(arena_bytes=1 << 30))))
    return cluster_runtime(spec=ClusterSpec(devices=devices, arena_bytes=1 << 30))


def _busy(rt, n: int) -> float:
    return sum(rt.device(i).telemetry().get("busy_s", 0.0) for i in range(n))


def bench_decode(rt, devices: int, parallel: str, tokens: int, rounds: int, with_numpy: bool,
                 graphs: bool = True) -> dict:
    """Decode ms/token (medians), with ``graphs`` (each step one captured-graph replay per device) or
    launching every kernel of every step."""
    from runtime.models.bench import NumpyLlama
    from runtime.models.llama import GenerateJob
    from runtime.models.weights import LlamaConfig, load_gguf_cached, smollm2_gguf
    ref = None
    if with_numpy:
        g = load_gguf_cached(str(smollm2_gguf()))
        ref = NumpyLlama(g, LlamaConfig.from_gguf_meta(g.meta))
    job = GenerateJob(rt, "smollm2", devices=devices, parallel=parallel, max_len=512, graphs=graphs)
    prompt = job.tok.chat_prompt("Write a short story about a robot learning to paint.")
    emu, base = [], []
    generated: list[int] = []
    mismatches = 0
    host = {"launch_s": 0.0, "h2d_s": 0.0, "d2h_s": 0.0, "sync_s": 0.0}
    busy = 0.0
    steps = 0
    lpt = 0.0
    try:
        job.generate([prompt], max_new_tokens=2, stop_at_eos=False)          # warm up
        for rnd in range(rounds):
            want = [int(np.argmax(ref.forward(prompt, 0)))] if ref is not None else [None]
            stamps, spent = [], []
            pos = [len(prompt)]
            snaps = {}

            def on_token(b, tok, piece, rnd=rnd, want=want):
                nonlocal mismatches
                t0 = time.perf_counter()
                stamps.append(t0)
                if rnd == 0:
                    generated.append(int(tok))
                if want[0] is not None and int(tok) != want[0]:
                    mismatches += 1
                if len(stamps) == 2:               # decode starts after the first (prefill) token
                    snaps["host"] = [rt.device(i).host_stats.snapshot() for i in range(devices)]
                    snaps["busy"] = _busy(rt, devices)
                    snaps["t"] = time.perf_counter()
                if ref is not None:
                    want[0] = int(np.argmax(ref.forward([tok], pos[0])))     # numpy's greedy next token
                    pos[0] += 1
                spent.append(time.perf_counter() - t0)

            job.generate([prompt], max_new_tokens=tokens, stop_at_eos=False, on_token=on_token)
            lpt = job.last_stats.launches_per_token
            n = len(stamps) - 1
            emu += [(stamps[i + 1] - stamps[i] - spent[i]) * 1e3 for i in range(n)]
            base += [x * 1e3 for x in spent[1:]]
            if "host" in snaps:
                for i in range(devices):
                    d = rt.device(i).host_stats.since(snaps["host"][i])
                    for k in host:
                        host[k] += getattr(d, k)
                busy += _busy(rt, devices) - snaps["busy"]
                steps += n - 1
    finally:
        job.close()
    e = float(np.median(emu))
    out = {"devices": devices, "parallel": parallel, "graphs": graphs, "emulator_ms_per_token": round(e, 2),
           "emulator_tokens_per_s": round(1e3 / e, 2), "launches_per_token": round(lpt, 1), "tokens": generated}
    if ref is not None:
        out["tokens_differing_from_numpy"] = mismatches
    if steps:
        per = {k: v * 1e3 / steps for k, v in host.items()}
        compute = busy * 1e3 / steps
        out["breakdown_ms_per_token"] = {
            "host_launch": round(per["launch_s"], 3), "copies": round(per["h2d_s"] + per["d2h_s"], 3),
            "host_wait_for_device": round(per["sync_s"], 3), "device_compute": round(compute, 3),
            "device_overhead": round(max(0.0, e - compute - per["launch_s"] - per["h2d_s"] - per["d2h_s"]), 3)}
        out["overhead_vs_compute"] = round(max(0.0, e - compute) / compute, 3) if compute else None
    if base:
        b = float(np.median(base))
        out.update(numpy_ms_per_token=round(b, 2), numpy_tokens_per_s=round(1e3 / b, 2),
                   speed_vs_numpy=round(b / e, 3),
                   overhead_us_per_launch=round((e - b) / lpt * 1e3, 1) if lpt else None)
    return out


def bench_embed(rt, devices: int, parallel: str, rounds: int) -> dict:
    from runtime.models.bench import bench_embed as run
    return run("minilm-l6", rounds=rounds, devices=devices, rt=rt, parallel=parallel)


#: embeddings (unit vectors) may differ from numpy's by this much (float32 rounding, other sum orders)
EMBED_ATOL = 1e-4


def verified(res: dict) -> bool:
    """Every check of a run: tokens equal numpy's greedy ones, multi-device tokens equal the single
    device's, embeddings within :data:`EMBED_ATOL` of numpy's."""
    ok = True
    for k, v in res.items():
        if k.startswith("decode"):
            ok = ok and v.get("tokens_differing_from_numpy", 0) == 0 and bool(v["tokens"])
            one = res["decode_1dev"]["tokens"]
            ok = ok and v["tokens"] == one[:len(v["tokens"])]
        elif k.startswith("embed"):
            ok = ok and v["max_abs_diff_vs_numpy"] <= EMBED_ATOL
    return ok


def _run(a) -> int:
    from devices.arena import shm_huge_pages
    res: dict = {"backend": a.backend, "shm_huge_pages": shm_huge_pages()}
    with _runtime(a.backend, 1) as rt:
        res["decode_1dev"] = bench_decode(rt, 1, "none", a.tokens, a.rounds, True)
        res["decode_1dev_eager"] = bench_decode(rt, 1, "none", a.tokens, a.rounds, True, graphs=False)
        res["embed_1dev"] = bench_embed(rt, 1, "dp", a.rounds)
    if not a.no_multi:
        with _runtime(a.backend, 3) as rt:
            res["decode_tp3"] = bench_decode(rt, 3, "tp", max(4, a.tokens // 3), 1, False)
            res["decode_pp2"] = bench_decode(rt, 2, "pp", max(4, a.tokens // 3), 1, False)
            res["embed_dp2"] = bench_embed(rt, 2, "dp", a.rounds)
    res["verified"] = verified(res)
    if a.json:
        print(json.dumps(res))
        return 0 if res["verified"] else 1
    if res["shm_huge_pages"] in ("never", "deny"):
        print(f"(device HBM arenas use 4 KiB pages: {SHM_DIR_NOTE})")
    for key, how in (("decode_1dev", "graph replay"), ("decode_1dev_eager", "eager launches")):
        d = res[key]
        print(f"SmolLM2-135M decode, 1 device ({a.backend}, {how}): {d['emulator_tokens_per_s']:.1f} tok/s "
              f"({d['emulator_ms_per_token']:.1f} ms/token) vs numpy {d['numpy_tokens_per_s']:.1f} tok/s "
              f"-> {d['speed_vs_numpy']:.2f}x numpy; {d['launches_per_token']:.0f} launches/token, "
              f"{d['overhead_us_per_launch']} us overhead/launch")
        if "breakdown_ms_per_token" in d:
            print("  per token (ms): " + ", ".join(f"{k} {v}" for k, v in d["breakdown_ms_per_token"].items())
                  + f"; overhead {100 * (d['overhead_vs_compute'] or 0):.0f}% of device compute")
    for key in ("decode_tp3", "decode_pp2"):
        if key in res:
            r = res[key]
            print(f"SmolLM2 decode, {r['devices']} devices {r['parallel']}: {r['emulator_tokens_per_s']:.1f} tok/s "
                  f"({r['emulator_ms_per_token']:.1f} ms/token)")
    for key in ("embed_1dev", "embed_dp2"):
        r = res.get(key, {})
        if "emulator_sentences_per_s" in r:
            print(f"MiniLM-L6 embed, {r['devices']} device(s) {r['parallel']}: {r['emulator_sentences_per_s']} "
                  f"sentences/s vs numpy {r['numpy_sentences_per_s']} -> {r['speed_vs_numpy']:.2f}x")
    print(f"verified: {'yes' if res['verified'] else 'NO: tokens or embeddings differ from numpy'}")
    return 0 if res["verified"] else 1
