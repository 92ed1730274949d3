"""The paged KV cache's bookkeeping: a pool of fixed-size blocks, a block table per request, and the
automatic prefix cache (vLLM's APC).

Block 0 is the null block (as in vLLM): never handed out; padded batch rows and the query heads of the
cache write land there, and a zero-filled block table entry points at it.  KV usage is
``1 - free / (num_blocks - 1)`` (a cached block nobody uses counts as free: it is evicted when its memory
is needed).  Pure host-side data: the device memory itself is one region per device
(:func:`runtime.serve.engine.kv_cache.allocate_kv_region`).

**Prefix caching.**  Every *full* block of computed tokens gets a content hash that chains its parent
block's hash, the block's token ids and (in the first block) the request's cache *salt* -- its tenant's
namespace -- so two blocks hash alike only when every token before and in them is the same and they belong
to the same namespace (SHA-256: no collision between tenants to find).  A block is reference counted; a
new request whose leading full blocks are already cached takes them into its table (reference + 1) and
computes only the rest.  A block whose count drops to 0 stays cached, at the tail of the free queue;
blocks are handed out from the head, least recently freed first, and a cached block handed out is
evicted (its hash forgotten) -- LRU among the blocks nobody uses.  The blocks of one request are freed
last block first, so a prefix outlives its tails."""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Sequence

import numpy as np

from devices.errors import InvalidParamError


