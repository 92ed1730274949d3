"""Unit tests of the HBM arena (devices.arena): CANN allocation rules, bounds checks, shared memory.

The stateful test drives ``HbmArena`` with random malloc / free / write / read steps and checks it
against a plain Python model after every step; the deterministic tests pin down the rules one by one.
"""
from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, multiple, precondition, rule

from devices.arena import (ARENA_HEADER, ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEM_MALLOC_NORMAL_ONLY, Allocator, HbmArena, attach,
                           block_size, make_ptr, ptr_offset)
from devices.errors import AclError, InvalidParamError, MemoryAccessError, MemoryAllocationError, error_for_code

OFF_MASK = (1 << 40) - 1
KIB = 1 << 10
MIB = 1 << 20
_dev_ids = itertools.count(100)


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def cann_block(size: int) -> int:
    """Bytes CANN reserves for a request of ``size`` <= 1 MiB: round to 32, add 32, 64-aligned start."""
    return round_up(round_up(size, 32) + 32, 64)


def off(ptr: int) -> int:
    return ptr & OFF_MASK


@pytest.fixture
def arena():
    a = HbmArena(next(_dev_ids), 1 * MIB)
    try:
        yield a
    finally:
        a.close()


# ------------------------------------------------------------------------------------------ stateful
ARENA_BYTES = 128 * KIB
END_BYTES = 8          # pattern-filled bytes at each end of every block


def _ends(size: int) -> tuple[int, int]:
    """(head, tail) pattern lengths of a block: the first and the last bytes, never overlapping."""
    n = min(END_BYTES, size)
    return n, min(END_BYTES, size - n)


class ArenaMachine(RuleBasedStateMachine):
    """malloc / free / write / read on a 128 KiB arena against a model of live blocks and their bytes."""

    blocks = Bundle("blocks")

    def __init__(self):
        super().__init__()
        self.dev = next(_dev_ids)
        self.arena = HbmArena(self.dev, ARENA_BYTES)
        # model: start offset -> [size, reserved, content(np.uint8), known(bool mask), head, tail]
        self.live: dict[int, list] = {}
        self.freed: set[int] = set()        # starts freed and not handed out again at the same start
        self.peak = 0
        self.fill = 0

    def teardown(self):
        self.arena.close()

    # -- model helpers
    def _used(self) -> int:
        return sum(b[1] for b in self.live.values())

    def _gaps(self) -> list[tuple[int, int]]:
        """Free ranges implied by the live blocks (maximal, i.e. fully coalesced)."""
        gaps, pos = [], 0
        for s in sorted(self.live):
            if s > pos:
                gaps.append((pos, s - pos))
            pos = s + self.live[s][1]
        if pos < ARENA_BYTES:
            gaps.append((pos, ARENA_BYTES - pos))
        return gaps

    def _verify_block(self, start: int) -> None:
        size, _, content, known, head, tail = self.live[start]
        got = self.arena.view(make_ptr(self.dev, start), size)
        assert np.array_equal(got[known], content[known]), f"block at {start:#x} lost data"
        assert bytes(got[:len(head)]) == head, f"head pattern of block at {start:#x} overwritten"
        assert bytes(got[size - len(tail):]) == tail, f"tail pattern of block at {start:#x} overwritten"

    # -- rules
    @rule(target=blocks, size=st.one_of(st.integers(1, 64 * KIB), st.integers(16 * KIB, 64 * KIB), st.integers(1, 256),
                                        st.sampled_from([32, 64, 96])))
    def malloc(self, size):
        need = cann_block(size)
        gaps = self._gaps()
        fits = [g for g in gaps if g[1] >= need]
        if not fits:
            with pytest.raises(MemoryAllocationError) as ei:
                self.arena.malloc(size)
            assert ei.value.code == 207001
            return multiple()
        ptr = self.arena.malloc(size)
        start = off(ptr)
        assert (ptr >> 40) & 0xFFFF == self.dev
        # best fit: the smallest free range that is large enough, from its start
        best = min(g[1] for g in fits)
        assert (start, best) in [(g[0], g[1]) for g in fits if g[1] == best], \
            f"malloc({size}) placed at {start:#x}, not at the start of a smallest fitting free range {fits}"
        # pattern-fill both ends
        self.fill = (self.fill + 1) % 251
        n, m = _ends(size)
        head = bytes((self.fill + i) % 256 for i in range(n))
        tail = bytes((self.fill * 7 + i + 1) % 256 for i in range(m))
        v = self.arena.view(ptr, size)
        v[:n] = np.frombuffer(head, np.uint8)
        v[size - m:] = np.frombuffer(tail, np.uint8)
        content = np.zeros(size, np.uint8)
        known = np.zeros(size, bool)
        content[:n] = np.frombuffer(head, np.uint8)
        content[size - m:] = np.frombuffer(tail, np.uint8)
        known[:n] = True
        known[size - m:] = True
        self.live[start] = [size, need, content, known, head, tail]
        # freed starts that this block covers are memory in use again: no double free (the interior of a
        # live block: 107000); test_freed_memory_allocated_again_is_memory_in_use
        self.freed -= {f for f in self.freed if start <= f < start + need}
        self.peak = max(self.peak, self._used())
        return ptr

    @rule(ptr=consumes(blocks))
    def free(self, ptr):
        start = off(ptr)
        assert start in self.live
        self._verify_block(start)
        self.arena.free(ptr)
        del self.live[start]
        self.freed.add(start)

    @rule(kind=st.sampled_from(["size", "double", "never", "other_device", "oob"]), data=st.data())
    def misuse(self, kind, data):
        """One bad call; it must raise its code and change nothing (the invariants check the rest)."""
        before = self.arena.stats()
        if kind == "size":
            size = data.draw(st.one_of(st.just(0), st.integers(-(1 << 20), -1)))
            with pytest.raises(InvalidParamError) as ei:
                self.arena.malloc(size)
            assert ei.value.code == 107000
        elif kind == "double":
            if not self.freed:
                return
            start = data.draw(st.sampled_from(sorted(self.freed)))
            assert start not in self.live
            with pytest.raises(AclError) as ei:
                self.arena.free(make_ptr(self.dev, start))
            assert ei.value.code == 207002
        elif kind == "never":
            o = data.draw(st.integers(0, ARENA_BYTES - 1))
            if o in self.live or o in self.freed:
                return
            with pytest.raises(AclError) as ei:
                self.arena.free(make_ptr(self.dev, o))
            assert ei.value.code == 107000
        elif kind == "other_device":
            o = data.draw(st.sampled_from(sorted(self.live)) if self.live else st.integers(0, ARENA_BYTES - 1))
            with pytest.raises(MemoryAccessError):
                self.arena.free(make_ptr(self.dev + 1, o))
            with pytest.raises(MemoryAccessError):
                self.arena.view(make_ptr(self.dev + 1, o), 1)
        else:
            if not self.live:
                return
            start = data.draw(st.sampled_from(sorted(self.live)))
            size = self.live[start][0]
            o = data.draw(st.integers(0, size))
            with pytest.raises(MemoryAccessError):
                self.arena.view(make_ptr(self.dev, start) + o, size - o + 1)
        assert self.arena.stats() == before

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def write(self, data):
        start = data.draw(st.sampled_from(sorted(self.live)))
        size, _, content, known = self.live[start][:4]
        o = data.draw(st.integers(0, size - 1))
        n = data.draw(st.integers(1, min(size - o, 512)))
        # keep the end patterns: write only between them when there is room
        lo, hi = _ends(size)[0], size - _ends(size)[1]
        if hi > lo:
            o = lo + o % (hi - lo)
            n = max(1, min(n, hi - o))
        else:
            return
        payload = np.frombuffer(data.draw(st.binary(min_size=n, max_size=n)), np.uint8)
        self.arena.view(make_ptr(self.dev, start) + o, n)[:] = payload
        content[o:o + n] = payload
        known[o:o + n] = True

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def read(self, data):
        start = data.draw(st.sampled_from(sorted(self.live)))
        size, _, content, known = self.live[start][:4]
        o = data.draw(st.integers(0, size - 1))
        n = data.draw(st.integers(1, size - o))
        got = self.arena.view(make_ptr(self.dev, start) + o, n)
        k = known[o:o + n]
        assert np.array_equal(got[k], content[o:o + n][k])

    # -- invariants
    @invariant()
    def stats_consistent(self):
        s = self.arena.stats()
        used = self._used()
        assert s.total == ARENA_BYTES
        assert s.used == used
        assert s.free == ARENA_BYTES - used
        assert s.allocations == len(self.live)
        assert s.peak >= s.used
        assert s.peak == self.peak
        assert s.largest_free <= s.free
        gaps = self._gaps()
        assert s.largest_free == max((g[1] for g in gaps), default=0)
        if s.free == 0:
            assert s.fragmentation == 0.0
        else:
            assert s.fragmentation == pytest.approx(1.0 - s.largest_free / s.free)
        assert s.canary_violations == 0

    @invariant()
    def layout_consistent(self):
        allocs = self.arena.live_allocations()
        assert sorted(a.offset for a in allocs) == sorted(self.live)
        prev_end = 0
        for a in sorted(allocs, key=lambda a: a.offset):
            assert a.offset % 64 == 0, f"block start {a.offset:#x} not 64-byte aligned"
            assert a.offset >= prev_end, "live blocks overlap"
            assert a.size == self.live[a.offset][0]
            assert a.reserved == cann_block(a.size) == self.live[a.offset][1]
            prev_end = a.offset + a.reserved
        assert prev_end <= ARENA_BYTES
        # the allocator's free list is exactly the coalesced complement of the live blocks
        assert self.arena._alloc.free_ranges() == self._gaps()


