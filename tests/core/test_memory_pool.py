"""Unit tests of the caching pool (runtime.memory) driven in-process over a real device model.

The pool sits on a real :class:`devices.device.Device` (its arena is the driver allocator, its scheduler
orders the events), with no runtime.api in between: sizes, reuse, split/merge, exact statistics after a
scripted sequence, the out-of-memory path, stream safety (a host-gated stream makes "not done yet"
deterministic), placement by lifetime, max_split_size, garbage collection, host-side checks,
defragmentation and ``VNPU_ALLOC_CONF``.
"""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from devices.arena import PLACEMENT_HIGH, PLACEMENT_LOW, make_ptr
from devices.device import Device, DeviceConfig
from devices.errors import AclError, InvalidParamError, MemoryAccessError, MemoryAllocationError
from devices.tasks import CopyD2D, Memset, Wait
from runtime.memory import (KEYS, AllocConfig, AllocConfigError, CachingAllocator, HandleAllocator,
                            HandleStreamOrder, parse, render_summary, roundup_power2_next_division)
from runtime.memory.stats import COUNTERS, METRICS, POOLS, STATS

MiB = 1 << 20
SYNC_MS = 20_000
_ids = itertools.count(80)


@pytest.fixture
def dev():
    d = Device(DeviceConfig(device_id=next(_ids), arena_bytes=64 * MiB))
    yield d
    d.close()


def make_pool(dev, conf: str = "", **kw) -> CachingAllocator:
    return CachingAllocator(HandleAllocator(dev), HandleStreamOrder(dev), parse(conf), device=dev.id, **kw)


def off(dev, ptr: int) -> int:
    return ptr - make_ptr(dev.id, 0)


def write(dev, h, data: np.ndarray) -> None:
    dev.memcpy_h2d(h.ptr, data)


def read(dev, h, n: int) -> np.ndarray:
    return dev.memcpy_d2h(h.ptr, n)


class Gate:
    """A stream that does nothing until the test opens the gate (a host-signalled event)."""

    def __init__(self, dev, sid: int):
        self.dev, self.sid = dev, sid
        self.eid = dev.create_event(0)
        dev.submit([Wait(sid, self.eid, 1)])

    def open(self) -> None:
        self.dev.signal_event(self.eid, 1)


# ---------------------------------------------------------------------------------------------- sizes
def test_size_classes_and_segment_sizes(dev):
    p = make_pool(dev)
    assert [p.round_size(n) for n in (1, 511, 512, 513, 5000)] == [512, 512, 512, 1024, 5120]
    assert p.segment_size(p.round_size(1 * MiB), "small_pool") == 2 * MiB
    assert p.segment_size(1 * MiB + 512, "large_pool") == 20 * MiB
    assert p.segment_size(9 * MiB, "large_pool") == 20 * MiB
    assert p.segment_size(10 * MiB + 1, "large_pool") == 12 * MiB      # >= 10 MiB: own segment, 2 MiB steps
    s = dev.default_stream
    own = p.malloc(11 * MiB, s)                     # 12 MiB segment: the 1 MiB left is not worth a split
    small, large = p.malloc(1 * MiB, s), p.malloc(1 * MiB + 1, s)
    sizes = sorted(seg["total_size"] for seg in p.snapshot())
    assert sizes == [2 * MiB, 12 * MiB, 20 * MiB]
    st = p.memory_stats()
    assert st["segment.small_pool.current"] == 1 and st["segment.large_pool.current"] == 2
    for h in (small, large, own):
        p.free(h)


