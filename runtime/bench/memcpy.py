"""``vnpu bench memcpy``: host<->device bandwidth (shared-memory fast path and gRPC path) against
``np.copyto`` measured in the same run.  Every copied size is read back and compared (``verified``; the
command exits 1 when any is not)."""
from __future__ import annotations

import json

import numpy as np

from runtime.cliargs import fail, size

from .common import add_plot_arg, fmt_size as _fmt_size, median_time as _median_time, write_plot


def register(bs) -> None:
    mc = bs.add_parser("memcpy", help="H2D/D2H bandwidth vs np.copyto",
                       example="vnpu bench memcpy --min-bytes 1M --max-bytes 256M")
    mc.add_argument("--min-bytes", type=size, default="1M", help="smallest copy (default 1M)")
    mc.add_argument("--max-bytes", type=size, default="256M", help="largest copy (sizes double up to it; default 256M)")
    mc.add_argument("--grpc-max-bytes", type=size, default="64M",
                    help="largest size also measured over the gRPC path")
    mc.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_plot_arg(mc, "bandwidth vs size with np.copyto as the bound")
    mc.set_defaults(fn=run)


def run(a) -> int:
    from runtime.api import Runtime
    from runtime.cluster import cluster_runtime
    from runtime.cluster.remote import RemoteBackend
    lo, hi, ghi = a.min_bytes, a.max_bytes, a.grpc_max_bytes        # sizes >= 1 (runtime.cliargs.size)
    if hi < lo:
        fail(f"argument --max-bytes: {hi} is below --min-bytes {lo}", "vnpu bench memcpy")
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
                t_h2d = _median_time(lambda: dev.memcpy_h2d(ptr, host), reps)
                t_d2h = _median_time(lambda: dev.memcpy_d2h(ptr, size, out=back), reps)
                ok = bool(np.array_equal(back, host))
                row = {"bytes": size, "copyto_gbs": size / t_copy / 1e9, "h2d_gbs": size / t_h2d / 1e9,
                       "d2h_gbs": size / t_d2h / 1e9, "verified": ok}
                if slow is not None and size <= ghi:
                    sd = slow.device(0)
                    g_h2d = _median_time(lambda: sd.memcpy_h2d(ptr, host), 3)
                    g_d2h = _median_time(lambda: sd.memcpy_d2h(ptr, size, out=back), 3)
                    row.update(grpc_h2d_gbs=size / g_h2d / 1e9, grpc_d2h_gbs=size / g_d2h / 1e9)
                    row["verified"] = ok and bool(np.array_equal(back, host))
                row["h2d_vs_copyto"] = row["h2d_gbs"] / row["copyto_gbs"]
                row["d2h_vs_copyto"] = row["d2h_gbs"] / row["copyto_gbs"]
                rows.append(row)
            finally:
                dev.free(ptr)
        if slow is not None:
            slow.backend.close()
    verified = bool(rows) and all(r["verified"] for r in rows)
    doc = {"rows": rows, "verified": verified}
    if a.json:
        print(json.dumps(doc))
    else:
        print(f"{'size':>10} {'copyto GB/s':>12} {'H2D GB/s':>9} {'D2H GB/s':>9} {'H2D/copyto':>10} "
              f"{'D2H/copyto':>10} {'gRPC H2D':>9} {'gRPC D2H':>9} ok")
        for r in rows:
            print(f"{_fmt_size(r['bytes']):>10} {r['copyto_gbs']:12.2f} {r['h2d_gbs']:9.2f} {r['d2h_gbs']:9.2f} "
                  f"{r['h2d_vs_copyto']:10.0%} {r['d2h_vs_copyto']:10.0%} "
                  f"{r.get('grpc_h2d_gbs', float('nan')):9.2f} {r.get('grpc_d2h_gbs', float('nan')):9.2f} "
                  f"{'yes' if r['verified'] else 'NO'}")
        print(f"verified: {'yes' if verified else 'NO: a copy came back different'}")
    return write_plot(a, "memcpy", doc) or (0 if verified else 1)
