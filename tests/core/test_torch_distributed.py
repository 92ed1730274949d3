"""``runtime.torch.distributed`` in one process: ranks are threads, each driving its own in-process device
(``npu:<rank>``) through a :class:`ProcessGroupHCCL` of its own over one shared store -- the operators that
``torch.distributed``'s functions call, each checked against numpy; bad arguments (ValueError at the call);
failures (a peer that never comes, a link down, a killed device) raising DistBackendError within the exec
timeout and aborting the group.  Across processes (torchrun, Ray actors): tests/cluster/test_torch_distributed_cluster.py."""
from __future__ import annotations

import datetime
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch._C._distributed_c10d import (AllgatherOptions, AllreduceOptions, AllToAllOptions,  # noqa: E402
                                        BarrierOptions, BroadcastOptions, GatherOptions, ReduceOp, ReduceOptions,
                                        ReduceScatterOptions, ScatterOptions)

import runtime.torch  # noqa: E402,F401
from conftest import installed, make_local_runtime  # noqa: E402
from devices.errors import HCCL_E_NETWORK, HCCL_E_REMOTE, HCCL_E_TIMEOUT  # noqa: E402
from runtime.torch.distributed import HcclOptions, ProcessGroupHCCL, is_hccl_available  # noqa: E402

N = 2
RANK_TIMEOUT_S = 120.0       # a thread rank that has not finished by then fails the test (never hangs it)


@pytest.fixture(scope="module", autouse=True)
def rt():
    with installed(make_local_runtime(3, arena=16 << 20)) as r:
        yield r


def ranks(fn, n: int = N, timeout_s: float = 30.0, options: HcclOptions | None = None, store=None):
    """Run ``fn(pg, rank, dev)`` on ``n`` thread ranks (rank r on npu:r, a fresh group each); returns
    each rank's result or the exception it raised.  The groups are shut down after."""
    store = store or dist.HashStore()
    out: list = [None] * n

    def body(r):
        torch.npu.set_device(r)
        pg = ProcessGroupHCCL(store, r, n, datetime.timedelta(seconds=timeout_s), options)
        try:
            out[r] = fn(pg, r, torch.device("npu", r))
        except Exception as e:  # noqa: BLE001 - handed to the test
            out[r] = e
        finally:
            pg.shutdown()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RANK_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a rank did not finish"
    return out


def ok(results):
    bad = [r for r in results if isinstance(r, BaseException)]
    if bad:
        raise bad[0]
    return results


def data(rank, n=6, dtype=np.float32):
    return np.random.default_rng(10 + rank).integers(-9, 10, n).astype(dtype)


def npu(arr, dev):
    return torch.from_numpy(np.ascontiguousarray(arr)).to(dev)


def opts(cls, **kw):
    o = cls()
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def test_registered_for_npu():
    assert is_hccl_available()
    assert "hccl" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["npu"] == "hccl"


def test_init_process_group_with_pg_options():
    """The path user code takes: ``init_process_group("hccl", pg_options=HcclOptions(...))`` builds this
    backend's group (its exec timeout from the options), and ``dist.*`` calls reach it."""
    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1,
                            pg_options=HcclOptions(exec_timeout_s=3.0))
    try:
        pg = dist.distributed_c10d._get_default_group()
        assert isinstance(pg, ProcessGroupHCCL) and pg.exec_timeout_s == 3.0 and dist.get_backend() == "hccl"
        x = torch.full((3,), 2.0, device="npu:0")
        w = dist.all_reduce(x, op=dist.ReduceOp.PRODUCT, async_op=True)
        assert w.wait() and w.is_completed()
        assert x.cpu().tolist() == [2.0, 2.0, 2.0]
        dist.barrier()
    finally:
        dist.destroy_process_group()
    with pytest.raises(ValueError) as ei:
        dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1, pg_options=object())
    assert "HcclOptions" in str(ei.value)
    assert not dist.is_initialized()


@pytest.mark.parametrize("op,ref", [(ReduceOp.SUM, np.sum), (ReduceOp.PRODUCT, np.prod), (ReduceOp.MAX, np.max),
                                    (ReduceOp.MIN, np.min), (ReduceOp.AVG, np.mean)])
