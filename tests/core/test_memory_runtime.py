"""The caching pool through runtime.api, on both backends (in-process devices and device actors over
gRPC): tensors come from the pool, stream safety with a host-gated stream (ordering asserted through
results and stream state, never time), the out-of-memory path, lifetime placement, and live
defragmentation of a fragmented arena shared with raw ``acl.rt.malloc`` memory and another client.
"""
from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from conftest import make_local_runtime
from devices.errors import AclError, CaptureError, InvalidParamError, MemoryAccessError, MemoryAllocationError
from runtime import acl
from runtime.memory import AllocConfigError

MiB = 1 << 20
SYNC_MS = 20_000


def gate(stream) -> threading.Event:
    """Hold ``stream``: its later work waits until the returned event is set (a blocking host function,
    which waits on the event with a deadline; no sleeps)."""
    release = threading.Event()
    stream.launch_host_func(lambda: release.wait(60), blocking=True)
    return release


def offset(ptr: int) -> int:
    return ptr & ((1 << 40) - 1)


class OtherClient:
    """Another tenant of the same device: in-process, the device's own calls under another owner; on
    the cluster, a second gRPC client with its own identity."""

    def __init__(self, rt, dev):
        self.backend = None
        if rt.backend.name == "local":
            h = rt.backend.device(dev.physical_id)
            self.malloc = lambda n: h.malloc(n, 0, owner="tenant-b")
            self.free = lambda p: h.free(p, owner="tenant-b")
            self.write = lambda p, a: h.memcpy_h2d(p, a, owner="tenant-b")
            self.read = lambda p, n: h.memcpy_d2h(p, n, owner="tenant-b")
        else:
            from runtime.cluster.remote import RemoteBackend
            b = self.backend = RemoteBackend(list(rt.backend.where.values()), rt.backend.token,
                                             client_id="tenant-b-memory-test")
            h = b.device(dev.physical_id)
            self.malloc = lambda n: h.malloc(n, 0)
            self.free = h.free
            self.write = h.memcpy_h2d
            self.read = lambda p, n: h.memcpy_d2h(p, n)

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


@pytest.fixture
def clean(rt):
    """Device 3 with nothing cached or allocated (its arena layout is then this test's to predict)."""
    dev = rt.device(3)
    dev.synchronize(SYNC_MS)
    dev.empty_cache()
    free, total = dev.mem_info()
    assert free == total, "device 3 is not empty at the start of the test"
    yield dev
    dev.synchronize(SYNC_MS)
    dev.empty_cache()


# ---------------------------------------------------------------------------------------------- the pool
def test_tensors_come_from_the_pool_and_reuse_costs_no_driver_call(rt):
    dev = rt.device(0)
    t = dev.from_numpy(np.arange(1000, dtype=np.float32))
    ptr = t.ptr
    t.free()
    st0 = dev.memory_stats()
    rpc = getattr(dev.handle, "rpc_count", None)
    for _ in range(200):
        u = dev.empty((1000,), "float32")
        assert u.ptr == ptr
        u.free()
    st = dev.memory_stats()
    assert st["num_device_alloc"] == st0["num_device_alloc"] and st["num_device_free"] == st0["num_device_free"]
    assert st["allocation.all.allocated"] - st0["allocation.all.allocated"] == 200
    if rpc is not None:                                            # cluster: not one RPC for 200 pairs
        assert dev.handle.rpc_count == rpc
    assert "Allocated memory" in dev.memory_summary()
    seg = next(s for s in dev.memory_snapshot() if s["address"] <= ptr < s["address"] + s["total_size"])
    assert seg["segment_type"] == "small"


def test_pool_memory_is_checked_on_the_host(rt):
    dev = rt.device(0)
    t = dev.from_numpy(np.arange(16, dtype=np.int32))
    with pytest.raises(InvalidParamError, match="caching pool"):
        dev.free(t.ptr)                                           # not a raw allocation
    s = dev.stream()
    with pytest.raises(MemoryAccessError):
        s.memset(t.ptr, 0, 65)                                    # the segment is larger; the block is not
    v = t.view((4,), offset_bytes=48)
    np.testing.assert_array_equal(v.numpy(), [12, 13, 14, 15])
    t.free()
    with pytest.raises(MemoryAccessError, match="use after free"):
        dev.launch("relu", [v], [v])
    with pytest.raises(MemoryAccessError):
        s.memset(v.ptr, 0, 4)
    s.destroy()


