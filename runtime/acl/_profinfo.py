"""What the profiler notes about an acl call beyond its name and times (bytes copied, pinned or not).

:data:`INFO` maps an acl call name to a function of the call's arguments that returns a small dict; the
calling convention (:mod:`._calls`) passes it to the profiler, which calls it only while a profile runs.
A host buffer counts as pinned when it is ``rt.malloc_host`` memory (the host-pointer table's kind).
"""
from __future__ import annotations

from typing import Callable

from runtime import hostmem


def _pinned(*ptrs) -> bool:
    for p in ptrs:
        try:
            if isinstance(p, int) and p and hostmem.lookup(p, 1).kind == "malloc_host":
                return True
        except Exception:  # noqa: BLE001 - device pointers and unknown ones are not pinned host memory
            continue
    return False


def _memcpy(dst, _dest_max, src, count, *_a, **_k) -> dict:
    return {"bytes": int(count), "pinned": _pinned(dst, src)}


def _memcpy_async(dst, _dest_max, src, count, *_a, **_k) -> dict:
    return {"bytes": int(count), "pinned": _pinned(dst, src), "async": True}


def _sized(_ptr, size, *_a, **_k) -> dict:
    return {"bytes": int(size)}


INFO: dict[str, Callable[..., dict]] = {
    "acl.rt.memcpy": _memcpy,
    "acl.rt.memcpy_async": _memcpy_async,
    "acl.rt.malloc": lambda size, *_a, **_k: {"bytes": int(size)},
    "acl.rt.memset": _sized,
}
