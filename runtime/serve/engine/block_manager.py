"""The paged KV cache's bookkeeping: a pool of fixed-size blocks and a block table per request.

Block 0 is the null block (as in vLLM): never handed out; padded batch rows and the query heads of the
cache write land there, and a zero-filled block table entry points at it.  KV usage is
``1 - free / (num_blocks - 1)``.  Pure host-side data: the device memory itself is one region per
device (:func:`runtime.serve.engine.kv_cache.allocate_kv_region`)."""
from __future__ import annotations

from collections import deque

from devices.errors import InvalidParamError


class BlockPool:
    """Free list of block ids ``[1, num_blocks)`` (first freed, first reused)."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise InvalidParamError(f"a KV cache needs >= 2 blocks (block 0 is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self._free = deque(range(1, num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / (self.num_blocks - 1)

    def take(self, n: int) -> list[int] | None:
        """``n`` blocks, or None (and nothing taken) when fewer are free."""
        if n > len(self._free):
            return None
        return [self._free.popleft() for _ in range(n)]

    def give(self, blocks: list[int]) -> None:
        self._free.extend(blocks)


class BlockManager:
    """Block tables of requests over one :class:`BlockPool`."""

    def __init__(self, num_blocks: int, block_size: int):
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.tables: dict[str, list[int]] = {}

    @property
    def capacity_tokens(self) -> int:
        """Tokens one request may hold at most (all usable blocks)."""
        return (self.pool.num_blocks - 1) * self.block_size

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def allocate(self, request_id: str, total_tokens: int) -> bool:
        """Grow ``request_id``'s table to hold ``total_tokens`` tokens; False (nothing taken) if the pool
        cannot."""
        table = self.tables.setdefault(request_id, [])
        need = self.blocks_for(total_tokens) - len(table)
        if need <= 0:
            return True
        got = self.pool.take(need)
        if got is None:
            if not table:
                del self.tables[request_id]
            return False
        table.extend(got)
        return True

    def free(self, request_id: str) -> int:
        """Return the request's blocks to the pool; how many."""
        table = self.tables.pop(request_id, [])
        self.pool.give(table)
        return len(table)

    def table(self, request_id: str) -> list[int]:
        return self.tables.get(request_id, [])

    def slot(self, request_id: str, position: int) -> int:
        """The cache slot (block * block_size + offset) of ``position`` of the request."""
        t = self.tables[request_id]
        return t[position // self.block_size] * self.block_size + position % self.block_size
