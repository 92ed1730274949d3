"""HCCL on many ranks (in-process devices): the dissemination barrier of communicators above
``DIRECT_BARRIER_MAX`` ranks, the many-rank algorithm choice, and a lost rank failing the operator on
every other rank -- also on the ranks that never wait for it directly (they hear the abort).

Inputs are small integers, so every reduction is exact in any order.  Nothing sleeps: a rank is held
back by a host-signalled gate (a blocking host function waiting on an event with a deadline).
"""
from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from conftest import make_local_runtime
from devices.errors import HCCL_E_PARA, HCCL_E_REMOTE
from devices.hccl import DIRECT_BARRIER_MAX
from devices.hccl_schedule import MESH_MAX_RANKS, choose_algo
from hccl_ranks import GATE_TIMEOUT_S, Pool, communicators, every_rank_fails, gate_stream
from runtime import hccl

N = 9


@pytest.fixture(scope="module")
def rt9():
    r = make_local_runtime(N, arena=16 << 20)
    try:
        yield r
    finally:
        r.close()


def _engines(rt, devs):
    return [rt.backend.device(d.physical_id).hccl for d in devs]


@pytest.mark.parametrize("n", [5, 8, 9])
@pytest.mark.parametrize("algo", ["mesh", "hd", "ring", "oneshot", None])
def test_allreduce_on_many_ranks(rt9, n, algo):
    devs = rt9.devices()[:n]
    count = 3 * n + 1
    want = sum((np.arange(count) * (r + 1) % 13).astype(np.float32) for r in range(n))
    with Pool() as pool, communicators(devs, algo=algo, timeout_s=60) as comms:
        xs = [pool.put(d, (np.arange(count) * (r + 1) % 13).astype(np.float32)) for r, d in enumerate(devs)]
        for c, x in zip(comms, xs):
            c.all_reduce(x)
        for x in xs:
            np.testing.assert_array_equal(x.numpy(), want)


@pytest.mark.parametrize("n", [5, 8, 9])
def test_barrier_disseminates_beyond_the_direct_limit(rt9, n):
    """A oneshot AllReduce is a "ready" barrier plus one round of reads: above DIRECT_BARRIER_MAX ranks the
    barrier sends ceil(log2 n) messages per rank (not n - 1), and every rank still learns every peer's
    buffers (the result is right)."""
    assert n > DIRECT_BARRIER_MAX
    devs = rt9.devices()[:n]
    engines = _engines(rt9, devs)
    with Pool() as pool, communicators(devs, algo="oneshot") as comms:
        xs = [pool.put(d, np.full(16, r + 1.0, np.float32)) for r, d in enumerate(devs)]
        before = [e.stats["messages"] for e in engines]
        for c, x in zip(comms, xs):
            c.all_reduce(x)
        for x in xs:
            np.testing.assert_array_equal(x.numpy(), np.full(16, n * (n + 1) / 2, np.float32))
        sent = [e.stats["messages"] - b for e, b in zip(engines, before)]
        assert sent == [math.ceil(math.log2(n))] * n


def test_mismatch_on_many_ranks_fails_every_rank(rt9):
    devs = rt9.devices()
    with Pool() as pool, communicators(devs, timeout_s=60) as comms:
        xs = [pool.put(d, np.ones(8 if r != 5 else 9, np.float32)) for r, d in enumerate(devs)]
        for c, x in zip(comms, xs):
            c.all_reduce(x)
        every_rank_fails(devs, HCCL_E_PARA)


def test_algorithm_for_large_allreduce_by_rank_count():
    assert choose_algo("allreduce", MESH_MAX_RANKS, 64 << 20) == "mesh"
    assert choose_algo("allreduce", MESH_MAX_RANKS + 1, 64 << 20) == "hd"
    assert choose_algo("allgather", 32, 64 << 20) == "mesh"


def test_lost_rank_fails_every_other_rank_with_remote_error():
    """Eight ranks enter a mesh AllReduce while rank 6 is held by a gate; rank 6's device dies.  Every other
    rank fails with HCCL_E_REMOTE well before the 120 s exec timeout: those waiting for rank 6 probe it
    and find it gone, and they tell the rest (abort), and the operator's error is the same everywhere."""
    r = make_local_runtime(8, arena=16 << 20)
    gate = threading.Event()
    try:
        devs = r.devices()
        engines = _engines(r, devs)
        comms = hccl.comm_init_all(devs, hccl.CommOptions(exec_timeout_s=120, algo="mesh"))
        ts = [d.from_numpy(np.full(4096, i + 1.0, np.float32)) for i, d in enumerate(devs)]
        gate_stream(devs[6].default_stream, gate)
        for c, t in zip(comms, ts):
            c.all_reduce(t)
        victim = r.backend.device(devs[6].physical_id)
        mb = victim.hccl.mailbox                 # rank 6 has heard from the ranks of its first barrier round
        assert mb.wait_pending(1, GATE_TIMEOUT_S)
        victim.close()
        gate.set()
        every_rank_fails([d for i, d in enumerate(devs) if i != 6], HCCL_E_REMOTE)
        assert sum(e.stats["aborts_sent"] for i, e in enumerate(engines) if i != 6) >= 1
        survivors = [d for i, d in enumerate(devs) if i != 6]
        fresh = hccl.comm_init_all(survivors, hccl.CommOptions(exec_timeout_s=60))
        xs = [d.from_numpy(np.full(100, 1.0, np.float32)) for d in survivors]
        for c, x in zip(fresh, xs):
            c.all_reduce(x)
        for x in xs:
            np.testing.assert_array_equal(x.numpy(), np.full(100, 7.0, np.float32))
    finally:
        gate.set()
        r.close()


def test_link_down_fails_the_operator_on_many_ranks(rt9):
    """Eight ranks, the link between devices of ranks 0 and 5 down: the barrier disseminates (the two never
    exchange a message directly in it), yet the operator fails with HCCL_E_NETWORK on both ends -- and on the
    other ranks, told by rank 0 -- and works again once the link is back."""
    from devices.errors import HCCL_E_NETWORK
    devs = rt9.devices()[:8]
    h0 = rt9.backend.device(devs[0].physical_id)
    with Pool() as pool, communicators(devs, algo="hd", timeout_s=60) as comms:
        xs = [pool.put(d, np.ones(64, np.float32)) for d in devs]
        try:
            h0.inject_fault("link-down", peer=devs[5].physical_id)
            for c, x in zip(comms, xs):
                c.all_reduce(x)
            every_rank_fails(devs, HCCL_E_NETWORK)
            h0.clear_fault()
            ys = [pool.put(d, np.full(64, 2.0, np.float32)) for d in devs]
            for c, y in zip(comms, ys):
                c.all_reduce(y)
            for y in ys:
                np.testing.assert_array_equal(y.numpy(), np.full(64, 16.0, np.float32))
        finally:
            h0.clear_fault()
