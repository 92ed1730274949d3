"""``vnpu bench torch``: PyTorch code on the ``npu`` device (:mod:`runtime.torch`) against the same models
on vnpu through :mod:`runtime.api` and against torch on the CPU -- the machine's bound: the npu device's
kernels are numpy on this machine's cores, so eager torch on the CPU, same process, same run, is what
the arithmetic costs without vnpu.

- **decode**: HF transformers SmolLM2-135M ``generate`` (greedy, batch 1) on the CPU and on ``npu``,
  alternated round by round (both see the same load); ms/token from the time between consecutive
  tokens (a streamer stamps each), medians.  Beside them the runtime's own SmolLM2 job on the same
  devices (:func:`runtime.bench.infer.bench_decode`, eager launches).
- **embed**: sentence-transformers all-MiniLM-L6-v2 ``encode`` of ``--sentences`` sentences in batches
  of ``--batch`` on the CPU and on ``npu``, beside the runtime's EmbedJob on the same sentences
  (:func:`runtime.models.bench.bench_embed`); sentences/s, best of ``--rounds``.
- **dispatch**: the cost of one small aten op on ``npu`` (``torch.add`` of 16 floats, ``--ops`` in a row,
  then one ``torch.npu.synchronize``) against the same op on a CPU tensor and against one vnpu launch
  of the ``add`` kernel through runtime.api (the torch layer's own share is their difference).

Verified (the command exits 1 otherwise): the npu tokens are the CPU's, the npu embeddings are within
the float32 bound of the CPU's (:data:`EMBED_BOUND`), the runtime's embeddings within
:data:`runtime.bench.infer.EMBED_ATOL` of numpy's, and the dispatched adds computed 2 = 1 + 1.
Host-blocking throughout.
"""
from __future__ import annotations

import copy
import json
import statistics
import time

import numpy as np

from runtime.cliargs import int_at_least, positive_int

#: npu vs CPU embeddings (unit vectors): float32 rounding over 6 layers of sums of 384 + 384 + 1536 terms
EMBED_BOUND = 6 * (384 + 384 + 1536) * 2.0 ** -24 / (1 - 6 * (384 + 384 + 1536) * 2.0 ** -24)
#: HBM of the device: SmolLM2 in float32 (~540 MB) through torch, then through runtime.api, plus activations
ARENA = 2 << 30
PROMPT = "Write a short story about a robot learning to paint."


def register(bench_sub) -> None:
    p = bench_sub.add_parser("torch", help="PyTorch on the npu device vs runtime.api and torch on the CPU "
                             "(decode tokens/s, sentences/s, us per aten op)",
                             example="vnpu bench torch --tokens 16 --sentences 32 --rounds 2")
    p.add_argument("--tokens", type=int_at_least(3), default=16, help="decode steps per round (default 16)")
    p.add_argument("--sentences", type=positive_int, default=32, help="sentences per embedding round (default 32)")
    p.add_argument("--batch", type=positive_int, default=8, help="embedding batch size (default 8)")
    p.add_argument("--rounds", type=positive_int, default=2, help="alternated rounds of each (default 2)")
    p.add_argument("--ops", type=positive_int, default=500, help="aten ops per dispatch-overhead run (default 500)")
    p.add_argument("--backend", choices=["local", "cluster"], default="local",
                   help="npu devices in this process (default) or the running cluster's device actors")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(fn=_run)


def _runtime(backend: str):
    from devices.device import DeviceConfig
    from runtime.api import Runtime, runtime_scope
    from runtime.backend import LocalBackend
    from runtime.cluster import ClusterSpec, cluster_runtime
    if backend == "local":
        return runtime_scope(Runtime(LocalBackend(1, DeviceConfig(arena_bytes=ARENA))))
    return cluster_runtime(spec=ClusterSpec(devices=1, arena_bytes=ARENA))


class _Stamps:
    """A transformers streamer: ``put`` gets the prompt first, then each new token; each call is stamped."""

    def __init__(self) -> None:
        self.t: list[float] = []

    def put(self, value) -> None:
        self.t.append(time.perf_counter())

    def end(self) -> None:
        pass

    def step_ms(self) -> list[float]:
        """ms between consecutive new tokens (the decode steps; the prefill is before the first)."""
        return [(b - a) * 1e3 for a, b in zip(self.t[1:], self.t[2:])]


