"""HCCL collectives through the public runtime API (``rt`` fixture: 4 devices; 5-rank cases use a
dedicated in-process runtime).

Every operator is checked against a numpy reference for 2..5 ranks, the ring / halving-doubling / mesh
algorithms, odd sizes, every supported dtype (bfloat16 is carried as 16-bit patterns in an int16
tensor and compared after widening to float32), in place and out of place.  Inputs are small integers
so every reduction is exact whatever the order the algorithm reduces in.  Then: overlap with compute on
other streams ordered by events, the C-style API's HcclResult codes, rank tables, root-info
rendezvous, and failures (mismatched operators, a peer that never arrives, a device killed in the
middle of an AllReduce).

Nothing sleeps: the device is held back only by host-signalled gates (a blocking host function that
waits on a ``threading.Event`` with a deadline) and threads are joined with deadlines.
"""
from __future__ import annotations

import json
import secrets
import threading

import numpy as np
import pytest

from conftest import make_local_runtime
from devices.errors import (HCCL_E_PARA, HCCL_E_REMOTE, HCCL_E_TIMEOUT, HCCL_SUCCESS, AclError, HcclError)
from devices.hccl_schedule import chunks
from fp32 import assert_within, gamma, sum_bound
from hccl_ranks import GATE_TIMEOUT_S, Pool, communicators, drain, gate_stream, sync_error
from runtime import hccl

JOIN_TIMEOUT_S = 30.0
ALGOS = ("ring", "hd", "mesh", "oneshot")
DTYPES = ("float32", "float16", "int8", "int32", "int64", "bfloat16")
REDOPS = ("sum", "prod", "max", "min")
_REF = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}
SENTINEL = 77


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def rt5():
    r = make_local_runtime(5)
    try:
        yield r
    finally:
        r.close()


def devices_for(request, rt, n: int):
    if n <= rt.device_count():
        return rt.devices()[:n]
    return request.getfixturevalue("rt5").devices()[:n]


@pytest.fixture
def pool():
    with Pool() as p:
        yield p


def comm_init_with(devs, **config):
    """Engine-level communicator (device handles directly) with CommConfig fields the public
    CommOptions does not expose (segment_bytes)."""
    cid = secrets.token_hex(16)
    peers = [d.handle.hccl_info() for d in devs]
    cfg = hccl.CommOptions(exec_timeout_s=30).device_config()
    cfg.update(config)
    for r, d in enumerate(devs):
        d.handle.hccl_comm_init(cid, r, peers, cfg)
    return [hccl.Communicator(d, cid, r, len(devs), peers) for r, d in enumerate(devs)]


def sync_all(devs):
    """Synchronize every device (all of them, even after one failed), then raise the first error."""
    first = None
    for d in devs:
        try:
            d.synchronize()
        except AclError as e:
            first = first or e
    if first is not None:
        raise first


# ------------------------------------------------------------------------------------------ host data
def storage_dtype(dtype: str) -> str:
    return "int16" if dtype == "bfloat16" else dtype


def encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """Logical values (small integers, float64) -> what the device buffer holds."""
    if dtype == "bfloat16":
        bits = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)   # exact for small ints
        return bits.view(np.int16)
    return values.astype(dtype)