def block_hashes(token_ids: Sequence[int], block_size: int, salt: str = "", parent: bytes | None = None,
                 start: int = 0) -> list[bytes]:
    """Chained content hashes of the full blocks of ``token_ids`` (from block ``start``, whose parent's hash
    is ``parent``): ``sha256(parent | salt, the block's token ids)``.  Pure."""
    out: list[bytes] = []
    prev = parent if parent is not None else b"salt:" + salt.encode()
    ids = np.asarray(token_ids, np.int64)
    for b in range(start, len(ids) // block_size):
        prev = hashlib.sha256(prev + ids[b * block_size:(b + 1) * block_size].tobytes()).digest()
        out.append(prev)
    return out


class BlockPool:
    """Blocks ``[1, num_blocks)``: reference counts, the free queue (unused blocks, least recently freed
    first) and the hash -> block map of cached blocks."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise InvalidParamError(f"a KV cache needs >= 2 blocks (block 0 is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self._refs = [0] * num_blocks
        self._by_hash: dict[bytes, int] = {}
        self._hash_of: dict[int, bytes] = {}
        self.evictions = 0                       #: cached blocks handed out for other content

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._by_hash)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / (self.num_blocks - 1)

    def refs(self, block: int) -> int:
        return self._refs[block]

    def lookup(self, h: bytes) -> int | None:
        return self._by_hash.get(h)

    def take(self, n: int) -> list[int] | None:
        """``n`` blocks (reference 1 each), or None (and nothing taken) when fewer are free; a cached block
        taken is evicted."""
        if n > len(self._free):
            return None
        out = []
        for _ in range(n):
            b, _none = self._free.popitem(last=False)
            h = self._hash_of.pop(b, None)
            if h is not None:
                del self._by_hash[h]
                self.evictions += 1
            self._refs[b] = 1
            out.append(b)
        return out

    def touch(self, blocks: Sequence[int]) -> None:
        """One more reference to each of ``blocks`` (cached blocks a request takes into its table)."""
        for b in blocks:
            if self._refs[b] == 0:
                del self._free[b]
            self._refs[b] += 1

    def give(self, blocks: Sequence[int]) -> None:
        """One reference less to each of ``blocks``, in order; one nobody uses goes to the free queue's tail."""
        for b in blocks:
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None

    def cache(self, block: int, h: bytes) -> None:
        """Remember ``block`` as holding the content of hash ``h`` (the first block for a hash stays)."""
        if h not in self._by_hash and block not in self._hash_of:
            self._by_hash[h] = block
            self._hash_of[block] = h


class BlockManager:
    """Block tables of requests over one :class:`BlockPool`; with ``enable_caching`` the full blocks of
    computed tokens are cached by content (module doc)."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False):
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[bytes]] = {}      #: hashes of the request's cached full blocks, in order
        self.queries = 0                               #: tokens of requests looked up in the prefix cache
        self.hits = 0                                  #: of those, tokens found cached

    @property
    def capacity_tokens(self) -> int:
        """Tokens one request may hold at most (all usable blocks)."""
        return (self.pool.num_blocks - 1) * self.block_size

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def cached_prefix(self, token_ids: Sequence[int], salt: str = "") -> list[int]:
        """The cached blocks holding the longest prefix of ``token_ids``' full blocks, leaving at least the
        last token to compute (its logits are wanted).  No side effect."""
        if not self.enable_caching:
            return []
        out: list[int] = []
        for h in block_hashes(token_ids[:max(0, len(token_ids) - 1)], self.block_size, salt):
            b = self.pool.lookup(h)
            if b is None:
                break
            out.append(b)
        return out

    def allocate(self, request_id: str, total_tokens: int, prefix: Sequence[int] = ()) -> bool:
        """Grow ``request_id``'s table to hold ``total_tokens`` tokens; False (nothing taken) if the pool
        cannot.  ``prefix``: cached blocks (:meth:`cached_prefix`) that start a new table."""
        table = self.tables.setdefault(request_id, [])
        if prefix and table:
            raise InvalidParamError(f"request {request_id}: a cached prefix only starts a new block table")
        idle = sum(1 for b in prefix if self.pool.refs(b) == 0)      # taken out of the free queue by touch
        need = self.blocks_for(total_tokens) - len(table) - len(prefix)
        if need > self.pool.num_free - idle:
            if not table:
                del self.tables[request_id]
            return False
        self.pool.touch(prefix)
        table.extend(prefix)
        if need > 0:
            table.extend(self.pool.take(need) or [])
        return True

    def counted(self, tokens: int, hit_tokens: int) -> None:
        """A request looked up in the prefix cache was admitted: ``tokens`` queried, ``hit_tokens`` found."""
        if self.enable_caching:
            self.queries += tokens
            self.hits += hit_tokens

    def has_uncached_full_block(self, request_id: str, num_computed: int) -> bool:
        """Whether the request's first ``num_computed`` tokens fill a block not cached yet (cheap: no
        hashing)."""
        return self.enable_caching and num_computed // self.block_size > len(self._hashes.get(request_id, ()))

    def cache_full_blocks(self, request_id: str, token_ids: Sequence[int], num_computed: int, salt: str = "") -> None:
        """Cache the full blocks among the request's first ``num_computed`` tokens (``token_ids``: at least
        those) that are not cached yet."""
        if not self.enable_caching:
            return
        table = self.tables.get(request_id)
        if not table:
            return
        done = self._hashes.setdefault(request_id, [])
        full = min(num_computed // self.block_size, len(table))
        if full <= len(done):
            return
        new = block_hashes(token_ids[:full * self.block_size], self.block_size, salt,
                           done[-1] if done else None, len(done))
        for i, h in enumerate(new, start=len(done)):
            self.pool.cache(table[i], h)
        done.extend(new)

    def free(self, request_id: str) -> int:
        """Drop the request's references to its blocks (last block first: a shared prefix is evicted after
        its tails); how many."""
        table = self.tables.pop(request_id, [])
        self._hashes.pop(request_id, None)
        self.pool.give(table[::-1])
        return len(table)

    def table(self, request_id: str) -> list[int]:
        return self.tables.get(request_id, [])

    def slot(self, request_id: str, position: int) -> int:
        """The cache slot (block * block_size + offset) of ``position`` of the request."""
        t = self.tables[request_id]
        return t[position // self.block_size] * self.block_size + position % self.block_size
