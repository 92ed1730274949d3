"""``vnpu bench hccl``: nccl-tests-style collective benchmark, beside AllReduce baselines of the same run.

For every size (doubling from ``--min-bytes`` to ``--max-bytes``) and every ``--op``, each rank's
inputs are filled with known rank-dependent values, ``--warmup`` then ``--iters`` operators are issued
back to back on one stream per rank, and the time from the first issue to the completion of every
rank's stream, divided by ``--iters``, is reported with nccl-tests' algorithm and bus bandwidths
(busbw = algbw x 2(n-1)/n for AllReduce, x (n-1)/n for AllGather / ReduceScatter / AlltoAll, x 1 for
Broadcast / Reduce).  The outputs are then checked against numpy (``#wrong`` counts bad elements): integer
dtypes hold small integers (exact in any order); floating dtypes hold non-integer values, and a reduced
element is wrong when it is farther from the exact (float64) result than rounding allows -- ``(n - 1) u
sum|x|`` for sum, ``((1 + u)^(n - 1) - 1) |prod|`` for prod, with ``u`` the dtype's unit roundoff (bfloat16
reductions accumulate in float32 and round to bfloat16 at each step); max, min and the data movers are exact.

"size" follows nccl-tests: the bytes of the larger per-rank buffer (AllReduce/Broadcast/Reduce: the
buffer; AllGather: the receive buffer; ReduceScatter: the send buffer; AlltoAll: the whole send buffer).

Every row also carries the machine's memory-bound limit for the same operator, size and rank count,
measured in the same run (:mod:`runtime.bench.bound`: one process doing the same reductions and copies,
with one thread and with as many threads as cores), and vnpu's time as a multiple of the all-core bound.

Baselines (AllReduce, at min(--max-bytes, 64 MiB)), unless ``--no-baselines``:
  - plain Ray: N actors each holding a numpy array; each ``ray.put``s its array, one actor sums the
    arrays it gets as ObjectRefs, and every actor fetches the result back through the object store;
  - torch.distributed gloo with N spawned processes, when torch is importable (timed inside the
    processes, median of a few iterations).

Devices: ``runtime.cluster.cluster_runtime`` (the running cluster, or an embedded one sized for the
run); ``VNPU_BACKEND=local`` uses in-process devices instead.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import numpy as np

from runtime.cliargs import fail, nonneg_int, positive_int, size
from runtime.cluster import rayenv

from .common import add_plot_arg, cpu_seconds, device_pids, write_plot

OPS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce")
DTYPES = ("float32", "float16", "float64", "int8", "int32", "int64", "bfloat16")
REDOPS = ("sum", "prod", "max", "min")
#: unit roundoff of each floating dtype (round to nearest even)
UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24, "float64": 2.0 ** -53}
BASELINE_MAX = 64 << 20
_BUS_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
               "reducescatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
               "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}


def register(bench_subparsers) -> None:
    p = bench_subparsers.add_parser(
        "hccl", help="HCCL collectives (nccl-tests style) vs plain Ray and torch gloo AllReduce",
        example="vnpu bench hccl --op allreduce,allgather --devices 4 --max-bytes 64M")
    p.add_argument("--op", default="allreduce", type=_ops,
                   help=f"operator(s), comma separated: {', '.join(OPS)}")
    p.add_argument("--devices", type=positive_int, default=4, help="ranks (devices) of the communicator (default 4)")
    p.add_argument("--min-bytes", type=size, default="8", help="smallest message (e.g. 8, 64K; default 8)")
    p.add_argument("--max-bytes", type=size, default="256M",
                   help="largest message (sizes double up to it; default 256M)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="element type (default float32)")
    p.add_argument("--redop", default="sum", choices=REDOPS, help="reduction of the reducing operators (default sum)")
    p.add_argument("--iters", type=positive_int, default=None,
                   help="timed iterations per size (default 20, at least 10 for large sizes)")
    p.add_argument("--warmup", type=nonneg_int, default=None, help="untimed iterations per size (default 5, fewer "
                                                            "for large sizes)")
    p.add_argument("--algo", choices=("ring", "hd", "mesh"), default=None,
                   help="force an algorithm (default: chosen per size)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--no-baselines", action="store_true", help="skip the plain Ray and torch gloo baselines")
    p.add_argument("--no-bound", action="store_true", help="skip the memory-bound limit of each row")
    add_plot_arg(p, "bus bandwidth vs size with the memory-bound lines")
    p.set_defaults(fn=_bench_hccl)


# ------------------------------------------------------------------------------------------ helpers
def _ops(spec: str) -> list[str]:
    ops = [o.strip().lower().replace("_", "").replace("-", "") for o in spec.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise argparse.ArgumentTypeError(f"unknown operator {','.join(bad) or spec!r} (choose from {', '.join(OPS)})")
    return ops


def _sizes(lo: int, hi: int) -> list[int]:
    out, s = [], max(1, lo)
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def _storage(dtype: str) -> str:
    return "int16" if dtype == "bfloat16" else dtype


def _encode(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":        # float32 -> bfloat16, round to nearest even
        u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).view(np.int16)
    return values.astype(dtype)


def _decode(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (arr.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return arr


def _counts(op: str, size: int, n: int, isz: int) -> tuple[int, int] | None:
    """(elements of "size" as nccl-tests prints them, the HCCL count argument) or None if too small."""
    total = size // isz
    if op in ("allgather", "reducescatter", "alltoall"):
        per = total // n
        return (per * n, per) if per else None
    return (total, total) if total else None


def _values(op: str, r: int, send_n: int, redop: str, dtype: str = "float32") -> np.ndarray:
    """Rank r's known inputs: small integers for integer dtypes (exact in every order), non-integer
    values for floating ones (magnitudes within [1/8, 8], products near 1: no overflow in float16)."""
    i = np.arange(send_n, dtype=np.int64)
    if dtype not in UNIT_ROUNDOFF:
        if redop == "prod":
            return ((i + r) % 2 + 1).astype(np.float64)      # products of 1s and 2s
        return ((i * 7 + r * 3) % 11 - 5).astype(np.float64)
    t = np.sin(i * 0.7071 + r * 1.618 + 0.5)
    if redop == "prod":
        return 1.0 + 0.25 * t                                # in [0.75, 1.25]
    return np.sign(t + 1e-9) * np.exp2(3.0 * np.cos(i * 0.3183 + r * 2.718))


def _tolerance(op: str, vals: list[np.ndarray], r: int, count: int, redop: str, dtype: str) -> np.ndarray | float:
    """How far a correct result of rank r may be from the exact one (0: must be exact)."""
    u = UNIT_ROUNDOFF.get(dtype)
    if u is None or op not in ("allreduce", "reducescatter", "reduce") or redop in ("max", "min"):
        return 0.0
    n = len(vals)
    x = np.stack(vals) if op != "reducescatter" else np.stack([v[r * count:(r + 1) * count] for v in vals])
    if redop == "sum":
        return (n - 1) * u * np.abs(x).sum(0)
    return ((1 + u) ** (n - 1) - 1) * 1.001 * np.abs(np.prod(x, 0))


def _reference(op, vals, r, count, redop, root):
    n = len(vals)
    red = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[redop]
    if op == "allreduce":
        return red(np.stack(vals), axis=0)
    if op == "allgather":
        return np.concatenate(vals)
    if op == "reducescatter":
        return red(np.stack([v[r * count:(r + 1) * count] for v in vals]), axis=0)
    if op == "alltoall":
        return np.concatenate([vals[q][r * count:(r + 1) * count] for q in range(n)])
    if op == "broadcast":
        return vals[root]
    if op == "reduce":
        return red(np.stack(vals), axis=0) if r == root else None
    raise ValueError(op)


def _fmt_dtype(dtype: str) -> str:
    return {"float32": "float", "float16": "half", "float64": "double", "bfloat16": "bfloat16"}.get(dtype, dtype)


# ------------------------------------------------------------------------------------------ vnpu
class _Case:
    """Buffers of one (op, size) on every rank."""

    def __init__(self, comms, streams, op, count, dtype, redop, root=0):
        self.comms, self.streams, self.op, self.count = comms, streams, op, count
        self.dtype, self.redop, self.root = dtype, redop, root
        n = len(comms)
        send_n = count * n if op in ("reducescatter", "alltoall") else count
        recv_n = count * n if op in ("allgather", "alltoall") else count
        sdt = _storage(dtype)
        # the values the buffers hold (inputs rounded to the dtype): the reference starts from those
        self.vals = [_decode(_encode(_values(op, r, send_n, redop, dtype), dtype), dtype).astype(np.float64)
                     for r in range(n)]
        self.send, self.recv = [], []
        for r, c in enumerate(comms):
            d = c.device
            s = d.from_numpy(_encode(self.vals[r], dtype))
            self.send.append(s)
            if op == "broadcast":
                self.recv.append(s)
            else:
                t = d.empty((recv_n,), sdt)
                self.recv.append(t)
        self.send_ptrs = [t.ptr for t in self.send]
        self.recv_ptrs = [t.ptr for t in self.recv]

    def issue(self) -> None:
        for r, c in enumerate(self.comms):
            c.collective(self.op, self.send_ptrs[r], self.recv_ptrs[r], self.count, self.dtype, self.redop,
                         root=self.root, stream=self.streams[r])

    def wrong(self) -> int:
        bad = 0
        for r in range(len(self.comms)):
            want = _reference(self.op, self.vals, r, self.count, self.redop, self.root)
            if want is None:
                continue
            got = _decode(self.recv[r].numpy(self.streams[r]), self.dtype).astype(np.float64)
            if got.shape != want.shape:
                bad += int(want.size)
                continue
            tol = _tolerance(self.op, self.vals, r, self.count, self.redop, self.dtype)
            with np.errstate(invalid="ignore"):
                bad += int(np.count_nonzero(~(np.abs(got - want) <= tol)))     # NaN counts as wrong
        return bad

    def free(self) -> None:
        for t in {id(t): t for t in self.send + self.recv}.values():
            with contextlib.suppress(Exception):
                t.free()


def _auto_iters(size: int, iters: int | None, warmup: int | None) -> tuple[int, int]:
    budget = 2 << 30                                   # bytes moved per size in the timed loop, about
    it = iters if iters is not None else max(10, min(20, budget // max(size, 1)))
    wu = warmup if warmup is not None else max(1, min(5, (budget // 4) // max(size, 1)))
    return it, wu


def _time_case(case: _Case, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        case.issue()
    for s in case.streams:
        s.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        case.issue()
    for s in case.streams:
        s.synchronize()
    return (time.perf_counter() - t0) / iters


def _measure(comms, streams, op, size, dtype, redop, iters, warmup, bound: bool = False,
             pids: list[int] | None = None) -> dict | None:
    n = len(comms)
    cnt = _counts(op, size, n, _itemsize(dtype))
    if cnt is None:
        return None
    elements, count = cnt
    case = _Case(comms, streams, op, count, dtype, redop)
    bd = None
    try:
        it, wu = _auto_iters(size, iters, warmup)
        if not bound:
            t = _time_case(case, it, wu)
        else:
            # interleaved with the bound, round by round, so that both see the same machine (a shared
            # machine's load changes within seconds): medians of the rounds
            bd = _Bound(op, n, count, dtype, redop)
            times, cpus = [], []
            for k in range(BOUND_ROUNDS):        # each round a full measurement (as many back-to-back
                w = wu if k == 0 else 1          # operators as without the bound)
                c0 = cpu_seconds(pids) if pids else 0.0
                times.append(_time_case(case, it, w))
                if pids:                         # what the device processes spent per operator (CPU time:
                    cpus.append((cpu_seconds(pids) - c0) / (it + w))   # less disturbed by load)
                bd.round()
            t = statistics.median(times)
        wrong = case.wrong()
    finally:
        case.free()
        if bd is not None:
            bd.close()
    nbytes = elements * _itemsize(dtype)
    algbw = nbytes / t / 1e9
    row = {"op": op, "size": nbytes, "count": elements, "type": dtype,
           "redop": redop if op in ("allreduce", "reducescatter", "reduce") else "none",
           "root": 0 if op in ("broadcast", "reduce") else -1, "time_us": t * 1e6, "algbw": algbw,
           "busbw": algbw * _BUS_FACTOR[op](n), "wrong": wrong, "iters": it}
    if bd is not None:
        row["bound"] = bd.result()
        if cpus:
            row["cpu_us"] = statistics.median(cpus) * 1e6
    return row


#: rounds of (vnpu, bound 1 thread, bound all cores) per row when the bound is measured
BOUND_ROUNDS = 3


class _Bound:
    """The memory-bound limit of the same operator (this process; the devices are idle meanwhile),
    measured one round at a time."""

    def __init__(self, op, n, count, dtype, redop):
        from .bound import Bound, cores
        self.skipped = "bfloat16 has no native numpy type" if dtype == "bfloat16" else None
        self.threads = cores()
        self.b = None if self.skipped else Bound(op, n, count, dtype, redop)
        self.t1: list[float] = []
        self.tn: list[float] = []
        self.cpu1: list[float] = []

    def round(self) -> None:
        if self.b is not None:
            c0 = time.thread_time()
            self.t1.append(self.b.time(1, iters=3))            # 1 warm-up + 3 runs on this thread
            self.cpu1.append((time.thread_time() - c0) / 4)
            self.tn.append(self.b.time(self.threads, iters=3) if self.threads > 1 else self.t1[-1])

    def result(self) -> dict:
        if self.b is None:
            return {"skipped": self.skipped}
        return {"t1_us": statistics.median(self.t1) * 1e6, "tn_us": statistics.median(self.tn) * 1e6,
                "cpu1_us": statistics.median(self.cpu1) * 1e6, "threads": self.threads}

    def close(self) -> None:
        if self.b is not None:
            self.b.close()


@contextlib.contextmanager
def _runtime(devices: int, arena: int):
    """The devices: a cluster (``cluster_runtime``) or, with VNPU_BACKEND=local, in-process ones."""
    kind = os.environ.get("VNPU_BACKEND", "cluster")
    if kind == "local":
        from devices.device import DeviceConfig
        from runtime.api import Runtime, set_runtime
        from runtime.backend import LocalBackend
        rt = Runtime(LocalBackend(devices, DeviceConfig(arena_bytes=arena)))
        old = set_runtime(rt)
        try:
            yield rt, "local"
        finally:
            set_runtime(old)
            rt.close()
    else:
        from runtime.cluster import ClusterSpec, cluster_runtime
        with cluster_runtime(devices=devices, spec=ClusterSpec(devices=devices, arena_bytes=arena)) as rt:
            yield rt, rt.backend.name


def _arena_for(max_bytes: int) -> int:
    """~4x the largest buffer, rounded up to a power of two (at least 64 MiB)."""
    need = max(64 << 20, 4 * max_bytes)
    return 1 << (need - 1).bit_length()


# ------------------------------------------------------------------------------------------ baselines
def _ray_gather_bcast(n: int, nbytes: int, iters: int = 5) -> dict:
    """AllReduce with plain Ray actors: ray.put of every array, one actor sums what it gets as
    ObjectRefs, every actor fetches the sum back through the object store."""
    rayenv.prepare()
    import ray
    from runtime.cluster.discovery import LOOPBACK
    owns = not ray.is_initialized()
    if owns:
        rayenv.ensure_token()
        ray.init(address="local", _node_ip_address=LOOPBACK, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 num_cpus=max(2, os.cpu_count() or 2))

    @ray.remote(num_cpus=0)
    class Holder:
        def __init__(self, rank: int, count: int):
            self.a = np.full(count, rank + 1, np.float32)
            self.result = np.empty_like(self.a)

        def share(self):
            return [ray.put(self.a)]                   # a list: the caller gets the ref, not the data

        def reduce(self, refs):
            acc = self.a.copy()
            for x in ray.get(refs):
                acc += x
            return acc

        def receive(self, total):
            np.copyto(self.result, total)
            return float(self.result[0]), float(self.result[-1])

    count = nbytes // 4
    actors = [Holder.remote(r, count) for r in range(n)]
    try:
        ray.get([a.share.remote() for a in actors])    # actors are up

        def once():
            refs = [lst[0] for lst in ray.get([a.share.remote() for a in actors[1:]])]
            total = actors[0].reduce.remote(refs)
            return ray.get([a.receive.remote(total) for a in actors])
        once()
        times, ok = [], True
        for _ in range(iters):
            t0 = time.perf_counter()
            res = once()
            times.append(time.perf_counter() - t0)
            ok = ok and all(v == (n * (n + 1) / 2, n * (n + 1) / 2) for v in res)
        t = statistics.median(times)
    finally:
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        if owns:
            ray.shutdown()
    algbw = nbytes / t / 1e9
    return {"time_us": t * 1e6, "algbw": algbw, "busbw": algbw * _BUS_FACTOR["allreduce"](n), "correct": ok,
            "iters": iters}


def _gloo_worker(rank: int, n: int, port: int, count: int, iters: int, out) -> None:   # pragma: no cover
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    try:
        t = torch.full((count,), float(rank + 1), dtype=torch.float32)
        dist.all_reduce(t)
        dist.barrier()
        times = []
        for _ in range(iters):
            t.fill_(float(rank + 1))
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        ok = bool(t[0].item() == n * (n + 1) / 2)
        # the collective ends when the slowest rank is done: report every rank's times
        out.put((rank, times, ok))
    finally:
        dist.destroy_process_group()


def _torch_gloo(n: int, nbytes: int, iters: int = 5) -> dict:
    try:
        import torch  # noqa: F401
        import torch.multiprocessing as mp
    except ImportError:
        return {"skipped": "torch is not installed"}
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    procs = [ctx.Process(target=_gloo_worker, args=(r, n, port, nbytes // 4, iters, q), daemon=True)
             for r in range(n)]
    for p in procs:
        p.start()
    try:
        res = []
        deadline = time.monotonic() + 300
        while len(res) < n and time.monotonic() < deadline:
            if not q.empty():
                res.append(q.get())
            elif not any(p.is_alive() for p in procs) and q.empty():
                break
            else:
                procs[0].join(0.05)
        if len(res) < n:
            return {"skipped": "gloo workers failed"}
        per_iter = [max(r[1][i] for r in res) for i in range(iters)]
        t = statistics.median(per_iter)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
    algbw = nbytes / t / 1e9
    return {"time_us": t * 1e6, "algbw": algbw, "busbw": algbw * _BUS_FACTOR["allreduce"](n),
            "correct": all(r[2] for r in res), "iters": iters}


# ------------------------------------------------------------------------------------------ command
def _bench_hccl(a) -> int:
    from runtime import hccl
    ops = a.op                                       # checked by argparse, like the sizes (runtime.cliargs)
    lo, hi = a.min_bytes, a.max_bytes
    if hi < lo:
        fail(f"argument --max-bytes: {hi} is below --min-bytes {lo}", "vnpu bench hccl")
    sizes = _sizes(lo, hi)
    base_size = min(hi, BASELINE_MAX)
    rows: list[dict] = []
    baselines: dict = {}
    out = sys.stdout
    with _runtime(a.devices, _arena_for(hi)) as (rt, backend):
        devs = rt.devices()[:a.devices]
        if len(devs) < a.devices:
            fail(f"argument --devices: {a.devices} devices wanted, {len(devs)} available", "vnpu bench hccl")
        total = devs[0].mem_info()[1]
        sizes, base_size = _fitting_sizes(sizes, base_size, total)
        comms = hccl.comm_init_all(devs, hccl.CommOptions(algo=a.algo))
        streams = [d.stream() for d in devs]
        from .bound import cores
        ncores = cores()
        pids = device_pids(rt)
        try:
            if not a.json:
                print(f"# vnpu bench hccl: {', '.join(ops)} on {len(devs)} devices ({backend} backend, "
                      f"{total >> 20} MiB HBM each), {a.dtype}, redop {a.redop}, algo {a.algo or 'auto'}", file=out)
            for op in ops:
                if not a.json:
                    _print_op_header(op, ncores, a.no_bound, out)
                for size in sizes:
                    row = _measure(comms, streams, op, size, a.dtype, a.redop, a.iters, a.warmup,
                                   bound=not a.no_bound, pids=pids)
                    if row is None:
                        continue
                    rows.append(row)
                    if not a.json:
                        print(f" {row['size']:>11} {row['count']:>12} {_fmt_dtype(row['type']):>8} "
                              f"{row['redop']:>6} {row['root']:>5} {row['time_us']:>10.1f} {row['algbw']:>8.3f} "
                              f"{row['busbw']:>8.3f} {row['wrong']:>7}{_fmt_bound(row)}", file=out, flush=True)
            if not a.no_baselines and base_size:
                baselines = _vnpu_baseline(comms, streams, rows, base_size, pids)
        finally:
            for c in comms:
                c.destroy()
            for s in streams:
                with contextlib.suppress(Exception):
                    s.destroy()
        if baselines:
            # inside the runtime's context: a cluster runtime's Ray session is reused (and stays up)
            baselines["ray_gather_bcast"] = _ray_gather_bcast(len(devs), base_size)
    if baselines:
        baselines["torch_gloo"] = _torch_gloo(len(devs), base_size)
        v = baselines["vnpu"]["time_us"]
        for k in ("ray_gather_bcast", "torch_gloo"):
            b = baselines[k]
            if "time_us" in b:
                b["speedup"] = b["time_us"] / v             # baseline time / vnpu time (= vnpu/baseline busbw)
    return _report(a, backend, rows, baselines, len(devs), out)


def _fitting_sizes(sizes: list[int], base_size: int, total: int) -> tuple[list[int], int]:
    """The sizes (and baseline size) whose send + recv + scratch buffers fit a device's ``total`` bytes of
    HBM; a note on stderr when some do not."""
    fit = [z for z in sizes if 3 * z <= total]       # send + recv + scratch of the largest buffer
    if len(fit) < len(sizes):
        print(f"# note: sizes above {fit[-1] if fit else 0} B skipped: {total >> 20} MiB of HBM per device "
              f"(a running cluster's devices keep their size)", file=sys.stderr)
        sizes = fit
        base_size = min(base_size, fit[-1]) if fit else 0
    return sizes, base_size


def _print_op_header(op: str, ncores: int, no_bound: bool, out) -> None:
    """The nccl-tests-style column header of one collective's table (with the bound's columns unless
    ``no_bound``)."""
    bh = (f" {'bound 1T':>10} {'bound ' + str(ncores) + 'T':>10} {'x bound':>8} {'dev cpu':>9} "
          f"{'x 1T cpu':>8}", f" {'(us)':>10} {'(us)':>10} {'':>8} {'(us/op)':>9} {'':>8}") \
        if not no_bound else ("", "")
    print(f"#\n# {op}\n#{'size':>11} {'count':>12} {'type':>8} {'redop':>6} {'root':>5} "
          f"{'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}{bh[0]}\n"
          f"#{'(B)':>11} {'(elements)':>12}"
          f" {'':>8} {'':>6} {'':>5} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}{bh[1]}",
          file=out, flush=True)


def _vnpu_baseline(comms, streams, rows: list[dict], base_size: int, pids) -> dict:
    """vnpu's own baseline row: a float32 sum allreduce of ``base_size`` bytes with its bound (the table's
    row when it has one, else measured now)."""
    ref = next((r for r in rows if r["op"] == "allreduce" and r["size"] == base_size
                and r["type"] == "float32" and r["redop"] == "sum"), None)
    if ref is None:
        ref = _measure(comms, streams, "allreduce", base_size, "float32", "sum", None, None, bound=True,
                       pids=pids)
    if "bound" not in ref:
        ref = _measure(comms, streams, "allreduce", base_size, "float32", "sum", None, None, bound=True,
                       pids=pids)
    return {"op": "allreduce", "size": base_size, "type": "float32", "redop": "sum",
            "vnpu": {k: ref[k] for k in ("time_us", "algbw", "busbw", "wrong", "cpu_us") if k in ref},
            "bound": ref["bound"]}


def _report(a, backend: str, rows: list[dict], baselines: dict, ndev: int, out) -> int:
    """Print the run's JSON document or its text totals (and baselines): exit status 0 when some row ran
    and no value was out of bounds, else 1."""
    avg = statistics.mean(r["busbw"] for r in rows) if rows else 0.0
    wrong = sum(r["wrong"] for r in rows)
    keep = ("op", "size", "count", "type", "redop", "root", "time_us", "algbw", "busbw", "wrong", "bound", "cpu_us")
    doc = {"devices": a.devices, "backend": backend, "algo": a.algo or "auto",
           "rows": [{k: r[k] for k in keep if k in r} for r in rows], "avg_busbw": avg,
           "out_of_bounds": wrong, "verified": bool(rows) and not wrong, "baselines": baselines}
    if a.json:
        print(json.dumps(doc))
    else:
        print(f"# Out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}", file=out)
        print(f"# Avg bus bandwidth    : {avg:.4f}", file=out)
        if baselines:
            _print_baselines(baselines, ndev, out)
    return write_plot(a, "hccl", doc) or (0 if rows and not wrong else 1)


def _fmt_bound(row: dict) -> str:
    b = row.get("bound")
    if b is None:
        return ""
    if "skipped" in b:
        return f" {'-':>10} {'-':>10} {'-':>8} {'-':>9} {'-':>8}"
    cpu = (f" {row['cpu_us']:>9.1f} {row['cpu_us'] / b['cpu1_us']:>7.2f}x" if "cpu_us" in row and b.get("cpu1_us")
           else f" {'-':>9} {'-':>8}")
    return f" {b['t1_us']:>10.1f} {b['tn_us']:>10.1f} {row['time_us'] / b['tn_us']:>7.2f}x{cpu}"


def _print_baselines(b: dict, n: int, out) -> None:
    size = b["size"]
    print(f"#\n# AllReduce {size >> 20 if size >= 1 << 20 else size}{' MiB' if size >= 1 << 20 else ' B'} float32 "
          f"sum on {n} ranks, side by side:", file=out)
    print(f"#{'':<36} {'time (us)':>12} {'busbw (GB/s)':>13} {'vnpu speedup':>13}", file=out)
    v = b["vnpu"]
    print(f"# {'vnpu HCCL':<35} {v['time_us']:>12.1f} {v['busbw']:>13.3f} {'':>13}", file=out)
    bd = b.get("bound") or {}
    if "t1_us" in bd:
        factor = _BUS_FACTOR["allreduce"](n) * size / 1e3
        for key, name in (("tn_us", f"memory bound, {bd['threads']} threads (all cores)"),
                          ("t1_us", "memory bound, 1 thread")):
            t = bd[key]
            print(f"# {name:<35} {t:>12.1f} {factor / t:>13.3f} {t / v['time_us']:>12.2f}x  (vnpu at "
                  f"{v['time_us'] / t:.2f}x the bound's time)", file=out)
        if "cpu_us" in v and bd.get("cpu1_us"):
            print(f"# CPU time per operator: the device processes {v['cpu_us']:.0f} us, the 1-thread bound "
                  f"{bd['cpu1_us']:.0f} us ({v['cpu_us'] / bd['cpu1_us']:.2f}x the work)", file=out)
    names = {"ray_gather_bcast": "plain Ray (gather-to-one + bcast)", "torch_gloo": "torch.distributed gloo"}
    for k, name in names.items():
        r = b.get(k, {})
        if "time_us" in r:
            ok = "" if r.get("correct", True) else "  (WRONG RESULT)"
            print(f"# {name:<35} {r['time_us']:>12.1f} {r['busbw']:>13.3f} {r['speedup']:>12.2f}x{ok}", file=out)
        else:
            print(f"# {name:<35} skipped: {r.get('skipped', 'not run')}", file=out)