def decode(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (arr.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return arr.astype(np.float64)


def inputs(op: str, n: int, count: int, redop: str, seed: int) -> np.ndarray:
    """(n, send elements) logical inputs: small integers, so every dtype and order is exact."""
    send_n = count * n if op in ("reducescatter", "alltoall") else count
    rng = np.random.default_rng(seed)
    if redop == "prod":
        return rng.choice(np.array([-2.0, -1.0, 1.0, 2.0]), size=(n, send_n))
    return rng.integers(-4, 5, size=(n, send_n)).astype(np.float64)


def reference(op: str, x: np.ndarray, r: int, count: int, redop: str, root: int):
    n = x.shape[0]
    if op == "allreduce":
        return _REF[redop](x, axis=0)
    if op == "allgather":
        return x.reshape(-1)
    if op == "reducescatter":
        return _REF[redop](x, axis=0)[r * count:(r + 1) * count]
    if op == "broadcast":
        return x[root]
    if op == "reduce":
        return _REF[redop](x, axis=0) if r == root else None
    if op == "alltoall":
        return np.concatenate([x[q][r * count:(r + 1) * count] for q in range(n)])
    raise AssertionError(op)


def run_and_check(comms, pool, op, count, dtype="float32", redop="sum", root=0, inplace=False, seed=0,
                  stream_of=None):
    """Issue ``op`` on every rank, synchronize, compare with numpy.  bfloat16 goes through the raw
    ``Communicator.collective`` (there is no numpy bfloat16), every other dtype through the tensor API."""
    n = len(comms)
    x = inputs(op, n, count, redop, seed)
    sdt = storage_dtype(dtype)
    isz = np.dtype(sdt).itemsize
    recv_n = count * n if op in ("allgather", "alltoall") else count
    outs = []                                   # (rank, tensor to read, elements to read)
    for r, c in enumerate(comms):
        d = c.device
        stream = stream_of(c) if stream_of else None
        mine = encode(x[r], dtype)
        if inplace and op == "allgather":       # send is recv's own block
            buf = encode(np.full(recv_n, float(SENTINEL)), dtype)
            buf[r * count:(r + 1) * count] = mine
            recv = pool.put(d, buf)
            send = recv.view((count,), offset_bytes=r * count * isz)
        elif inplace and op == "reducescatter":   # recv is send's own block
            send = pool.put(d, mine)
            recv = send.view((count,), offset_bytes=r * count * isz)
        elif inplace or op == "broadcast":
            send = recv = pool.put(d, mine)
        else:
            send = pool.put(d, mine)
            recv = pool.put(d, encode(np.full(recv_n, float(SENTINEL)), dtype))
        if dtype == "bfloat16":
            c.collective(op, send.ptr, recv.ptr, count, "bfloat16", redop, root=root, stream=stream)
        elif op == "allreduce":
            c.all_reduce(send, recv, op=redop, stream=stream)
        elif op == "allgather":
            c.all_gather(send, recv, stream=stream)
        elif op == "reducescatter":
            c.reduce_scatter(send, recv, op=redop, stream=stream)
        elif op == "broadcast":
            c.broadcast(send, root, stream=stream)
        elif op == "reduce":
            c.reduce(send, recv, op=redop, root=root, stream=stream)
        elif op == "alltoall":
            c.all_to_all(send, recv, stream=stream)
        else:
            raise AssertionError(op)
        outs.append((r, recv))
    sync_all([c.device for c in comms])
    for r, recv in outs:
        want = reference(op, x, r, count, redop, root)
        got = decode(recv.numpy(), dtype)
        what = f"{op}/{redop} {dtype} n={n} count={count} root={root} inplace={inplace} rank {r}"
        if want is None:                        # reduce, non-root: its recv buffer is not touched
            if not inplace:
                assert np.all(got == SENTINEL), f"{what}: a non-root recv buffer was written"
            continue
        assert got.shape == want.shape, what
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"{what}: {bad.size} wrong, first at {bad[0]}: {got[bad[0]]} != {want[bad[0]]}"


# ------------------------------------------------------------------------------------------ correctness
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce")
SIZES = (1, 7, 1001)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("algo", ALGOS)
def test_collectives_float32(request, rt, pool, algo, n):
    """Every collective, every root, sizes 1/7/1001, in place and out of place, float32 sum."""
    devs = devices_for(request, rt, n)
    with communicators(devs, algo) as comms:
        seed = 0
        for op in COLLECTIVES:
            roots = range(n) if op in ("broadcast", "reduce") else [0]
            for count in SIZES:
                for root in roots:
                    for inplace in ((False,) if op == "broadcast" else (False, True)):
                        seed += 1
                        run_and_check(comms, pool, op, count, root=root, inplace=inplace, seed=seed)
                pool.free()


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_collectives_dtypes_and_redops(rt, pool, dtype, algo):
    """Every dtype x every reduce op (3 ranks; int8 prod uses values whose products fit)."""
    devs = rt.devices()[:3]
    with communicators(devs, algo) as comms:
        seed = 100
        for count in (7, 1001):
            for redop in REDOPS:
                for op in ("allreduce", "reducescatter", "reduce"):
                    seed += 1
                    run_and_check(comms, pool, op, count, dtype, redop, root=1, seed=seed)
                seed += 1
                run_and_check(comms, pool, "allreduce", count, dtype, redop, inplace=True, seed=seed)
            for op in ("allgather", "broadcast", "alltoall"):
                seed += 1
                run_and_check(comms, pool, op, count, dtype, root=2, seed=seed)
            pool.free()


def test_all_reduce_random_floats(rt, pool):
    """Non-integer float32 data: equal to numpy's sum within rounding, and identical on every rank."""
    devs = rt.devices()
    rng = np.random.default_rng(7)
    for algo in ALGOS:
        x = rng.standard_normal((4, 4099)).astype(np.float32)
        with communicators(devs, algo) as comms:
            ts = [pool.put(d, x[r]) for r, d in enumerate(devs)]
            for c, t in zip(comms, ts):
                c.all_reduce(t)
            outs = [t.numpy() for t in ts]
        assert_within(outs[0], x.astype(np.float64).sum(0), sum_bound(x, axis=0), algo)   # any summation order
        for o in outs[1:]:
            assert np.array_equal(o, outs[0]), f"{algo}: ranks disagree"
        pool.free()


def test_zero_count_collectives(rt, pool):
    devs = rt.devices()
    with communicators(devs, "ring") as comms:
        for op in COLLECTIVES:
            run_and_check(comms, pool, op, 0)


@pytest.mark.parametrize("algo", ALGOS)
def test_large_buffers_in_segments(rt, pool, algo):
    """~300k elements with a 64 KiB segment (engine-level CommConfig.segment_bytes): pulls are split
    into many segments; AllReduce in place, AllGather and ReduceScatter out of place."""
    devs = rt.devices()
    comms = comm_init_with(devs, algo=algo, segment_bytes=64 << 10)
    try:
        run_and_check(comms, pool, "allreduce", 300_007, inplace=True, seed=1)
        pool.free()
        run_and_check(comms, pool, "reducescatter", 75_001, seed=2)
        pool.free()
        run_and_check(comms, pool, "allgather", 75_001, seed=3)
        pool.free()
        run_and_check(comms, pool, "allreduce", 300_007, "bfloat16", "max", seed=4)
    finally:
        drain(devs)
        for c in comms:
            c.destroy()


@pytest.mark.parametrize("inplace", [False, True])
def test_mesh_allreduce_on_one_node_pushes_each_chunk_once(rt, pool, inplace):
    """On one node (peers' arenas mapped, so writable) the mesh AllReduce pushes: each rank reduces its
    chunk out of every rank's send buffer and writes it into every peer's receive buffer -- per rank
    exactly its chunk from each peer pulled and its chunk to each peer pushed, nothing else -- and the
    result is the same as numpy's (exact: small integers)."""
    devs = rt.devices()
    n, count = len(devs), 300_007
    with communicators(devs, "mesh") as comms:
        before = [d.handle.hccl_info()["stats"] for d in devs]
        run_and_check(comms, pool, "allreduce", count, inplace=inplace, seed=5)
        after = [d.handle.hccl_info()["stats"] for d in devs]
    chunk = [ln * 4 for _, ln in chunks(count, n)]
    for key in ("bytes_pulled", "bytes_pushed"):
        assert [a[key] - b[key] for a, b in zip(after, before)] == [(n - 1) * c for c in chunk], key
    assert [a["bytes_same-node"] - b["bytes_same-node"] for a, b in zip(after, before)] == \
        [2 * (n - 1) * c for c in chunk]


@pytest.mark.parametrize("algo", ["mesh", "ring", "hd"])
def test_a_rank_that_gave_up_is_never_accessed_by_a_late_peer(rt, pool, algo):
    """Rank 1 names its buffers (its "ready"), then gives up (its peer is late: HCCL_E_TIMEOUT) and its user
    reuses them -- here: writes a secret into both (as another tenant's data in memory handed on would be).
    When rank 0 finally runs the operator it has rank 1's "ready" in its mailbox and goes on to read rank 1's
    buffers (every algorithm) and to write rank 1's receive buffer (the mesh's push) -- neither may happen:
    rank 1 bumped its fence when it gave up, so rank 0's accesses are refused (HCCL_E_REMOTE), no byte of
    the secret reaches rank 0 and rank 1's buffers keep what its user put there."""
    devs = rt.devices()[:2]
    count = 300_000                                          # several 256 KiB segments per chunk
    comms = hccl.comm_init_all(devs, hccl.CommOptions(algo=algo, exec_timeout_s=1))
    gate = threading.Event()
    try:
        sends = [pool.put(d, np.full(count, r + 1.0, np.float32)) for r, d in enumerate(devs)]
        recvs = [pool.put(d, np.zeros(count, np.float32)) for d in devs]
        gate_stream(devs[0].default_stream, gate)           # rank 0 is late ...
        for c, s, rv in zip(comms, sends, recvs):
            c.all_reduce(s, rv)
        assert sync_error(devs[1]).hccl_code == HCCL_E_TIMEOUT      # ... so rank 1 gives up
        secret = 1e6 + np.arange(count, dtype=np.float32)   # and its user's memory holds something else
        for t in (sends[1], recvs[1]):
            devs[1].memcpy_h2d(t.ptr, secret)
        gate.set()                                           # now rank 0 runs its part
        assert isinstance(sync_error(devs[0]), HcclError)
        assert recvs[0].numpy().max() < 1e5                  # nothing of rank 1's reused memory was read
        for t in (sends[1], recvs[1]):
            np.testing.assert_array_equal(t.numpy(), secret)         # nor written
    finally:
        gate.set()
        drain(devs)
        for c in comms:
            c.destroy()


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_send_recv_ring_shift(request, rt, pool, n):
    """Rank r sends to r+1 and receives from r-1 (rank 0 sends first, the others receive first)."""
    devs = devices_for(request, rt, n)
    with communicators(devs) as comms:
        for dtype, count in (("float32", 1), ("float32", 1001), ("int64", 7), ("bfloat16", 7)):
            x = np.stack([np.full(count, 10 * r + 1.0) + np.arange(count) for r in range(n)]) % 100
            sends = [pool.put(d, encode(x[r], dtype)) for r, d in enumerate(devs)]
            recvs = [pool.put(d, encode(np.full(count, float(SENTINEL)), dtype)) for d in devs]
            for r, c in enumerate(comms):
                nxt, prev = (r + 1) % n, (r - 1) % n
                if dtype == "bfloat16":
                    send = lambda: c.collective("send", sends[r].ptr, 0, count, "bfloat16", peer=nxt)  # noqa: E731
                    recv = lambda: c.collective("recv", 0, recvs[r].ptr, count, "bfloat16", peer=prev)  # noqa: E731
                else:
                    send = lambda: c.send(sends[r], nxt)  # noqa: E731
                    recv = lambda: c.recv(recvs[r], prev)  # noqa: E731
                if r == 0:
                    send()
                    recv()
                else:
                    recv()
                    send()
            sync_all(devs)
            for r in range(n):
                got = decode(recvs[r].numpy(), dtype)
                assert np.array_equal(got, x[(r - 1) % n]), f"{dtype} rank {r}"
                assert np.array_equal(decode(sends[r].numpy(), dtype), x[r])
            pool.free()


def test_send_recv_size_mismatch(rt, pool):
    devs = rt.devices()[:2]
    with communicators(devs) as comms:
        a = pool.put(devs[0], np.ones(8, np.float32))
        b = pool.put(devs[1], np.zeros(9, np.float32))
        comms[0].send(a, 1)
        comms[1].recv(b, 0)
        e = sync_error(devs[1])
        assert e.hccl_code == HCCL_E_PARA
        devs[0].synchronize()                     # the sender is released, not left hanging


def test_barrier_waits_for_every_rank(rt):
    """Rank 1 is held by a gate: rank 0's work after the barrier cannot complete until it is let go."""
    devs = rt.devices()
    gate = threading.Event()
    with communicators(devs) as comms:
        try:
            gate_stream(devs[1].default_stream, gate)
            for c in comms:
                c.barrier()
            ev = devs[0].event()
            ev.record(devs[0].default_stream)
            assert not ev.query(), "rank 0 passed the barrier while rank 1 had not reached it"
        finally:
            gate.set()
        sync_all(devs)
        assert ev.query()
        assert all(hccl.HcclBarrier(c, c.device.default_stream) == HCCL_SUCCESS for c in comms)
        sync_all(devs)
        ev.destroy()


def test_no_messages_left_behind(rt, pool):
    """After collectives complete, no doorbell message of the communicator stays in any mailbox
    (a signal nobody waits for would pile up for the communicator's lifetime)."""
    if rt.backend.name != "local":
        pytest.skip("inspects the in-process engine")
    devs = rt.devices()
    for algo in ALGOS:
        with communicators(devs, algo) as comms:
            for count in (1, 7, 1001):
                for op in COLLECTIVES:
                    run_and_check(comms, pool, op, count, root=1)
                pool.free()
            cid = comms[0].comm_id
            for d in devs:
                mb = rt.backend.device(d.physical_id).hccl.mailbox
                left = mb.pending(cid)
                assert not left, f"{algo}: device {d.index} still holds {left[:4]}"


def test_mailbox_pending_view_takes_nothing_and_wait_pending_wakes_on_put():
    """The mailbox's read-only view (what the tests gate on): ``pending`` lists the keys received and not
    taken (per communicator; an abort is not a message), ``wait_pending`` blocks until n are there or its
    timeout passes (``waiters`` counts it meanwhile), and neither takes anything."""
    import time

    from devices.hccl import ABORT_TAG, Mailbox
    mb = Mailbox()
    mb.put(("c1", 0, "x", 1), b"a")
    mb.put(("c2", 0, "x", 1), b"b")
    mb.put(("c1", 0, ABORT_TAG, 2), (HCCL_E_REMOTE, "gone"))          # an abort: not a pending message
    assert sorted(mb.pending()) == [("c1", 0, "x", 1), ("c2", 0, "x", 1)]
    assert mb.pending("c1") == [("c1", 0, "x", 1)] and mb.pending("c3") == []
    assert not mb.wait_pending(2, 0.01, "c1")                            # times out: only one of c1
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(mb.wait_pending(2, 120, "c1")), daemon=True)
    waiter.start()
    # the put below comes once the waiter waits: only the wake-up ends it
    assert mb.wait_waiters(1, 30) and waiter.is_alive(), "the waiter never waited"
    mb.put(("c1", 1, "x", 1), b"c")
    waiter.join(30)                          # far below the waiter's own 120 s: woken by the put, not timed out
    assert not waiter.is_alive() and got == [True] and mb.waiters() == 0
    assert len(mb.pending("c1")) == 2                                    # nothing was taken
    assert mb.take([("c2", 0, "x", 1)], time.monotonic() + 5, lambda missing: None, lambda: False) == [b"b"]
    assert mb.pending("c2") == [] and len(mb.pending()) == 2


def test_small_collectives_reuse_the_communicators_buffers(rt, pool):
    """Small operators work in the communicator's two CCL buffers (no allocation or free per operator,
    so the device's cached launch plans and graph bindings stay valid), and a oneshot AllReduce is one
    round of doorbells: n - 1 messages per rank.  The buffers go with the communicator."""
    if rt.backend.name != "local":
        pytest.skip("inspects the in-process engine")
    devs = rt.devices()
    n = len(devs)
    engines = [rt.backend.device(d.physical_id) for d in devs]
    for d in devs:
        d.empty_cache()                   # the driver's view below: no cached pool segments on either side
    used0 = [d.mem_info() for d in devs]
    x = np.arange(n * 300, dtype=np.float32).reshape(n, 300)
    ts = [pool.put(d, x[r]) for r, d in enumerate(devs)]
    with communicators(devs) as comms:
        for c, t in zip(comms, ts):
            c.all_reduce(t, t)
        sync_all(devs)
        gens = [e.arena.gen for e in engines]
        msgs = [e.hccl.stats["messages"] for e in engines]
        for k in range(2, 12):
            for c, t in zip(comms, ts):
                c.all_reduce(t, t)
            sync_all(devs)
            for t in ts:
                np.testing.assert_array_equal(t.numpy(), x.sum(0) * n ** (k - 1))
        assert [e.arena.gen for e in engines] == gens                     # nothing freed
        assert [e.hccl.stats["messages"] - m for e, m in zip(engines, msgs)] == [10 * (n - 1)] * n
    pool.free()
    for d in devs:
        d.empty_cache()
    assert [d.mem_info() for d in devs] == used0                          # destroy returned them


# ------------------------------------------------------------------------------------------ overlap
def test_all_reduce_overlapped_with_compute(rt, pool):
    """Stream A computes (held by a gate first), records an event; stream B waits on it and all-reduces
    the result; stream C computes something else meanwhile and finishes while A is still held."""
    devs = rt.devices()
    n = len(devs)
    base = [np.arange(1001, dtype=np.float32) + r for r in range(n)]
    other0 = np.linspace(0, 1, 513, dtype=np.float32)
    gate = threading.Event()
    events = []
    with communicators(devs, "ring") as comms:
        try:
            work = []
            for r, (c, d) in enumerate(zip(comms, devs)):
                sa, sb, sc = d.stream(), d.stream(), d.stream()
                x = pool.put(d, base[r])
                y = pool.put(d, np.full(1001, -1.0, np.float32))      # stale contents the event must hide
                z = pool.put(d, other0)
                ev = d.event()
                events.append(ev)
                gate_stream(sa, gate)
                sa.launch("mul_scalar", [x], [y], attrs={"value": 3.0})
                ev.record(sa)
                sb.wait(ev)
                c.all_reduce(y, stream=sb)
                for _ in range(10):
                    sc.launch("add_scalar", [z], [z], attrs={"value": 0.5})
                work.append((sa, sb, sc, y, z))
            for _, _, sc, _, _ in work:
                sc.synchronize()                      # C is independent of the held stream A ...
            assert not any(ev.query() for ev in events)   # ... while A (and so B) is still held
        finally:
            gate.set()
        for sa, sb, sc, y, z in work:
            sb.synchronize()
            want = 3.0 * np.sum(base, axis=0)
            np.testing.assert_array_equal(y.numpy(sb), want)
            assert_within(z.numpy(sc), other0 + 5.0, gamma(10) * (other0 + 5.0))     # ten float32 adds
            for s in (sa, sb, sc):
                s.destroy()
    for ev in events:
        ev.destroy()


# ------------------------------------------------------------------------------------------ C-style API
def test_c_api_success_codes(rt, pool):
    devs = rt.devices()
    n = len(devs)
    with communicators(devs) as comms:
        s = [c.device.default_stream for c in comms]
        x = [pool.put(d, np.arange(8, dtype=np.float32) + r) for r, d in enumerate(devs)]
        y = [pool.put(d, np.zeros(8 * n, np.float32)) for d in devs]
        z = [pool.put(d, np.zeros(8, np.float32)) for d in devs]
        for r, c in enumerate(comms):
            assert hccl.HcclGetRankSize(c) == (n, HCCL_SUCCESS)
            assert hccl.HcclGetRankId(c) == (r, HCCL_SUCCESS)
            assert hccl.HcclAllReduce(x[r].ptr, z[r].ptr, 8, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM,
                                      c, s[r]) == HCCL_SUCCESS
        sync_all(devs)
        for r in range(n):
            np.testing.assert_array_equal(z[r].numpy(), sum(np.arange(8, dtype=np.float32) + q for q in range(n)))
        for r, c in enumerate(comms):
            assert hccl.HcclAllGather(x[r].ptr, y[r].ptr, 8, hccl.HCCL_DATA_TYPE_FP32, c, s[r]) == HCCL_SUCCESS
        sync_all(devs)
        for r in range(n):
            np.testing.assert_array_equal(y[r].numpy(), np.concatenate([np.arange(8) + q for q in range(n)]))
        for r, c in enumerate(comms):
            assert hccl.HcclReduceScatter(y[r].ptr, z[r].ptr, 8, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_MAX,
                                          c, s[r]) == HCCL_SUCCESS
        sync_all(devs)
        for r in range(n):
            np.testing.assert_array_equal(z[r].numpy(), np.arange(8) + r)
        for r, c in enumerate(comms):
            assert hccl.HcclBroadcast(x[r].ptr, 8, hccl.HCCL_DATA_TYPE_FP32, 2, c, s[r]) == HCCL_SUCCESS
        sync_all(devs)
        for r in range(n):
            np.testing.assert_array_equal(x[r].numpy(), np.arange(8) + 2)
        for r, c in enumerate(comms):
            assert hccl.HcclReduce(x[r].ptr, z[r].ptr, 8, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_PROD, 3, c,
                                   s[r]) == HCCL_SUCCESS
        sync_all(devs)
        np.testing.assert_array_equal(z[3].numpy(), (np.arange(8, dtype=np.float32) + 2) ** n)
        for r, c in enumerate(comms):
            assert hccl.HcclAlltoAll(y[r].ptr, 8, hccl.HCCL_DATA_TYPE_FP32, y[r].ptr, 8, hccl.HCCL_DATA_TYPE_FP32,
                                     c, s[r]) == HCCL_SUCCESS        # in place: y[r] block q = q's block r
        sync_all(devs)
        for r in range(n):
            np.testing.assert_array_equal(y[r].numpy(), np.tile(np.arange(8, dtype=np.float32) + r, n))
        for r, c in enumerate(comms):
            if r == 0:
                assert hccl.HcclSend(x[r].ptr, 8, hccl.HCCL_DATA_TYPE_FP32, 1, c, s[r]) == HCCL_SUCCESS
            elif r == 1:
                assert hccl.HcclRecv(z[r].ptr, 8, hccl.HCCL_DATA_TYPE_FP32, 0, c, s[r]) == HCCL_SUCCESS
            assert hccl.HcclBarrier(c, s[r]) == HCCL_SUCCESS
        sync_all(devs)
        np.testing.assert_array_equal(z[1].numpy(), np.arange(8) + 2)
        for c in comms:
            assert hccl.HcclCommDestroy(c) == HCCL_SUCCESS


def test_c_api_parameter_errors(rt, pool):
    """Bad calls return HCCL_E_PARA at the call and enqueue nothing: a good AllReduce afterwards still
    matches on every rank."""
    devs = rt.devices()
    n = len(devs)
    fp32 = hccl.HCCL_DATA_TYPE_FP32
    with communicators(devs) as comms:
        s = [c.device.default_stream for c in comms]
        x = [pool.put(d, np.full(8, r + 1.0, np.float32)) for r, d in enumerate(devs)]
        big = [pool.put(d, np.zeros(8 * n, np.float32)) for d in devs]
        for r, c in enumerate(comms):
            p, q = x[r].ptr, big[r].ptr
            bad = {
                "dtype 13 (unused)": hccl.HcclAllReduce(p, p, 8, 13, 0, c, s[r]),
                "dtype 255": hccl.HcclAllReduce(p, p, 8, 255, 0, c, s[r]),
                "dtype -1": hccl.HcclAllGather(p, q, 8, -1, c, s[r]),
                "reduce op 7": hccl.HcclAllReduce(p, p, 8, fp32, 7, c, s[r]),
                "reduce op 255": hccl.HcclReduceScatter(q, p, 8, fp32, 255, c, s[r]),
                "negative count": hccl.HcclAllReduce(p, p, -1, fp32, 0, c, s[r]),
                "broadcast root n": hccl.HcclBroadcast(p, 8, fp32, n, c, s[r]),
                "broadcast root -1": hccl.HcclBroadcast(p, 8, fp32, -1, c, s[r]),
                "reduce root n+5": hccl.HcclReduce(p, q, 8, fp32, 0, n + 5, c, s[r]),
                "send to self": hccl.HcclSend(p, 8, fp32, r, c, s[r]),
                "send to rank n": hccl.HcclSend(p, 8, fp32, n, c, s[r]),
                "recv from -1": hccl.HcclRecv(p, 8, fp32, -1, c, s[r]),
                "alltoall counts differ": hccl.HcclAlltoAll(q, 8, fp32, q, 4, fp32, c, s[r]),
                "alltoall types differ": hccl.HcclAlltoAll(q, 8, fp32, q, 8, hccl.HCCL_DATA_TYPE_INT32, c, s[r]),
                "allreduce count > buffer": hccl.HcclAllReduce(p, p, 9, fp32, 0, c, s[r]),
                "allgather recv too small": hccl.HcclAllGather(q, p, 8, fp32, c, s[r]),
                "reducescatter send too small": hccl.HcclReduceScatter(p, q, 8, fp32, 0, c, s[r]),
                "misaligned buffer": hccl.HcclAllReduce(q + 2, q + 2, 4, fp32, 0, c, s[r]),
            }
            wrong = {k: v for k, v in bad.items() if v != HCCL_E_PARA}
            assert not wrong, f"rank {r}: expected HCCL_E_PARA (1), got {wrong}"
        # tensor-level size mismatches raise HcclError(E_PARA) at the call
        with pytest.raises(HcclError) as ei:
            comms[0].all_gather(x[0], x[0])
        assert ei.value.hccl_code == HCCL_E_PARA
        with pytest.raises(HcclError) as ei:
            comms[0].all_reduce(x[0], big[0])
        assert ei.value.hccl_code == HCCL_E_PARA
        with pytest.raises(HcclError) as ei:
            comms[0].collective("allreduce", x[0].ptr, x[0].ptr, 8, 12)     # INT128: no such dtype here
        assert ei.value.hccl_code == HCCL_E_PARA
        for r, c in enumerate(comms):
            assert hccl.HcclAllReduce(x[r].ptr, x[r].ptr, 8, fp32, hccl.HCCL_REDUCE_SUM, c, s[r]) == HCCL_SUCCESS
        sync_all(devs)
        for r in range(n):
            np.testing.assert_array_equal(x[r].numpy(), np.full(8, n * (n + 1) / 2, np.float32))


# ------------------------------------------------------------------------------------------ rank tables
REFERENCE_TABLE = {
    "status": "completed", "version": "1.0", "server_count": "2",
    "server_list": [
        {"server_id": "node_0",
         "device": [{"device_id": "0", "device_ip": "192.168.1.8", "device_port": "16667", "rank_id": "0"},
                    {"device_id": "1", "device_ip": "192.168.1.9", "device_port": "16667", "rank_id": "1"}]},
        {"server_id": "node_1",
         "device": [{"device_id": "0", "device_ip": "192.168.2.8", "device_port": "16667", "rank_id": "2"},
                    {"device_id": "1", "device_ip": "192.168.2.9", "device_port": "16667", "rank_id": "3"}]}]}


def test_parse_rank_table_reference_format():
    want = [(0, 0, "node_0"), (1, 1, "node_0"), (2, 0, "node_1"), (3, 1, "node_1")]
    assert hccl.parse_rank_table(REFERENCE_TABLE) == want
    assert hccl.parse_rank_table(json.dumps(REFERENCE_TABLE)) == want
    # ranks listed out of order come back sorted by rank
    t = json.loads(json.dumps(REFERENCE_TABLE))
    t["server_list"].reverse()
    assert hccl.parse_rank_table(t) == want


def _table(mutate):
    t = json.loads(json.dumps(REFERENCE_TABLE))
    mutate(t)
    return t


MALFORMED = {
    "not json": "{not json",
    "not an object": "[1, 2]",
    "no server_list": _table(lambda t: t.pop("server_list")),
    "server without devices": _table(lambda t: t["server_list"][0].pop("device")),
    "device without rank_id": _table(lambda t: t["server_list"][0]["device"][0].pop("rank_id")),
    "device without device_id": _table(lambda t: t["server_list"][1]["device"][1].pop("device_id")),
    "rank_id not a number": _table(lambda t: t["server_list"][0]["device"][1].update(rank_id="one")),
    "duplicate rank_id": _table(lambda t: t["server_list"][1]["device"][0].update(rank_id="1")),
    "rank ids with a gap": _table(lambda t: t["server_list"][1]["device"][1].update(rank_id="7")),
    "status initializing": _table(lambda t: t.update(status="initializing")),
    "server_list not a list": _table(lambda t: t.update(server_list=5)),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_parse_rank_table_malformed(name):
    with pytest.raises(HcclError) as ei:
        hccl.parse_rank_table(MALFORMED[name])
    assert ei.value.hccl_code == HCCL_E_PARA


def test_comm_init_cluster_info(rt, pool, tmp_path):
    """One rank table, one call per rank (ranks deliberately not in device order), then an AllReduce;
    the table may also be given as a file path."""
    devs = rt.devices()
    order = [2, 0, 3, 1]                         # rank i runs on devs[order[i]]
    table = {"status": "completed", "version": "1.0", "server_count": "1",
             "server_list": [{"server_id": "node_0", "device": [
                 {"device_id": str(devs[order[i]].physical_id), "rank_id": str(i)} for i in range(4)]}]}
    path = tmp_path / "rank_table.json"
    path.write_text(json.dumps(table))
    opts = hccl.CommOptions(exec_timeout_s=30)
    comms = [hccl.comm_init_cluster_info(table if i % 2 else str(path), i, opts, runtime=rt) for i in range(4)]
    try:
        for i, c in enumerate(comms):
            assert (c.rank, c.size) == (i, 4)
            assert c.device.physical_id == devs[order[i]].physical_id
        ts = [pool.put(c.device, np.full(5, 10.0 ** i, np.float32)) for i, c in enumerate(comms)]
        for c, t in zip(comms, ts):
            c.all_reduce(t)
        for t in ts:
            np.testing.assert_array_equal(t.numpy(), np.full(5, 1111.0, np.float32))
        # rank 0 gathers in rank order, whatever devices the ranks run on
        g = pool.put(comms[0].device, np.zeros(4, np.float32))
        parts = [pool.put(c.device, np.full(1, float(i), np.float32)) for i, c in enumerate(comms)]
        for i, c in enumerate(comms):
            c.all_gather(parts[i], g if i == 0 else pool.put(c.device, np.zeros(4, np.float32)))
        np.testing.assert_array_equal(g.numpy(), np.arange(4, dtype=np.float32))
    finally:
        drain(devs)                 # destroy waits for nothing: every rank's operators must be done
        for c in comms:
            c.destroy()
    with pytest.raises(HcclError) as ei:
        hccl.comm_init_cluster_info(table, 4, opts, runtime=rt)
    assert ei.value.hccl_code == HCCL_E_PARA
    for bad in ("duplicate rank_id", "not json", "status initializing"):
        with pytest.raises(HcclError) as ei:
            hccl.comm_init_cluster_info(MALFORMED[bad], 0, opts, runtime=rt)
        assert ei.value.hccl_code == HCCL_E_PARA, bad


# ------------------------------------------------------------------------------------------ root info
def test_root_info_rendezvous(rt, pool):
    """get_root_info on rank 0's device; every rank joins from its own thread (the call blocks until all
    ranks joined); then an AllReduce works."""
    devs = rt.devices()
    n = len(devs)
    info = hccl.get_root_info(devs[0])
    assert isinstance(info, bytes) and len(info) == hccl.HCCL_ROOT_INFO_BYTES
    got: dict[int, object] = {}

    def join(r):
        try:
            got[r] = hccl.comm_init_root_info(n, info, r, devs[r], hccl.CommOptions(exec_timeout_s=30),
                                              timeout_s=JOIN_TIMEOUT_S)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            got[r] = e
    threads = [threading.Thread(target=join, args=(r,), daemon=True) for r in reversed(range(n))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S + 5)
    assert not any(t.is_alive() for t in threads), "comm_init_root_info did not return"
    comms = [got[r] for r in range(n)]
    errors = [c for c in comms if not isinstance(c, hccl.Communicator)]
    assert not errors, errors
    try:
        assert [(c.rank, c.size, c.device) for c in comms] == [(r, n, devs[r]) for r in range(n)]
        assert len({c.comm_id for c in comms}) == 1
        ts = [pool.put(d, np.full(3, r + 1, np.int32)) for r, d in enumerate(devs)]
        for c, t in zip(comms, ts):
            c.all_reduce(t, op="max")
        for t in ts:
            np.testing.assert_array_equal(t.numpy(), np.full(3, n, np.int32))
    finally:
        drain(devs)
        for c in comms:
            c.destroy()


def test_root_info_errors(rt):
    devs = rt.devices()
    info = hccl.get_root_info(devs[0])
    for bad in (b"garbage", b"\0" * hccl.HCCL_ROOT_INFO_BYTES, b'{"comm": 1}'):
        with pytest.raises(HcclError) as ei:
            hccl.comm_init_root_info(2, bad, 1, devs[1], timeout_s=1)
        assert ei.value.hccl_code == HCCL_E_PARA
    for nranks, rank in ((2, 2), (2, -1), (0, 0)):
        with pytest.raises(HcclError) as ei:
            hccl.comm_init_root_info(nranks, info, rank, devs[1], timeout_s=1)
        assert ei.value.hccl_code == HCCL_E_PARA
    with pytest.raises(HcclError) as ei:               # rank 0 is the root: it must be on the root device
        hccl.comm_init_root_info(2, info, 0, devs[1], timeout_s=1)
    assert ei.value.hccl_code == HCCL_E_PARA


def test_root_info_join_times_out_without_root(rt):
    """A rank whose root never shows up gives up after its timeout with HCCL_E_TIMEOUT."""
    devs = rt.devices()
    info = hccl.get_root_info(devs[2])
    with pytest.raises(HcclError) as ei:
        hccl.comm_init_root_info(2, info, 1, devs[3], timeout_s=0.5)
    assert ei.value.hccl_code == HCCL_E_TIMEOUT


# ------------------------------------------------------------------------------------------ failures
def test_mismatched_operators_fail_every_rank(rt, pool):
    devs = rt.devices()[:2]
    with communicators(devs) as comms:
        ts = [pool.put(d, np.ones(9, np.float32)) for d in devs]
        comms[0].collective("allreduce", ts[0].ptr, ts[0].ptr, 8, "float32")
        comms[1].collective("allreduce", ts[1].ptr, ts[1].ptr, 9, "float32")
        for d in devs:
            assert sync_error(d).hccl_code == HCCL_E_PARA
        assert [c.async_error() for c in comms] == [HCCL_E_PARA, HCCL_E_PARA]


def test_mismatched_op_kinds_fail_every_rank(rt, pool):
    devs = rt.devices()[:3]
    with communicators(devs) as comms:
        ts = [pool.put(d, np.ones(6, np.float32)) for d in devs]
        comms[0].all_reduce(ts[0])
        comms[1].all_reduce(ts[1], op="max")
        comms[2].broadcast(ts[2], 0)
        for d in devs:
            assert sync_error(d).hccl_code == HCCL_E_PARA


def test_peer_never_arrives_times_out_then_new_comm_works(rt, pool):
    devs = rt.devices()[:2]
    comms = hccl.comm_init_all(devs, hccl.CommOptions(exec_timeout_s=1))
    try:
        t0 = pool.put(devs[0], np.ones(4, np.float32))
        comms[0].all_reduce(t0)                    # rank 1 never issues its part
        e = sync_error(devs[0])
        assert e.hccl_code == HCCL_E_TIMEOUT
        assert comms[0].async_error() == HCCL_E_TIMEOUT
        assert comms[1].async_error() == HCCL_SUCCESS
    finally:
        drain(devs)
        for c in comms:
            c.destroy()
    with communicators(devs) as fresh:
        ts = [pool.put(d, np.full(4, r + 1.0, np.float32)) for r, d in enumerate(devs)]
        for c, t in zip(fresh, ts):
            c.all_reduce(t)
        for t in ts:
            np.testing.assert_array_equal(t.numpy(), np.full(4, 3.0, np.float32))


def test_destroyed_communicator_rejects_operators(rt, pool):
    devs = rt.devices()[:2]
    comms = hccl.comm_init_all(devs)
    for c in comms:
        c.destroy()
    t = pool.put(devs[0], np.ones(2, np.float32))
    with pytest.raises(HcclError) as ei:
        comms[0].all_reduce(t)
    assert ei.value.hccl_code == HCCL_E_PARA
    assert hccl.HcclAllReduce(t.ptr, t.ptr, 2, hccl.HCCL_DATA_TYPE_FP32, 0, comms[0],
                              devs[0].default_stream) == HCCL_E_PARA


def test_comm_init_all_rejects_bad_device_lists(rt):
    devs = rt.devices()
    with pytest.raises(HcclError) as ei:
        hccl.comm_init_all([])
    assert ei.value.hccl_code == HCCL_E_PARA
    with pytest.raises(HcclError) as ei:
        hccl.comm_init_all([devs[0], devs[1], devs[0]])
    assert ei.value.hccl_code == HCCL_E_PARA


def test_killed_device_fails_peers_with_remote_error():
    """Ranks 0-2 enter an AllReduce while rank 3 is held by a gate; rank 3's device is closed (its
    process "dies"); the survivors fail with HCCL_E_REMOTE long before the 60 s exec timeout, and a new
    communicator over the survivors works."""
    r = make_local_runtime(4)
    gate = threading.Event()
    try:
        devs = r.devices()
        comms = hccl.comm_init_all(devs, hccl.CommOptions(exec_timeout_s=60, algo="ring"))
        ts = [d.from_numpy(np.full(1001, i + 1.0, np.float32)) for i, d in enumerate(devs)]
        gate_stream(devs[3].default_stream, gate)
        for c, t in zip(comms, ts):
            c.all_reduce(t)
        # ranks 0-2 are inside the collective once their "ready" messages reached rank 3's mailbox
        victim = r.backend.device(devs[3].physical_id)
        mb = victim.hccl.mailbox
        assert mb.wait_pending(3, GATE_TIMEOUT_S), "the other ranks never entered the AllReduce"
        victim.close()
        gate.set()
        for d in devs[:3]:
            e = sync_error(d)
            assert e.hccl_code == HCCL_E_REMOTE, e
        for i, c in enumerate(comms[:3]):
            assert c.async_error() == HCCL_E_REMOTE
            c.destroy()
        comms[3].destroy()                          # its device is gone: nothing left to free
        survivors = devs[:3]
        with communicators(survivors, "ring") as fresh:
            xs = [d.from_numpy(np.full(7, 2.0 ** i, np.float32)) for i, d in enumerate(survivors)]
            for c, x in zip(fresh, xs):
                c.all_reduce(x)
            for x in xs:
                np.testing.assert_array_equal(x.numpy(), np.full(7, 7.0, np.float32))
                x.free()
        for t in ts[:3]:
            t.free()
    finally:
        gate.set()
        r.close()


# ------------------------------------------------------------------------------------------ enums
def test_enum_values():
    assert (hccl.HCCL_DATA_TYPE_INT8, hccl.HCCL_DATA_TYPE_INT16, hccl.HCCL_DATA_TYPE_INT32,
            hccl.HCCL_DATA_TYPE_FP16, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_DATA_TYPE_INT64,
            hccl.HCCL_DATA_TYPE_UINT64, hccl.HCCL_DATA_TYPE_UINT8, hccl.HCCL_DATA_TYPE_UINT16,
            hccl.HCCL_DATA_TYPE_UINT32, hccl.HCCL_DATA_TYPE_FP64, hccl.HCCL_DATA_TYPE_BFP16) == tuple(range(12))
    assert (hccl.HCCL_REDUCE_SUM, hccl.HCCL_REDUCE_PROD, hccl.HCCL_REDUCE_MAX, hccl.HCCL_REDUCE_MIN) == (0, 1, 2, 3)
    assert hccl.HCCL_ROOT_INFO_BYTES == 4108
    assert (HCCL_SUCCESS, HCCL_E_PARA, HCCL_E_TIMEOUT, HCCL_E_REMOTE) == (0, 1, 9, 21)