TestArenaStateful = ArenaMachine.TestCase
TestArenaStateful.settings = settings(max_examples=50, stateful_step_count=50, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# ------------------------------------------------------------------------------------------ rules
@pytest.mark.parametrize("size,expected", [
    (1, 64), (31, 64), (32, 64), (33, 128), (64, 128), (95, 128), (96, 128), (97, 192), (128, 192),
    (1000, 1088), (4096, 4160), (MIB, MIB + 64),
])
def test_cann_rounding(size, expected):
    assert cann_block(size) == expected
    assert block_size(size) == expected
    assert block_size(size, ACL_MEM_MALLOC_NORMAL_ONLY) == expected


def test_rounding_applied_by_malloc(arena):
    sizes = [1, 32, 33, 100, 1000, 64]
    ptrs = [arena.malloc(s) for s in sizes]
    for p, s in zip(ptrs, sizes):
        assert off(p) % 64 == 0
        assert arena.allocation_of(p).reserved == cann_block(s)
        assert arena.allocation_of(p).size == s
    # a fresh arena hands out consecutive blocks
    for p, q, s in zip(ptrs, ptrs[1:], sizes):
        assert off(q) - off(p) == cann_block(s)
    assert arena.stats().used == sum(cann_block(s) for s in sizes)


def test_huge_page_rounding():
    a = HbmArena(next(_dev_ids), 8 * MIB)
    try:
        p = a.malloc(MIB + 1, ACL_MEM_MALLOC_HUGE_FIRST)
        assert a.allocation_of(p).reserved == 2 * MIB
        q = a.malloc(MIB + 1, ACL_MEM_MALLOC_NORMAL_ONLY)
        assert a.allocation_of(q).reserved == cann_block(MIB + 1)
    finally:
        a.close()


@pytest.mark.parametrize("size", [0, -1, -64, 2.5, "10", None, True])
def test_bad_malloc_size_rejected(arena, size):
    before = arena.stats()
    with pytest.raises(InvalidParamError) as ei:
        arena.malloc(size)
    assert ei.value.code == 107000
    assert arena.stats() == before


def test_oom_leaves_other_allocations_intact(arena):
    p = arena.malloc(1000)
    data = np.arange(1000, dtype=np.uint32).astype(np.uint8)
    arena.view(p, 1000)[:] = data
    before = arena.stats()
    with pytest.raises(MemoryAllocationError) as ei:
        arena.malloc(2 * MIB)
    assert ei.value.code == 207001
    assert "allocate" in str(ei.value)
    # fill the rest exactly, then one more byte does not fit
    rest = arena.stats().largest_free
    q = arena.malloc(rest - 64)          # block of exactly `rest` bytes
    assert arena.stats().free == 0
    with pytest.raises(MemoryAllocationError) as ei:
        arena.malloc(1)
    assert ei.value.code == 207001
    assert np.array_equal(arena.view(p, 1000), data)
    arena.free(q)
    after = arena.stats()
    assert (after.used, after.free, after.allocations, after.largest_free) == \
        (before.used, before.free, before.allocations, before.largest_free)
    assert after.peak == MIB


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_coalescing_three_adjacent_blocks(arena, order):
    ptrs = [arena.malloc(100) for _ in range(3)]           # 192 B blocks
    guard = arena.malloc(64)                                # keeps the three apart from the tail
    b = cann_block(100)
    assert [off(p) for p in ptrs] == [0, b, 2 * b]
    tail = (off(guard) + cann_block(64), MIB - off(guard) - cann_block(64))
    for i in order:
        arena.free(ptrs[i])
    assert arena._alloc.free_ranges() == [(0, 3 * b), tail]
    s = arena.stats()
    assert s.largest_free == max(3 * b, tail[1])
    # the merged range is usable in one piece
    big = arena.malloc(3 * b - 64)
    assert off(big) == 0
    assert arena._alloc.free_ranges() == [tail]


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_allocator_coalescing(order):
    al = Allocator(1024)
    starts = [al.alloc(128) for _ in range(3)]
    assert starts == [0, 128, 256]
    al.alloc(128)
    for i in order:
        al.release(starts[i], 128)
    assert al.free_ranges() == [(0, 384), (512, 512)]
    assert al.used == 128 and al.free_bytes == 896 and al.largest_free == 512


def test_fragmentation_known_layout():
    a = HbmArena(next(_dev_ids), 1024)
    try:
        ptrs = [a.malloc(64) for _ in range(8)]            # 8 blocks of 128 B fill 1 KiB
        assert [off(p) for p in ptrs] == [128 * i for i in range(8)]
        s = a.stats()
        assert (s.used, s.free, s.largest_free, s.fragmentation) == (1024, 0, 0, 0.0)
        for i in (1, 3, 4):
            a.free(ptrs[i])
        # free ranges: [128, 256) and [384, 640): 384 B free, largest 256 B -> 1 - 256/384 = 1/3
        s = a.stats()
        assert (s.used, s.free, s.largest_free) == (640, 384, 256)
        assert s.fragmentation == pytest.approx(1 / 3)
        assert s.peak == 1024
        assert s.allocations == 5
    finally:
        a.close()


def test_fragmentation_known_layout_fit():
    a = HbmArena(next(_dev_ids), 1024)
    try:
        ptrs = [a.malloc(64) for _ in range(8)]
        for i in (1, 3, 4):
            a.free(ptrs[i])
        # 192 B (block 256) fits only the 256-byte range; 300 B (block 384) fits nowhere
        with pytest.raises(MemoryAllocationError) as ei:
            a.malloc(300)
        assert ei.value.code == 207001
        q = a.malloc(192)
        assert off(q) == 384
        s = a.stats()
        assert (s.free, s.largest_free, s.fragmentation) == (128, 128, 0.0)
    finally:
        a.close()


# ------------------------------------------------------------------------------------------ access
def _filled(arena, size, seed):
    p = arena.malloc(size)
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    arena.view(p, size)[:] = data
    return p, data


def test_pointer_arithmetic_inside_allocation(arena):
    p = arena.malloc(256)
    arena.view(p, 256)[:] = 0
    arena.view(p + 100, 10)[:] = np.arange(1, 11, dtype=np.uint8)
    whole = arena.view(p, 256)
    assert list(whole[100:110]) == list(range(1, 11))
    assert not whole[:100].any() and not whole[110:].any()
    assert list(arena.view(p + 105, 5)) == [6, 7, 8, 9, 10]
    assert arena.allocation_of(p + 200).offset == off(p)
    t = arena.typed_view(p + 64, (4,), np.uint32)
    t[:] = [1, 2, 3, 4]
    assert bytes(arena.view(p + 64, 4)) == (1).to_bytes(4, "little")


def _check_rejected(arena, call, others, *, words):
    with pytest.raises(MemoryAccessError) as ei:
        call()
    msg = str(ei.value).lower()
    assert any(w in msg for w in words), f"unclear message: {ei.value}"
    for p, data in others:
        assert np.array_equal(arena.view(p, data.size), data), "a rejected access touched another allocation"
    return ei.value


def test_out_of_bounds_rejected(arena):
    before, before_data = _filled(arena, 300, 1)
    p, pdata = _filled(arena, 300, 2)
    after, after_data = _filled(arena, 300, 3)
    others = [(before, before_data), (after, after_data)]
    e = _check_rejected(arena, lambda: arena.view(p, 301), others, words=["overrun"])
    assert f"{p:x}" in str(e)
    _check_rejected(arena, lambda: arena.view(p + 300, 1), others, words=["past the end", "overrun"])
    _check_rejected(arena, lambda: arena.view(p + 299, 2), others, words=["overrun"])
    _check_rejected(arena, lambda: arena.view(p - 1, 1), others + [(p, pdata)], words=["past the end", "overrun", "no live"])
    # the guard bytes past the end are not reachable either
    _check_rejected(arena, lambda: arena.view(p + 320, 1), others, words=["past the end", "no live"])
    with pytest.raises(MemoryAccessError):
        arena.typed_view(p, (76,), np.float32)
    assert np.array_equal(arena.view(p, 300), pdata)
    assert arena.stats().canary_violations == 0


def test_use_after_free_rejected(arena):
    a, adata = _filled(arena, 500, 4)
    p, _ = _filled(arena, 500, 5)
    arena.free(p)
    e = _check_rejected(arena, lambda: arena.view(p, 1), [(a, adata)], words=["free"])
    assert "use after free" in str(e)
    _check_rejected(arena, lambda: arena.view(p + 10, 4), [(a, adata)], words=["free"])
    with pytest.raises(AclError) as ei:
        arena.free(p)
    assert ei.value.code == 207002
    assert type(ei.value) is type(error_for_code(207002))      # the class every backend raises for it
    assert np.array_equal(arena.view(a, 500), adata)


def test_freed_memory_allocated_again_is_memory_in_use(arena):
    """A freed start that a later allocation covers (here from its interior) is no longer "freed memory":
    freeing it is "not the start of an allocation" (107000), not a double free (207002), and reading it is
    reading the live allocation."""
    pad = arena.malloc(64)
    a = arena.malloc(1000)
    arena.free(pad)
    arena.free(a)                                          # [0, 64 + 1056) is free again, coalesced
    big = arena.malloc(4000)
    assert off(big) == 0 and off(big) < off(a) < off(big) + 4000
    with pytest.raises(AclError) as ei:
        arena.free(a)
    assert ei.value.code == 107000 and "not the start of an allocation" in str(ei.value)
    arena.view(a, 16)[:] = 7                               # interior of the live allocation: fine
    arena.free(big)
    with pytest.raises(AclError) as ei:
        arena.free(big)
    assert ei.value.code == 207002                          # the big one's own start: a double free
    with pytest.raises(MemoryAccessError) as ei:
        arena.view(a, 1)
    assert "use after free" in str(ei.value)               # inside the freed big allocation
    arena.reset()
    with pytest.raises(AclError) as ei:
        arena.free(big)
    assert ei.value.code == 107000                          # a reset forgets what was freed before


def test_pointer_of_another_device_rejected(arena):
    a, adata = _filled(arena, 128, 6)
    foreign = make_ptr(arena.device_id + 1, off(a))
    e = _check_rejected(arena, lambda: arena.view(foreign, 1), [(a, adata)], words=["device"])
    assert f"device {arena.device_id + 1}" in str(e)
    with pytest.raises(MemoryAccessError):
        arena.free(foreign)
    assert arena.stats().allocations == 1
    assert np.array_equal(arena.view(a, 128), adata)


def test_never_allocated_and_interior_free(arena):
    a, adata = _filled(arena, 1000, 7)
    for bad in (a + 64, a + 1, make_ptr(arena.device_id, 512 * KIB)):
        with pytest.raises(AclError) as ei:
            arena.free(bad)
        assert ei.value.code == 107000
    with pytest.raises(InvalidParamError):
        arena.free(12345)                # not a device pointer at all
    assert arena.stats().allocations == 1
    assert np.array_equal(arena.view(a, 1000), adata)
    with pytest.raises(MemoryAccessError):
        arena.view(make_ptr(arena.device_id, 512 * KIB), 1)


# ------------------------------------------------------------------------------------------ shared memory
def test_segment_lifecycle_and_attach():
    a = HbmArena(next(_dev_ids), 256 * KIB)
    path = os.path.join("/dev/shm", a.name)
    try:
        assert os.path.exists(path)
        assert os.path.getsize(path) == 256 * KIB + ARENA_HEADER   # arena + generation header
        p = a.malloc(4096)
        a.view(p, 4096)[:] = np.arange(4096, dtype=np.uint16).astype(np.uint8)
        mm, buf = attach(a.name, a.size)
        try:
            o = off(p)
            assert np.array_equal(buf[o:o + 4096], a.view(p, 4096))
            buf[o + 10:o + 14] = [0xDE, 0xAD, 0xBE, 0xEF]          # the other mapping writes ...
            assert bytes(a.view(p + 10, 4)) == b"\xde\xad\xbe\xef"  # ... and the arena sees it
        finally:
            del buf
            mm.close()
    finally:
        a.close()
    assert not os.path.exists(path)
    a.close()                                                        # idempotent


def test_closed_arena_rejects_every_call():
    a = HbmArena(next(_dev_ids), 64 * KIB)
    p = a.malloc(100)
    a.close()
    calls = [lambda: a.malloc(64), lambda: a.free(p), lambda: a.view(p, 4), lambda: a.typed_view(p, (4,), np.int32),
             lambda: a.resolve(p, 4), lambda: a.allocation_of(p)]
    for call in calls:
        with pytest.raises(AclError) as ei:
            call()
        assert ei.value.code == 207004
        assert type(ei.value) is type(error_for_code(207004))


def test_shm_huge_page_policy_is_read_from_the_mount_table():
    from devices.arena import shm_huge_pages
    assert shm_huge_pages() in ("never", "always", "within_size", "advise", "deny", "force")


# ------------------------------------------------------------------------------------------ views, owners, epochs
def test_typed_view_shapes_alignment_and_tenant(arena):
    """A typed view has the asked shape (a scalar for ``()``), is refused unaligned with 107008 and the
    reason, and only the allocation's tenant (or an unchecked call) gets one."""
    from devices.tenancy import Owner
    alice, bob = Owner("alice", "a1"), Owner("bob", "b1")
    p = arena.malloc(64, owner=alice)
    arena.view(p, 64)[:] = np.arange(64, dtype=np.uint8)
    v = arena.typed_view(p, (2, 4), np.float32, owner=alice)
    assert v.shape == (2, 4) and v.dtype == np.float32
    assert v.tobytes() == bytes(range(32))
    s = arena.typed_view(p + 4, (), np.int32)
    assert s.shape == () and int(s) == int.from_bytes(bytes(range(4, 8)), "little")
    with pytest.raises(AclError) as ei:
        arena.typed_view(p + 2, (4,), np.float32)
    assert ei.value.code == 107008 and "not aligned to 4 B" in str(ei.value)
    with pytest.raises(AclError) as ei:
        arena.typed_view(p, (4,), np.float32, owner=bob)
    assert ei.value.code == 207006 and "another tenant" in str(ei.value)


def test_free_owner_frees_that_client_only_and_usage_follows(arena):
    from devices.tenancy import Owner
    a1, a2, b1 = Owner("alice", "a1"), Owner("alice", "a2"), Owner("bob", "b1")
    mine = [arena.malloc(100, owner=a1) for _ in range(3)]
    other = arena.malloc(200, owner=a2)
    bobs = arena.malloc(64, owner=b1)
    assert arena.used_by(a1) == arena.used_by(a2) == 3 * block_size(100) + block_size(200)   # per tenant
    assert arena.used_by(b1) == block_size(64)
    assert arena.free_owner(a1) == 3
    assert arena.used_by(a2) == block_size(200) and arena.used_by(b1) == block_size(64)
    for p in mine:
        with pytest.raises(AclError) as ei:
            arena.free(p)
        assert ei.value.code == 207002                      # freed by free_owner
    arena.free(other)
    arena.free(bobs)
    assert arena.free_owner(a1) == 0 and arena.stats().allocations == 0


def test_every_reset_starts_a_new_epoch_and_publishes_a_generation(arena):
    """Plans and views cached against an epoch must never match a later one: each reset gives a new,
    larger epoch.  Every change of the allocation table publishes a new generation in the header that
    other processes read (header_gen)."""
    from devices.arena import header_gen
    epochs = [arena.epoch]
    gens = [header_gen(arena.buf, arena.size)]
    for _ in range(3):
        arena.free(arena.malloc(64))
        gens.append(header_gen(arena.buf, arena.size))
        arena.reset()
        epochs.append(arena.epoch)
        gens.append(header_gen(arena.buf, arena.size))
    assert epochs == sorted(set(epochs)) and len(epochs) == 4
    assert gens == sorted(set(gens)) and gens[-1] == arena.gen


def test_attach_checks_the_name_and_whose_hbm_it_is(arena):
    for bad in ("", "a/b", "../vnpu_x"):
        with pytest.raises(ValueError, match="bad arena name"):
            attach(bad, arena.size)
    p = arena.malloc(16)
    arena.view(p, 16)[:] = 7
    mm, buf = attach(arena.name, arena.size, device_id=arena.device_id)
    try:
        assert bytes(buf[p & ((1 << 40) - 1):][:16]) == b"\x07" * 16
    finally:
        del buf
        mm.close()
    with pytest.raises(ValueError, match=f"is not device {arena.device_id + 1}'s HBM"):
        attach(arena.name, arena.size, device_id=arena.device_id + 1)
    other = HbmArena(arena.device_id + 1000, arena.size)
    try:
        other.buf[other.size + 16:other.size + 24] = np.frombuffer(b"NOTANHBM", np.uint8)   # not an arena
        with pytest.raises(ValueError, match="HBM"):
            attach(other.name, other.size, device_id=other.device_id)
    finally:
        other.close()


# ------------------------------------------------------------------------------------------ what a rejection says
def test_every_rejection_carries_its_cann_code_and_the_detail_a_user_reads(arena):
    """The detail of each refusal is what a user debugging a bad pointer reads (``AclError.detail``, the
    text after the ``[code NAME]`` prefix): which pointer, which device, how many bytes were asked and how
    many are left.  Each one is pinned exactly, with its class and CANN code."""
    from devices.arena import ptr_device
    from devices.errors import ACL_ERROR_RT_NO_PERMISSION
    from devices.tenancy import Owner
    d = arena.device_id
    p = arena.malloc(300)                                    # block 384 B at offset 0 of a fresh arena
    q = arena.malloc(64)
    owned = arena.malloc(64, owner=Owner("alice", "a1"))
    arena.free(q)
    assert off(p) == 0 and block_size(300) == 384
    free_now = arena.stats().free
    cases = [
        (lambda: arena.malloc(0), InvalidParamError, 107000, "malloc size must be a positive integer, got 0"),
        (lambda: arena.malloc(True), InvalidParamError, 107000, "malloc size must be a positive integer, got True"),
        (lambda: arena.malloc(64, policy=-1), AclError, 107018, "invalid malloc policy -1"),
        (lambda: arena.malloc(64, placement=3), InvalidParamError, 107000,
         "unknown placement hint 3 (known: 0 = best-fit, 1 = low, 2 = high)"),
        (lambda: arena.malloc(2 * MIB), MemoryAllocationError, 207001,
         f"device {d}: cannot allocate {2 * MIB} B ({2 * MIB} B reserved); free {free_now} B, "
         f"largest free block {arena.stats().largest_free} B"),
        (lambda: arena.free(p + 64), InvalidParamError, 107000,
         f"free of 0x{p + 64:x}: not the start of an allocation on device {d}"),
        (lambda: arena.free(q), type(error_for_code(207002)), 207002, f"double free of 0x{q:x} on device {d}"),
        (lambda: arena.free(owned, Owner("bob", "b1")), AclError, ACL_ERROR_RT_NO_PERMISSION,
         f"0x{owned:x} belongs to another tenant"),
        (lambda: arena.view(owned, 1, Owner("bob", "b1")), AclError, ACL_ERROR_RT_NO_PERMISSION,
         f"0x{owned:x} belongs to another tenant"),
        (lambda: arena.view(p, 301), MemoryAccessError, 107000,
         f"access of 301 B at 0x{p:x} overruns its allocation (300 B at 0x{p:x}, 300 B left)"),
        (lambda: arena.view(p + 299, 2), MemoryAccessError, 107000,
         f"access of 2 B at 0x{p + 299:x} overruns its allocation (300 B at 0x{p:x}, 1 B left)"),
        (lambda: arena.view(p + 300, 1), MemoryAccessError, 107000,
         f"0x{p + 300:x} is past the end of the 300 B allocation at 0x{p:x}"),
        (lambda: arena.view(q + 8, 1), MemoryAccessError, 107000,
         f"0x{q + 8:x} on device {d} points to freed memory (use after free)"),
        (lambda: arena.view(q + 64, 1), MemoryAccessError, 107000,          # the freed one's 64 B ended there
         f"0x{q + 64:x} on device {d} points to no live allocation"),
        (lambda: arena.view(make_ptr(d, 512 * KIB), 1), MemoryAccessError, 107000,
         f"0x{make_ptr(d, 512 * KIB):x} on device {d} points to no live allocation"),
        (lambda: arena.resolve(p, -1), InvalidParamError, 107000, "negative length -1"),
        (lambda: arena.view(make_ptr(d + 1, 0), 1), MemoryAccessError, 107000,
         f"pointer 0x{make_ptr(d + 1, 0):x} belongs to device {d + 1}, not device {d}"),
        (lambda: ptr_device(12345), InvalidParamError, 107000, "0x3039 is not a device pointer"),
        (lambda: ptr_device("p"), InvalidParamError, 107000, "'p' is not a device pointer"),
        (lambda: arena.typed_view(p + 2, (2,), np.float32), type(error_for_code(107008)), 107008,
         f"0x{p + 2:x} is not aligned to 4 B for float32"),
    ]
    for call, cls, code, detail in cases:
        with pytest.raises(AclError) as ei:
            call()
        assert (type(ei.value), ei.value.code, ei.value.detail) == (cls, code, detail)
    # and none of them changed anything: the same allocations, the same free space
    assert [a.offset for a in arena.live_allocations()] == [off(p), off(owned)]
    assert arena.stats().free == free_now
    arena.close()
    with pytest.raises(AclError) as ei:
        arena.malloc(64)
    assert (ei.value.code, ei.value.detail) == (207004, f"device {d} arena is closed")


def test_free_checks_the_tenant_and_a_reset_epoch(arena):
    """Another tenant's free is refused and frees nothing (the same tenant's other client may free); a
    free naming the current epoch frees, one naming an epoch a reset ended is a no-op -- the offset may
    hold someone else's allocation by now."""
    from devices.tenancy import Owner
    p = arena.malloc(64, owner=Owner("alice", "a1"))
    with pytest.raises(AclError) as ei:
        arena.free(p, Owner("bob", "b1"))
    assert ei.value.code == 207006
    assert arena.stats().allocations == 1 and arena.used_by(Owner("alice", "a1")) == block_size(64)
    arena.free(p, Owner("alice", "a2"), epoch=arena.epoch)
    assert arena.stats().allocations == 0 and arena.used_by(Owner("alice")) == 0
    old = arena.malloc(64)
    stale = arena.epoch
    arena.reset()
    new = arena.malloc(64)
    assert new == old                                      # the same offset, another allocation
    arena.free(old, epoch=stale)                           # the allocation it names is gone: nothing happens
    assert [a.offset for a in arena.live_allocations()] == [off(new)]
    arena.free(new, epoch=arena.epoch)
    assert arena.stats().allocations == 0


def test_quota_is_reserved_bytes_per_charged_tenant_up_to_the_byte(arena):
    """``quota`` caps the reserved bytes of the charged tenant: an allocation that brings it to exactly
    the quota fits, one byte of block more does not (207001 with the tenant's numbers); ``charge`` moves
    the count to another tenant; 0 means no quota; a free gives the bytes back to whoever was charged."""
    b = block_size(100)                                       # 192
    q = 2 * b
    x = arena.malloc(100, owner="t", quota=q)
    y = arena.malloc(100, owner="t", quota=q)                 # exactly at the quota
    assert arena.used_by("t") == q
    with pytest.raises(MemoryAllocationError) as ei:
        arena.malloc(1, owner="t", quota=q)
    assert ei.value.detail == (f"device {arena.device_id}: tenant 't' holds {q} B of its {q} B HBM quota; "
                               f"1 B ({block_size(1)} B reserved) do not fit")
    arena.malloc(100, owner="t", quota=q + b)                 # a larger quota: fits again
    arena.malloc(100, owner="t")                              # no quota: no limit
    assert arena.used_by("t") == 4 * b
    arena.free(x)
    assert arena.used_by("t") == 3 * b
    # charged to another tenant: counts there, not against the owner
    c = arena.malloc(100, owner="u", charge="payer", quota=b)
    assert arena.used_by("payer") == b and arena.used_by("u") == 0
    with pytest.raises(MemoryAllocationError) as ei:
        arena.malloc(100, owner="u", charge="payer", quota=b)
    assert "tenant 'payer' holds 192 B of its 192 B HBM quota" in ei.value.detail
    arena.malloc(100, owner="u", quota=b)                     # u's own count is empty
    arena.free(c)
    assert arena.used_by("payer") == 0 and arena.used_by("u") == b
    arena.free(y)


def test_ecc_poison_fails_exactly_the_accesses_that_touch_it():
    """An ECC range ``[s, e)`` fails every access that overlaps it -- a zero-length access at a poisoned
    byte included -- with 507054 and where, and no access that ends at ``s`` or starts at ``e``."""
    from devices.faults import FaultState
    size = 64 * KIB
    fs = FaultState(size, 7)
    a = HbmArena(next(_dev_ids), size, faults=fs)
    try:
        p = a.malloc(256)
        other = a.malloc(256)
        a.view(p, 256)[:] = 9
        fs.apply("ecc", {"offset": off(p) + 64, "length": 16})         # bytes 64..79 of p
        bad = [(p, 256), (p + 63, 2), (p + 79, 1), (p + 64, 0), (p + 70, 4), (p + 79, 0)]
        good = [(p, 64), (p + 63, 1), (p + 80, 16), (p + 80, 0), (p + 48, 16), (other, 256)]
        for ptr, n in bad:
            with pytest.raises(AclError) as ei:
                a.resolve(ptr, n)
            assert (ei.value.code, ei.value.detail) == (
                507054, f"uncorrectable HBM ECC error at device {a.device_id} offset 0x{off(p) + 64:x}"), (ptr - p, n)
        for ptr, n in good:
            assert a.resolve(ptr, n) == off(ptr)
        assert bytes(a.view(p + 80, 4)) == b"\x09" * 4
        fs.clear("ecc")
        assert bytes(a.view(p, 256)) == b"\x09" * 256
    finally:
        a.close()


def test_every_overwritten_canary_is_counted_at_its_free(arena):
    """The guard bytes between an allocation's end and its block's end are checked at free: each
    allocation whose guard was written (a kernel writing past the end, seen through the raw mapping)
    counts once, an intact one not at all."""
    ps = [arena.malloc(100) for _ in range(4)]
    for p in ps[:3]:
        arena.buf[off(p) + 100 + 5] ^= 0xFF                 # one byte of the guard, past the accessible end
    arena.free(ps[3])
    assert arena.stats().canary_violations == 0
    for i, p in enumerate(ps[:3]):
        arena.free(p)
        assert arena.stats().canary_violations == i + 1


def test_the_freed_history_keeps_the_last_65536_frees():
    """Double-free and use-after-free diagnoses remember the most recent 65536 freed starts (bounded
    memory on a long-lived device): after one free more, the oldest is forgotten -- freeing it again is
    "not the start of an allocation" (107000) and reading it "no live allocation" -- the next oldest and the
    newest are still known."""
    n = 65536 + 1
    a = HbmArena(next(_dev_ids), (n + 1) * 64, shared=False)
    try:
        ps = [a.malloc(1) for _ in range(n)]                 # 64 B blocks, never reused below
        for p in ps:
            a.free(p)
        codes = []
        for p in (ps[0], ps[1], ps[-1]):
            with pytest.raises(AclError) as ei:
                a.free(p)
            codes.append(ei.value.code)
        assert codes == [107000, 207002, 207002]
        with pytest.raises(MemoryAccessError, match="no live allocation"):
            a.view(ps[0], 1)
        with pytest.raises(MemoryAccessError, match="use after free"):
            a.view(ps[1], 1)
    finally:
        a.close()


# ------------------------------------------------------------------------------------------ placement
def test_placements_choose_the_range_and_its_end():
    """Free ranges [0, 512), [640, 768) and [896, 4096): best fit takes the smallest range that fits (the
    lowest of equal ones) at its bottom, PLACEMENT_LOW the lowest range that fits, PLACEMENT_HIGH the top of
    the highest one; what is left of a range stays free, in address order."""
    from devices.arena import PLACEMENT_HIGH, PLACEMENT_LOW
    def layout():
        al = Allocator(4096)
        assert [al.alloc(n) for n in (512, 128, 128, 128)] == [0, 512, 640, 768]
        al.release(0, 512)
        al.release(640, 128)
        assert al.free_ranges() == [(0, 512), (640, 128), (896, 3200)]
        return al
    al = layout()
    assert al.alloc(64) == 640 and al.free_ranges() == [(0, 512), (704, 64), (896, 3200)]
    al = layout()
    assert al.alloc(64, PLACEMENT_LOW) == 0 and al.free_ranges() == [(64, 448), (640, 128), (896, 3200)]
    al = layout()
    assert al.alloc(192, PLACEMENT_HIGH) == 3904 and al.free_ranges() == [(0, 512), (640, 128), (896, 3008)]
    assert al.used == 256 + 192
    al = layout()
    assert al.alloc(4096, PLACEMENT_HIGH) is None and al.alloc(4096) is None
    # equal ranges: best fit takes the lowest
    al = Allocator(1024)
    assert [al.alloc(n) for n in (256, 64, 256, 64)] == [0, 256, 320, 576]
    al.release(0, 256)
    al.release(320, 256)
    assert al.alloc(128) == 0 and al.free_ranges() == [(128, 128), (320, 256), (640, 384)]


def test_high_placement_aligns_down_and_keeps_both_remainders():
    """An arena whose size is not a multiple of 64: a high block starts 64-aligned below the top, the
    bytes under it and the few above it both stay free; a block that fills its range exactly leaves none."""
    from devices.arena import PLACEMENT_HIGH
    al = Allocator(1000)
    assert al.alloc(64) == 0 and al.alloc(64) == 64
    al.release(0, 64)
    assert al.alloc(64, PLACEMENT_HIGH) == 896
    assert al.free_ranges() == [(0, 64), (128, 768), (960, 40)]
    assert al.alloc(64, PLACEMENT_HIGH) == 832          # the top range (40 B) is too small now
    assert al.free_ranges() == [(0, 64), (128, 704), (960, 40)]
    al = Allocator(1024)
    assert [al.alloc(n) for n in (128, 128, 768)] == [0, 128, 256]
    al.release(0, 128)
    assert al.alloc(128, PLACEMENT_HIGH) == 0 and al.free_ranges() == []


def test_malloc_owner_policy_and_placement_arguments(arena):
    """A malloc without an owner belongs to the anonymous in-process tenant ""; a policy that is not a
    non-negative integer is 107018 (a string too), a placement hint must be one of the table's (True is
    not 1)."""
    p = arena.malloc(64)
    assert arena.live_allocations()[0].owner == "" and arena.used_by("") == block_size(64)
    for policy in ("huge", -1, 1.5):
        with pytest.raises(AclError) as ei:
            arena.malloc(64, policy=policy)
        assert (ei.value.code, ei.value.detail) == (107018, f"invalid malloc policy {policy!r}")
    with pytest.raises(InvalidParamError) as ei:
        arena.malloc(64, placement=True)
    assert ei.value.detail == "unknown placement hint True (known: 0 = best-fit, 1 = low, 2 = high)"
    assert arena.stats().allocations == 1
    from devices.arena import PLACEMENT_HIGH
    top = arena.malloc(64, placement=PLACEMENT_HIGH)            # the hint reaches the allocator
    assert off(top) == arena.size - block_size(64)
    arena.free(top)
    arena.free(p)


# ------------------------------------------------------------------------------------------ the segment
def test_arena_size_bounds_and_an_anonymous_arena():
    """Sizes from 1 B to the 40-bit offset field are arenas; 0, negative and larger ones are refused with
    the size named.  An anonymous arena (``shared=False``) has no name or path and says it is not shared."""
    from devices.arena import _OFF_MASK
    for size in (0, -1, _OFF_MASK + 1):
        with pytest.raises(InvalidParamError) as ei:
            HbmArena(next(_dev_ids), size, shared=False)
        assert ei.value.detail == f"arena size {size} out of range"
    one = HbmArena(next(_dev_ids), 1, shared=False)
    try:
        assert (one.size, one.shared, one.name, one.path) == (1, False, "", "")
        assert one.stats().free == 1
    finally:
        one.close()
    assert one.buf is None


def test_a_shared_arena_is_a_private_named_segment_and_sweeps_dead_ones():
    """A shared arena's segment is mode 0600 whatever the umask, named for this process and the device
    (``vnpu_<pid>_<start>_<device>_<token>``), and creating one first removes segments that dead processes
    of this user left behind."""
    import subprocess
    import sys
    from devices import segments
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    start = segments.process_start(child.pid)
    child.stdin.close()
    child.wait()
    dead = f"{segments.PREFIX}{child.pid}_{start}_0_deadbeef"
    with open(os.path.join("/dev/shm", dead), "wb") as f:
        f.write(b"\0" * 64)
    old = os.umask(0)
    try:
        a = HbmArena(next(_dev_ids), 64 * KIB)
    finally:
        os.umask(old)
    try:
        assert not os.path.exists(os.path.join("/dev/shm", dead))
        assert a.shared is True and a.path == os.path.join("/dev/shm", a.name)
        assert os.stat(a.path).st_mode & 0o777 == 0o600
        pid, st, dev, _token = a.name[len(segments.PREFIX):].split("_")
        assert (int(pid), int(st), int(dev)) == (os.getpid(), segments.process_start(os.getpid()), a.device_id)
    finally:
        a.close()
    assert a.buf is None and not os.path.exists(a.path)


def test_an_arena_never_closed_is_unlinked_when_its_process_exits():
    """A process that exits without closing its arena (normal exit, not SIGKILL) leaves no segment."""
    import subprocess
    import sys
    import devices
    code = "from devices.arena import HbmArena; a = HbmArena(3, 4096); print(a.path, flush=True)"
    here = os.path.dirname(os.path.dirname(os.path.abspath(devices.__file__)))    # the code this test imported
    env = dict(os.environ, PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         cwd=here, env=env)
    path = out.stdout.strip()
    assert path.startswith("/dev/shm/") and not os.path.exists(path)


def test_a_fresh_arena_publishes_its_generation_and_records_each_blocks_policy(arena):
    """Before any change the header already holds the arena's generation (a same-node client that maps it
    then must agree with the device); every allocation records the policy it was made with, next to the
    bytes that policy reserved."""
    from devices.arena import ACL_MEM_MALLOC_HUGE_ONLY, header_gen
    assert header_gen(arena.buf, arena.size) == arena.gen == 0
    p = arena.malloc(100, policy=ACL_MEM_MALLOC_NORMAL_ONLY)
    q = arena.malloc(2 * MIB // 4 + 1, policy=ACL_MEM_MALLOC_NORMAL_ONLY)
    assert [(a.policy, a.size, a.reserved) for a in arena.live_allocations()] == [
        (ACL_MEM_MALLOC_NORMAL_ONLY, 100, block_size(100)),
        (ACL_MEM_MALLOC_NORMAL_ONLY, 2 * MIB // 4 + 1, block_size(2 * MIB // 4 + 1))]
    arena.free(q)
    assert arena.allocation_of(p + 99).policy == ACL_MEM_MALLOC_NORMAL_ONLY
    r = arena.malloc(64, policy=ACL_MEM_MALLOC_HUGE_ONLY)
    assert arena.allocation_of(r).policy == ACL_MEM_MALLOC_HUGE_ONLY
    assert header_gen(arena.buf, arena.size) == arena.gen == 1


def test_an_empty_allocator_has_nothing_to_give():
    al = Allocator(0)
    assert al.free_ranges() == [] and al.alloc(64) is None and al.alloc(64, 2) is None
    assert (al.free_bytes, al.largest_free, al.used) == (0, 0, 0)


def test_peer_fence_stops_peer_writes_and_waits_for_the_one_in_progress():
    """A same-node peer writes this arena (HCCL push) only while the fence holds the value published with
    the operator; ``fence_peers`` bumps it and then waits (exclusive lock) for a write in progress: it
    cannot complete while a peer holds the shared lock, and afterwards every write is refused."""
    from devices.errors import HCCL_E_REMOTE, HcclError
    from devices.hccl import PeerInfo
    from devices.hccl_transport import ShmTransport

    owner, writer = HbmArena(next(_dev_ids), 1 << 20), HbmArena(next(_dev_ids), 1 << 20)
    t = ShmTransport(writer, lambda msg: True)
    try:
        peer = PeerInfo(0, owner.device_id, owner.name, owner.size, "")
        link = t.link(peer)
        p = owner.malloc(4096)
        fence = owner.peer_fence()
        with link.writing("c", p, 4096, fence) as view:                           # allowed: the fence holds
            view[:] = np.full(1024, 7, np.float32).view(np.uint8)
        assert owner.buf[ptr_offset(p):ptr_offset(p) + 4096].view(np.float32).tolist() == [7.0] * 1024
        with t.fenced(peer):                                                       # a write in progress ...
            assert owner.fence_peers(timeout_s=0.05) is False                     # ... is waited for
        assert owner.fence_peers(timeout_s=5) is True                             # none in progress now
        with pytest.raises(HcclError) as e:
            with link.writing("c", p, 4096, fence):                               # the old value: refused
                pass
        assert e.value.hccl_code == HCCL_E_REMOTE
        assert owner.buf[ptr_offset(p):ptr_offset(p) + 4096].view(np.float32).tolist() == [7.0] * 1024
        with link.writing("c", p, 4096, owner.peer_fence()) as view:             # a new operator's value
            view[:] = np.full(1024, 9, np.float32).view(np.uint8)
        assert owner.buf[ptr_offset(p):ptr_offset(p) + 4096].view(np.float32)[0] == 9.0
        before = owner.peer_fence()
        owner.reset()                                                              # a reset fences too
        assert owner.peer_fence() != before
    finally:
        t.close()
        writer.close()
        owner.close()
