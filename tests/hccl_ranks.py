"""What a collective test needs around its ranks: the device tensors it puts on them (:class:`Pool`, freed
at the end), communicators destroyed after their streams drained (:func:`communicators`), the error a
collective left on a rank (:func:`sync_error`) or on every rank (:func:`every_rank_fails`), and a gate that
holds a stream back (:func:`gate_stream`: a blocking host function waiting on an event with a deadline,
never a sleep)."""
from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest

from devices.errors import AclError, HcclError
from runtime import hccl

GATE_TIMEOUT_S = 20.0        # a gate nobody releases lets go by itself: a failing test cannot hang


class Pool:
    """Device tensors of one test, freed at its end (``free``, or leaving a ``with`` block)."""

    def __init__(self):
        self.tensors = []

    def put(self, dev, arr):
        t = dev.from_numpy(np.ascontiguousarray(arr))
        self.tensors.append(t)
        return t

    def empty(self, dev, shape, dtype="float32"):
        t = dev.empty(shape, dtype)
        self.tensors.append(t)
        return t

    def free(self):
        for t in self.tensors:
            with contextlib.suppress(AclError):
                t.free()
        self.tensors.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


@contextlib.contextmanager
def communicators(devs, algo=None, timeout_s=30.0):
    """One communicator per device of ``devs`` (rank i on ``devs[i]``) for the block; after it the devices'
    streams are drained (a failed collective's sticky error cleared) and the communicators destroyed."""
    comms = hccl.comm_init_all(devs, hccl.CommOptions(algo=algo, exec_timeout_s=timeout_s))
    try:
        yield comms
    finally:
        drain(devs)
        for c in comms:
            c.destroy()


def drain(devs):
    """Clear the sticky stream errors a failed test may leave (a failed stream skips later work)."""
    for d in devs:
        with contextlib.suppress(AclError):
            d.synchronize()


def sync_error(dev) -> HcclError:
    """Synchronize ``dev``; it must raise an HcclError (its HcclResult in ``hccl_code``)."""
    with pytest.raises(AclError) as ei:
        dev.synchronize()
    e = ei.value
    assert isinstance(e, HcclError), \
        f"a failed collective must reach the host as HcclError (with hccl_code), got {type(e).__name__}: {e}"
    return e


def every_rank_fails(devs, code: int) -> None:
    """Each of ``devs``, synchronized, raises an HcclError with HcclResult ``code``."""
    for i, d in enumerate(devs):
        e = sync_error(d)
        assert e.hccl_code == code, (i, e)


def gate_stream(stream, gate: threading.Event, started: threading.Event | None = None):
    """Hold ``stream`` until ``gate`` is set (or GATE_TIMEOUT_S passes)."""
    def hold():
        if started is not None:
            started.set()
        gate.wait(GATE_TIMEOUT_S)
    stream.launch_host_func(hold, blocking=True)


def allreduce_checked(devs, algo: str, count: int, seed: int) -> dict[str, list[int]]:
    """An AllReduce of ``count`` random float32 on every device of ``devs`` (algorithm ``algo``), each result
    checked against numpy's float64 sum within the bound of a blocked float32 sum in any order; returns each
    HCCL byte counter's change per rank (``bytes_pulled``, ``bytes_pushed``, ``bytes_same-node``, ...)."""
    from fp32 import assert_within, sum_bound
    rng = np.random.default_rng(seed)
    data = [rng.standard_normal(count).astype(np.float32) for _ in devs]
    with Pool() as pool, communicators(devs, algo=algo, timeout_s=60) as comms:
        ts = [pool.put(d, x) for d, x in zip(devs, data)]
        before = [d.handle.hccl_info()["stats"] for d in devs]
        for c, t in zip(comms, ts):
            c.all_reduce(t)
        ref = np.sum(np.stack(data).astype(np.float64), axis=0)
        for t in ts:
            assert_within(t.numpy(), ref, sum_bound(np.stack(data), axis=0), algo)
        after = [d.handle.hccl_info()["stats"] for d in devs]
    return {k: [a[k] - b[k] for a, b in zip(after, before)] for k in after[0] if k.startswith("bytes_")}
