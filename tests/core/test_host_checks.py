"""The runtime's host-side range checks (``runtime.api.AllocTable``, ``Device.check_range`` / ``alloc_gen``):
what it remembers of raw allocations and their frees, what it forgets, and what it leaves to the device.
These are the checks that let a batched launch or a graph replay over freed memory fail on the host before
anything is sent (the device-side layer is tested on its own in test_graph.py)."""
from __future__ import annotations

import numpy as np
import pytest

from devices.errors import InvalidParamError, MemoryAccessError
from runtime.api import AllocTable

B = 0xAC << 56                     # any base: the table only compares integers


def _uaf(ptr: int, size: int, start: int) -> str:
    return f"0x{ptr:x} points to freed memory (use after free of the {size} B allocation at 0x{start:x})"


def _refused(t: AllocTable, ptr: int, nbytes: int = 1) -> str:
    with pytest.raises(MemoryAccessError) as ei:
        t.check(ptr, nbytes)
    assert ei.value.code == 107000
    return ei.value.detail


def test_a_freed_allocation_is_remembered_with_its_size_and_a_live_one_bounds_its_accesses():
    t = AllocTable()
    t.add(B + 1000, 100)
    t.check(B + 1000, 100)
    t.check(B + 1099, 1)
    assert _refused(t, B + 1050, 51) == (f"access of 51 B at 0x{B + 1050:x} overruns its allocation (100 B at "
                                         f"0x{B + 1000:x}, 50 B left)")
    t.remove(B + 1000)
    assert _refused(t, B + 1000) == _uaf(B + 1000, 100, B + 1000)
    assert _refused(t, B + 1099) == _uaf(B + 1099, 100, B + 1000)
    t.check(B + 1100, 8)                       # past the freed allocation: left to the device
    t.check(B + 999, 1)
    t.remove(B + 5000)                         # not this table's: nothing recorded (the device decides)
    t.check(B + 5000, 4)


def test_memory_freed_behind_the_tables_back_and_handed_out_again_replaces_its_entries():
    """A device reset (or any free the table did not see) lets the device hand the same addresses out again:
    the new allocation replaces the live entries under it -- a second entry at the same start left a start
    without a size, and a later check raised KeyError (found in CI as a 500000 from acl.media)."""
    t = AllocTable()
    t.add(B + 1000, 100)
    t.add(B + 1200, 100)
    gen = t.gen
    t.add(B + 1000, 16)                        # the same start again
    t.add(B + 1250, 100)                       # over the tail of the other one
    assert t.gen > gen                         # cached launch checks over the dropped ones do not hold
    t.check(B + 1000, 16)
    assert _refused(t, B + 1000, 17).startswith(f"access of 17 B at 0x{B + 1000:x} overruns its allocation (16 B")
    t.remove(B + 1000)
    assert _refused(t, B + 1000) == _uaf(B + 1000, 16, B + 1000)
    t.check(B + 1200, 4)                       # the replaced one: left to the device
    t.remove(B + 1200)                         # not live any more: nothing to record
    t.check(B + 1250, 100)


def test_an_allocation_over_freed_ranges_makes_exactly_those_live_again():
    """Freed [500, 600), [800, 900), [1000, 1100), [1150, 1200), [1300, 1400), [1400, 1500); a new allocation
    [900, 1300) overlaps the middle two: they are forgotten (memory in use again, left to the device past
    the new allocation's end), the ones that end at its start or begin at its end are still freed."""
    t = AllocTable()
    spans = [(500, 100), (800, 100), (1000, 100), (1150, 50), (1300, 100), (1400, 100)]
    for s, n in spans:
        t.add(B + s, n)
    for s, _ in spans:
        t.remove(B + s)
    t.add(B + 900, 400)
    assert _refused(t, B + 899) == _uaf(B + 899, 100, B + 800)           # ends at the new start
    assert _refused(t, B + 1300) == _uaf(B + 1300, 100, B + 1300)        # begins at the new end
    assert _refused(t, B + 1450) == _uaf(B + 1450, 100, B + 1400)
    t.check(B + 1000, 300)                                                # the live one
    t.remove(B + 900)                                                     # freed again: as one allocation
    assert _refused(t, B + 1050) == _uaf(B + 1050, 400, B + 900)
    assert _refused(t, B + 550) == _uaf(B + 550, 100, B + 500)
    # an allocation that covers only the first part of a freed range: the rest is no longer "freed"
    u = AllocTable()
    u.add(B + 1000, 100)
    u.remove(B + 1000)
    u.add(B + 950, 100)                                                  # [950, 1050)
    u.check(B + 1060, 4)                                                 # not live, not freed: the device's
    assert _refused(u, B + 1040, 20).startswith(f"access of 20 B at 0x{B + 1040:x} overruns")


