"""``vnpu bench memory``: the caching pool against the driver, measured in the same run.

1. **Allocation**: allocate + free pairs through the pool (``Device.empty`` / ``Tensor.free``) against
   raw driver calls (``Device.malloc`` / ``free``, what ``acl.rt.malloc`` does) on the same device, on
   the cluster backend (a device actor over gRPC: RPCs counted with the driver client's counter) and
   in-process.
2. **Fragmenting workload**: a decode service (long-lived weights and per-request KV caches,
   short-lived activations whose size follows the running batch, requests of varying batch sizes
   coming and going) on identical in-process devices, with the lifetime hint, without it (one pool,
   best-fit placement: the plain allocator), and with the hint plus one ``defragment()`` and retry
   when an allocation fails: peak reserved memory, failed requests and steps, arena fragmentation.
3. **Defragmentation**: an arena of 12 MiB tensors with every other one freed is compacted; the
   copy throughput against ``np.copyto`` of the same block size (the machine's memcpy bound, measured
   here) and the pause, in-process and on the device actor.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import numpy as np

from runtime.cliargs import int_in, nonneg_int, positive_int

from .common import fmt_size, median_time

MiB = 1 << 20
ALLOC_SIZES = (4 << 10, 256 << 10, 4 << 20)


def register(bs) -> None:
    m = bs.add_parser("memory", help="caching pool vs driver malloc, fragmentation with/without the lifetime "
                                     "hint, defragmentation throughput vs memcpy",
                      example="vnpu bench memory --pairs 2000 --seeds 5")
    m.add_argument("--pairs", type=positive_int, default=2000, help="allocate+free pairs through the pool per size")
    m.add_argument("--raw-pairs", type=positive_int, default=300, help="pairs through the driver per size")
    m.add_argument("--steps", type=positive_int, default=600, help="decode steps of the fragmenting workload")
    m.add_argument("--defrag-tensors", type=int_in(2, 80), default=24,
                   help="12 MiB tensors in the defragmentation run (2-80: they fit the 1 GiB arena)")
    m.add_argument("--seed", type=nonneg_int, default=0, help="first seed of the workload runs")
    m.add_argument("--seeds", type=positive_int, default=5, help="workload runs per variant (seeds seed, seed+1, ...)")
    m.add_argument("--json", action="store_true", help="print the results as JSON")
    m.set_defaults(fn=run)


# ---------------------------------------------------------------------------------------------- 1. allocation
def _pairs_per_s(fn, n: int) -> float:
    fn(min(n, 50))                                  # warm up (the pool's first segment, caches)
    return median_time(lambda: fn(n), 3) / n


def alloc_rows(dev, backend: str, pairs: int, raw_pairs: int, holes: int = 0) -> list[dict]:
    """µs per allocate+free pair (and RPCs per 1000 pairs when the handle counts them).  ``holes``: first
    leave that many free ranges in the arena (raw 64 KiB allocations, every other one freed), as a heap
    that has run for a while has: the driver's best fit walks them, the pool does not."""
    rows = []
    counter = getattr(dev.handle, "rpc_count", None) is not None
    kept = []
    if holes:
        ptrs = [dev.malloc(64 << 10) for _ in range(2 * holes)]
        for p in ptrs[0::2]:
            dev.free(p)
        kept = ptrs[1::2]

    def pool_loop(n, size):
        pool, alloc = dev.pool, dev.alloc
        for _ in range(n):
            pool.free(alloc(size))

    def tensor_loop(n, size):
        for _ in range(n):
            dev.empty((size,), "uint8").free()

    def raw_loop(n, size):
        for _ in range(n):
            dev.free(dev.malloc(size))

    try:
        for size in ALLOC_SIZES:
            row = {"backend": backend, "bytes": size, "arena_holes": holes}
            for name, loop, n in (("pool", pool_loop, pairs), ("tensor", tensor_loop, pairs),
                                  ("driver", raw_loop, raw_pairs)):
                r0 = dev.handle.rpc_count if counter else 0
                row[f"{name}_us"] = _pairs_per_s(lambda k: loop(k, size), n) * 1e6
                if counter:
                    done = min(n, 50) + 3 * n
                    row[f"{name}_rpcs_per_1000"] = (dev.handle.rpc_count - r0) * 1000 / done
            row["speedup"] = row["driver_us"] / row["pool_us"]
            rows.append(row)
    finally:
        for p in kept:
            dev.free(p)
    return rows


