"""The machine's memory-bound limit for a collective: one process doing the same reductions and copies.

A collective on ``n`` ranks has, whatever its algorithm, a minimum of memory work: AllReduce reads the
``n`` inputs once, reduces them and writes the result into the ``n`` outputs; AllGather and AlltoAll copy
every block once; ReduceScatter reduces each output chunk out of the ``n`` inputs; Broadcast copies the
root's buffer ``n - 1`` times; Reduce reduces into the root's.  :func:`collective_bound` does exactly that
work in this process, on plain numpy buffers, the way a tuned implementation would: segment by segment
(each result segment is built in cache from every input's segment, then copied out while it is still
there), with ufuncs writing into their output (no temporaries), on one thread and on as many threads as
the machine has cores (each thread takes a contiguous slice of every buffer; numpy releases the GIL for
these loops).  Every collective's figures are then read against the limit measured in the same run.

Host-blocking; allocates ``2 n`` buffers of the operator's size (touched once before timing).
"""
from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

#: segment of the blocked loops: the result segment and one input segment fit in a core's L2 cache
SEGMENT_BYTES = 256 << 10
_UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
#: per-rank buffer elements (send, recv) of each operator, as HCCL counts them (``count``: HCCL's count)
_SIZES = {"allreduce": lambda n, k: (k, k), "allgather": lambda n, k: (k, k * n),
          "reducescatter": lambda n, k: (k * n, k), "alltoall": lambda n, k: (k * n, k * n),
          "broadcast": lambda n, k: (k, k), "reduce": lambda n, k: (k, k)}


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _groups(op: str, n: int, count: int, ins: list, outs: list, root: int = 0) -> list[list[tuple]]:
    """The operator's work as groups of ``(dst, [sources], reduce)`` jobs over equally long 1-D views;
    the jobs of a group run segment by segment, in order (a later job may read an earlier one's dst)."""
    if op == "allreduce":
        return [[(outs[0], ins, True)] + [(outs[r], [outs[0]], False) for r in range(1, n)]]
    if op == "reduce":
        return [[(outs[root], ins, True)]]
    if op == "broadcast":
        return [[(outs[r], [ins[root]], False) for r in range(n) if r != root]]
    blk = slice
    if op == "reducescatter":
        return [[(outs[r], [ins[q][blk(r * count, (r + 1) * count)] for q in range(n)], True)] for r in range(n)]
    if op == "allgather":
        return [[(outs[r][blk(q * count, (q + 1) * count)], [ins[q]], False) for r in range(n) for q in range(n)]]
    if op == "alltoall":
        return [[(outs[r][blk(q * count, (q + 1) * count)], [ins[q][blk(r * count, (r + 1) * count)]], False)
                 for r in range(n) for q in range(n)]]
    raise ValueError(f"no bound for {op!r}")


def _run_slice(groups: list, lo_frac: tuple[int, int], seg: int, ufunc) -> None:
    """Do this thread's slice (``part`` of ``parts``) of every job, segment by segment."""
    part, parts = lo_frac
    for jobs in groups:
        length = len(jobs[0][0])
        lo, hi = length * part // parts, length * (part + 1) // parts
        for s in range(lo, hi, seg):
            e = min(hi, s + seg)
            for dst, srcs, reduce in jobs:
                d = dst[s:e]
                if reduce:
                    ufunc(srcs[0][s:e], srcs[1][s:e], out=d) if len(srcs) > 1 else np.copyto(d, srcs[0][s:e])
                    for x in srcs[2:]:
                        ufunc(d, x[s:e], out=d)
                else:
                    np.copyto(d, srcs[0][s:e])


class Bound:
    """Buffers of one (op, n, count, dtype) and a pool of worker threads; :meth:`time` measures the
    operator's memory work with ``threads`` threads (median seconds of ``iters`` runs)."""

    def __init__(self, op: str, n: int, count: int, dtype: str = "float32", redop: str = "sum", root: int = 0):
        if op not in _SIZES:
            raise ValueError(f"no bound for {op!r}")
        send_n, recv_n = _SIZES[op](n, count)
        dt = np.dtype(dtype)
        self.ins = [np.full(send_n, r + 1, dt) for r in range(n)]
        self.outs = [np.zeros(recv_n, dt) for _ in range(n)]
        self.groups = _groups(op, n, count, self.ins, self.outs, root)
        self.seg = max(1, SEGMENT_BYTES // dt.itemsize)
        self.ufunc = _UFUNC[redop]
        self._pool: ThreadPoolExecutor | None = None
        self._pool_threads = 0                            # the pool's size (ThreadPoolExecutor does not say)

    def run(self, threads: int) -> None:
        if threads <= 1:
            _run_slice(self.groups, (0, 1), self.seg, self.ufunc)
            return
        if self._pool is None or self._pool_threads != threads:
            self.close()
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="vnpu-bound")
            self._pool_threads = threads
        futs = [self._pool.submit(_run_slice, self.groups, (i, threads), self.seg, self.ufunc) for i in range(threads)]
        for f in futs:
            f.result()

    def time(self, threads: int, iters: int = 5, warmup: int = 1) -> float:
        for _ in range(warmup):
            self.run(threads)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            self.run(threads)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def collective_bound(op: str, n: int, count: int, dtype: str = "float32", redop: str = "sum",
                     threads: int | None = None, iters: int = 5) -> dict:
    """``{"t1_s": one thread, "tn_s": all cores, "threads": cores}`` for the operator (median seconds);
    ``{"skipped": why}`` for data types numpy cannot reduce natively (bfloat16)."""
    if dtype == "bfloat16":
        return {"skipped": "bfloat16 has no native numpy type"}
    threads = threads or cores()
    b = Bound(op, n, count, dtype, redop)
    try:
        t1 = b.time(1, iters)
        tn = b.time(threads, iters) if threads > 1 else t1
    finally:
        b.close()
    return {"t1_s": t1, "tn_s": tn, "threads": threads}


__all__ = ["Bound", "collective_bound", "cores", "SEGMENT_BYTES"]
