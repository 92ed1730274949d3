"""``vnpu bench launch``: the amortized cost of a kernel launch against a Ray actor call and a gRPC unary
call measured in the same run.  The launched kernel's output is read back and checked on both devices
(``verified``; the command exits 1 when it is wrong)."""
from __future__ import annotations

import json

import numpy as np

from runtime.cliargs import positive_int
from runtime.cluster import rayenv

from .common import median_time as _median_time


def register(bs) -> None:
    la = bs.add_parser("launch", help="amortized cost per kernel launch vs a Ray actor call and a gRPC call",
                       example="vnpu bench launch --launches 1000 --repeat 5")
    la.add_argument("--launches", type=positive_int, default=1000, help="launches per timed run (default 1000)")
    la.add_argument("--repeat", type=positive_int, default=5, help="timed runs (the best is kept; default 5)")
    la.add_argument("--json", action="store_true", help="print the results as JSON")
    la.set_defaults(fn=run)


def _launch_loop(dev, n: int):
    a = dev.from_numpy(np.ones(16, np.float32))
    out = dev.empty((16,), "float32")
    s = dev.stream()

    def run():
        for _ in range(n):
            s.launch("add", [a, a], [out], block_dim=1)
        s.synchronize()
    run()  # warm up
    return run, s, (a, out)


def _verified(s, out) -> bool:
    """The launches computed what ``add`` computes (1 + 1 = 2 everywhere)."""
    return bool(np.array_equal(out.numpy(s), np.full(16, 2.0, np.float32)))


def _ray_baselines(n: int) -> dict:
    rayenv.prepare()
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


def run(a) -> int:
    from runtime.api import Runtime
    from runtime.backend import LocalBackend
    from runtime.cluster import cluster_runtime
    res: dict = {"launches": a.launches}
    local = Runtime(LocalBackend(1))
    try:
        run, s, (_, out) = _launch_loop(local.device(0), a.launches)
        res["launch_us_inprocess"] = _median_time(run, a.repeat) / a.launches * 1e6
        ok = _verified(s, out)
    finally:
        local.close()
    with cluster_runtime(devices=1) as rt:
        dev = rt.device(0)
        run, s, keep = _launch_loop(dev, a.launches)
        q0 = (dev.queue.batches_sent, getattr(dev.handle, "rpc_count", 0))
        res["launch_us"] = _median_time(run, a.repeat) / a.launches * 1e6
        res["rpcs_per_1000_launches"] = (getattr(dev.handle, "rpc_count", 0) - q0[1]) / a.repeat * 1000 / a.launches
        res["verified"] = ok and _verified(s, keep[1])
        res.update(_ray_baselines(a.launches))
    res["grpc_unary_us"] = _grpc_baseline(a.launches)
    res["speedup_vs_ray_call"] = res["ray_call_us"] / res["launch_us"]
    res["speedup_vs_ray_pipelined"] = res["ray_pipelined_us"] / res["launch_us"]
    res["speedup_vs_grpc_unary"] = res["grpc_unary_us"] / res["launch_us"]
    if a.json:
        print(json.dumps(res))
    else:
        if not res["verified"]:
            print("verified: NO -- the launched kernel computed a wrong result")
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
    return 0 if res["verified"] else 1