def test_all_reduce_every_op(op, ref):
    every = np.stack([data(r) for r in range(N)])

    def fn(pg, r, dev):
        x = npu(data(r), dev)
        pg.allreduce([x], opts(AllreduceOptions, reduceOp=op)).wait()
        return x.cpu().numpy()
    for got in ok(ranks(fn)):
        np.testing.assert_allclose(got, ref(every, axis=0), rtol=1e-6)


def test_all_reduce_int64_bool_and_cpu_tensors():
    def fn(pg, r, dev):
        i = npu(data(r, dtype=np.int64) * 1000003, dev)
        pg.allreduce([i], AllreduceOptions()).wait()
        b = npu(np.array([r == 0, False, True]), dev)            # SUM of bools is a logical or
        pg.allreduce([b], AllreduceOptions()).wait()
        c = torch.from_numpy(data(r))                             # a CPU tensor: staged through npu:r
        pg.allreduce([c], opts(AllreduceOptions, reduceOp=ReduceOp.MAX)).wait()
        return i.cpu().numpy(), b.cpu().numpy(), c.numpy()
    every = np.stack([data(r) for r in range(N)])
    for i, b, c in ok(ranks(fn)):
        np.testing.assert_array_equal(i, (every.astype(np.int64) * 1000003).sum(0))
        np.testing.assert_array_equal(b, [True, False, True])
        np.testing.assert_array_equal(c, every.max(0))


def test_gathers_scatters_broadcast_and_all_to_all():
    every = np.stack([data(r) for r in range(N)])
    big = [data(20 + r, 2 * N) for r in range(N)]

    def fn(pg, r, dev):
        outs = [torch.empty(6, device=dev) for _ in range(N)]
        pg.allgather([outs], [npu(data(r), dev)], AllgatherOptions()).wait()
        flat = torch.empty(6 * N, device=dev)
        pg.all_gather_single(flat, npu(data(r), dev), AllgatherOptions()).wait()
        rs = torch.empty(2, device=dev)
        pg.reduce_scatter_single(rs, npu(big[r], dev), ReduceScatterOptions()).wait()
        rsl = torch.empty(2, device=dev)
        pg.reduce_scatter([rsl], [[npu(big[r][2 * q:2 * q + 2], dev) for q in range(N)]],
                          ReduceScatterOptions()).wait()
        bc = npu(data(r), dev)
        pg.broadcast([bc], opts(BroadcastOptions, rootRank=1)).wait()
        a2a = torch.empty(2 * N, device=dev)
        pg.all_to_all_single(a2a, npu(np.arange(2 * N, dtype=np.float32) + 100 * r, dev), [], [],
                             AllToAllOptions()).wait()
        a2l = [torch.empty(3, device=dev) for _ in range(N)]
        pg.alltoall(a2l, [npu(np.full(3, 10 * r + q, np.float32), dev) for q in range(N)], AllToAllOptions()).wait()
        red = npu(data(r), dev)
        pg.reduce([red], opts(ReduceOptions, rootRank=0, reduceOp=ReduceOp.SUM)).wait()
        gat = [torch.empty(6, device=dev) for _ in range(N)] if r == 0 else []
        pg.gather([gat], [npu(data(r), dev)], opts(GatherOptions, rootRank=0)).wait()
        sc = torch.empty(3, device=dev)
        parts = [[npu(np.full(3, 7 + q, np.float32), dev) for q in range(N)]] if r == 1 else []
        pg.scatter([sc], parts, opts(ScatterOptions, rootRank=1)).wait()
        pg.barrier(BarrierOptions()).wait()
        cpu = lambda ts: [t.cpu().numpy() for t in ts]  # noqa: E731
        return dict(outs=cpu(outs), flat=flat.cpu().numpy(), rs=rs.cpu().numpy(), rsl=rsl.cpu().numpy(),
                    bc=bc.cpu().numpy(), a2a=a2a.cpu().numpy(), a2l=cpu(a2l), red=red.cpu().numpy(),
                    gat=cpu(gat), sc=sc.cpu().numpy())
    res = ok(ranks(fn))
    for r, g in enumerate(res):
        np.testing.assert_array_equal(np.stack(g["outs"]), every)
        np.testing.assert_array_equal(g["flat"], every.reshape(-1))
        np.testing.assert_array_equal(g["rs"], np.sum(big, 0)[2 * r:2 * r + 2])
        np.testing.assert_array_equal(g["rsl"], np.sum(big, 0)[2 * r:2 * r + 2])
        np.testing.assert_array_equal(g["bc"], data(1))
        a2a = np.concatenate([np.array([2 * r, 2 * r + 1]) + 100 * q for q in range(N)])
        np.testing.assert_array_equal(g["a2a"], a2a)
        np.testing.assert_array_equal(np.stack(g["a2l"]), [np.full(3, 10 * q + r) for q in range(N)])
        np.testing.assert_array_equal(g["sc"], np.full(3, 7 + r))
    np.testing.assert_array_equal(res[0]["red"], every.sum(0))
    np.testing.assert_array_equal(np.stack(res[0]["gat"]), every)


