"""The profiler's hooks in the runtime: what ``runtime.api`` and ``runtime.acl`` call, and nothing else.

This module is the only part of :mod:`runtime.profiler` that the runtime's hot paths import.  It holds
the process's active :class:`~runtime.profiler.collector.Collector` (:data:`ACTIVE`; None when nothing is
profiled) and the runtime devices alive in the process (so that a profile started later can reach them).

Off (the default), every hook costs one global read and a ``None`` check: :func:`api` wraps an entry
point in a function that calls the original at once when :data:`ACTIVE` is None, and the enqueue path
tests :data:`ACTIVE` inline.  Nothing here blocks.
"""
from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

from runtime import hostbuf

#: the process's collector while a profile runs (set by runtime.profiler; read by every hook)
ACTIVE: Any = None

_devices: "weakref.WeakSet[Any]" = weakref.WeakSet()

#: API category by name fragment, first match wins (the breakdown's rows); anything else is "other"
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("synchronize", "sync"), ("malloc", "alloc"), ("free", "alloc"), ("memcpy", "copy"), ("memset", "copy"),
    ("write", "copy"), ("copy", "copy"), ("launch", "launch"), ("replay", "launch"), ("execute", "launch"),
    ("submit", "launch"),
)


def category_of(name: str) -> str:
    """The breakdown category of an API name (``acl.rt.malloc`` -> alloc)."""
    low = name.lower()
    for frag, cat in CATEGORIES:
        if frag in low:
            return cat
    return "other"


def set_active(collector: Any) -> Any:
    """Install ``collector`` (None: profiling off); returns the previous one."""
    global ACTIVE
    old, ACTIVE = ACTIVE, collector
    return old


def note_device(dev: Any) -> None:
    """A runtime device was made (``runtime.api.Device``): remember it; a running profile attaches it."""
    _devices.add(dev)
    c = ACTIVE
    if c is not None:
        c.attach(dev)


def live_devices() -> list[Any]:
    return list(_devices)


def api(name: str, level: str = "Runtime", info: Callable[..., dict] | None = None) -> Callable[[Callable], Callable]:
    """Decorator: record calls of ``fn`` as API ``name`` (msprof level ``Runtime`` / ``AscendCL``) while a
    profile runs; ``info(*args, **kwargs)`` adds a small dict (bytes copied, ...) to the record."""
    cat = category_of(name)

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args, **kwargs):
            c = ACTIVE
            if c is None:
                return fn(*args, **kwargs)
            return c.call(name, cat, level, fn, args, kwargs, info)
        return call
    return deco


def nbytes_of(data: Any) -> int:
    """Bytes in a host buffer argument (bytes, memoryview, numpy array)."""
    n = getattr(data, "nbytes", None)
    return int(n) if n is not None else len(data)


def h2d_info(_self, _dst, data, *_a, **_k) -> dict:
    return {"bytes": nbytes_of(data), "pinned": hostbuf.is_pinned(data)}


def sized_info(_self, _ptr, _src_or_value, nbytes, *_a, **_k) -> dict:
    return {"bytes": int(nbytes)}


def d2h_info(_self, _src, nbytes, out=None, *_a, **_k) -> dict:
    return {"bytes": int(nbytes), "pinned": out is not None and hostbuf.is_pinned(out)}


def write_info(_self, _dst, data, *_a, **_k) -> dict:
    return {"bytes": nbytes_of(data), "pinned": hostbuf.is_pinned(data), "async": True}