def test_roundup_power2_divisions():
    # 1.2 MiB with 4 divisions of [1, 2) MiB -> 1.25 MiB; powers of two stay; 2 divisions -> 1.5 MiB
    assert roundup_power2_next_division(1258291, 4) == 1310720
    assert roundup_power2_next_division(1 * MiB, 4) == 1 * MiB
    assert roundup_power2_next_division(1258291, 2) == 1572864
    cfg = parse("roundup_power2_divisions:[1:1,2:4,>:8]")
    assert [cfg.divisions(x) for x in (MiB // 2, MiB, 2 * MiB, 3 * MiB, 1 << 30)] == [1, 1, 4, 8, 8]
    dev = Device(DeviceConfig(device_id=next(_ids), arena_bytes=64 * MiB))
    try:
        p = make_pool(dev, "roundup_power2_divisions:4")
        assert p.round_size(1258291) == 1310720
        assert p.round_size(1000) == 1024               # under 512 B x divisions: plain 512 B rounding
    finally:
        dev.close()


# ---------------------------------------------------------------------------------------------- reuse
def test_reuse_without_driver_calls(dev):
    p = make_pool(dev)
    s = dev.default_stream
    h = p.malloc(4000, s)
    ptr = h.ptr
    p.free(h)
    for _ in range(50):
        h = p.malloc(4000, s)
        assert h.ptr == ptr
        p.free(h)
    st = p.memory_stats()
    assert st["num_device_alloc"] == 1 and st["num_device_free"] == 0
    assert dev.arena.stats().allocations == 1
    assert st["allocation.all.allocated"] == 51 and st["allocation.all.current"] == 0


def test_split_and_merge(dev):
    p = make_pool(dev)
    s = dev.default_stream
    a, b, c = (p.malloc(8192, s) for _ in range(3))
    assert (b.ptr - a.ptr, c.ptr - b.ptr) == (8192, 8192)           # carved from one segment, in order
    seg = p.snapshot()[0]
    assert [blk["state"] for blk in seg["blocks"]] == ["active_allocated"] * 3 + ["inactive"]
    p.free(b)                                                        # a hole between a and c
    assert p.memory_stats()["inactive_split.all.current"] == 2
    p.free(a)                                                        # merges with the hole
    blocks = p.snapshot()[0]["blocks"]
    assert [(blk["size"], blk["state"]) for blk in blocks] == [(16384, "inactive"), (8192, "active_allocated"),
                                                              (2 * MiB - 24576, "inactive")]
    p.free(c)                                                        # everything merges back
    blocks = p.snapshot()[0]["blocks"]
    assert [(blk["size"], blk["state"]) for blk in blocks] == [(2 * MiB, "inactive")]
    st = p.memory_stats()
    assert st["inactive_split.all.current"] == 0 and st["inactive_split_bytes.all.current"] == 0
    d = p.malloc(16000, s)                                           # the merged space is reused from its start
    assert d.ptr == a.ptr
    p.free(d)


def test_stats_exact_after_a_scripted_sequence(dev):
    """Every counter against a hand computation (PyTorch's semantics: net change per operation)."""
    p = make_pool(dev)
    s = dev.default_stream
    a = p.malloc(1000, s)             # small: 1024 B block, segment 2 MiB split -> free rest 2 MiB - 1 KiB
    b = p.malloc(5000, s)             # 5120 B after a; rest 2 MiB - 6 KiB
    c = p.malloc(3 * MiB, s)          # large: 20 MiB segment split -> free rest 17 MiB
    p.free(b)                         # merges with the rest: 2 MiB - 1 KiB free (split)
    d = p.malloc(4096, s)             # takes it from the start: rest 2 MiB - 5 KiB
    e = p.malloc(18 * MiB, s)         # > the 17 MiB left of c's segment: own 18 MiB segment, not split
    p.free(c)                         # merges with its rest: the 20 MiB segment is whole again
    assert d.ptr == b.ptr
    st = p.memory_stats()
    K = 1024
    alloc_bytes = (5 * K + 18 * MiB, 5 * K + 21 * MiB, 10 * K + 21 * MiB, 5 * K + 3 * MiB)
    expect = {
        "allocation.all": (3, 4, 5, 2), "allocation.small_pool": (2, 2, 3, 1), "allocation.large_pool": (1, 2, 2, 1),
        "allocated_bytes.all": alloc_bytes,
        "allocated_bytes.small_pool": (5 * K, 6 * K, 10 * K, 5 * K),
        "requested_bytes.all": (1000 + 4096 + 18 * MiB, 1000 + 4096 + 21 * MiB,
                                1000 + 5000 + 4096 + 21 * MiB, 5000 + 3 * MiB),
        "segment.all": (3, 3, 3, 0), "reserved_bytes.all": (40 * MiB, 40 * MiB, 40 * MiB, 0),
        "reserved_bytes.large_pool": (38 * MiB, 38 * MiB, 38 * MiB, 0),
        "active.all": (3, 4, 5, 2), "active_bytes.all": alloc_bytes,
        "inactive_split.all": (1, 2, 2, 1), "inactive_split.large_pool": (0, 1, 1, 1),
        "inactive_split_bytes.all": (2 * MiB - 5 * K, 2 * MiB - K + 17 * MiB,
                                     2 * MiB - K + 17 * MiB + 5 * K, 5 * K + 4 * K + 17 * MiB),
    }
    for key, (cur, peak, alloc, freed) in expect.items():
        got = tuple(st[f"{key}.{m}"] for m in METRICS)
        assert got == (cur, peak, alloc, freed), f"{key}: {got} != {(cur, peak, alloc, freed)}"
    assert (st["num_device_alloc"], st["num_device_free"], st["num_alloc_retries"], st["num_ooms"]) == (3, 0, 0, 0)
    assert st["max_split_size"] == -1
    # the pool's own fragmentation: free inside segments = 2 MiB - 5 KiB (small) + 20 MiB (whole large)
    free = 2 * MiB - 5 * K + 20 * MiB
    assert st["inactive_bytes"] == free and st["largest_free_block"] == 20 * MiB
    assert st["fragmentation"] == pytest.approx(1 - 20 * MiB / free)
    # the schema: every PyTorch key is there
    for name in STATS:
        for pool in POOLS:
            for m in METRICS:
                assert f"{name}.{pool}.{m}" in st
    for k in COUNTERS + ("oversize_allocations.current", "oversize_segments.peak"):
        assert k in st
    for h in (a, d, e):
        p.free(h)
    assert p.memory_stats()["allocated_bytes.all.current"] == 0
    p.empty_cache()
    st = p.memory_stats()
    assert (st["reserved_bytes.all.current"], st["segment.all.current"], st["num_device_free"]) == (0, 0, 3)
    assert dev.arena.stats().used == 0
    p.reset_peak_stats()
    p.reset_accumulated_stats()
    st = p.memory_stats()
    assert st["allocated_bytes.all.peak"] == 0 and st["allocation.all.allocated"] == 0


def test_summary_table(dev):
    p = make_pool(dev)
    h = p.malloc(3 * MiB, dev.default_stream)
    text = render_summary(p.memory_stats(), dev.id)
    lines = text.splitlines()
    assert all(len(x) == 77 for x in lines), [x for x in lines if len(x) != 77]
    row = next(x for x in lines if x.startswith("| Allocated memory"))
    assert row.split("|")[2].strip() == "3072 KiB"
    assert "NPU reserved memory" in text and "NPU OOMs: 0" in text and "aclrtMalloc retries: 0" in text
    p.free(h)


def test_double_free_and_bad_requests(dev):
    p = make_pool(dev)
    s = dev.default_stream
    h = p.malloc(100, s)
    p.free(h)
    with pytest.raises(AclError) as e:
        p.free(h)
    assert e.value.code == 207002
    for bad in (0, -5, 1.5, "8", None, True):
        with pytest.raises(InvalidParamError):
            p.malloc(bad, s)
    with pytest.raises(InvalidParamError):
        p.malloc(64, s, lifetime="forever")
    with pytest.raises(InvalidParamError):
        p.free(12345)
    assert p.memory_stats()["allocation.all.current"] == 0


# ---------------------------------------------------------------------------------------------- host checks
def test_host_side_range_checks(dev):
    p = make_pool(dev)
    s = dev.default_stream
    a, b = p.malloc(1000, s), p.malloc(1000, s)
    assert p.check(a.ptr, 1000) and p.check(a.ptr + 10, 990)
    with pytest.raises(MemoryAccessError):
        p.check(a.ptr, 1001)                        # overruns into b's block (the device sees one segment)
    with pytest.raises(MemoryAccessError):
        p.check(a.ptr + 1000, 4)                    # the block's rounding slack
    p.free(a)
    with pytest.raises(MemoryAccessError, match="freed"):
        p.check(a.ptr, 4)                           # use after free, although the segment is live
    raw = dev.malloc(4096)
    assert p.check(raw, 4096) is False              # not the pool's: left to the device
    assert p.owns(b.ptr) and not p.owns(raw)
    p.free(b)
    dev.free(raw)


# ---------------------------------------------------------------------------------------------- out of memory
def test_oom_releases_cache_retries_then_reports(dev):
    p = make_pool(dev)
    s = dev.default_stream
    small = [p.malloc(1 * MiB, s) for _ in range(60)]          # 30 small segments of 2 MiB: 60 MiB reserved
    for h in small:
        p.free(h)
    assert p.memory_stats()["reserved_bytes.all.current"] == 60 * MiB
    big = p.malloc(40 * MiB, s)                                 # needs the cached small segments back
    st = p.memory_stats()
    assert st["num_alloc_retries"] == 1 and st["num_ooms"] == 0
    assert st["segment.small_pool.current"] == 0 and st["num_device_free"] == 30
    assert st["reserved_bytes.all.current"] == 40 * MiB
    other = dev.malloc(10 * MiB, 0, owner="tenant-b")          # someone else's memory
    with pytest.raises(MemoryAllocationError) as e:
        p.malloc(20 * MiB, s)
    assert e.value.code == 207001
    st = p.memory_stats()
    assert st["num_alloc_retries"] == 2 and st["num_ooms"] == 1
    m = re.search(r"requested (\d+) B.*free (\d+) B.*cached (\d+) B.*largest free (\d+) B", str(e.value))
    assert m, str(e.value)
    arena = dev.arena.stats()
    assert tuple(map(int, m.groups())) == (20 * MiB, arena.free, 0, arena.largest_free)
    p.free(big)
    with pytest.raises(MemoryAllocationError) as e:             # cached now: reported, then released
        p.malloc(60 * MiB, s)
    m = re.search(r"cached (\d+) B", str(e.value))
    assert int(m.group(1)) == 0 and p.memory_stats()["reserved_bytes.all.current"] == 0
    h = p.malloc(20 * MiB, s)                                   # and the pool works on
    p.free(h)
    dev.free(other, owner="tenant-b")


def test_tight_segment_when_the_standard_one_does_not_fit(dev):
    p = make_pool(dev)
    s = dev.default_stream
    hog = dev.malloc(50 * MiB, 0, owner="tenant-b")             # 14 MiB left: no room for 20 MiB
    h = p.malloc(3 * MiB, s)
    assert p.snapshot()[0]["total_size"] == 4 * MiB              # just the request, in 2 MiB pages
    p.free(h)
    dev.free(hog, owner="tenant-b")


# ---------------------------------------------------------------------------------------------- streams
def test_record_stream_holds_the_block_until_the_other_stream_is_done(dev):
    """A block freed while another (recorded) stream still has work on it is not reused, by its own
    stream either, before that work completes; the control run without record_stream shows the hazard."""
    p = make_pool(dev)
    s_alloc, s_use = dev.create_stream(0), dev.create_stream(0)
    n = 1 << 16
    data = np.arange(n, dtype=np.uint8)
    out = dev.malloc(n)
    for recorded in (True, False):
        h = p.malloc(n, s_alloc)
        write(dev, h, data)
        gate = Gate(dev, s_use)                                 # s_use is held ...
        dev.submit([CopyD2D(s_use, out, h.ptr, n)])             # ... before it reads the block
        if recorded:
            p.record_stream(h, s_use)
        old = h.ptr
        p.free(h)
        h2 = p.malloc(n, s_alloc)
        if recorded:
            assert h2.ptr != old                                # pending: not handed out again
            assert p.memory_stats()["pending_free_blocks"] == 1
        else:
            assert h2.ptr == old                                # freed at once: reused at once
        dev.submit([Memset(s_alloc, h2.ptr, 0xEE, n)])          # the new owner overwrites its block
        dev.synchronize_stream(s_alloc, SYNC_MS)
        gate.open()
        dev.synchronize_stream(s_use, SYNC_MS)
        got = dev.memcpy_d2h(out, n)
        if recorded:
            np.testing.assert_array_equal(got, data)            # the other stream read the old contents
            h3 = p.malloc(n, s_alloc)                            # its work is done: the block comes back
            assert h3.ptr == old and p.memory_stats()["pending_free_blocks"] == 0
            p.free(h3)
        else:
            assert np.all(got == 0xEE)                          # the hazard record_stream prevents
        p.free(h2)
    dev.free(out)


def test_cross_stream_reuse_waits_on_the_device(dev):
    p = make_pool(dev)
    s1, s2 = dev.create_stream(0), dev.create_stream(0)
    n = 12 * MiB                                                 # own segment: wholly free once freed
    h = p.malloc(n, s1)
    write(dev, h, np.full(n, 7, np.uint8))
    out = dev.malloc(4096)
    gate = Gate(dev, s1)
    dev.submit([CopyD2D(s1, out, h.ptr, 4096)])                 # s1 still has to read it
    old = h.ptr
    p.free(h)
    h2 = p.malloc(n, s2)                                         # s2 has nothing cached: takes s1's segment
    assert h2.ptr == old
    st = p.memory_stats()
    assert st["num_cross_stream_reuse"] == 1 and st["num_device_alloc"] == 1
    dev.submit([Memset(s2, h2.ptr, 0, n)])
    assert not dev.query_stream(s2)                              # s2 waits for s1's earlier work ...
    gate.open()
    dev.synchronize_stream(s2, SYNC_MS)
    assert np.all(dev.memcpy_d2h(out, 4096) == 7)                # ... which read the old contents
    p.free(h2)
    dev.free(out)


def test_no_cross_stream_reuse_when_disabled(dev):
    p = make_pool(dev, "cross_stream_reuse:False")
    s1, s2 = dev.create_stream(0), dev.create_stream(0)
    h = p.malloc(12 * MiB, s1)
    p.free(h)
    h2 = p.malloc(12 * MiB, s2)
    assert h2.ptr != h.ptr and p.memory_stats()["num_device_alloc"] == 2
    p.free(h2)


def test_destroyed_stream_memory_serves_others_without_events(dev):
    p = make_pool(dev, "cross_stream_reuse:False")
    s1, s2 = dev.create_stream(0), dev.create_stream(0)
    h = p.malloc(12 * MiB, s1)
    p.free(h)
    dev.destroy_stream(s1)
    p.stream_destroyed(s1)
    h2 = p.malloc(12 * MiB, s2)
    assert h2.ptr == h.ptr and h2.fence is None
    p.free(h2)


def test_host_write_into_reused_memory_waits_for_its_stream(dev):
    """The fence: memory freed while its stream still had queued work makes the next host-synchronous
    write wait for that work (the pool tells it from a stream the host has seen idle)."""
    idle = set()
    p = make_pool(dev, quiet=lambda s: s in idle)
    s = dev.create_stream(0)
    n = 4096
    h = p.malloc(n, s)
    write(dev, h, np.full(n, 3, np.uint8))
    out = dev.malloc(n)
    gate = Gate(dev, s)
    dev.submit([CopyD2D(s, out, h.ptr, n)])
    p.free(h)
    h2 = p.malloc(n, s)
    assert h2.ptr == h.ptr and h2.fence == ("stream", s)
    gate.open()
    p.host_fence(h2)                                             # waits for the copy
    assert h2.fence is None
    write(dev, h2, np.zeros(n, np.uint8))
    np.testing.assert_array_equal(dev.memcpy_d2h(out, n), np.full(n, 3, np.uint8))
    p.free(h2)
    idle.add(s)
    h3 = p.malloc(n, s)
    assert h3.fence is not None                                  # freed before the stream was seen idle
    p.free(h3)
    h4 = p.malloc(n, s)
    assert h4.fence is None                                      # freed while the stream was idle
    p.free(h4)
    dev.free(out)


# ---------------------------------------------------------------------------------------------- placement
def test_long_lived_segments_pack_at_the_top(dev):
    p = make_pool(dev)
    s = dev.default_stream
    top = dev.arena.size
    w1 = p.malloc(12 * MiB, s, lifetime="long")
    a = p.malloc(3 * MiB, s)
    w2 = p.malloc(6 * MiB, s, lifetime="long")                   # in w1's... no: own 20 MiB long segment
    segs = sorted(p.snapshot(), key=lambda x: x["address"])
    longs = [x for x in segs if x["lifetime"] == "long"]
    shorts = [x for x in segs if x["lifetime"] == "short"]
    assert off(dev, shorts[0]["address"]) == 0                   # short-lived from the bottom
    ends = sorted(off(dev, x["address"]) + x["total_size"] for x in longs)
    starts = sorted(off(dev, x["address"]) for x in longs)
    assert ends[-1] == top and starts[1] == ends[0]              # long-lived packed together at the top
    assert off(dev, w1.ptr) >= top - 12 * MiB - 20 * MiB and off(dev, w2.ptr) >= top - 32 * MiB
    st = dev.arena.stats()
    assert st.largest_free == st.free                            # one free range between the two ends
    for h in (w1, a, w2):
        p.free(h)


def _churn(dev, conf: str) -> tuple[float, int]:
    """Interleave long-lived weights with short-lived activations, free the activations; return the
    arena fragmentation and its largest free range."""
    p = make_pool(dev, conf)
    s = dev.default_stream
    keep, temp = [], []
    for i in range(4):
        temp.append(p.malloc(11 * MiB, s))
        keep.append(p.malloc(4 * MiB, s, lifetime="long"))
    for h in temp:
        p.free(h)
    p.empty_cache()
    st = dev.arena.stats()
    for h in keep:
        p.free(h)
    p.empty_cache()
    return st.fragmentation, st.largest_free


def test_the_hint_keeps_the_free_space_in_one_piece():
    frag = {}
    for conf in ("lifetime_pools:True", "lifetime_pools:False"):
        d = Device(DeviceConfig(device_id=next(_ids), arena_bytes=128 * MiB))
        try:
            frag[conf] = _churn(d, conf)
        finally:
            d.close()
    # with the hint: activations in 12 MiB segments from the bottom, weights in one 20 MiB segment at the
    # top; once the activations go, [0, 108) MiB is one free range
    assert frag["lifetime_pools:True"] == (0.0, 108 * MiB)
    # without: weights share 20 MiB segments with activations; what is left free is [0, 12), [32, 44)
    # and [64, 128) MiB
    assert frag["lifetime_pools:False"] == (pytest.approx(1 - 64 / 88), 64 * MiB)


# ---------------------------------------------------------------------------------------------- max_split_size, GC
def test_max_split_size(dev):
    p = make_pool(dev, "max_split_size_mb:24")
    s = dev.default_stream
    big = p.malloc(30 * MiB, s)
    p.free(big)
    st = p.memory_stats()
    assert st["oversize_segments.current"] == 1 and st["oversize_allocations.allocated"] == 1
    small = p.malloc(3 * MiB, s)                   # never carved out of the oversize block
    assert not (big.ptr <= small.ptr < big.ptr + 30 * MiB)
    again = p.malloc(26 * MiB, s)                  # oversize request: the cached block, unsplit
    assert again.ptr == big.ptr
    assert p.memory_stats()["allocated_bytes.large_pool.current"] == 30 * MiB + 20 * MiB - 17 * MiB
    p.free(again)
    p.free(small)


def test_garbage_collection_threshold(dev):
    p = make_pool(dev, "garbage_collection_threshold:0.5")
    s1, s2 = dev.create_stream(0), dev.create_stream(0)
    hs = [p.malloc(12 * MiB, s1) for _ in range(2)]
    for h in hs:
        p.free(h)                                   # 24 MiB cached on s1 (useless to s2 without reuse ...)
    p2 = p.malloc(12 * MiB, s2)                      # ... it would be reused cross-stream: use another size
    p.free(p2)
    st = p.memory_stats()
    assert st["num_gc_releases"] == 0
    big = p.malloc(20 * MiB, s2)                     # 24 + 20 > 32 MiB (half the arena): collect first
    st = p.memory_stats()
    assert st["num_gc_releases"] >= 1
    assert st["reserved_bytes.all.current"] <= 32 * MiB
    p.free(big)


def test_memory_fraction_caps_the_pool(dev):
    p = make_pool(dev, "per_process_memory_fraction:0.5")
    s = dev.default_stream
    h = p.malloc(30 * MiB, s)
    with pytest.raises(MemoryAllocationError):
        p.malloc(4 * MiB, s)                         # 30 + 20 (or 4) > 32 MiB allowed
    assert dev.arena.stats().free > 30 * MiB         # the device had room: the cap refused it
    p.free(h)


# ---------------------------------------------------------------------------------------------- defragmentation
def test_defragment_makes_room_and_keeps_contents(dev):
    p = make_pool(dev)
    s = dev.default_stream
    hs = [p.malloc(12 * MiB, s) for _ in range(5)]               # offsets 0, 12, 24, 36, 48 MiB
    assert [off(dev, h.ptr) for h in hs] == [0, 12 * MiB, 24 * MiB, 36 * MiB, 48 * MiB]
    rng = np.random.default_rng(0)
    data = {i: rng.integers(0, 255, 12 * MiB, dtype=np.uint8) for i in (0, 2, 4)}
    for i, a in data.items():
        write(dev, hs[i], a)
    p.free(hs[1])
    p.free(hs[3])
    with pytest.raises(MemoryAllocationError) as e:
        p.malloc(24 * MiB, s)                                    # 28 MiB free, but 12 + 12 + 4 apart
    assert dev.arena.stats().free >= 24 * MiB and "defragment" in str(e.value)
    moved = []
    rep = p.defragment(rebind=lambda mv: moved.extend(mv) or 7)
    assert rep.blocks_moved == 2 and rep.bytes_moved == 24 * MiB and rep.graphs_rebound == 7
    assert rep.arena_largest_free_after == 28 * MiB and rep.arena_fragmentation_after == 0.0
    assert rep.arena_fragmentation_before > 0.5 and rep.pause_s > 0 and rep.copy_s > 0
    assert sorted(off(dev, h.ptr) for h in (hs[0], hs[2], hs[4])) == [0, 12 * MiB, 24 * MiB]
    assert {(o, n) for o, n, _ in moved} == {(o, n) for o, n, _ in rep.moves} and len(moved) == 2
    assert hs[2].moves == 1 and hs[0].moves == 0
    for i, a in data.items():
        np.testing.assert_array_equal(read(dev, hs[i], 12 * MiB), a)
    h = p.malloc(24 * MiB, s)
    st = p.memory_stats()
    assert st["num_defragmentations"] == 1 and st["defrag_bytes_moved"] == 24 * MiB
    p.free(h)
    for i in (0, 2, 4):
        p.free(hs[i])


def test_defragment_leaves_pinned_blocks_and_other_tenants_alone(dev):
    p = make_pool(dev)
    s = dev.default_stream
    a = p.malloc(12 * MiB, s)
    theirs = dev.malloc(12 * MiB, 0, owner="tenant-b")          # between the pool's segments
    b = p.malloc(12 * MiB, s)
    c = p.malloc(12 * MiB, s)
    p.pin(c)
    p.free(a)
    p.empty_cache()
    rep = p.defragment()
    assert off(dev, b.ptr) == 0 and b.moves == 1                 # b slid down into a's old place
    assert off(dev, c.ptr) == 36 * MiB and c.moves == 0           # pinned: stays
    assert dev.arena.allocation_of(theirs).owner == "tenant-b" and off(dev, theirs) == 12 * MiB
    assert rep.blocks_moved == 1
    p.free(b)
    p.free(c)
    dev.free(theirs, owner="tenant-b")


def test_defragment_packs_sparse_small_segments(dev):
    p = make_pool(dev)
    s = dev.default_stream
    hs = [p.malloc(512 * 1024, s) for _ in range(16)]            # 4 per 2 MiB segment: 4 segments
    keep = hs[3::4]                                              # the last block of each segment
    vals = {}
    for i, h in enumerate(keep):
        vals[i] = np.full(512 * 1024, i + 1, np.uint8)
        write(dev, h, vals[i])
    for h in hs:
        if h not in keep:
            p.free(h)
    hole = p.malloc(12 * MiB, s)                                 # something after the small segments
    assert p.memory_stats()["segment.small_pool.current"] == 4
    p.free(hole)
    p.empty_cache()
    rep = p.defragment()
    st = p.memory_stats()
    assert st["segment.small_pool.current"] == 1 and rep.segments_moved >= 4
    assert st["reserved_bytes.small_pool.current"] == 2 * MiB     # 4 x 512 KiB packed tight ...
    assert min(off(dev, h.ptr) for h in keep) == 0                # ... and slid to the bottom (a 2nd pass)
    assert rep.arena_fragmentation_after == 0.0
    for i, h in enumerate(keep):
        np.testing.assert_array_equal(read(dev, h, 512 * 1024), vals[i])
        p.free(h)


def test_defragment_of_long_lived_slides_up(dev):
    p = make_pool(dev)
    s = dev.default_stream
    w = [p.malloc(12 * MiB, s, lifetime="long") for _ in range(3)]   # top: 52, 40, 28 MiB
    assert [off(dev, h.ptr) for h in w] == [52 * MiB, 40 * MiB, 28 * MiB]
    p.free(w[0])
    p.empty_cache()
    rep = p.defragment()
    assert sorted(off(dev, h.ptr) for h in w[1:]) == [40 * MiB, 52 * MiB]
    assert rep.arena_fragmentation_after == 0.0
    for h in w[1:]:
        p.free(h)


# ---------------------------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("text,match", [
    ("bogus:1", "unknown key 'bogus'"),
    ("max_split_size_mb:20", "too small, must be > 20"),
    ("max_split_size_mb:-3", "positive whole number"),
    ("max_split_size_mb:abc", "not a number"),
    ("garbage_collection_threshold:1.0", r"in \(0, 1\)"),
    ("garbage_collection_threshold:0", r"in \(0, 1\)"),
    ("roundup_power2_divisions:3", "power of two"),
    ("roundup_power2_divisions:[256:1,>:8,512:2]", "last item"),
    ("roundup_power2_divisions:[512:1,256:2]", "increase"),
    ("roundup_power2_divisions:[256:1", "unbalanced"),
    ("expandable_segments:True", "not supported"),
    ("cross_stream_reuse:maybe", "True or False"),
    ("large_segment_size_mb:5", "multiple of 2"),
    ("per_process_memory_fraction:1.5", r"in \(0, 1\]"),
    ("max_split_size_mb", "not key:value"),
])
def test_bad_settings_are_clear_errors(text, match):
    with pytest.raises(AllocConfigError, match=match) as e:
        parse(text)
    assert e.value.code == 107000 and "VNPU_ALLOC_CONF" in str(e.value)


