"""The caching allocator: PyTorch's CUDA caching allocator, for one vnpu device.

The pool calls the driver only when it runs dry.  Requests are rounded up to 512 B (or to power-of-two
divisions, see ``roundup_power2_divisions``); up to 1 MiB they come from the small pool, carved from
2 MiB segments; larger ones from the large pool, carved from 20 MiB segments, and from 10 MiB on each
gets a segment of its own rounded up to 2 MiB (PyTorch's constants, torch_npu's too).  A free block of
the requesting stream is reused (the smallest that fits, split when the rest is worth keeping: >= 512 B
in the small pool, > 1 MiB in the large one); a freed block merges with free neighbours at once.

Streams.  Blocks belong to the stream they were allocated on, and memory freed on a stream is reused on
that stream right away (its later work is ordered after the earlier work).  ``record_stream(h, s)``
says another stream uses the block: when it is freed, an event is recorded on each such stream and the
block is not reused, by any stream, before those events complete (it is "pending"; pending blocks are
checked when a request misses the cache, and waited for when cached memory is released).  With
``cross_stream_reuse`` a wholly free segment of stream A may serve stream B when B has nothing cached
that fits: an event is recorded on A and B waits for it on the device (CUDA's stream-ordered pools do
the same, ``cudaMemPoolReuseAllowInternalDependencies``), so B's work on it starts after A's earlier
work; the host does not wait.

Lifetimes.  ``lifetime="long"`` blocks (weights, KV caches) live in their own pools, whose segments the
driver places at the top of the arena (``PLACEMENT_HIGH``); short-lived segments go to the lowest range
that fits (``PLACEMENT_LOW``).  Long-lived memory packs at one end, short-lived churn stays at the
other, and the free space stays between them in one piece.

Out of memory: when the driver refuses a segment, the pool first tries a segment just large enough for
the request (vnpu's arenas are small; PyTorch goes straight on), then frees cached oversize blocks
(with ``max_split_size``), then synchronizes and frees every cached segment and retries once
(``num_alloc_retries``), and finally raises 207001 (``num_ooms``) naming the requested, free, cached and
largest-free bytes.  Before a segment goes back to the driver the pool waits for the work queued on its
stream (a driver free does not wait, unlike ``cudaFree``).

Host-side checks: :meth:`check` tells whether a pointer lies in one of the pool's segments and, if so,
that the range lies inside one live allocation (a freed pool tensor or an overrun into a neighbour is
caught before the device, which only sees segments, could miss it).

Blocking: ``malloc``/``free``/``record_stream`` return at once unless the pool must call the driver
(an RPC on the cluster backend) or, on the out-of-memory and release paths, wait for streams;
``empty_cache`` and ``defragment`` block the host.  All methods are thread-safe.
"""
from __future__ import annotations

import bisect
import threading
import time
from typing import Callable

from devices.arena import PLACEMENT_BEST_FIT, PLACEMENT_HIGH, PLACEMENT_LOW
from devices.errors import (ACL_ERROR_RT_MEMORY_FREE, AclError, InvalidParamError, MemoryAccessError,
                            MemoryAllocationError, error_for_code)

from . import defrag as _plan
from .blocks import LARGE, LIFETIMES, LONG, NO_STREAM, SHORT, SMALL, Block, FreeBlocks, Handle, Segment
from .config import (LARGE_BUFFER, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE,
                     AllocConfig)
from .driver_api import ArenaState, DriverAllocator
from .ordering import StreamOrder
from .stats import MemoryStats

