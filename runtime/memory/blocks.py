"""The pool's data structures: segments (driver allocations), the blocks they are split into, the
sorted sets of free blocks, and the relocatable handle a caller holds.

A :class:`Segment` is one driver allocation.  Its :class:`Block` s tile it exactly, in address order
(``prev``/``next``), each either allocated, free (in its pool's :class:`FreeBlocks`) or pending (freed
while recorded streams may still use it: in no set until their events complete).  Free neighbours are
merged at once, so two free blocks are never adjacent.

A :class:`Handle` is what an allocation returns: its ``ptr`` is the block's current address, which live
defragmentation may change (handles are updated in place; callers read ``ptr`` when they enqueue work).
"""
from __future__ import annotations

import bisect

SMALL, LARGE = "small_pool", "large_pool"
SHORT, LONG = "short", "long"
LIFETIMES = (SHORT, LONG)
NO_STREAM = -1          #: a segment no live stream owns (its stream was destroyed): any stream may take it


class Segment:
    __slots__ = ("ptr", "size", "stream", "kind", "lifetime", "head")

    def __init__(self, ptr: int, size: int, stream: int, kind: str, lifetime: str):
        self.ptr, self.size, self.stream, self.kind, self.lifetime = ptr, size, stream, kind, lifetime
        self.head: Block | None = None

    def blocks(self):
        b = self.head
        while b is not None:
            yield b
            b = b.next

    @property
    def end(self) -> int:
        return self.ptr + self.size

    def __repr__(self) -> str:
        return f"<Segment 0x{self.ptr:x} {self.size} B {self.kind} {self.lifetime} stream {self.stream}>"


class Block:
    __slots__ = ("ptr", "size", "requested", "segment", "prev", "next", "allocated", "pending", "stream_uses",
                 "handle", "freed_at", "fence_stream")

    def __init__(self, ptr: int, size: int, segment: Segment):
        self.ptr, self.size, self.segment = ptr, size, segment
        self.requested = 0
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.pending = False            #: freed, waiting for recorded streams' events
        self.stream_uses: set[int] = set()
        self.handle: Handle | None = None
        self.freed_at = 0               #: allocator tick of the last free (garbage collection age)
        #: the stream still had queued work when this memory was freed: a host-synchronous write into it
        #: must wait for that stream first (stream-ordered work is ordered anyway)
        self.fence_stream: int | None = None

    @property
    def is_free(self) -> bool:
        return not self.allocated and not self.pending

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.segment.stream, self.size, self.ptr)

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "pending" if self.pending else "free"
        return f"<Block 0x{self.ptr:x} {self.size} B {state}>"


class FreeBlocks:
    """One pool's free blocks ordered by (stream, size, address): the smallest block of a stream that
    holds a request is one bisection away (PyTorch's BlockPool)."""

    def __init__(self, kind: str, lifetime: str):
        self.kind, self.lifetime = kind, lifetime
        self._keys: list[tuple[int, int, int]] = []
        self._blocks: dict[tuple[int, int, int], Block] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self):
        return (self._blocks[k] for k in list(self._keys))

    def add(self, b: Block) -> None:
        k = b.key
        bisect.insort(self._keys, k)
        self._blocks[k] = b

    def remove(self, b: Block) -> None:
        k = b.key
        del self._blocks[k]
        del self._keys[bisect.bisect_left(self._keys, k)]

    def first_fit(self, stream: int, size: int) -> Block | None:
        """The smallest free block of ``stream`` with at least ``size`` bytes (lowest address first)."""
        i = bisect.bisect_left(self._keys, (stream, size, -1))
        if i < len(self._keys) and self._keys[i][0] == stream:
            return self._blocks[self._keys[i]]
        return None

    def candidates(self, size: int):
        """Free blocks of any stream with at least ``size`` bytes, smallest first."""
        found = [self._blocks[k] for k in self._keys if k[1] >= size]
        found.sort(key=lambda b: (b.size, b.ptr))
        return found


class Handle:
    """A live allocation of the pool, as its owner sees it.  ``ptr`` is where the bytes are now (live
    defragmentation moves them and updates this); ``nbytes`` what was asked for; ``moves`` how many times
    it moved.  A pinned handle is never moved."""

    __slots__ = ("ptr", "nbytes", "stream", "lifetime", "pinned", "freed", "moves", "fence", "block", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, stream: int, lifetime: str, pinned: bool, block: Block):
        self.ptr, self.nbytes, self.stream, self.lifetime, self.pinned = ptr, nbytes, stream, lifetime, pinned
        self.freed = False
        self.moves = 0
        self.fence: tuple | None = None   #: what a host-synchronous access waits for first (see host_fence)
        self.block = block              #: the pool's block (pool internals; changes when it moves)

    def __repr__(self) -> str:
        return (f"<pool Handle 0x{self.ptr:x} {self.nbytes} B stream {self.stream} {self.lifetime}"
                f"{' pinned' if self.pinned else ''}{' freed' if self.freed else ''}>")