def test_settings_parse_and_come_from_the_environment():
    cfg = AllocConfig.from_env({"VNPU_ALLOC_CONF": " max_split_size_mb:64 , garbage_collection_threshold:0.6,"
                                                   "expandable_segments:False,segment_size_mb:16,"
                                                   "roundup_power2_divisions:[256:1,>:4]"})
    assert cfg.max_split_size == 64 * MiB and cfg.garbage_collection_threshold == 0.6
    assert cfg.large_segment_size == 16 * MiB and cfg.roundup_power2_divisions == ((256, 1), (None, 4))
    assert AllocConfig.from_env({}) == AllocConfig()
    assert parse(cfg.describe()) == cfg                          # describe() round-trips
    assert set(KEYS) >= {"max_split_size_mb", "garbage_collection_threshold", "roundup_power2_divisions",
                         "expandable_segments", "max_non_split_rounding_mb"}


def test_placement_hints_reach_the_arena(dev):
    lo = dev.malloc(4096, 0, placement=PLACEMENT_LOW)
    hi = dev.malloc(4096, 0, placement=PLACEMENT_HIGH)
    assert off(dev, lo) == 0 and off(dev, hi) + dev.arena.allocation_of(hi).reserved == dev.arena.size
    with pytest.raises(InvalidParamError):
        dev.malloc(4096, 0, placement=7)
    dev.free(lo)
    dev.free(hi)


