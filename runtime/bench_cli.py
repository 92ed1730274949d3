"""``vnpu bench ...``: benchmarks that print vnpu's figures beside baselines measured in the same run."""
from __future__ import annotations

import json
import statistics
import time

import numpy as np


def register(sub) -> None:
    b = sub.add_parser("bench", help="benchmarks against baselines measured in the same run")
    bs = b.add_subparsers(dest="bench", required=True)
    la = bs.add_parser("launch", help="amortized cost per kernel launch vs a Ray actor call and a gRPC call")
    la.add_argument("--launches", type=int, default=1000)
    la.add_argument("--repeat", type=int, default=5)
    la.add_argument("--json", action="store_true")
    la.set_defaults(fn=_bench_launch)
    mc = bs.add_parser("memcpy", help="H2D/D2H bandwidth vs np.copyto")
    mc.add_argument("--min-bytes", default="1M")
    mc.add_argument("--max-bytes", default="256M")
    mc.add_argument("--grpc-max-bytes", default="64M", help="largest size also measured over the gRPC path")
    mc.add_argument("--json", action="store_true")
    mc.set_defaults(fn=_bench_memcpy)
    for mod in ("runtime.bench_hccl", "runtime.bench_infer"):
        try:
            __import__(mod, fromlist=["register"]).register(bs)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


def parse_size(s: str | int) -> int:
    if isinstance(s, int):
        return s
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ----------------------------------------------------------------------------------------- launch
def _launch_loop(dev, n: int):
    from .api import Tensor  # noqa: F401
    a = dev.from_numpy(np.ones(16, np.float32))
    out = dev.empty((16,), "float32")
    s = dev.stream()

    def run():
        for _ in range(n):
            s.launch("add", [a, a], [out], block_dim=1)
        s.synchronize()
    run()  # warm up
    return run, s, (a, out)


def _ray_baselines(n: int) -> dict:
    import ray

    @ray.remote(num_cpus=0)
    class Echo:
        def ping(self, x=None):
            return x

    e = Echo.remote()
    ray.get(e.ping.remote())
    m = min(n, 300)
    sync = _median_time(lambda: [ray.get(e.ping.remote()) for _ in range(m)], 3) / m
    piped = _median_time(lambda: ray.get([e.ping.remote() for _ in range(n)]), 3) / n
    ray.kill(e)
    return {"ray_call_us": sync * 1e6, "ray_pipelined_us": piped * 1e6}


def _grpc_baseline(n: int) -> float:
    import grpc
    from concurrent import futures
    server = grpc.server(futures.ThreadPoolExecutor(4))
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Ping": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        call = ch.unary_unary("/bench.Echo/Ping")
        call(b"x", timeout=10)
        m = min(n, 500)
        t = _median_time(lambda: [call(b"x", timeout=10) for _ in range(m)], 3) / m
        ch.close()
        return t * 1e6
    finally:
        server.stop(None)


def _bench_launch(a) -> int:
    from .api import Runtime
    from .backend import LocalBackend
    from .cluster import cluster_runtime
    res: dict = {"launches": a.launches}
    local = Runtime(LocalBackend(1))
    try:
        run, *_ = _launch_loop(local.device(0), a.launches)
        res["launch_us_inprocess"] = _median_time(run, a.repeat) / a.launches * 1e6
    finally:
        local.close()
    with cluster_runtime(devices=1) as rt:
        dev = rt.device(0)
        run, s, keep = _launch_loop(dev, a.launches)
        q0 = (dev.queue.batches_sent, getattr(dev.handle, "rpc_count", 0))
        res["launch_us"] = _median_time(run, a.repeat) / a.launches * 1e6
        res["rpcs_per_1000_launches"] = (getattr(dev.handle, "rpc_count", 0) - q0[1]) / a.repeat * 1000 / a.launches
        res.update(_ray_baselines(a.launches))
    res["grpc_unary_us"] = _grpc_baseline(a.launches)
    res["speedup_vs_ray_call"] = res["ray_call_us"] / res["launch_us"]
    res["speedup_vs_ray_pipelined"] = res["ray_pipelined_us"] / res["launch_us"]
    res["speedup_vs_grpc_unary"] = res["grpc_unary_us"] / res["launch_us"]
    if a.json:
        print(json.dumps(res))
    else:
        print(f"amortized launch cost ({a.launches} launches + synchronize, median of {a.repeat}):")
        print(f"  vnpu, device actor over gRPC : {res['launch_us']:8.1f} us/launch "
              f"({res['rpcs_per_1000_launches']:.1f} RPCs per 1000 launches)")
        print(f"  vnpu, in-process device      : {res['launch_us_inprocess']:8.1f} us/launch")
        print(f"  plain Ray actor call (sync)  : {res['ray_call_us']:8.1f} us   -> vnpu is "
              f"{res['speedup_vs_ray_call']:.1f}x faster")
        print(f"  plain Ray calls, pipelined   : {res['ray_pipelined_us']:8.1f} us   -> "
              f"{res['speedup_vs_ray_pipelined']:.1f}x")
        print(f"  plain gRPC unary call        : {res['grpc_unary_us']:8.1f} us   -> "
              f"{res['speedup_vs_grpc_unary']:.1f}x")
    return 0