def test_record_stream_keeps_memory_from_other_users_until_the_work_is_done(rt):
    dev = rt.device(1)
    s_alloc, s_use = dev.stream(), dev.stream()
    n = 1 << 16
    data = np.random.default_rng(1).integers(0, 255, n, dtype=np.uint8)
    out = dev.empty((n,), "uint8", stream=s_use)
    t = dev.from_numpy(data, stream=s_alloc)
    release = gate(s_use)
    s_use.copy(out.ptr, t.ptr, n)                                 # reads t once the gate opens
    t.record_stream(s_use)
    old = t.ptr
    t.free()
    t2 = dev.empty((n,), "uint8", stream=s_alloc)
    assert t2.ptr != old                                          # s_use's work is not done: not handed out
    assert dev.memory_stats()["pending_free_blocks"] == 1
    s_alloc.memset(t2.ptr, 0xEE, n)
    s_alloc.synchronize(SYNC_MS)
    assert not s_use.query()
    release.set()
    s_use.synchronize(SYNC_MS)
    np.testing.assert_array_equal(out.numpy(stream=s_use), data)  # it read the old contents
    t3 = dev.empty((n,), "uint8", stream=s_alloc)
    assert t3.ptr == old                                          # done: the memory is back in the pool
    for x in (t2, t3, out):
        x.free()
    s_alloc.destroy()
    s_use.destroy()


def test_cross_stream_reuse_is_ordered_on_the_device(rt):
    dev = rt.device(1)
    s1, s2 = dev.stream(), dev.stream()
    n = 12 * MiB                                                  # its own segment: wholly free when freed
    t = dev.from_numpy(np.full(n, 7, np.uint8), stream=s1)
    out = dev.empty((4096,), "uint8", stream=s1)
    release = gate(s1)
    s1.copy(out.ptr, t.ptr, 4096)
    old = t.ptr
    reuse0 = dev.memory_stats()["num_cross_stream_reuse"]
    t.free()
    t2 = dev.empty((n,), "uint8", stream=s2)                      # s2 has nothing cached: takes s1's segment
    assert t2.ptr == old and dev.memory_stats()["num_cross_stream_reuse"] == reuse0 + 1
    s2.memset(t2.ptr, 0, n)
    assert not s2.query()                                         # s2 waits for s1's earlier work
    release.set()
    s2.synchronize(SYNC_MS)
    np.testing.assert_array_equal(out.numpy(stream=s1), np.full(4096, 7, np.uint8))
    np.testing.assert_array_equal(t2.numpy(stream=s2)[:64], np.zeros(64, np.uint8))
    t2.free()
    out.free()
    s1.destroy()
    s2.destroy()


def test_host_write_into_reused_memory_waits_for_the_earlier_work(rt):
    dev = rt.device(1)
    s = dev.stream()
    n = 1 << 16
    t = dev.from_numpy(np.full(n, 5, np.uint8), stream=s)
    out = dev.empty((n,), "uint8", stream=s)
    release = gate(s)
    s.copy(out.ptr, t.ptr, n)
    old = t.ptr
    t.free()
    got = {}
    th = threading.Thread(target=lambda: got.setdefault("t", dev.from_numpy(np.zeros(n, np.uint8), stream=s)))
    th.start()                                                    # its upload waits for s's copy ...
    release.set()
    th.join(60)
    assert not th.is_alive()
    assert got["t"].ptr == old
    np.testing.assert_array_equal(out.numpy(stream=s), np.full(n, 5, np.uint8))   # ... which read the 5s
    got["t"].free()
    out.free()
    s.destroy()


# ---------------------------------------------------------------------------------------------- out of memory
def test_oom_retries_then_reports_the_four_numbers(rt, clean):
    dev = clean
    small = [dev.empty((MiB,), "uint8") for _ in range(40)]      # 20 small segments: 40 MiB
    for t in small:
        t.free()
    st0 = dev.memory_stats()
    big = dev.empty((40 * MiB,), "uint8")                         # needs the cached segments back
    st = dev.memory_stats()
    assert st["num_alloc_retries"] == st0["num_alloc_retries"] + 1 and st["num_ooms"] == st0["num_ooms"]
    with pytest.raises(MemoryAllocationError) as e:
        dev.empty((30 * MiB,), "uint8")
    assert e.value.code == 207001
    st = dev.memory_stats()
    assert st["num_alloc_retries"] == st0["num_alloc_retries"] + 2 and st["num_ooms"] == st0["num_ooms"] + 1
    m = re.search(r"requested (\d+) B.*free (\d+) B.*cached (\d+) B.*largest free (\d+) B", str(e.value))
    assert m, str(e.value)
    t = dev.telemetry()
    assert tuple(map(int, m.groups())) == (30 * MiB, t["hbm_free"], 0, t["hbm_largest_free"])
    big.free()


