"""The pool's counters, in the schema of PyTorch's ``torch.cuda.memory_stats()`` (torch_npu's too).

Keys are ``<stat>.<pool>.<metric>`` with ``<stat>`` in :data:`STATS`, ``<pool>`` in ``all``,
``large_pool``, ``small_pool`` and ``<metric>`` in ``current``, ``peak``, ``allocated``, ``freed``
(``allocated``/``freed`` accumulate increases/decreases), plus the scalar counters of :data:`COUNTERS`.
``max_split_size`` is -1 when unlimited (PyTorch reports SIZE_MAX cast to int64).  vnpu adds the pool's
own fragmentation (``fragmentation`` = 1 - largest free block / free bytes inside the pool's segments,
``largest_free_block``, ``inactive_bytes``) and its defragmentation and cross-stream counters.
"""
from __future__ import annotations

from dataclasses import dataclass

POOLS = ("all", "large_pool", "small_pool")
METRICS = ("current", "peak", "allocated", "freed")
#: per-pool statistics (PyTorch's StatType-indexed StatArrays), in the order memory_summary lists them
STATS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
         "active_bytes", "inactive_split_bytes", "requested_bytes")
#: oversize statistics (allocations / segments of at least max_split_size): one Stat each, no pools
OVERSIZE = ("oversize_allocations", "oversize_segments")
#: scalar counters
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
            "num_cross_stream_reuse", "num_gc_releases", "num_defragmentations", "defrag_bytes_moved",
            "defrag_blocks_moved")


@dataclass
class Stat:
    current: int = 0
    peak: int = 0
    allocated: int = 0
    freed: int = 0

    def update(self, amount: int) -> None:
        if not amount:
            return
        self.current += amount
        if amount > 0:
            self.allocated += amount
            if self.current > self.peak:
                self.peak = self.current
        else:
            self.freed -= amount

    def reset_peak(self) -> None:
        self.peak = self.current

    def reset_accumulated(self) -> None:
        self.allocated = self.freed = 0


class MemoryStats:
    """All the pool's counters.  Not thread-safe by itself (the allocator's lock covers it).  The hot
    paths (:meth:`on_alloc`, :meth:`on_free`) update everything an allocation changes in one call."""

    def __init__(self):
        self.stats = {name: {pool: Stat() for pool in POOLS} for name in STATS}
        self.oversize = {name: Stat() for name in OVERSIZE}
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._hot = {pool: tuple(self.stats[n][p] for p in ("all", pool) for n in
                                 ("allocation", "active", "allocated_bytes", "active_bytes", "requested_bytes"))
                     for pool in POOLS[1:]}

    def update(self, name: str, pool: str, amount: int) -> None:
        """Change ``name`` by ``amount`` in ``pool`` and in ``all``."""
        if amount:
            row = self.stats[name]
            row["all"].update(amount)
            row[pool].update(amount)

    def on_alloc(self, pool: str, size: int, requested: int) -> None:
        """A block of ``size`` bytes (``requested`` asked for) was handed out."""
        for s, amount in zip(self._hot[pool], (1, 1, size, size, requested, 1, 1, size, size, requested)):
            s.current += amount
            s.allocated += amount
            if s.current > s.peak:
                s.peak = s.current

    def on_release(self, pool: str, size: int, requested: int) -> None:
        """A block was freed by its owner (it stays active while pending)."""
        h = self._hot[pool]
        for i, amount in ((0, 1), (2, size), (4, requested), (5, 1), (7, size), (9, requested)):
            s = h[i]
            s.current -= amount
            s.freed += amount

    def on_inactive(self, pool: str, size: int) -> None:
        """A freed block is free now (no longer active)."""
        h = self._hot[pool]
        for i, amount in ((1, 1), (3, size), (6, 1), (8, size)):
            s = h[i]
            s.current -= amount
            s.freed += amount

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    def reset_peak(self) -> None:
        for row in self.stats.values():
            for s in row.values():
                s.reset_peak()
        for s in self.oversize.values():
            s.reset_peak()

    def reset_accumulated(self) -> None:
        for row in self.stats.values():
            for s in row.values():
                s.reset_accumulated()
        for s in self.oversize.values():
            s.reset_accumulated()
        for k in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
                  "num_cross_stream_reuse", "num_gc_releases"):
            self.counters[k] = 0

    def as_dict(self, extra: dict | None = None) -> dict:
        """Flat ``{key: number}`` sorted by key, as ``torch.cuda.memory_stats()`` returns it."""
        out: dict = {}
        for name, row in self.stats.items():
            for pool, s in row.items():
                for m in METRICS:
                    out[f"{name}.{pool}.{m}"] = getattr(s, m)
        for name, s in self.oversize.items():
            for m in METRICS:
                out[f"{name}.{m}"] = getattr(s, m)
        out.update(self.counters)
        if extra:
            out.update(extra)
        return dict(sorted(out.items()))
