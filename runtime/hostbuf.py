"""Pinned (page-locked) host buffers of the runtime: ``aclrtMallocHost`` for :mod:`runtime.api` users.

:func:`pinned_empty` returns a numpy array that the runtime treats as page-locked host memory: copies
from it (``Stream.write``) are priced at the pinned PCIe bandwidth on the modeled clock and run
asynchronously, as CANN runs ``aclrtMemcpyAsync`` from ``aclrtMallocHost`` memory; copies from any other
host buffer are pageable (staged, and they hold the host).  On this machine both are ordinary memory,
so only the modeled clock can show the difference.  ``rt.malloc_host`` buffers of :mod:`runtime.acl`
are registered here too.

A buffer is recognised while it lives (a weak reference to the array that owns the memory; views of
it count).  Host-only; nothing here blocks.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Sequence

import numpy as np

_pinned: "weakref.WeakValueDictionary[int, np.ndarray]" = weakref.WeakValueDictionary()
_lock = threading.Lock()


def _owner(obj: Any) -> Any:
    while isinstance(obj, np.ndarray) and isinstance(obj.base, np.ndarray):
        obj = obj.base
    return obj


def register(arr: np.ndarray) -> None:
    """Treat ``arr`` (and views of it) as pinned host memory while it lives."""
    owner = _owner(arr)
    with _lock:
        _pinned[id(owner)] = owner


def pinned_empty(shape: int | Sequence[int], dtype: Any = "float32") -> np.ndarray:
    """A new pinned host array (uninitialised, 64 B aligned start, like aclrtMallocHost)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(n + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    arr = raw[start:start + n].view(dt).reshape(shape)
    register(raw)
    return arr


def is_pinned(data: Any) -> bool:
    """Whether ``data`` is (a view of) a live pinned buffer."""
    owner = _owner(data) if isinstance(data, np.ndarray) else (_owner(data.obj) if isinstance(data, memoryview) else None)
    if owner is None:
        return False
    with _lock:
        return _pinned.get(id(owner)) is owner