def test_the_freed_history_is_bounded_and_every_free_changes_the_generation():
    """At most MAX_FREED freed ranges are remembered: the free that would hold one more forgets the
    older ones (the device still checks them).  Every free, known or not, moves the generation forward
    (a sum with the pool's: it must never go back)."""
    t = AllocTable()
    n = AllocTable.MAX_FREED
    gens = [t.gen]
    for i in range(n):
        t.add(B + 64 * i, 64)
        t.remove(B + 64 * i)
        if i < 3:
            gens.append(t.gen)
    _refused(t, B)                                           # all MAX_FREED are known
    _refused(t, B + 64 * (n - 1))
    t.add(B + 64 * n, 64)
    t.remove(B + 64 * n)                                     # one more: the older ones are forgotten
    t.check(B, 1)
    t.check(B + 64 * (n - 1), 1)
    assert _refused(t, B + 64 * n) == _uaf(B + 64 * n, 64, B + 64 * n)
    t.remove(B + 1)                                          # unknown pointer: still a new generation
    gens.append(t.gen)
    assert gens[:4] == [0, 1, 2, 3] and gens[-1] == n + 2


def test_a_runtime_free_is_checked_on_the_host_and_pool_memory_is_not_freed_raw(rt):
    """Through the runtime: a raw allocation freed with Device.free is known to the host check (107000
    before anything is sent), the generation moves, the policy reaches the driver; the pointer of a pool
    Tensor is refused by Device.free (and stays usable)."""
    from devices.arena import ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEM_MALLOC_NORMAL_ONLY, block_size
    dev = rt.device(0)
    ptr = dev.malloc(256)
    g = dev.alloc_gen
    dev.free(ptr)
    assert dev.alloc_gen == g + 1
    with pytest.raises(MemoryAccessError) as ei:
        dev.check_range(ptr + 8, 4)
    assert ei.value.detail == _uaf(ptr + 8, 256, ptr)
    t = dev.from_numpy(np.arange(16, dtype=np.float32))
    try:
        with pytest.raises(InvalidParamError) as ei:
            dev.free(t.ptr)
        assert ei.value.detail == (f"0x{t.ptr:x} is memory of the caching pool (a Tensor's), not a raw "
                                   "allocation: free the Tensor")
        np.testing.assert_array_equal(t.numpy(), np.arange(16, dtype=np.float32))
    finally:
        t.free()
    arena = getattr(dev.handle, "arena", None)               # in-process: the allocation table itself
    if arena is not None:
        big = (1 << 20) + 1
        p, q = dev.malloc(big), dev.malloc(big, ACL_MEM_MALLOC_NORMAL_ONLY)
        try:
            got = {a.offset: (a.policy, a.reserved) for a in arena.live_allocations()}
            assert got[p & ((1 << 40) - 1)] == (ACL_MEM_MALLOC_HUGE_FIRST, block_size(big))
            assert got[q & ((1 << 40) - 1)] == (ACL_MEM_MALLOC_NORMAL_ONLY, block_size(big, ACL_MEM_MALLOC_NORMAL_ONLY))
        finally:
            dev.free(p)
            dev.free(q)