# ----------------------------------------------------------------------------------------- memcpy
def _bench_memcpy(a) -> int:
    from .api import Runtime
    from .cluster import cluster_runtime
    from .remote import RemoteBackend
    lo, hi, ghi = parse_size(a.min_bytes), parse_size(a.max_bytes), parse_size(a.grpc_max_bytes)
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(s)
        s *= 2
    rows = []
    with cluster_runtime(devices=1) as rt:
        dev = rt.device(0)
        backend = rt.backend
        slow = None
        if isinstance(backend, RemoteBackend):
            slow = Runtime(RemoteBackend(list(backend.where.values()), backend.token, same_node=False,
                                         client_id=backend.client_id))
        for size in sizes:
            host = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
            back = np.empty_like(host)
            ptr = dev.malloc(size)
            try:
                reps = 3 if size >= 64 << 20 else 5
                t_copy = _median_time(lambda: np.copyto(back, host), reps)
                t_h2d = _median_time(lambda: dev.handle.memcpy_h2d(ptr, host), reps)
                t_d2h = _median_time(lambda: dev.handle.memcpy_d2h(ptr, size, out=back), reps)
                ok = bool(np.array_equal(back, host))
                row = {"bytes": size, "copyto_gbs": size / t_copy / 1e9, "h2d_gbs": size / t_h2d / 1e9,
                       "d2h_gbs": size / t_d2h / 1e9, "verified": ok}
                if slow is not None and size <= ghi:
                    sd = slow.device(0).handle
                    g_h2d = _median_time(lambda: sd.memcpy_h2d(ptr, host), 3)
                    g_d2h = _median_time(lambda: sd.memcpy_d2h(ptr, size), 3)
                    row.update(grpc_h2d_gbs=size / g_h2d / 1e9, grpc_d2h_gbs=size / g_d2h / 1e9)
                row["h2d_vs_copyto"] = row["h2d_gbs"] / row["copyto_gbs"]
                row["d2h_vs_copyto"] = row["d2h_gbs"] / row["copyto_gbs"]
                rows.append(row)
            finally:
                dev.free(ptr)
        if slow is not None:
            slow.backend.close()
    if a.json:
        print(json.dumps({"rows": rows}))
    else:
        print(f"{'size':>10} {'copyto GB/s':>12} {'H2D GB/s':>9} {'D2H GB/s':>9} {'H2D/copyto':>10} "
              f"{'D2H/copyto':>10} {'gRPC H2D':>9} {'gRPC D2H':>9} ok")
        for r in rows:
            print(f"{_fmt_size(r['bytes']):>10} {r['copyto_gbs']:12.2f} {r['h2d_gbs']:9.2f} {r['d2h_gbs']:9.2f} "
                  f"{r['h2d_vs_copyto']:10.0%} {r['d2h_vs_copyto']:10.0%} "
                  f"{r.get('grpc_h2d_gbs', float('nan')):9.2f} {r.get('grpc_d2h_gbs', float('nan')):9.2f} "
                  f"{'yes' if r['verified'] else 'NO'}")
    return 0


def _fmt_size(n: int) -> str:
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m:
            return f"{n / m:g} {unit}"
    return f"{n} B"