def bench_decode(tokens: int, rounds: int) -> dict:
    """SmolLM2 ``generate`` (greedy) on the CPU and on npu, alternated; medians of the decode steps."""
    import torch

    from runtime.models import hf
    cpu_model, tok = hf.smollm2()
    npu_model = copy.deepcopy(cpu_model).to("npu")
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    gen = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    steps: dict[str, list[float]] = {"cpu": [], "npu": []}
    out: dict[str, list[int]] = {}
    with torch.no_grad():
        for dev, model in (("cpu", cpu_model), ("npu", npu_model)):     # warm up (first-call costs)
            model.generate(**{k: v.to(dev) for k, v in ids.items()}, max_new_tokens=2, do_sample=False)
        for _ in range(rounds):
            for dev, model in (("cpu", cpu_model), ("npu", npu_model)):
                s = _Stamps()
                seq = model.generate(**{k: v.to(dev) for k, v in ids.items()}, **gen, streamer=s)
                steps[dev] += s.step_ms()
                out[dev] = seq[0, ids["input_ids"].shape[1]:].cpu().tolist()
    cpu_ms, npu_ms = statistics.median(steps["cpu"]), statistics.median(steps["npu"])
    return {"tokens": out["npu"], "tokens_equal_cpu": out["npu"] == out["cpu"],
            "cpu_ms_per_token": round(cpu_ms, 2), "cpu_tokens_per_s": round(1e3 / cpu_ms, 2),
            "npu_ms_per_token": round(npu_ms, 2), "npu_tokens_per_s": round(1e3 / npu_ms, 2),
            "npu_of_cpu_bound": round(cpu_ms / npu_ms, 3)}


def bench_embed(sentences: int, batch: int, rounds: int) -> dict:
    """sentence-transformers MiniLM ``encode`` on the CPU and on npu, alternated; best round of each."""
    from runtime.models import hf
    from runtime.models.bench import bench_texts
    texts = bench_texts(sentences)
    models = {"cpu": hf.minilm("cpu"), "npu": hf.minilm("npu")}
    best = {"cpu": float("inf"), "npu": float("inf")}
    got = {}
    for dev, m in models.items():
        m.encode(texts[:batch], batch_size=batch)                      # warm up
    for _ in range(rounds):
        for dev, m in models.items():
            t0 = time.perf_counter()
            got[dev] = m.encode(texts, batch_size=batch)                # numpy: copied to the host, synchronous
            best[dev] = min(best[dev], time.perf_counter() - t0)
    diff = float(np.abs(got["npu"].astype(np.float64) - got["cpu"]).max())
    return {"sentences": sentences, "batch": batch, "max_abs_diff_vs_cpu": diff,
            "cpu_sentences_per_s": round(sentences / best["cpu"], 1),
            "npu_sentences_per_s": round(sentences / best["npu"], 1),
            "npu_of_cpu_bound": round(best["cpu"] / best["npu"], 3)}


def bench_dispatch(rt, ops: int, rounds: int) -> dict:
    """us per ``torch.add`` of 16 floats on npu and on the CPU, and per vnpu ``add`` launch (runtime.api)."""
    import torch

    def per_op(x) -> float:
        sync = torch.npu.synchronize if x.device.type == "npu" else (lambda: None)
        y = torch.add(x, x)
        sync()
        best = float("inf")
        for _ in range(max(3, rounds)):
            t0 = time.perf_counter()
            for _ in range(ops):
                y = torch.add(x, x)
            sync()
            best = min(best, time.perf_counter() - t0)
        per_op.last = y
        return best / ops * 1e6

    npu_us = per_op(torch.ones(16, device="npu"))
    ok = bool(torch.equal(per_op.last.cpu(), torch.full((16,), 2.0)))
    cpu_us = per_op(torch.ones(16))
    dev = rt.device(0)
    a, out = dev.from_numpy(np.ones(16, np.float32)), dev.empty((16,), "float32")
    s = dev.stream()
    s.launch("add", [a, a], [out], block_dim=1)
    s.synchronize()
    best = float("inf")
    for _ in range(max(3, rounds)):
        t0 = time.perf_counter()
        for _ in range(ops):
            s.launch("add", [a, a], [out], block_dim=1)
        s.synchronize()
        best = min(best, time.perf_counter() - t0)
    ok = ok and bool(np.array_equal(out.numpy(s), np.full(16, 2.0, np.float32)))
    launch_us = best / ops * 1e6
    return {"ops": ops, "npu_us_per_op": round(npu_us, 2), "cpu_us_per_op": round(cpu_us, 2),
            "api_launch_us": round(launch_us, 2), "overhead_us_vs_cpu": round(npu_us - cpu_us, 2),
            "torch_layer_us": round(npu_us - launch_us, 2), "verified": ok}


