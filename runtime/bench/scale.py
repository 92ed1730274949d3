"""``vnpu bench scale``: many virtual NPUs on one machine -- how long they take to start, what each costs in
memory, and an AllReduce across all of them, beside baselines measured in the same run.

For each device count (``--devices 4,16,32,64``), on a fresh embedded Ray cluster with small arenas:

- **start**: the time from asking Ray for the device actors (all at once) until every one serves gRPC;
  baseline: the same number of empty Ray actors (``num_cpus=0``) started the same way in the same cluster
  just before (what Ray itself costs per actor process);
- **CPU per device**: CPU time (user + system, ``/proc/<pid>/stat``) each device process has used by the time
  every one serves, median; baseline: an empty actor's worker.  Unlike the start time it hardly depends on
  what else the machine runs (it includes the earliest ones' idle time until the last serves: ~6 ms/s);
- **memory per device**: RSS and PSS (``/proc/<pid>/smaps_rollup``: shared pages split among the processes
  that map them) of each device process, median and max; baseline: an empty actor's;
- **AllReduce** of ``--allreduce-bytes`` (float32) across all devices: median time per operator (issue on
  every rank, then wait for every rank), results checked exactly (small integers); beside the machine's
  memory-bound limit for the same operator (:mod:`runtime.bench.bound`, one thread / all cores).

Every figure is this machine's (cores and memory are printed).  Host-blocking; tears every cluster down.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time

import numpy as np

from devices import procstat
from runtime.cliargs import fail, int_list, positive_int, size
from runtime.cluster import rayenv

from .common import add_plot_arg, write_plot


def register(bs) -> None:
    p = bs.add_parser("scale", help="many devices per machine: start time, memory per device, AllReduce "
                                    "across all, vs plain Ray actors and the memory bound",
                      example="vnpu bench scale --devices 4,16,32 --hbm-mb 16")
    p.add_argument("--devices", type=int_list, default="4,16,32,64", help="device counts, comma separated")
    p.add_argument("--hbm-mb", type=positive_int, default=16, help="HBM arena per device (MiB)")
    p.add_argument("--allreduce-bytes", type=size, default="1M", help="AllReduce size (float32: at least 4 B)")
    p.add_argument("--iters", type=positive_int, default=10, help="timed AllReduce iterations")
    p.add_argument("--no-baseline", action="store_true", help="skip the plain-actor baseline")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_plot_arg(p, "start time, memory per device and AllReduce time vs devices")
    p.set_defaults(fn=run)


def proc_memory(pid: int) -> dict:
    """RSS and PSS of a process in bytes (0 when it cannot be read)."""
    out = {"rss": 0, "pss": 0}
    with contextlib.suppress(OSError, ValueError):
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss"):
                    out[key.lower()] = int(rest.split()[0]) * 1024
    return out


def _mem_summary(pids: list[int]) -> dict:
    cpu = [procstat.cpu_seconds(p) or 0.0 for p in pids]    # first: the memory reads below cost CPU of their own
    mems = [proc_memory(p) for p in pids]
    rss = [m["rss"] for m in mems]
    pss = [m["pss"] for m in mems]
    return {"rss_median": statistics.median(rss), "rss_max": max(rss), "pss_median": statistics.median(pss),
            "pss_total": sum(pss), "cpu_s_median": statistics.median(cpu), "n": len(pids)}


def _plain_actors(n: int) -> dict:
    """Start ``n`` empty actors at once and wait for all; their memory; then kill them."""
    rayenv.prepare()
    import ray

    @ray.remote(num_cpus=0)
    class Empty:
        def pid(self):
            return os.getpid()
    t0 = time.perf_counter()
    actors = [Empty.remote() for _ in range(n)]
    pids = ray.get([a.pid.remote() for a in actors], timeout=600)
    t = time.perf_counter() - t0
    mem = _mem_summary(pids)
    for a in actors:
        with contextlib.suppress(Exception):
            ray.kill(a)
    return {"start_s": t, **mem}


def _allreduce(rt, nbytes: int, iters: int) -> dict:
    from runtime import hccl
    devs = rt.devices()
    n = len(devs)
    count = max(1, nbytes // 4)
    t0 = time.perf_counter()
    comms = hccl.comm_init_all(devs, hccl.CommOptions(exec_timeout_s=300))
    t_init = time.perf_counter() - t0
    vals = [((np.arange(count) + r) % 7).astype(np.float32) for r in range(n)]
    want = np.sum(np.stack(vals).astype(np.float64), axis=0)
    xs = [d.from_numpy(v) for d, v in zip(devs, vals)]
    ys = [d.empty((count,)) for d in devs]
    streams = [d.stream() for d in devs]
    try:
        def once():
            for c, x, y, s in zip(comms, xs, ys, streams):
                c.collective("allreduce", x.ptr, y.ptr, count, "float32", "sum", stream=s)
            for s in streams:
                s.synchronize()
        once()
        once()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            once()
            times.append(time.perf_counter() - t0)
        wrong = sum(int(np.count_nonzero(y.numpy(stream=s) != want)) for y, s in zip(ys, streams))
    finally:
        for c in comms:
            with contextlib.suppress(Exception):
                c.destroy()
        for t in xs + ys:
            with contextlib.suppress(Exception):
                t.free()
    return {"time_us": statistics.median(times) * 1e6, "comm_init_s": t_init, "wrong": wrong, "count": count,
            "algo": hccl_algo(n, count * 4)}


def hccl_algo(n: int, nbytes: int) -> str:
    from devices.hccl_schedule import choose_algo
    return choose_algo("allreduce", n, nbytes)


def _one(n: int, a, nbytes: int) -> dict:
    rayenv.prepare()
    import ray

    from runtime.api import Runtime
    from runtime.cluster.local import ClusterSpec, LocalCluster, start_devices

    from .bound import collective_bound
    row: dict = {"devices": n}
    t0 = time.perf_counter()
    cluster = LocalCluster(ClusterSpec(devices=0, arena_bytes=a.hbm_mb << 20))
    row["ray_up_s"] = time.perf_counter() - t0
    rt = None
    try:
        if not a.no_baseline:
            row["plain_actors"] = _plain_actors(n)
        t0 = time.perf_counter()
        cluster.where, cluster.actors = start_devices(ClusterSpec(devices=n, arena_bytes=a.hbm_mb << 20),
                                                      cluster.token, detached=False, timeout_s=900)
        row["start_s"] = time.perf_counter() - t0
        row["memory"] = _mem_summary([w["pid"] for w in cluster.where])
        rt = Runtime(cluster.backend())
        row["allreduce"] = _allreduce(rt, nbytes, a.iters)
        b = collective_bound("allreduce", n, row["allreduce"]["count"])
        row["bound"] = {"t1_us": b["t1_s"] * 1e6, "tn_us": b["tn_s"] * 1e6, "threads": b["threads"]}
    finally:
        if rt is not None:
            rt.close()
        cluster.close()
        if ray.is_initialized():
            ray.shutdown()
    return row


def _mib(x: float) -> str:
    return f"{x / (1 << 20):.0f}"


def run(a) -> int:
    from .bound import cores
    counts, nbytes = a.devices, a.allreduce_bytes           # checked by argparse (runtime.cliargs)
    if nbytes < 4:
        fail(f"argument --allreduce-bytes: must be at least 4 (one float32), got {nbytes}", "vnpu bench scale")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    machine = {"cores": cores(), "memory_gib": round(mem / (1 << 30), 1)}
    out = sys.stdout
    if not a.json:
        print(f"# vnpu bench scale: this machine: {machine['cores']} cores, {machine['memory_gib']} GiB; "
              f"{a.hbm_mb} MiB HBM per device; AllReduce {nbytes} B float32", file=out)
        print(f"#{'devices':>8} {'ray up':>7} {'start':>8} {'plain':>8} {'x plain':>8} {'RSS/dev':>8} {'PSS/dev':>8} "
              f"{'plain RSS':>9} {'CPU/dev':>8} {'plain CPU':>9} "
              f"{'AllReduce':>10} {'algo':>8} {'bound 1T':>9} {'bound NT':>9} {'#wrong':>7}\n"
              f"#{'':>8} {'(s)':>7} {'(s)':>8} {'(s)':>8} {'':>8} {'(MiB)':>8} {'(MiB)':>8} {'(MiB)':>9} "
              f"{'(s)':>8} {'(s)':>9} {'(us)':>10} {'':>8} {'(us)':>9} {'(us)':>9} {'':>7}", file=out, flush=True)
    rows = []
    for n in counts:
        row = _one(n, a, nbytes)
        rows.append(row)
        if not a.json:
            pl = row.get("plain_actors") or {}
            ar, bd, mem = row["allreduce"], row["bound"], row["memory"]
            ratio = f"{row['start_s'] / pl['start_s']:.2f}x" if pl else "-"
            print(f" {n:>8} {row['ray_up_s']:>7.1f} {row['start_s']:>8.1f} {pl.get('start_s', float('nan')):>8.1f} "
                  f"{ratio:>8} {_mib(mem['rss_median']):>8} {_mib(mem['pss_median']):>8} "
                  f"{_mib(pl['rss_median']) if pl else '-':>9} {mem['cpu_s_median']:>8.2f} "
                  f"{format(pl['cpu_s_median'], '.2f') if pl else '-':>9} {ar['time_us']:>10.0f} {ar['algo']:>8} "
                  f"{bd['t1_us']:>9.0f} {bd['tn_us']:>9.0f} {ar['wrong']:>7}", file=out, flush=True)
    wrong = sum(r["allreduce"]["wrong"] for r in rows)
    doc = {"machine": machine, "hbm_mb": a.hbm_mb, "allreduce_bytes": nbytes, "rows": rows,
           "verified": bool(rows) and not wrong}
    if a.json:
        print(json.dumps(doc))
    else:
        print(f"# start: from asking Ray for every device actor at once until all serve gRPC; plain: as many empty "
              f"Ray actors, same cluster, just before; CPU: CPU time of each process once all serve, "
              f"median\n# AllReduce results {'OK' if not wrong else 'WRONG'} "
              f"({wrong} bad elements)", file=out)
    return write_plot(a, "scale", doc) or (0 if rows and not wrong else 1)


__all__ = ["register", "run", "proc_memory"]