# ---------------------------------------------------------------------------------------------- graph re-binding
def test_graph_rebind_on_the_device(dev):
    from devices.kernel import TensorDesc
    from devices.tasks import ExecGraph, Launch
    s = dev.default_stream
    a, b, c = (dev.malloc(256) for _ in range(3))
    dev.memcpy_h2d(a, np.ones(64, np.float32))
    dev.memcpy_h2d(b, np.full(64, 2.0, np.float32))
    da, dc = TensorDesc(a, (64,), "float32"), TensorDesc(c, (64,), "float32")
    gid = dev.graph_create([Launch(s, "add", (da, da), (dc,))])
    dev.submit([ExecGraph(s, gid)])
    dev.synchronize_stream(s, SYNC_MS)
    np.testing.assert_array_equal(dev.memcpy_d2h(c, 256).view(np.float32), np.full(64, 2.0))
    assert dev.graph_rebind(gid, [(a, b, 256)]) == 2                  # both inputs now read b
    assert dev.graph_rebind(gid, [(a + 4096, b, 256)]) == 0           # nothing of the graph there
    dev.submit([ExecGraph(s, gid)])
    dev.synchronize_stream(s, SYNC_MS)
    np.testing.assert_array_equal(dev.memcpy_d2h(c, 256).view(np.float32), np.full(64, 4.0))
    nowhere = make_ptr(dev.id, dev.arena.size - 4096)
    with pytest.raises(MemoryAccessError):
        dev.graph_rebind(gid, [(b, nowhere, 256)])                    # refused: the graph stays as it was
    with pytest.raises(InvalidParamError, match="overlap"):
        dev.graph_rebind(gid, [(b, a, 256), (b + 128, c, 256)])
    dev.memcpy_h2d(b, np.full(64, 3.0, np.float32))
    dev.submit([ExecGraph(s, gid)])
    dev.synchronize_stream(s, SYNC_MS)
    np.testing.assert_array_equal(dev.memcpy_d2h(c, 256).view(np.float32), np.full(64, 6.0))
    assert dev.graph_info(gid)["replays"] == 3
    dev.graph_destroy(gid)
    for p in (a, b, c):
        dev.free(p)