def test_send_recv_and_async_work():
    def fn(pg, r, dev):
        if r == 0:
            w = pg.send([npu(data(5), dev)], 1, 0)
            w.wait()
            return w.is_completed() and w.is_success()
        got = torch.empty(6, device=dev)
        w = pg.recv([got], 0, 0)
        fut = w.get_future()
        return fut.wait()[0].cpu().numpy()
    sent, got = ok(ranks(fn))
    assert sent is True
    np.testing.assert_array_equal(got, data(5))


def bad_call(pg, r, dev, what):
    x = torch.ones(4, 4, device=dev)
    calls = {
        "non_contiguous": lambda: pg.allreduce([x.t()], AllreduceOptions()),
        "gather_sizes": lambda: pg.allgather([[torch.empty(3, device=dev)] * N], [torch.ones(4, device=dev)]),
        "uneven_splits": lambda: pg.all_to_all_single(torch.empty(4, device=dev), torch.ones(4, device=dev),
                                                      [1, 3], [3, 1], AllToAllOptions()),
        "bor": lambda: pg.allreduce([x], opts(AllreduceOptions, reduceOp=ReduceOp.BOR)),
        "avg_int": lambda: pg.allreduce([torch.ones(2, dtype=torch.int32).to(dev)],
                                        opts(AllreduceOptions, reduceOp=ReduceOp.AVG)),
        "other_device": lambda: pg.all_gather_single(torch.empty(2, device="npu:2"), torch.ones(2, device=dev),
                                                     AllgatherOptions()),
        "peer_self": lambda: pg.send([torch.ones(2, device=dev)], r, 0),
    }
    with pytest.raises(ValueError) as ei:
        calls[what]()
    return str(ei.value)


@pytest.mark.parametrize("what,words", [("non_contiguous", "contiguous"), ("gather_sizes", "output tensors"),
                                        ("uneven_splits", "uneven"), ("bor", "not supported"),
                                        ("avg_int", "floating point"), ("other_device", "different devices"),
                                        ("peer_self", "peer")])
def test_bad_arguments_raise_value_error_at_the_call(what, words):
    """Checked before anything is enqueued: one rank alone sees it (no peer is needed)."""
    msg = ranks(lambda pg, r, dev: bad_call(pg, r, dev, what), n=1)[0]
    assert isinstance(msg, str) and words in msg, msg


def test_in_process_devices_across_processes_are_refused():
    """Rank 1 lives in another process (its entry in the store says so): the in-process devices of this one
    cannot be its peers -- a one-line ValueError naming the cure, at group creation."""
    store = dist.HashStore()
    store.set("vnpu-hccl/inits", "1")                 # rank 1 of generation 0 was created...
    store.set("vnpu-hccl/proc/0/1", "otherhost:4242:local")     # ...in another process
    with pytest.raises(ValueError) as ei:
        ProcessGroupHCCL(store, 0, 2, datetime.timedelta(seconds=5))
    assert "VNPU_BACKEND=cluster" in str(ei.value) and "vnpu up" in str(ei.value)