_now = time.perf_counter


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """``size`` rounded up to the next of ``divisions`` equal steps between its two powers of two."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


class CachingAllocator:
    """A caching pool over one device's driver allocator (see the module docstring)."""

    def __init__(self, driver: DriverAllocator, order: StreamOrder, config: AllocConfig | None = None, *,
                 device: int = 0, quiet: Callable[[int], bool] | None = None):
        self.driver = driver
        self.order = order
        self.config = config if config is not None else AllocConfig.from_env()
        self._max_split = self.config.max_split_size
        self._rounding = bool(self.config.roundup_power2_divisions)
        self.device = device
        #: ``quiet(stream)``: True only when nothing was queued on the stream since the host last saw it
        #: idle (memory freed then needs no fence before a host-synchronous write); default: never
        self._quiet = quiet or (lambda stream: False)
        self._lock = threading.RLock()
        self._pools = {(k, lt): FreeBlocks(k, lt) for k in (SMALL, LARGE) for lt in LIFETIMES}
        self._seg_starts: list[int] = []
        self._segs: dict[int, Segment] = {}
        self._live_starts: list[int] = []
        self._live: dict[int, Block] = {}
        self._pending: list[tuple[Block, list[int]]] = []
        self._dead: set[int] = set()
        self._total: int | None = None
        self._limit: int | None = None          #: set_limit(): a cap on reserved bytes, None = none
        self._tick = 0
        self.stats = MemoryStats()
        #: bumped whenever a range of the pool stops being valid (a free, a move): host-side caches of
        #: launch checks are good while it is unchanged
        self.gen = 0
        #: defragmentations that moved something: descriptors cached from handles are stale once it changes
        self.relocations = 0

    # ------------------------------------------------------------------------------------------ sizes
    def round_size(self, nbytes: int) -> int:
        if nbytes < MIN_BLOCK_SIZE:
            return MIN_BLOCK_SIZE
        if not self._rounding:
            return -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
        div = self.config.divisions(nbytes)
        if div > 1 and nbytes > MIN_BLOCK_SIZE * div:
            return roundup_power2_next_division(nbytes, div)
        return -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE

    def segment_size(self, size: int, kind: str) -> int:
        """The driver allocation a cache miss of ``size`` bytes asks for."""
        if kind == SMALL:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return max(self.config.large_segment_size, -(-size // ROUND_LARGE) * ROUND_LARGE)
        return -(-size // ROUND_LARGE) * ROUND_LARGE

    def _oversize(self, size: int) -> bool:
        ms = self._max_split
        return ms is not None and size >= ms

    def _should_split(self, b: Block, size: int) -> bool:
        rest = b.size - size
        if b.segment.kind == SMALL:
            return rest >= MIN_BLOCK_SIZE
        return not self._oversize(size) and rest > SMALL_SIZE

    def _acceptable(self, b: Block, size: int) -> bool:
        """PyTorch's max_split_size rules: small requests never take an oversize block; oversize requests
        take an unsplit block at most max_non_split_rounding larger."""
        ms = self._max_split
        if ms is None:
            return True
        if size < ms:
            return b.size < ms
        return b.size < size + self.config.max_non_split_rounding

    # ------------------------------------------------------------------------------------------ malloc
    def malloc(self, nbytes: int, stream: int, lifetime: str = SHORT, pinned: bool = False) -> Handle:
        """A block of at least ``nbytes`` for work on ``stream``; ``lifetime`` is "short" (activations,
        the default) or "long" (weights, KV caches); a ``pinned`` block is never moved."""
        if nbytes.__class__ is not int or nbytes <= 0:
            try:
                ok = int(nbytes) == nbytes and nbytes > 0 and not isinstance(nbytes, bool)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise InvalidParamError(f"allocation size must be a positive integer, got {nbytes!r}")
            nbytes = int(nbytes)
        if lifetime not in LIFETIMES:
            raise InvalidParamError(f"lifetime must be one of {LIFETIMES}, got {lifetime!r}")
        if stream.__class__ is not int:
            raise InvalidParamError(f"stream must be a stream id, got {stream!r}")
        size = self.round_size(nbytes)
        kind = SMALL if size <= SMALL_SIZE else LARGE
        pool = self._pools[(kind, lifetime if self.config.lifetime_pools else SHORT)]
        if not self.config.caching:
            return self._malloc_uncached(pool, nbytes, stream, pinned)
        with self._lock:
            self._tick += 1
            fence = None
            if self._pending:
                self._process_events()
            b = self._find(pool, stream, size)
            if b is None:
                b, fence = self._claim(pool, stream, size)
            if b is None:
                b = self._grow(pool, stream, size, nbytes)
            return self._take(pool, b, size, nbytes, pinned, fence)

    def _malloc_uncached(self, pool: FreeBlocks, nbytes: int, stream: int, pinned: bool) -> Handle:
        """``caching:False``: a driver allocation of exactly ``nbytes`` (the device checks its bounds),
        one block, freed to the driver at once."""
        with self._lock:
            self._tick += 1
            try:
                ptr = self.driver.malloc(nbytes, self._placement(pool.lifetime))
            except MemoryAllocationError:
                raise self._oom(nbytes) from None
            self.stats.count("num_device_alloc")
            seg = self._add_segment(ptr, nbytes, stream, pool.kind, pool.lifetime)
            b = seg.head = Block(ptr, nbytes, seg)
            pool.add(b)
            return self._take(pool, b, nbytes, nbytes, pinned, None)

    def _find(self, pool: FreeBlocks, stream: int, size: int) -> Block | None:
        b = pool.first_fit(stream, size)
        return b if b is not None and self._acceptable(b, size) else None

    def _claim(self, pool: FreeBlocks, stream: int, size: int) -> tuple[Block | None, tuple | None]:
        """A wholly free segment of another (or no longer existing) stream, handed to ``stream`` behind an
        event: ``stream`` waits on the device for the old stream's earlier work."""
        for b in pool.candidates(size):
            seg = b.segment
            if b.is_split or seg.stream == stream or not self._acceptable(b, size):
                continue
            old = seg.stream
            gone = old == NO_STREAM or old in self._dead
            if not gone and not self.config.cross_stream_reuse:
                continue
            pool.remove(b)
            seg.stream = stream
            pool.add(b)
            fence = None
            if not gone:
                ev = self.order.record(old)
                self.order.wait(stream, ev)
                fence = ("event", ev)
                b.fence_stream = None               # the event covers everything queued on the old stream
            self.stats.count("num_cross_stream_reuse")
            return b, fence
        return None, None

    def _take(self, pool: FreeBlocks, b: Block, size: int, nbytes: int, pinned: bool, fence) -> Handle:
        pool.remove(b)
        seg = b.segment
        d_n = -1 if b.is_split else 0
        d_b = -b.size if b.is_split else 0
        if self._should_split(b, size):
            rest = Block(b.ptr + size, b.size - size, seg)
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            rest.freed_at, rest.fence_stream = b.freed_at, b.fence_stream
            b.size = size
            pool.add(rest)
            d_n += 1
            d_b += rest.size
        self._inactive(seg.kind, d_n, d_b)
        b.allocated = True
        b.requested = nbytes
        if b.stream_uses:
            b.stream_uses = set()
        st = self.stats
        st.on_alloc(seg.kind, b.size, nbytes)
        if self._oversize(b.size):
            st.oversize["oversize_allocations"].update(1)
        if fence is None and b.fence_stream is not None:
            fence = ("stream", b.fence_stream)
        h = Handle(b.ptr, nbytes, seg.stream, seg.lifetime, bool(pinned), b)
        h.fence = fence
        b.handle = h
        self._index_live(b)
        return h

    def _inactive(self, kind: str, d_n: int, d_b: int) -> None:
        if d_n:
            self.stats.update("inactive_split", kind, d_n)
        if d_b:
            self.stats.update("inactive_split_bytes", kind, d_b)

    # ------------------------------------------------------------------------------------------ growing
    def _grow(self, pool: FreeBlocks, stream: int, size: int, nbytes: int) -> Block:
        seg_size = self.segment_size(size, pool.kind)
        if self.config.garbage_collection_threshold > 0:
            self._garbage_collect(seg_size)
        b = self._new_segment(pool, stream, seg_size, size)
        if b is None and self._release_available(pool, stream, size):
            b = self._new_segment(pool, stream, seg_size, size)
        if b is None:
            self._release_cached()
            self.stats.count("num_alloc_retries")
            b = self._new_segment(pool, stream, seg_size, size)
        if b is None:
            raise self._oom(nbytes)
        return b

    def _placement(self, lifetime: str) -> int:
        if not self.config.lifetime_pools:
            return PLACEMENT_BEST_FIT
        return PLACEMENT_HIGH if lifetime == LONG else PLACEMENT_LOW

    def _allowed(self) -> int:
        if self.config.per_process_memory_fraction >= 1.0 and self._limit is not None:
            return self._limit
        if self._total is None:
            self._total = int(self.driver.mem_info()[1])
        allowed = int(self.config.per_process_memory_fraction * self._total)
        return allowed if self._limit is None else min(allowed, self._limit)

    def _new_segment(self, pool: FreeBlocks, stream: int, seg_size: int, size: int) -> Block | None:
        """A new segment (the standard size, else one just holding ``size``), as one free block in
        ``pool``; None when the driver has no room."""
        reserved = self.stats.stats["reserved_bytes"]["all"].current
        limited = self.config.per_process_memory_fraction < 1.0 or self._limit is not None
        tight = _plan.tight_size(size)
        for want in dict.fromkeys((seg_size, tight)):
            if limited and reserved + want > self._allowed():
                continue
            try:
                ptr = self.driver.malloc(want, self._placement(pool.lifetime))
            except MemoryAllocationError:
                continue
            self.stats.count("num_device_alloc")
            seg = self._add_segment(ptr, want, stream, pool.kind, pool.lifetime)
            b = Block(ptr, want, seg)
            seg.head = b
            pool.add(b)
            return b
        return None

    def _add_segment(self, ptr: int, size: int, stream: int, kind: str, lifetime: str) -> Segment:
        seg = Segment(ptr, size, stream, kind, lifetime)
        bisect.insort(self._seg_starts, ptr)
        self._segs[ptr] = seg
        self.stats.update("segment", kind, 1)
        self.stats.update("reserved_bytes", kind, size)
        if self._oversize(size):
            self.stats.oversize["oversize_segments"].update(1)
        return seg

    def _drop_segment(self, seg: Segment) -> None:
        """Forget a segment and give it back to the driver (its blocks are the caller's business)."""
        del self._segs[seg.ptr]
        del self._seg_starts[bisect.bisect_left(self._seg_starts, seg.ptr)]
        self.stats.update("segment", seg.kind, -1)
        self.stats.update("reserved_bytes", seg.kind, -seg.size)
        if self._oversize(seg.size):
            self.stats.oversize["oversize_segments"].update(-1)
        self.gen += 1
        self.driver.free(seg.ptr)
        self.stats.count("num_device_free")

    def _oom(self, nbytes: int) -> MemoryAllocationError:
        self.stats.count("num_ooms")
        st = self.stats.stats
        reserved = st["reserved_bytes"]["all"].current
        allocated = st["allocated_bytes"]["all"].current
        cached = reserved - allocated
        try:
            arena = self.driver.arena()
        except AclError:
            arena = ArenaState(*self.driver.mem_info()[:2], 0)
        return MemoryAllocationError(
            f"NPU out of memory on device {self.device}: requested {nbytes} B ({_mib(nbytes)}), free {arena.free} B "
            f"({_mib(arena.free)} of {_mib(arena.total)}), cached {cached} B (reserved by this pool "
            f"{_mib(reserved)}, allocated {_mib(allocated)}), largest free {arena.largest_free} B "
            f"(arena fragmentation {arena.fragmentation:.3f}). "
            + (f"The pool's size limit ({_mib(self._limit)}) is reached: raise it (set_limit; serve: memory.pool_size) "
               "or lower the batch size." if self._limit is not None and reserved + nbytes > self._limit else
               "Free memory exceeds the request: the arena is fragmented -- call Device.defragment(), or set "
               "VNPU_ALLOC_CONF=max_split_size_mb:<n> to bound splitting."
               if arena.free >= nbytes else "Free tensors or lower the batch size."))

    # ------------------------------------------------------------------------------------------ releasing
    def _free_whole(self, blocks: list[Block], timeout_ms: float = -1) -> int:
        """Return wholly free segments to the driver, after the work queued on their streams (a stream
        still busy after ``timeout_ms`` keeps its segments cached)."""
        if not blocks:
            return 0
        streams = sorted({b.segment.stream for b in blocks} - self._dead - {NO_STREAM})
        busy = set()
        for s, ev in [(s, self.order.record(s)) for s in streams]:
            if not self.order.synchronize(ev, timeout_ms):
                busy.add(s)
            self.order.release(ev)
        n = 0
        for b in blocks:
            if b.segment.stream in busy:
                continue
            self._pools[(b.segment.kind, b.segment.lifetime)].remove(b)
            self._drop_segment(b.segment)
            n += 1
        return n

    def _whole_free(self, pools=None) -> list[Block]:
        out = []
        for p in (pools or self._pools.values()):
            out.extend(b for b in p if not b.is_split)
        return out

    def _release_available(self, pool: FreeBlocks, stream: int, size: int) -> bool:
        """PyTorch's release_available_cached_blocks: free cached oversize blocks of this stream, the
        smallest one that covers ``size`` or else the largest ones until ``size`` is covered."""
        ms = self.config.max_split_size
        if ms is None:
            return False
        big = sorted((b for b in pool if not b.is_split and b.segment.stream == stream and b.size >= ms),
                     key=lambda b: (b.size, b.ptr))
        if not big:
            return False
        enough = [b for b in big if b.size >= max(size, ms)]
        if enough:
            return self._free_whole([enough[0]]) > 0
        chosen, total = [], 0
        for b in reversed(big):
            chosen.append(b)
            total += b.size
            if total >= size:
                break
        return self._free_whole(chosen) > 0

    def _release_cached(self, timeout_ms: float = -1) -> int:
        """Wait for pending blocks, then free every wholly free segment (PyTorch's release_cached_blocks).
        With ``timeout_ms`` >= 0 nothing waits longer: what is not done by then stays cached."""
        self._sync_pending(timeout_ms)
        self.stats.count("num_sync_all_streams")
        return self._free_whole(self._whole_free(), timeout_ms)

    def _garbage_collect(self, want: int) -> None:
        """PyTorch's garbage_collect_cached_blocks: past the threshold, free cached segments unused for at
        least the average age, oldest first, until reserved memory is back under it."""
        limit = self.config.garbage_collection_threshold * self._allowed()
        reserved = self.stats.stats["reserved_bytes"]["all"].current
        if reserved + want <= limit:
            return
        target = reserved + want - limit
        freed = 0
        while freed < target:
            cands = self._whole_free()
            if not cands:
                return
            ages = [self._tick - b.freed_at for b in cands]
            avg = sum(ages) / len(ages)
            old = sorted((b for b, a in zip(cands, ages) if a >= avg), key=lambda b: b.freed_at)
            chosen = []
            for b in old:
                chosen.append(b)
                freed += b.size
                if freed >= target:
                    break
            self.stats.count("num_gc_releases", len(chosen))
            self._free_whole(chosen)

    def empty_cache(self, timeout_ms: float = -1) -> int:
        """Return every cached (wholly free) segment to the driver, after waiting for pending blocks and
        for the work queued on the segments' streams (host-blocking; with ``timeout_ms`` >= 0 at most
        about that long per stream, and what is not done by then stays cached: a hung device does not
        hang its caller).  Returns how many segments went back."""
        with self._lock:
            return self._release_cached(timeout_ms)

    # ------------------------------------------------------------------------------------------ pool size
    @property
    def limit(self) -> int | None:
        """The cap on reserved bytes (:meth:`set_limit`), None when only ``per_process_memory_fraction``
        caps the pool."""
        return self._limit

    def reserved(self) -> int:
        """Bytes the pool holds from the driver (live and cached)."""
        return self.stats.stats["reserved_bytes"]["all"].current

    def set_limit(self, nbytes: int | None, timeout_ms: float = -1) -> int:
        """Cap the pool at ``nbytes`` reserved (None: no cap beyond ``per_process_memory_fraction``): no
        new segment past it (a request that does not fit after the pool freed its cache raises 207001), and
        cached segments over it go back to the driver now (host-blocking: waits for the work queued on their
        streams, as :meth:`empty_cache`).  Live blocks are never touched: what is still over the cap goes
        back at a later :meth:`trim`, once they are freed.  Returns the bytes reserved after."""
        if nbytes is not None and (nbytes.__class__ is not int or nbytes <= 0):
            raise InvalidParamError(f"pool limit must be a positive number of bytes or None, got {nbytes!r}")
        with self._lock:
            self._limit = nbytes
            self._trim(timeout_ms)
            return self.reserved()

    def trim(self, timeout_ms: float = -1) -> int:
        """Give cached segments back until the pool is within its cap (host-blocking as :meth:`empty_cache`;
        nothing to do without a cap).  Returns the bytes reserved after."""
        with self._lock:
            self._trim(timeout_ms)
            return self.reserved()

    def _trim(self, timeout_ms: float) -> None:
        """Cached segments back to the driver until the pool is within its cap: short-lived ones first, the
        longest unused first."""
        over = self.reserved() - (self._limit if self._limit is not None else self.reserved())
        if over <= 0:
            return
        chosen, n = [], 0
        for b in sorted(self._whole_free(), key=lambda b: (b.segment.lifetime == LONG, b.freed_at)):
            if n >= over:
                break
            chosen.append(b)
            n += b.segment.size
        self._free_whole(chosen, timeout_ms)

    def reserve(self, nbytes: int) -> int:
        """Pre-warm: grow the pool with cached segments until it reserves ``nbytes`` (segments of the large
        pool's size, the last one smaller; they belong to no stream, so the first stream that needs one
        takes it without a wait), or until the cap or the driver refuses.  Blocks the host for the driver
        calls.  Returns the bytes reserved after."""
        if nbytes.__class__ is not int or nbytes < 0:
            raise InvalidParamError(f"pool size must be a non-negative number of bytes, got {nbytes!r}")
        pool = self._pools[(LARGE, SHORT)]
        with self._lock:
            while self.reserved() < nbytes:
                left = -(-(nbytes - self.reserved()) // ROUND_LARGE) * ROUND_LARGE
                want = min(self.config.large_segment_size, left)
                if self._new_segment(pool, NO_STREAM, want, want) is None:
                    break
            return self.reserved()

    # ------------------------------------------------------------------------------------------ free
    def free(self, h: Handle) -> None:
        """Give a block back to the pool (returns at once; only records events when other streams used it)."""
        if not isinstance(h, Handle):
            raise InvalidParamError(f"not a pool allocation: {h!r}")
        with self._lock:
            if h.freed:
                raise error_for_code(ACL_ERROR_RT_MEMORY_FREE, f"double free of pool allocation 0x{h.ptr:x} on "
                                                               f"device {self.device}")
            b = h.block
            h.freed = True
            b.handle = None
            if h.fence is not None and h.fence[0] == "event":
                self.order.release(h.fence[1])
            h.fence = None
            seg = b.segment
            b.allocated = False
            self.gen += 1
            self._unindex_live(b)
            st = self.stats
            st.on_release(seg.kind, b.size, b.requested)
            if self._oversize(b.size):
                st.oversize["oversize_allocations"].update(-1)
            if not self.config.caching:
                self.stats.on_inactive(seg.kind, b.size)
                self._drop_segment(seg)                 # the driver's free, as a raw allocation's
                return
            quiet = seg.stream == NO_STREAM or seg.stream in self._dead or self._quiet(seg.stream)
            b.fence_stream = None if quiet else seg.stream
            uses = sorted(s for s in b.stream_uses if s != seg.stream and s not in self._dead) \
                if b.stream_uses else ()
            if uses:
                b.stream_uses = set()
                b.pending = True
                self._pending.append((b, [self.order.record(s) for s in uses]))
            else:
                self._free_block(b, clear_fences=quiet)

    def _free_block(self, b: Block, clear_fences: bool = False) -> None:
        """``b`` is free now: merge it with free neighbours and put it in its pool.  ``clear_fences``: the
        stream is quiet, so nothing freed on it earlier needs a fence any more."""
        seg = b.segment
        pool = self._pools[(seg.kind, seg.lifetime)]
        self.stats.on_inactive(seg.kind, b.size)
        b.pending = False
        b.freed_at = self._tick
        d_n = d_b = 0
        for nb in (b.prev, b.next):
            if nb is None or not nb.is_free:
                continue
            pool.remove(nb)
            d_n -= 1
            d_b -= nb.size
            if nb is b.prev:
                b.ptr = nb.ptr
                b.prev = nb.prev
                if b.prev is None:
                    seg.head = b
                else:
                    b.prev.next = b
            else:
                b.next = nb.next
                if b.next is not None:
                    b.next.prev = b
            b.size += nb.size
            b.freed_at = max(b.freed_at, nb.freed_at)
            if b.fence_stream is None:
                b.fence_stream = nb.fence_stream
        if clear_fences:
            b.fence_stream = None
        if b.is_split:
            d_n += 1
            d_b += b.size
        self._inactive(seg.kind, d_n, d_b)
        pool.add(b)

    def record_stream(self, h: Handle, stream: int) -> None:
        """``stream`` uses the block too: when it is freed, no stream gets it back before the work queued
        on ``stream`` by then is done (``torch.Tensor.record_stream``).  Only bookkeeping; returns at once."""
        with self._lock:
            if h.freed:
                raise MemoryAccessError(f"record_stream on freed pool allocation 0x{h.ptr:x}")
            if stream != h.block.segment.stream:
                h.block.stream_uses.add(int(stream))

    def _process_events(self) -> None:
        """Pending blocks whose events have all completed become free (host queries, no waiting)."""
        still = []
        for b, events in self._pending:
            if all(self.order.query(e) for e in events):
                for e in events:
                    self.order.release(e)
                self._free_block(b)
            else:
                still.append((b, events))
        self._pending = still

    def _sync_pending(self, timeout_ms: float = -1) -> None:
        pending, self._pending = self._pending, []
        for b, events in pending:
            if all([self.order.synchronize(e, timeout_ms) for e in events]):
                for e in events:
                    self.order.release(e)
                self._free_block(b)
            else:
                self._pending.append((b, events))

    def stream_destroyed(self, stream: int) -> None:
        """A stream is gone (its work finished when it was destroyed): its wholly free segments serve any
        stream from now on, and it is no longer synchronized."""
        with self._lock:
            self._dead.add(int(stream))
            for p in self._pools.values():
                for b in [b for b in p if b.segment.stream == stream and not b.is_split]:
                    p.remove(b)
                    b.segment.stream = NO_STREAM
                    b.fence_stream = None
                    p.add(b)

    # ------------------------------------------------------------------------------------------ host access
    def host_fence(self, h: Handle) -> None:
        """Before a host-synchronous write into ``h``: wait (host-blocking, once) for the work the block's
        previous user queued before freeing it.  No-op for fresh memory or a quiet stream."""
        f = h.fence
        if f is None:
            return
        h.fence = None
        kind, x = f
        if kind == "event":
            self.order.synchronize(x)
            self.order.release(x)
        else:
            ev = self.order.record(x)
            self.order.synchronize(ev)
            self.order.release(ev)

    def pin(self, h: Handle) -> None:
        """Never move this block (its address was handed somewhere the pool cannot update)."""
        with self._lock:
            h.pinned = True

    def owns(self, ptr: int) -> bool:
        """Whether ``ptr`` lies inside one of the pool's segments."""
        return self._segment_at(ptr) is not None

    def _segment_at(self, ptr: int) -> Segment | None:
        i = bisect.bisect_right(self._seg_starts, ptr) - 1
        if i < 0:
            return None
        seg = self._segs[self._seg_starts[i]]
        return seg if ptr < seg.end else None

    def check(self, ptr: int, nbytes: int) -> bool:
        """False when ``ptr`` is not in the pool's memory; True when ``[ptr, ptr + nbytes)`` lies inside
        one live allocation; raises MemoryAccessError (107000) for any other range in the pool's memory."""
        with self._lock:
            seg = self._segment_at(ptr)
            if seg is None:
                return False
            i = bisect.bisect_right(self._live_starts, ptr) - 1
            b = self._live[self._live_starts[i]] if i >= 0 else None
            if b is None or b.segment is not seg or ptr >= b.ptr + b.requested:
                raise MemoryAccessError(f"0x{ptr:x} on device {self.device} points into the caching pool's "
                                        "memory but not into a live allocation (freed tensor?)")
            if ptr + nbytes > b.ptr + b.requested:
                raise MemoryAccessError(f"access of {nbytes} B at 0x{ptr:x} overruns its allocation ({b.requested} B "
                                        f"at 0x{b.ptr:x}, {b.ptr + b.requested - ptr} B left)")
            return True

    def _index_live(self, b: Block) -> None:
        bisect.insort(self._live_starts, b.ptr)
        self._live[b.ptr] = b

    def _unindex_live(self, b: Block) -> None:
        del self._live[b.ptr]
        del self._live_starts[bisect.bisect_left(self._live_starts, b.ptr)]

    # ------------------------------------------------------------------------------------------ stats
    def _free_space(self) -> tuple[int, int]:
        """(free bytes, largest free block) inside the pool's segments (pending blocks are not free)."""
        total = largest = 0
        for p in self._pools.values():
            for b in p:
                total += b.size
                largest = max(largest, b.size)
        return total, largest

    def fragmentation(self) -> float:
        """The pool's own fragmentation: 1 - largest free block / free bytes in its segments."""
        with self._lock:
            free, largest = self._free_space()
        return 1.0 - largest / free if free else 0.0

    def memory_stats(self) -> dict:
        """``torch.cuda.memory_stats()``-style flat dict (see :mod:`runtime.memory.stats`)."""
        with self._lock:
            free, largest = self._free_space()
            ms = self.config.max_split_size
            return self.stats.as_dict({
                "max_split_size": -1 if ms is None else ms,
                "fragmentation": 1.0 - largest / free if free else 0.0,
                "largest_free_block": largest,
                "inactive_bytes": free,
                "pending_free_blocks": len(self._pending),
            })

    def reset_peak_stats(self) -> None:
        with self._lock:
            self.stats.reset_peak()

    def reset_accumulated_stats(self) -> None:
        with self._lock:
            self.stats.reset_accumulated()

    def snapshot(self) -> list[dict]:
        """The segments and their blocks (``torch.cuda.memory_snapshot()``'s shape), by address."""
        out = []
        with self._lock:
            for ptr in self._seg_starts:
                seg = self._segs[ptr]
                blocks = []
                for b in seg.blocks():
                    state = "active_allocated" if b.allocated else "active_pending_free" if b.pending else "inactive"
                    blocks.append({"address": b.ptr, "size": b.size, "requested_size": b.requested if b.allocated else 0,
                                   "state": state, "pinned": bool(b.handle is not None and b.handle.pinned)})
                out.append({"device": self.device, "address": seg.ptr, "total_size": seg.size, "stream": seg.stream,
                            "segment_type": "small" if seg.kind == SMALL else "large", "lifetime": seg.lifetime,
                            "allocated_size": sum(x["size"] for x in blocks if x["state"] == "active_allocated"),
                            "active_size": sum(x["size"] for x in blocks if x["state"] != "inactive"),
                            "requested_size": sum(x["requested_size"] for x in blocks), "blocks": blocks})
        return out

    # ------------------------------------------------------------------------------------------ defragmentation
    def defragment(self, rebind: Callable[[list[tuple[int, int, int]]], int] | None = None,
                   max_passes: int = 4) -> _plan.DefragReport:
        """Move live blocks so the arena's free space becomes contiguous (see :mod:`runtime.memory.defrag`).
        Cached segments go back to the driver first; the report's "before" figures are taken then.

        Host-blocking, and a pause for the caller's work on this device: every block's copy is ordered
        after the work queued on the streams that use it (events), runs device-to-device on the pool's
        copy stream, and is waited for before the old segment goes back to the driver.  Handles are
        updated in place; ``rebind(moves)`` is then called with the ``(old, new, nbytes)`` ranges (the
        runtime re-binds its captured graphs there) and returns how many graphs it changed.  The caller
        must not enqueue work on the pool's memory from other threads meanwhile."""
        t0 = _now()
        moves: list[tuple[int, int, int]] = []
        copied = blocks = segs_moved = released = passes = 0
        copy_s = 0.0
        with self._lock:
            released = self._release_cached()
            arena0 = self.driver.arena()            # "before": with the pool's cache given back
            pool0 = self.fragmentation()
            for passes in range(1, max_passes + 1):
                progress = 0
                for g in _plan.plan(self._segment_infos(), exact=not self.config.caching):
                    r = self._evacuate(g)
                    if r is None:
                        continue
                    mv, nbytes, dt = r
                    moves.extend(mv)
                    copied += nbytes
                    blocks += len(mv)
                    segs_moved += len(g.sources)
                    copy_s += dt
                    progress += 1
                if not progress:
                    break
            if moves:
                self.relocations += 1
                self.stats.count("num_defragmentations")
                self.stats.count("defrag_bytes_moved", copied)
                self.stats.count("defrag_blocks_moved", blocks)
        rebound = rebind(moves) if (rebind is not None and moves) else 0
        arena1 = self.driver.arena()
        return _plan.DefragReport(
            bytes_moved=copied, blocks_moved=blocks, segments_moved=segs_moved,
            segments_released=released + segs_moved, graphs_rebound=int(rebound or 0), passes=passes,
            pause_s=_now() - t0, copy_s=copy_s, arena_free_before=arena0.free,
            arena_largest_free_before=arena0.largest_free, arena_fragmentation_before=arena0.fragmentation,
            arena_free_after=arena1.free, arena_largest_free_after=arena1.largest_free,
            arena_fragmentation_after=arena1.fragmentation, pool_fragmentation_before=pool0,
            pool_fragmentation_after=self.fragmentation(), moves=tuple(moves))

    def _segment_infos(self) -> list[_plan.SegmentInfo]:
        out = []
        for ptr in self._seg_starts:
            seg = self._segs[ptr]
            payload, movable = 0, True
            for b in seg.blocks():
                if b.allocated:
                    payload += b.size
                    if b.handle is None or b.handle.pinned:
                        movable = False
                elif b.pending:
                    movable = False
            out.append(_plan.SegmentInfo(seg.ptr, seg.size, seg.stream, seg.kind, seg.lifetime, payload,
                                         movable and payload > 0))
        return out

    def _evacuate(self, g: _plan.Group) -> tuple[list, int, float] | None:
        """Pack the live blocks of ``g``'s segments into one new segment, if the driver places it better."""
        srcs = [self._segs.get(p) for p in g.sources]
        if any(s is None for s in srcs):
            return None
        placement = PLACEMENT_HIGH if g.lifetime == LONG else PLACEMENT_LOW
        try:
            new_ptr = self.driver.malloc(g.size, placement)
        except MemoryAllocationError:
            return None
        self.stats.count("num_device_alloc")
        if not _plan.better(g, new_ptr):
            self.driver.free(new_ptr)
            self.stats.count("num_device_free")
            return None
        t0 = _now()
        live = [b for s in srcs for b in s.blocks() if b.allocated]
        cs = self.order.copy_stream()
        streams = ({s.stream for s in srcs} | {u for b in live for u in b.stream_uses}) - self._dead - {NO_STREAM}
        for s in sorted(streams):
            self.order.link(s, cs)
        plan, off = [], 0
        for b in live:
            self.order.copy(cs, new_ptr + off, b.ptr, b.requested)
            plan.append((b, new_ptr + off))
            off += b.size
        self.order.sync_stream(cs)
        dt = _now() - t0
        # the bytes are in place: rebuild the bookkeeping around the new segment
        seg = self._add_segment(new_ptr, g.size, g.stream, g.kind, g.lifetime)
        prev = None
        moves, nbytes = [], 0
        for b, at in plan:
            nb = Block(at, b.size, seg)
            nb.allocated, nb.requested, nb.stream_uses, nb.handle = True, b.requested, b.stream_uses, b.handle
            nb.prev = prev
            if prev is None:
                seg.head = nb
            else:
                prev.next = nb
            prev = nb
            self._unindex_live(b)
            self._index_live(nb)
            h = b.handle
            h.block, h.ptr, h.fence = nb, at, None
            h.moves += 1
            moves.append((b.ptr, at, b.size))
            nbytes += b.requested
        d_n = d_b = 0
        if off < g.size:
            tail = Block(new_ptr + off, g.size - off, seg)
            tail.prev = prev
            prev.next = tail
            self._pools[(g.kind, g.lifetime)].add(tail)
            d_n, d_b = 1, tail.size
        pool = self._pools[(g.kind, g.lifetime)]
        for s in srcs:
            for b in s.blocks():
                if b.is_free:
                    pool.remove(b)
                    if b.is_split:
                        d_n -= 1
                        d_b -= b.size
            self._drop_segment(s)
        self._inactive(g.kind, d_n, d_b)
        self.gen += 1
        return moves, nbytes, dt

    def close(self) -> None:
        """Return cached segments and the pool's events and stream (live allocations stay allocated)."""
        with self._lock:
            try:
                self._release_cached()
            finally:
                self.order.close()


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


__all__ = ["CachingAllocator", "roundup_power2_next_division", "LARGE_BUFFER"]
