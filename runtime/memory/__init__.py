"""The runtime's caching memory pool (one per device): PyTorch's CUDA caching allocator for vnpu, with
lifetime-aware placement and live defragmentation.

Modules, one job each:

- :mod:`.config`     ``VNPU_ALLOC_CONF`` parsing (:class:`AllocConfig`, the key table, PyTorch's constants)
- :mod:`.driver_api` the driver allocator the pool sits on (:class:`HandleAllocator` over a device handle)
- :mod:`.ordering`   device events, waits and copies the pool orders its reuse with (:class:`HandleStreamOrder`)
- :mod:`.blocks`     segments, blocks, the sorted free sets, the relocatable :class:`Handle`
- :mod:`.stats`      the ``memory_stats()`` schema (PyTorch's keys)
- :mod:`.allocator`  :class:`CachingAllocator`: malloc / free / record_stream / empty_cache / stats / defragment
- :mod:`.defrag`     the compaction plan and :class:`DefragReport`
- :mod:`.summary`    ``memory_summary()``'s table

:mod:`runtime.api` builds one pool per :class:`~runtime.api.Device` (tensors allocate from it); raw
``acl.rt.malloc`` memory does not go through it and is never moved.
"""
from .allocator import CachingAllocator, roundup_power2_next_division
from .blocks import LIFETIMES, LONG, SHORT, Handle
from .config import ENV, KEYS, AllocConfig, AllocConfigError, parse
from .defrag import DefragReport
from .driver_api import ArenaState, DriverAllocator, HandleAllocator
from .ordering import HandleStreamOrder, StreamOrder
from .summary import render as render_summary

__all__ = ["CachingAllocator", "roundup_power2_next_division", "LIFETIMES", "LONG", "SHORT", "Handle", "ENV",
           "KEYS", "AllocConfig", "AllocConfigError", "parse", "DefragReport", "ArenaState", "DriverAllocator",
           "HandleAllocator", "HandleStreamOrder", "StreamOrder", "render_summary"]