def failing(pg, r, dev, fault=None):
    """A first all_reduce that works, then (after ``fault`` on rank 0's device) one that must fail: returns
    the error it raised and what the next collective raised."""
    x = torch.ones(8, device=dev)
    pg.allreduce([x], AllreduceOptions()).wait()
    if fault is not None and r == 0:
        fault()
    w = pg.allreduce([x], AllreduceOptions())
    with pytest.raises(dist.DistBackendError) as ei:
        w.wait()
    with pytest.raises(dist.DistBackendError) as again:
        pg.allreduce([x], AllreduceOptions())
    return ei.value, str(again.value)


def test_peer_that_never_comes_times_out_and_aborts_the_group():
    def fn(pg, r, dev):
        x = torch.ones(8, device=dev)
        pg.allreduce([x], AllreduceOptions()).wait()
        if r == 1:
            return None                               # rank 1 never enters the second all_reduce
        w = pg.allreduce([x], AllreduceOptions())
        with pytest.raises(dist.DistBackendError) as ei:
            w.wait()
        with pytest.raises(dist.DistBackendError) as again:
            pg.allreduce([x], AllreduceOptions())
        return ei.value, str(again.value)
    (err, again), _ = ok(ranks(fn, options=HcclOptions(exec_timeout_s=1.0)))
    assert isinstance(err, RuntimeError) and err.hccl_code == HCCL_E_TIMEOUT, err
    assert "allreduce failed on rank 0 (npu:0)" in str(err)
    assert "aborted by an earlier failure" in again


def test_link_down_fails_the_collective_on_both_ranks(rt):
    peer = rt.device(1).physical_id

    def fault():
        rt.device(0).handle.inject_fault("link-down", peer=peer)
    try:
        res = ok(ranks(lambda pg, r, dev: failing(pg, r, dev, fault), options=HcclOptions(exec_timeout_s=5.0)))
    finally:
        rt.device(0).handle.clear_fault()
    assert res[0][0].hccl_code == HCCL_E_NETWORK, res[0][0]
    assert res[1][0].hccl_code in (HCCL_E_NETWORK, HCCL_E_REMOTE, HCCL_E_TIMEOUT), res[1][0]
    assert all("aborted by an earlier failure" in again for _, again in res)
    # the link is back: a new group (same store, next generation) works
    store = dist.HashStore()
    for _ in range(2):
        got = ok(ranks(lambda pg, r, dev: (lambda x: (pg.allreduce([x], AllreduceOptions()).wait(),
                                                      x.cpu().tolist())[1])(torch.ones(2, device=dev) * (r + 1)),
                       store=store))
        assert got == [[3.0, 3.0]] * 2


def test_killed_device_mid_collective_fails_every_survivor(rt):
    """Ranks 0 and 1 are in an all_reduce when rank 2's device is killed (it never joins): both raise
    DistBackendError (HCCL_E_REMOTE: the peer is gone) well within the exec timeout.  Last in the module:
    npu:2 stays lost."""
    entered = threading.Barrier(3, timeout=RANK_TIMEOUT_S)

    def fn(pg, r, dev):
        x = torch.ones(8, device=dev)
        pg.allreduce([x], AllreduceOptions()).wait()
        if r == 2:
            entered.wait()                            # the survivors have enqueued theirs
            rt.device(2).handle.inject_fault("kill")
            return None
        w = pg.allreduce([x], AllreduceOptions())
        w.is_completed()                              # the device has it
        entered.wait()
        with pytest.raises(dist.DistBackendError) as ei:
            w.wait()
        return {"error": ei.value}
    res = ok(ranks(fn, n=3, options=HcclOptions(exec_timeout_s=60.0)))
    for r, e in enumerate(x["error"] for x in res[:2]):
        assert e.hccl_code in (HCCL_E_REMOTE, HCCL_E_TIMEOUT) and f"on rank {r}" in str(e), e