# ---------------------------------------------------------------------------------------------- the benchmark's workload
def test_decode_service_workload_is_deterministic_and_the_hint_helps():
    """The figures `vnpu bench memory` reports for the fragmenting workload are reproducible, and on
    the one-step-buffer service the lifetime hint fails fewer steps than the plain allocator."""
    from runtime.bench.memory import SERVICES, decode_service
    spec = SERVICES["one step buffer"]
    plain = decode_service("lifetime_pools:False", spec, 300, 0)
    assert decode_service("lifetime_pools:False", spec, 300, 0) == plain
    hint = decode_service("", spec, 300, 0)
    assert hint["steps"] == plain["steps"] and hint["requests"] == plain["requests"]
    assert hint["failed_steps"] < plain["failed_steps"]
    assert hint["peak_allocated"] <= spec.arena and plain["num_ooms"] == plain["failed_steps"] + plain["failed_requests"]


def test_empty_cache_with_a_timeout_leaves_busy_memory_cached(dev):
    """A stream that does not finish (a hung device) does not hang empty_cache(timeout_ms): its segments
    stay cached, the idle stream's go back; once the work is done they go too."""
    p = make_pool(dev)
    s_busy, s_idle = dev.create_stream(0), dev.create_stream(0)
    a, b = p.malloc(12 * MiB, s_busy), p.malloc(12 * MiB, s_idle)
    gate = Gate(dev, s_busy)
    p.free(a)
    p.free(b)
    assert p.empty_cache(timeout_ms=50) == 1                     # only the idle stream's segment
    assert p.memory_stats()["reserved_bytes.all.current"] == 12 * MiB
    gate.open()
    assert p.empty_cache(timeout_ms=5000) == 1
    assert p.memory_stats()["reserved_bytes.all.current"] == 0 and dev.arena.stats().used == 0