# ---------------------------------------------------------------------------------------------- placement
def test_long_lived_tensors_pack_at_the_top_of_the_arena(rt, clean):
    dev = clean
    total = dev.mem_info()[1]
    w = [dev.empty((12 * MiB,), "uint8", lifetime="long") for _ in range(2)]
    a = dev.empty((12 * MiB,), "uint8")
    w.append(dev.empty((6 * MiB,), "uint8", lifetime="long"))
    assert offset(a.ptr) == 0
    segs = sorted((s for s in dev.memory_snapshot() if s["lifetime"] == "long"), key=lambda s: s["address"])
    spans = [(offset(s["address"]), offset(s["address"]) + s["total_size"]) for s in segs]
    assert spans[-1][1] == total                                  # from the top down, back to back
    assert all(x[1] == y[0] for x, y in zip(spans, spans[1:]))
    t = dev.telemetry()
    assert t["hbm_largest_free"] == t["hbm_free"] and t["fragmentation"] == 0.0
    for x in w + [a]:
        x.free()


# ---------------------------------------------------------------------------------------------- defragmentation
def test_defragmentation_end_to_end(rt, clean):
    """Fragment the arena so that an allocation fails although enough is free, defragment, and check
    that it then succeeds, that every tensor kept its contents, that a captured graph over moved tensors
    still replays correctly, and that raw acl memory and another client's memory did not move."""
    dev = clean
    other = OtherClient(rt, dev)
    acl.init()
    try:
        assert acl.rt.set_device(3) == 0
        rng = np.random.default_rng(7)
        n = 12 * MiB
        vals = {}
        s = dev.stream()
        out = dev.empty((1024,), "float32", stream=s)             # [0, 2) MiB: a small-pool segment
        t0 = dev.empty((n // 4,), "float32")                      # [2, 14)
        theirs = other.malloc(8 * MiB)                            # [14, 22): the other tenant's
        t1 = dev.empty((n // 4,), "float32")                      # [22, 34)
        t2 = dev.empty((n // 4,), "float32")                      # [34, 46)
        pinned, ret = acl.rt.malloc(4 * MiB, acl.ACL_MEM_MALLOC_HUGE_FIRST)    # [46, 50): raw, pinned
        assert ret == 0
        t3 = dev.empty((n // 4,), "float32")                      # [50, 62)
        assert [offset(x.ptr) for x in (out, t0, t1, t2, t3)] == [0, 2 * MiB, 22 * MiB, 34 * MiB, 50 * MiB]
        assert (offset(theirs), offset(pinned)) == (14 * MiB, 46 * MiB)
        for name, t in (("t0", t0), ("t2", t2), ("t3", t3)):
            vals[name] = rng.standard_normal(n // 4).astype(np.float32)
            t.copy_from(vals[name])
        theirs_data = rng.integers(0, 255, 8 * MiB, dtype=np.uint8)
        other.write(theirs, theirs_data)
        pinned_data = rng.integers(0, 255, 4 * MiB, dtype=np.uint8)
        assert acl.rt.memcpy(pinned, 4 * MiB, acl.util.numpy_to_ptr(pinned_data), 4 * MiB,
                             acl.ACL_MEMCPY_HOST_TO_DEVICE) == 0
        # a captured graph over two tensors that will move: out = t2[:1024] + t3[:1024]
        with s.capture() as cap:
            s.launch("add", [t2.view((1024,)), t3.view((1024,))], [out])
        g = cap.graph
        t1.free()
        with pytest.raises(MemoryAllocationError) as e:           # 14 MiB free, in 12 + 2 MiB pieces
            dev.empty((13 * MiB,), "uint8")
        free, _ = dev.mem_info()
        assert e.value.code == 207001 and free >= 13 * MiB
        frag0 = dev.telemetry()["fragmentation"]
        old = {k: x.ptr for k, x in (("t0", t0), ("t2", t2), ("t3", t3))}

        rep = dev.defragment()

        assert rep.blocks_moved == 2 and rep.bytes_moved == 2 * n and rep.graphs_rebound == 1
        assert frag0 > 0 and rep.arena_fragmentation_before == pytest.approx(frag0)
        assert rep.arena_largest_free_after == 14 * MiB and rep.arena_fragmentation_after == 0.0
        assert rep.pause_s > 0 and rep.copy_gbs > 0
        assert t0.ptr == old["t0"] and (offset(t2.ptr), offset(t3.ptr)) == (22 * MiB, 34 * MiB)
        assert dev.telemetry()["fragmentation"] == 0.0
        big = dev.empty((13 * MiB,), "uint8")                     # fits now
        for name, t in (("t0", t0), ("t2", t2), ("t3", t3)):
            np.testing.assert_array_equal(t.numpy(), vals[name])
        g.execute_async(s)                                        # the same graph object, re-bound
        s.synchronize(SYNC_MS)
        np.testing.assert_array_equal(out.numpy(stream=s), vals["t2"][:1024] + vals["t3"][:1024])
        assert g.rebinds == 1
        np.testing.assert_array_equal(other.read(theirs, 8 * MiB), theirs_data)   # their bytes, same place
        back = np.empty(4 * MiB, np.uint8)
        assert acl.rt.memcpy(acl.util.numpy_to_ptr(back), 4 * MiB, pinned, 4 * MiB,
                             acl.ACL_MEMCPY_DEVICE_TO_HOST) == 0
        np.testing.assert_array_equal(back, pinned_data)          # the raw pointer still holds its bytes
        assert (offset(theirs), offset(pinned)) == (14 * MiB, 46 * MiB)
        st = dev.memory_stats()
        assert st["num_defragmentations"] >= 1 and st["defrag_bytes_moved"] >= 2 * n
        g.destroy()
        for x in (t0, t2, t3, out, big):
            x.free()
        assert acl.rt.free(pinned) == 0
        s.destroy()
    finally:
        acl.finalize()
        try:
            other.free(theirs)
        finally:
            other.close()


def test_defragment_is_refused_while_capturing(rt):
    dev = rt.device(0)
    s = dev.stream()
    s.begin_capture()
    try:
        with pytest.raises(CaptureError) as e:
            dev.defragment()
        assert e.value.code == 107027
    finally:
        s.end_capture().destroy()
        s.destroy()


def test_pinned_tensors_do_not_move(rt, clean):
    dev = clean
    a = dev.empty((12 * MiB,), "uint8")
    b = dev.empty((12 * MiB,), "uint8")
    b.pin()
    a.free()
    rep = dev.defragment()
    assert rep.blocks_moved == 0 and offset(b.ptr) == 12 * MiB
    b.free()


# ---------------------------------------------------------------------------------------------- settings
def test_bad_alloc_conf_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("VNPU_ALLOC_CONF", "max_split_size_mb:4")
    r = make_local_runtime(1)
    try:
        with pytest.raises(AllocConfigError) as e:
            r.device(0).empty((4,))
        assert e.value.code == 107000 and "max_split_size_mb" in str(e.value)
        monkeypatch.setenv("VNPU_ALLOC_CONF", "max_split_size_mb:64")
        t = r.device(0).empty((4,))                               # the device still works once it is fixed
        assert r.device(0).memory_stats()["max_split_size"] == 64 * MiB
        t.free()
    finally:
        r.close()


def test_smi_shows_arena_fragmentation(rt, clean):
    from runtime.cli.smi import collect, render
    dev = clean
    a, b = dev.empty((12 * MiB,), "uint8"), dev.empty((12 * MiB,), "uint8")
    a.free()
    dev.empty_cache()                                             # a hole below b
    row = collect(rt)[3]
    t = dev.telemetry()
    assert t["fragmentation"] > 0 and row["fragmentation"] == pytest.approx(t["fragmentation"])
    assert row["hbm_largest_free_mb"] == pytest.approx(t["hbm_largest_free"] / MiB)
    assert f"{row['fragmentation']:.2f}" in render(collect(rt))
    b.free()


def test_server_metrics_export_arena_and_pool_fragmentation(rt, clean):
    """``vnpu serve``'s /metrics registry carries the arena's fragmentation (what ``vnpu smi`` shows)
    and the pool's own (``memory_stats()``), read at scrape: a hole in the arena and a hole in a split
    pool segment show as their exact fractions."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from runtime.serve.metrics import make_registry

    def scrape() -> dict:
        reg, _, _ = make_registry(rt, {})
        return {(s.name, s.labels.get("id")): s.value
                for fam in text_string_to_metric_families(generate_latest(reg).decode()) for s in fam.samples}

    dev = clean
    x = [dev.empty((512 << 10,), "uint8") for _ in range(3)]      # [0, 2) MiB, a small segment: 3 blocks + 512 KiB
    a, b = dev.empty((12 * MiB,), "uint8"), dev.empty((12 * MiB,), "uint8")     # [2, 14), [14, 26)
    dev.synchronize(SYNC_MS)
    a.free()
    dev.empty_cache()                                             # a 12 MiB hole below b
    x[1].free()                                                   # free: 512 KiB here and 512 KiB at the end
    m = scrape()
    t, st = dev.telemetry(), dev.memory_stats()
    assert t["fragmentation"] > 0 and m[("vnpu:hbm_fragmentation", "3")] == pytest.approx(t["fragmentation"])
    assert st["fragmentation"] == 0.5 and m[("vnpu:memory_pool_fragmentation", "3")] == 0.5
    assert m[("vnpu:memory_pool_largest_free_block_bytes", "3")] == 512 << 10
    assert m[("vnpu:memory_pool_reserved_bytes", "3")] == 12 * MiB + 2 * MiB
    assert m[("vnpu:memory_pool_allocated_bytes", "3")] == 12 * MiB + 2 * (512 << 10)
    with pytest.raises(MemoryAllocationError):
        dev.empty((1 << 30,), "uint8")                            # larger than the arena: an OOM after a retry
    rep = dev.defragment()
    m2 = scrape()
    assert m2[("vnpu:memory_pool_ooms_total", "3")] == m[("vnpu:memory_pool_ooms_total", "3")] + 1
    assert m2[("vnpu:memory_pool_alloc_retries_total", "3")] == m[("vnpu:memory_pool_alloc_retries_total", "3")] + 1
    assert m2[("vnpu:memory_pool_defragmentations_total", "3")] >= m[("vnpu:memory_pool_defragmentations_total", "3")]
    assert m2[("vnpu:memory_pool_defrag_moved_bytes_total", "3")] == \
        m[("vnpu:memory_pool_defrag_moved_bytes_total", "3")] + rep.bytes_moved
    assert rep.bytes_moved == 12 * MiB and m2[("vnpu:hbm_fragmentation", "3")] == 0.0
    for y in (b, x[0], x[2]):
        y.free()


def test_pool_and_defragmentation_under_the_sanitizer():
    """The pool's own work is clean for `vnpu sanitize`: reuse on one stream, record_stream across two,
    a defragmentation (its copies ordered after the blocks' last uses) and a re-bound graph raise no
    memcheck, racecheck or initcheck finding; the graph's footprint follows the move."""
    import io

    from devices.device import DeviceConfig
    from runtime.api import Runtime
    from runtime.backend import LocalBackend
    from runtime.sanitize import SanitizeOptions, Session

    s = Session(SanitizeOptions(tools=("memcheck", "racecheck", "initcheck")), out=io.StringIO())
    r = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=64 * MiB)), sanitizer=s)
    try:
        dev = r.device(0)
        st, side = dev.stream(), dev.stream()
        a = dev.from_numpy(np.arange(3 * MiB, dtype=np.float32), stream=st)      # 12 MiB: own segment
        b = dev.from_numpy(np.ones(3 * MiB, np.float32), stream=st)
        c = dev.from_numpy(np.full(3 * MiB, 2.0, np.float32), stream=st)
        out = dev.empty((1024,), "float32", stream=st)
        st.launch("add", [b.view((1024,)), c.view((1024,))], [out])
        ev = dev.event()
        ev.record(st)
        side.wait(ev)
        side.launch("relu", [c.view((1024,))], [c.view((1024,))])
        c.record_stream(side)
        with st.capture() as cap:
            st.launch("add", [b.view((1024,)), c.view((1024,))], [out])
        a.free()
        rep = dev.defragment()
        assert rep.blocks_moved >= 1 and rep.graphs_rebound == 1
        cap.graph.execute_async(st)
        np.testing.assert_array_equal(out.numpy(stream=st), np.full(1024, 3.0, np.float32))
        cap.graph.destroy()
        for t in (b, c, out):
            t.free()
        ev.destroy()
        st.destroy()
        side.destroy()
    finally:
        r.close()
        s.finish()
    assert s.errors == 0, s.report()["summary"]