# ---------------------------------------------------------------------------------------------- 2. workload
@dataclass(frozen=True)
class ServiceSpec:
    """A decode service on one device (sizes in bytes).  Weights are loaded first; the KV cache is a
    block pool that grows in chunks when the running sequences need more and is never shrunk (vLLM's
    block manager, grown on demand); every step allocates the running batch's activations and frees
    them.  Weights and KV chunks are long-lived, activations short-lived."""
    arena: int = 192 * MiB
    weights: tuple[int, ...] = (8 * MiB,) * 4
    batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    kv_per_seq: int = 1 * MiB              #: KV cache a running sequence holds
    kv_chunk: int = 4 * MiB                #: the KV block pool grows by this much at a time
    act_per_seq: tuple[int, ...] = (256 << 10, 1 << 20)   #: a step's activations per running sequence
    max_active: int = 6                    #: sized so that peak demand fits the arena: failures are fragmentation
    admit_p: float = 0.3
    length: tuple[int, int] = (8, 64)      #: decode steps per request


def decode_service(conf: str, spec: ServiceSpec, steps: int, seed: int, defrag_on_failure: bool = False) -> dict:
    """Run the service on a fresh in-process device with pool settings ``conf``."""
    from devices.device import Device, DeviceConfig
    from devices.errors import MemoryAllocationError
    from runtime.memory import CachingAllocator, HandleAllocator, HandleStreamOrder, parse

    dev = Device(DeviceConfig(device_id=900, arena_bytes=spec.arena))
    pool = CachingAllocator(HandleAllocator(dev), HandleStreamOrder(dev), parse(conf))
    s = dev.default_stream
    rng = np.random.default_rng(seed)
    out = {"requests": 0, "failed_requests": 0, "steps": 0, "failed_steps": 0, "defragmentations": 0,
           "bytes_moved": 0, "fragmentation_failures": 0}
    frag_max = 0.0

    def classify(n) -> None:
        # memory not in use (free in the arena, or free inside the pool's segments) covered the request:
        # the failure is fragmentation, not capacity ("the dashboard shows headroom")
        if dev.arena.stats().free + pool.memory_stats()["inactive_bytes"] >= pool.round_size(n):
            out["fragmentation_failures"] += 1

    def alloc(n, lifetime):
        try:
            return pool.malloc(n, s, lifetime)
        except MemoryAllocationError:
            if not defrag_on_failure:
                classify(n)
                raise
        rep = pool.defragment()
        out["defragmentations"] += 1
        out["bytes_moved"] += rep.bytes_moved
        try:
            return pool.malloc(n, s, lifetime)
        except MemoryAllocationError:
            classify(n)
            raise

    try:
        for w in spec.weights:
            pool.malloc(w, s, "long")
        kv_chunks: list = []
        active: list[list] = []                      # [steps left, batch]
        for _ in range(steps):
            if len(active) < spec.max_active and rng.random() < spec.admit_p:
                b = int(rng.choice(spec.batches))
                out["requests"] += 1
                need = (sum(r[1] for r in active) + b) * spec.kv_per_seq
                try:
                    while len(kv_chunks) * spec.kv_chunk < need:
                        kv_chunks.append(alloc(spec.kv_chunk, "long"))
                    active.append([int(rng.integers(*spec.length)), b])
                except MemoryAllocationError:
                    out["failed_requests"] += 1
            running = sum(r[1] for r in active)
            if running:
                out["steps"] += 1
                acts = []
                try:
                    for per in spec.act_per_seq:
                        acts.append(alloc(running * per + int(rng.integers(0, 64)) * 512, "short"))
                except MemoryAllocationError:
                    out["failed_steps"] += 1
                for h in acts:
                    pool.free(h)
            for r in list(active):
                r[0] -= 1
                if r[0] <= 0:
                    active.remove(r)
            frag_max = max(frag_max, dev.arena.stats().fragmentation)
        st = pool.memory_stats()
        out.update(peak_reserved=st["reserved_bytes.all.peak"], peak_allocated=st["allocated_bytes.all.peak"],
                   kv_bytes=len(kv_chunks) * spec.kv_chunk, num_alloc_retries=st["num_alloc_retries"],
                   num_ooms=st["num_ooms"], num_device_alloc=st["num_device_alloc"],
                   max_arena_fragmentation=frag_max, final_arena_fragmentation=dev.arena.stats().fragmentation)
        return out
    finally:
        dev.close()