def test_caching_off_gives_every_block_its_own_driver_allocation(dev):
    """``caching:False`` (what a sanitizer run uses, as PYTORCH_NO_CUDA_MEMORY_CACHING=1): exact-size
    driver allocations, returned on free; defragmentation still moves them, each into its own size."""
    p = make_pool(dev, "caching:False")
    s = dev.default_stream
    a, b, c = p.malloc(12 * MiB, s), p.malloc(12 * MiB, s), p.malloc(1000, s)
    assert dev.arena.allocation_of(c.ptr).size == 1000             # the device checks the exact bounds
    with pytest.raises(MemoryAccessError):
        dev.memcpy_h2d(c.ptr + 996, np.zeros(8, np.uint8))
    st = p.memory_stats()
    assert (st["num_device_alloc"], st["reserved_bytes.all.current"]) == (3, 1000 + 24 * MiB)
    old_b = b.ptr
    p.free(a)
    assert dev.arena.stats().allocations == 2 and p.memory_stats()["num_device_free"] == 1
    write(dev, b, np.full(12 * MiB, 9, np.uint8))
    rep = p.defragment()
    assert rep.blocks_moved >= 1 and b.ptr < old_b and dev.arena.allocation_of(b.ptr).size == 12 * MiB
    assert np.all(read(dev, b, 12 * MiB) == 9)
    p.free(b)
    p.free(c)
    assert dev.arena.stats().used == 0 and p.empty_cache() == 0