def test_the_host_counts_each_accepted_launch_once_and_caches_only_good_checks(rt):
    """``host_stats.launches`` counts launches the host accepted (a refused one is not queued, not
    counted); a refused launch is not remembered as checked: the same bad launch is refused again, and
    the good one that follows is accepted and runs."""
    dev = rt.device(0)
    s = dev.stream()
    x = dev.from_numpy(np.ones(64, np.float32))
    small = dev.from_numpy(np.ones(16, np.float32))
    try:
        before = dev.host_stats.launches
        for _ in range(3):
            s.launch("add", [x, x], [x])
        assert dev.host_stats.launches == before + 3
        bad = _over_desc(small)
        for _ in range(2):
            with pytest.raises(MemoryAccessError) as ei:
                s.launch("add", [bad, bad], [bad])
            assert ei.value.detail.startswith(f"access of 256 B at 0x{small.ptr:x} overruns")
        assert dev.host_stats.launches == before + 3
        s.launch("add", [small, small], [small])
        s.synchronize(20_000)
        np.testing.assert_array_equal(x.numpy(), np.full(64, 8.0, np.float32))
        np.testing.assert_array_equal(small.numpy(), np.full(16, 2.0, np.float32))
        assert dev.host_stats.launches == before + 4
    finally:
        x.free()
        small.free()
        s.destroy()


def _over_desc(t):
    """A descriptor that claims 64 float32 at a 16-element tensor's address."""
    from devices.kernel import TensorDesc
    return TensorDesc(t.ptr, (64,), "float32")


def test_launch_defaults_other_devices_and_the_host_time_it_accounts(rt):
    """A launch without block_dim leaves the split to the device's default rule (a large add gets more
    than one block); a pointer of another device is refused at the call with both devices named; the host
    time spent queuing launches only grows, by no more than the time the calls took."""
    import time
    from devices.kernel import TensorDesc
    dev, other = rt.device(0), rt.device(1)
    s = dev.stream()
    big = dev.from_numpy(np.ones(1 << 21, np.float32))
    far = other.from_numpy(np.ones(64, np.float32))
    try:
        s.begin_capture()
        s.launch("add", [big, big], [big])
        g = s.end_capture()
        info = g.info()
        assert info["steps"][0]["name"] == "add" and info["steps"][0]["blocks"] > 1
        g.destroy()
        d = TensorDesc(far.ptr, (64,), "float32")
        with pytest.raises(MemoryAccessError) as ei:
            s.launch("add", [d, d], [d])
        assert ei.value.detail == (f"pointer 0x{far.ptr:x} belongs to device {other.physical_id}, not device "
                                   f"{dev.physical_id}")
        hs = dev.host_stats
        t0, before = time.perf_counter(), hs.launch_s
        seen = [before]
        for _ in range(20):
            s.launch("add", [big, big], [big])
            seen.append(hs.launch_s)
        total = time.perf_counter() - t0
        assert seen == sorted(seen) and 0.0 < seen[-1] - before <= total
        s.synchronize(20_000)
    finally:
        big.free()
        far.free()
        s.destroy()


class _MallocDuringFree:
    """A device handle that, as the device takes a freed block back, lets another caller allocate (at once,
    the same size: the device hands the same address out again) -- the interleaving of two threads."""

    def __init__(self, inner):
        self.inner, self.runtime_device, self.reused = inner, None, None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def free(self, ptr):
        self.inner.free(ptr)
        if self.runtime_device is not None:
            dev, self.runtime_device = self.runtime_device, None
            self.reused = dev.malloc(256)


def test_an_address_freed_and_allocated_again_by_another_thread_stays_live():
    from devices.device import Device, DeviceConfig
    from runtime.cluster.failover import wrap_handle
    inner = Device(DeviceConfig(device_id=0, arena_bytes=16 << 20, shm=False))
    h = _MallocDuringFree(inner)
    dev = wrap_handle(h)
    try:
        p = dev.malloc(256)
        h.runtime_device = dev
        dev.free(p)
        assert h.reused == p                   # the same address, allocated while the free was returning
        dev.check_range(p, 256)                # live: launches over it are not refused as use after free
        dev.free(p)
        with pytest.raises(MemoryAccessError):
            dev.check_range(p, 4)
    finally:
        dev.rt.close()
        inner.close()