#: the two services of the workload: one activation buffer per step (a captured step's workspace), or
#: two differently sized activation tensors per step
SERVICES = {"one step buffer": ServiceSpec(act_per_seq=(5 << 18,)),
            "two step tensors": ServiceSpec(act_per_seq=(256 << 10, 1 << 20))}
#: allocator variants: (VNPU_ALLOC_CONF, defragment and retry once when an allocation fails)
VARIANTS = {"no hint (one pool, best fit)": ("lifetime_pools:False", False),
            "lifetime hint": ("", False),
            "lifetime hint + defragment on failure": ("", True)}


def workload_rows(steps: int, seeds: tuple[int, ...]) -> list[dict]:
    """Every service under every variant, summed over ``seeds`` (peaks: the maximum)."""
    rows = []
    for sname, spec in SERVICES.items():
        for vname, (conf, dfr) in VARIANTS.items():
            agg: dict = {"service": sname, "variant": vname, "arena": spec.arena, "seeds": len(seeds)}
            for seed in seeds:
                r = decode_service(conf, spec, steps, seed, dfr)
                for k in ("requests", "failed_requests", "steps", "failed_steps", "defragmentations", "bytes_moved",
                          "fragmentation_failures", "num_alloc_retries", "num_ooms", "num_device_alloc"):
                    agg[k] = agg.get(k, 0) + r[k]
                for k in ("peak_reserved", "peak_allocated", "max_arena_fragmentation"):
                    agg[k] = max(agg.get(k, 0), r[k])
            rows.append(agg)
    return rows


# ---------------------------------------------------------------------------------------------- 3. defragmentation
def defrag_median(dev, n: int, runs: int = 3) -> dict:
    """The run with the median copy throughput of ``runs`` (the machine is shared: one run can be unlucky)."""
    rs = sorted((fragment_and_defragment(dev, n) for _ in range(runs)), key=lambda r: r["copy_gbs"])
    r = dict(rs[len(rs) // 2])
    r["verified"] = all(x["verified"] for x in rs)
    r["runs"] = runs
    return r


def fragment_and_defragment(dev, n: int) -> dict:
    """``n`` 12 MiB tensors, every other one freed, then ``dev.defragment()`` (a runtime.api Device)."""
    size = 12 * MiB
    dev.empty_cache()
    ts = [dev.empty((size,), "uint8") for _ in range(n)]
    data = np.arange(size, dtype=np.uint8)
    for t in ts:                   # every page touched once, as in a service that has been running
        t.copy_from(data)
    for t in ts[0::2]:
        t.free()
    rep = dev.defragment()
    ok = all(np.array_equal(t.numpy(), data) for t in ts[1::2][:2])
    for t in ts[1::2]:
        t.free()
    dev.empty_cache()
    return {"bytes_moved": rep.bytes_moved, "blocks_moved": rep.blocks_moved, "copy_gbs": rep.copy_gbs,
            "effective_gbs": rep.bytes_moved / rep.pause_s / 1e9 if rep.pause_s else 0.0,
            "pause_ms": rep.pause_s * 1e3, "arena_fragmentation_before": rep.arena_fragmentation_before,
            "arena_fragmentation_after": rep.arena_fragmentation_after, "verified": ok}


def memcpy_bound(size: int = 12 * MiB, reps: int = 15) -> float:
    """The machine's copy bound for one block: the best of ``reps`` ``np.copyto`` (warm buffers)."""
    a = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return size / best / 1e9


# ---------------------------------------------------------------------------------------------- the command
def run(a) -> int:
    from runtime.api import Runtime
    from runtime.backend import LocalBackend
    from runtime.cluster import cluster_runtime
    from devices.device import DeviceConfig

    t0 = time.perf_counter()
    res: dict = {"machine": {"cpus": os.cpu_count()}}
    bound = memcpy_bound()
    res["memcpy_gbs"] = bound
    local = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30)))
    try:
        ldev = local.device(0)
        alloc = alloc_rows(ldev, "in-process", a.pairs, a.raw_pairs)
        alloc += alloc_rows(ldev, "in-process", a.pairs, a.raw_pairs, holes=1000)
        res["defrag_in_process"] = defrag_median(ldev, a.defrag_tensors)
    finally:
        local.close()
    with cluster_runtime(devices=1) as rt:
        cdev = rt.device(0)
        alloc += alloc_rows(cdev, "cluster (gRPC)", a.pairs, a.raw_pairs)
        res["defrag_cluster"] = defrag_median(cdev, a.defrag_tensors)
    res["alloc"] = alloc
    res["workload"] = workload_rows(a.steps, tuple(range(a.seed, a.seed + a.seeds)))
    for k in ("defrag_in_process", "defrag_cluster"):
        res[k]["vs_memcpy"] = res[k]["copy_gbs"] / bound
    res["wall_s"] = time.perf_counter() - t0
    # what is checked: every moved tensor's contents after both defragmentations
    res["verified"] = bool(res["defrag_in_process"]["verified"] and res["defrag_cluster"]["verified"])
    print(json.dumps(res) if a.json else render(res))
    return 0 if res["verified"] else 1