def _release() -> None:
    """Free what the torch models held on the device (their tensors are garbage once the benches return;
    modules can hold reference cycles) and hand the cached blocks back to the arena."""
    import gc

    import torch
    gc.collect()
    torch.npu.empty_cache()


def _run(a) -> int:
    import runtime.torch as vtorch
    from runtime.bench.infer import EMBED_ATOL
    from runtime.bench.infer import bench_decode as api_decode
    from runtime.models.bench import bench_embed as api_embed
    res: dict = {"backend": a.backend}
    with _runtime(a.backend) as rt:
        vtorch.reset_fallback_counts()
        res["decode"] = bench_decode(a.tokens, a.rounds)
        res["embed"] = bench_embed(a.sentences, a.batch, a.rounds)
        res["fallbacks"] = vtorch.fallback_counts()
        _release()                               # the torch models' HBM back, for the runtime's own jobs
        api = api_decode(rt, 1, "none", a.tokens, a.rounds, False, graphs=False)
        res["decode"]["api_tokens_per_s"] = api["emulator_tokens_per_s"]
        res["decode"]["npu_of_api"] = round(res["decode"]["npu_tokens_per_s"] / api["emulator_tokens_per_s"], 3)
        emb = api_embed("minilm-l6", n=a.sentences, batch=a.batch, rounds=a.rounds, rt=rt)
        res["embed"]["api_sentences_per_s"] = emb["emulator_sentences_per_s"]
        res["embed"]["api_max_abs_diff_vs_numpy"] = emb["max_abs_diff_vs_numpy"]
        res["embed"]["npu_of_api"] = round(res["embed"]["npu_sentences_per_s"] / emb["emulator_sentences_per_s"], 3)
        res["dispatch"] = bench_dispatch(rt, a.ops, a.rounds)
    res["verified"] = bool(res["decode"]["tokens_equal_cpu"] and res["embed"]["max_abs_diff_vs_cpu"] <= EMBED_BOUND
                           and res["embed"]["api_max_abs_diff_vs_numpy"] <= EMBED_ATOL and res["dispatch"]["verified"])
    if a.json:
        print(json.dumps(res))
    else:
        _print(res)
    return 0 if res["verified"] else 1


def _print(res: dict) -> None:
    d, e, o = res["decode"], res["embed"], res["dispatch"]
    print(f"SmolLM2-135M decode via torch (batch 1, greedy, {res['backend']} npu):")
    print(f"  torch on npu  : {d['npu_tokens_per_s']:8.1f} tok/s ({d['npu_ms_per_token']:.1f} ms/token)")
    print(f"  torch on CPU  : {d['cpu_tokens_per_s']:8.1f} tok/s (the bound)  -> npu at {d['npu_of_cpu_bound']:.2f}x of it")
    print(f"  runtime.api   : {d['api_tokens_per_s']:8.1f} tok/s (eager launches) -> torch at {d['npu_of_api']:.2f}x of it")
    print(f"all-MiniLM-L6-v2 embeddings via sentence-transformers ({e['sentences']} sentences, batch {e['batch']}):")
    print(f"  torch on npu  : {e['npu_sentences_per_s']:8.1f} sentences/s")
    print(f"  torch on CPU  : {e['cpu_sentences_per_s']:8.1f} sentences/s (the bound) -> npu at {e['npu_of_cpu_bound']:.2f}x")
    print(f"  runtime.api   : {e['api_sentences_per_s']:8.1f} sentences/s -> torch at {e['npu_of_api']:.2f}x of it")
    print(f"dispatch: torch.add of 16 floats: npu {o['npu_us_per_op']:.1f} us/op, CPU {o['cpu_us_per_op']:.1f} us/op "
          f"(+{o['overhead_us_vs_cpu']:.1f} us); one runtime.api launch {o['api_launch_us']:.1f} us "
          f"(torch layer {o['torch_layer_us']:.1f} us)")
    fb = res["fallbacks"]
    print("CPU fallbacks while running the models: " + (", ".join(f"{k} x{v}" for k, v in sorted(fb.items()))
                                                       if fb else "none"))
    print(f"verified: {'yes' if res['verified'] else 'NO: tokens or embeddings differ, or an add computed wrong'}")
