"""The caching pool's size (``memory.pool_size`` of serve.yaml): pre-warm (:meth:`CachingAllocator.reserve`),
a cap on reserved bytes (:meth:`set_limit`) that grows or shrinks a live pool without touching a live
block, and :meth:`trim`.  A real in-process device (its arena is the driver allocator); data written into
live blocks is read back after every resize."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from devices.device import Device, DeviceConfig
from devices.errors import InvalidParamError, MemoryAllocationError
from runtime.memory import CachingAllocator, HandleAllocator, HandleStreamOrder, parse

MiB = 1 << 20
_ids = itertools.count(180)


@pytest.fixture
def dev():
    d = Device(DeviceConfig(device_id=next(_ids), arena_bytes=96 * MiB))
    yield d
    d.close()


def make_pool(dev) -> CachingAllocator:
    return CachingAllocator(HandleAllocator(dev), HandleStreamOrder(dev), parse(""), device=dev.id)


def test_reserve_pre_warms_and_later_requests_need_no_driver_call(dev):
    p = make_pool(dev)
    assert p.reserve(50 * MiB) == 50 * MiB                     # two 20 MiB segments and a 10 MiB one
    st = p.memory_stats()
    assert st["num_device_alloc"] == 3 and st["allocated_bytes.all.current"] == 0
    free_before = dev.mem_info()[0] if hasattr(dev, "mem_info") else None
    s1, s2 = dev.default_stream, dev.create_stream()
    hs = [p.malloc(8 * MiB, s1), p.malloc(8 * MiB, s2), p.malloc(9 * MiB, s1)]   # any stream takes a warm one
    assert p.memory_stats()["num_device_alloc"] == 3            # served from the pre-warmed pool
    if free_before is not None:
        assert dev.mem_info()[0] == free_before
    for h in hs:
        p.free(h)
    assert p.reserve(10 * MiB) == 50 * MiB                     # already that large: nothing more


def test_the_cap_refuses_growth_the_arena_could_give(dev):
    p = make_pool(dev)
    p.set_limit(40 * MiB)
    a = p.malloc(18 * MiB, dev.default_stream)                 # >= 10 MiB: a segment of its own (18 MiB)
    b = p.malloc(18 * MiB, dev.default_stream)                 # another: 36 MiB reserved
    with pytest.raises(MemoryAllocationError) as e:
        p.malloc(6 * MiB, dev.default_stream)                  # the arena has 60 MiB free, the cap 4 MiB
    assert e.value.code == 207001
    c = p.malloc(4 * MiB, dev.default_stream)                  # what fits under the cap still does
    assert p.reserve(80 * MiB) == 40 * MiB                     # pre-warm stops at the cap too
    p.free(c)
    p.free(a)
    p.free(b)
    with pytest.raises(InvalidParamError):
        p.set_limit(0)


def test_grow_and_shrink_a_live_pool_without_touching_live_blocks(dev):
    p = make_pool(dev)
    s = dev.default_stream
    p.reserve(60 * MiB)
    live = [p.malloc(12 * MiB, s) for _ in range(2)]           # each in a warm 20 MiB segment
    data = [np.arange(12 * MiB // 4, dtype=np.float32) + i for i in range(2)]
    for h, x in zip(live, data):
        dev.memcpy_h2d(h.ptr, x)
    ptrs = [h.ptr for h in live]
    # shrink below what is reserved: the cached segment goes, the live ones stay where they are
    assert p.set_limit(30 * MiB) == 40 * MiB
    assert [h.ptr for h in live] == ptrs
    for h, x in zip(live, data):
        assert np.array_equal(dev.memcpy_d2h(h.ptr, x.nbytes).view(np.float32), x)
    p.free(live[1])
    assert p.trim() == 20 * MiB                                # the freed one goes back once trimmed
    # grow: more fits again, and pre-warm fills the new size
    p.set_limit(64 * MiB)
    assert p.reserve(64 * MiB) == 64 * MiB
    extra = p.malloc(30 * MiB, s)
    assert np.array_equal(dev.memcpy_d2h(live[0].ptr, data[0].nbytes).view(np.float32), data[0])
    p.free(extra)
    p.free(live[0])
    p.set_limit(None)
    assert p.limit is None