def render(res: dict) -> str:
    out = ["allocate+free pairs (pool: Device.alloc + pool.free; tensor: Device.empty + Tensor.free; driver: "
           "Device.malloc + free, as acl.rt.malloc)"]
    out.append(f"{'backend':<16} {'holes':>6} {'size':>8} {'pool us':>9} {'tensor us':>10} {'driver us':>10} "
               f"{'speedup':>8} {'pool RPC/1k':>12} {'driver RPC/1k':>14}")
    for r in res["alloc"]:
        out.append(f"{r['backend']:<16} {r['arena_holes']:6d} {fmt_size(r['bytes']):>8} {r['pool_us']:9.2f} "
                   f"{r['tensor_us']:10.2f} {r['driver_us']:10.2f} "
                   f"{r['speedup']:7.1f}x {r.get('pool_rpcs_per_1000', float('nan')):12.2f} "
                   f"{r.get('driver_rpcs_per_1000', float('nan')):14.1f}")
    out.append("")
    out.append("decode service (long-lived weights + growing KV pool, short-lived activations, varying batches); "
               "failures summed over the seeds")
    out.append(f"{'service':<17} {'variant':<38} {'failed req':>10} {'failed steps':>14} {'of which frag.':>14} "
               f"{'peak reserved':>14} {'peak alloc':>11} {'defrags':>8}")
    for r in res["workload"]:
        out.append(f"{r['service']:<17} {r['variant']:<38} {r['failed_requests']:4d}/{r['requests']:<5d} "
                   f"{r['failed_steps']:6d}/{r['steps']:<7d} {r['fragmentation_failures']:14d} "
                   f"{r['peak_reserved'] / MiB:10.1f} MiB {r['peak_allocated'] / MiB:7.1f} MiB {r['defragmentations']:8d}")
    out.append("  (of which frag.: failures although the memory not in use -- free in the arena or inside the pool's "
               "segments -- covered the request)")
    out.append("")
    out.append(f"defragmentation (12 MiB tensors, every other freed; median of 3 runs); np.copyto of 12 MiB "
               f"(the memcpy bound, best of 15) {res['memcpy_gbs']:.2f} GB/s")
    for k, label in (("defrag_in_process", "in-process"), ("defrag_cluster", "cluster (gRPC)")):
        d = res[k]
        out.append(f"  {label:<15} moved {fmt_size(d['bytes_moved'])} in {d['blocks_moved']} blocks: copies "
                   f"{d['copy_gbs']:.2f} GB/s ({d['vs_memcpy']:.0%} of memcpy), pause {d['pause_ms']:.1f} ms, "
                   f"fragmentation {d['arena_fragmentation_before']:.3f} -> {d['arena_fragmentation_after']:.3f}"
                   f"{'' if d['verified'] else '  CONTENTS WRONG'}")
    return "\n".join(out)
