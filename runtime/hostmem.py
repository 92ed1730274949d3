"""The host-pointer table: every host buffer that ``runtime.acl`` may read or write, like a sanitizer's.

pyACL hands host memory around as bare integers, and a wrong one (freed ``malloc_host`` memory, 0x10, a
1-byte buffer asked to take 1 MiB) would make ``ctypes`` read or write wild memory: SIGSEGV, or a heap
quietly corrupted.  Real hardware has no such check; an emulator should, so every host address an acl
call dereferences is first looked up here, and anything that is not inside one live registered buffer
is answered with ACL_ERROR_INVALID_PARAM (100000) before a byte is touched.

What is registered:

- ``rt.malloc_host`` buffers (kind ``malloc_host``): held until ``rt.free_host`` (:meth:`release`) or
  ``acl.finalize`` (:meth:`clear`);
- buffers whose address ``util.numpy_to_ptr`` / ``util.bytes_to_ptr`` handed out (kinds ``numpy``,
  ``bytes``): held for a while by a bounded LRU of strong references (so ``numpy_to_ptr(np.zeros(n))``
  used at once works), then -- numpy arrays only -- tracked by a weak reference to the array that owns
  the memory: valid while the caller holds it, refused once it is gone.  ``bytes`` objects cannot be
  tracked weakly: past the LRU their address is refused.

:meth:`lookup` returns a :class:`HostRange` that holds the buffer's owner, so memory stays mapped while a
caller uses it (an asynchronous copy keeps its range until it ran, even if ``free_host`` comes first).
The module-level functions act on the process's one table, :data:`TABLE`; later users (model loading's
host buffers, a sanitizer report) build on :func:`register` / :func:`lookup` / :func:`release`.
All methods are host-synchronous and thread-safe.
"""
from __future__ import annotations

import bisect
import ctypes
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from devices.errors import ACL_ERROR_INVALID_PARAM, AclError

KINDS = ("malloc_host", "numpy", "bytes")


def invalid(detail: str) -> AclError:
    """The acl layer's parameter error (100000) for a host pointer."""
    return AclError(detail, code=ACL_ERROR_INVALID_PARAM)


@dataclass(frozen=True, eq=False)
class HostRange:
    """A live registered host buffer ``[start, start + nbytes)``; holding it keeps the memory mapped."""
    start: int
    nbytes: int
    kind: str
    owner: Any

    @property
    def end(self) -> int:
        return self.start + self.nbytes

    def contains(self, ptr: int, nbytes: int) -> bool:
        return self.start <= ptr and ptr + nbytes <= self.end

    def view(self, ptr: int, nbytes: int) -> np.ndarray:
        """A writable uint8 numpy view of ``nbytes`` at ``ptr`` (inside this range, else 100000); the view
        keeps the owner alive."""
        if nbytes < 0 or not self.contains(ptr, nbytes):
            raise invalid(f"host range 0x{ptr:x}+{nbytes} is outside the {self.nbytes}-byte {self.kind} buffer "
                          f"at 0x{self.start:x}")
        c = (ctypes.c_uint8 * nbytes).from_address(ptr)
        c._vnpu_owner = self.owner                      # type: ignore[attr-defined]  # the view's base keeps it
        return np.ctypeslib.as_array(c)


class _Entry:
    __slots__ = ("start", "nbytes", "kind", "strong", "weak")

    def __init__(self, start: int, nbytes: int, kind: str, owner: Any):
        self.start, self.nbytes, self.kind = start, nbytes, kind
        self.strong: Any = owner
        self.weak: weakref.ref | None = None

    def owner(self) -> Any:
        return self.strong if self.strong is not None else (self.weak() if self.weak is not None else None)


def _weak_owner(obj: Any) -> Any:
    """The object whose life is the memory's: a numpy view's base array (as far as the chain goes), else
    ``obj``; None when it cannot be referenced weakly."""
    while isinstance(obj, np.ndarray) and isinstance(obj.base, np.ndarray):
        obj = obj.base
    try:
        weakref.ref(obj)
    except TypeError:
        return None
    return obj


class HostMemoryTable:
    """Registered host buffers (see the module doc).  ``max_strong_objects`` / ``max_strong_bytes`` bound
    the grace references of ``numpy``/``bytes`` registrations (``malloc_host`` ones do not count)."""

    def __init__(self, max_strong_objects: int = 1024, max_strong_bytes: int = 256 << 20, max_freed: int = 4096):
        self.max_strong_objects, self.max_strong_bytes, self.max_freed = max_strong_objects, max_strong_bytes, max_freed
        self._lock = threading.Lock()
        self._at: dict[int, dict[int, _Entry]] = {}           # start -> nbytes -> entry
        self._starts: list[int] = []                          # sorted keys of _at
        self._max_len = 0
        self._grace: OrderedDict[tuple[int, int], int] = OrderedDict()   # LRU of strong numpy/bytes entries
        self._grace_bytes = 0
        self._freed: OrderedDict[int, tuple[int, str]] = OrderedDict()  # recently released start -> (size, kind)

    # ------------------------------------------------------------------ register / release
    def register(self, ptr: int, nbytes: int, owner: Any, kind: str) -> None:
        """Record ``[ptr, ptr + nbytes)`` as live host memory owned by ``owner`` (a reference is held,
        see the module doc).  Registering the same range again refreshes it."""
        if kind not in KINDS:
            raise ValueError(f"unknown host buffer kind {kind!r} (one of {KINDS})")
        if ptr <= 0 or nbytes < 0:
            raise invalid(f"cannot register host range 0x{ptr:x}+{nbytes}")
        key = (ptr, nbytes)
        with self._lock:
            self._remove_locked(key)
            at = self._at.get(ptr)
            if at is None:
                at = self._at[ptr] = {}
                bisect.insort(self._starts, ptr)
            at[nbytes] = _Entry(ptr, nbytes, kind, owner)
            self._max_len = max(self._max_len, nbytes)
            self._freed.pop(ptr, None)
            if kind != "malloc_host":
                self._grace[key] = nbytes
                self._grace_bytes += nbytes
                self._trim_grace_locked()

    def release(self, ptr: int, kind: str = "malloc_host") -> HostRange:
        """Forget the ``kind`` buffer that starts at ``ptr`` (free_host); 100000 when there is none."""
        with self._lock:
            e = next((x for x in self._at.get(ptr, {}).values() if x.kind == kind), None)
            if e is None:
                was = self._freed.get(ptr)
                raise invalid(f"0x{ptr:x} is not the start of a live {kind} buffer"
                              + (f" (a {was[0]}-byte {was[1]} buffer there was already freed)" if was else ""))
            owner = e.owner()
            self._remove_locked((e.start, e.nbytes))
            self._remember_freed(e)
        return HostRange(e.start, e.nbytes, e.kind, owner)

    def clear(self, kind: str | None = None) -> None:
        """Forget every registration, or every one of ``kind`` (acl.finalize: ``malloc_host``)."""
        with self._lock:
            if kind is not None:
                for e in [e for at in self._at.values() for e in at.values() if e.kind == kind]:
                    self._remove_locked((e.start, e.nbytes))
                    self._remember_freed(e)
                return
            self._at.clear()
            self._starts.clear()
            self._grace.clear()
            self._grace_bytes = 0
            self._freed.clear()
            self._max_len = 0

    # ------------------------------------------------------------------ lookup
    def lookup(self, ptr: int, nbytes: int, what: str = "host pointer") -> HostRange:
        """The live registered buffer that holds all of ``[ptr, ptr + nbytes)``; otherwise 100000 with
        what is wrong (freed, past the end of a buffer, unknown address)."""
        if not isinstance(ptr, int) or isinstance(ptr, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise invalid(f"bad {what} range {ptr!r}+{nbytes!r}")
        partial: _Entry | None = None
        dead: _Entry | None = None
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr)
            lo = ptr - self._max_len
            for j in range(i - 1, -1, -1):
                start = self._starts[j]
                if start < lo:
                    break
                for e in list(self._at[start].values()):
                    key = (e.start, e.nbytes)
                    if not ptr < start + max(e.nbytes, 1):
                        continue
                    owner = e.owner()
                    if owner is None:                   # its array was garbage-collected
                        dead = e
                        self._remove_locked(key)
                        self._remember_freed(e)
                        continue
                    if ptr + nbytes <= start + e.nbytes:
                        if key in self._grace:
                            self._grace.move_to_end(key)
                        return HostRange(e.start, e.nbytes, e.kind, owner)
                    if partial is None or e.nbytes > partial.nbytes:
                        partial = e
            freed = self._freed_at(ptr) if dead is None else (dead.start, dead.nbytes, dead.kind)
        if partial is not None:
            raise invalid(f"{what} range 0x{ptr:x}+{nbytes} runs past the end of the {partial.nbytes}-byte "
                          f"{partial.kind} buffer at 0x{partial.start:x} (by {ptr + nbytes - partial.start - partial.nbytes}"
                          f" bytes)")
        if freed is not None:
            s, n, k = freed
            raise invalid(f"{what} 0x{ptr:x} is inside the {n}-byte {k} buffer at 0x{s:x}, which was freed"
                          + (" (its numpy array is gone)" if k == "numpy" else ""))
        raise invalid(f"{what} 0x{ptr:x} is not inside a live host buffer known to acl (rt.malloc_host, "
                      f"util.numpy_to_ptr, util.bytes_to_ptr)")

    def freed(self, ptr: int) -> tuple[int, int, str] | None:
        """``(start, nbytes, kind)`` of a recently freed buffer that held ``ptr`` (what :meth:`lookup`
        reports as freed when no live buffer holds it), else None."""
        with self._lock:
            return self._freed_at(ptr)

    def live(self) -> list[HostRange]:
        """The live registrations, by start (reports, tests)."""
        with self._lock:
            out = []
            for e in sorted((e for at in self._at.values() for e in at.values()), key=lambda e: (e.start, e.nbytes)):
                o = e.owner()
                if o is not None:
                    out.append(HostRange(e.start, e.nbytes, e.kind, o))
            return out

    # ------------------------------------------------------------------ internals (lock held)
    def _remember_freed(self, e: _Entry) -> None:
        self._freed.pop(e.start, None)
        self._freed[e.start] = (e.nbytes, e.kind)
        while len(self._freed) > self.max_freed:
            self._freed.popitem(last=False)

    def _freed_at(self, ptr: int):
        for s, (n, k) in reversed(self._freed.items()):
            if s <= ptr < s + max(n, 1):
                return s, n, k
        return None

    def _remove_locked(self, key: tuple[int, int]) -> None:
        at = self._at.get(key[0])
        if at is None or at.pop(key[1], None) is None:
            return
        if not at:
            del self._at[key[0]]
            i = bisect.bisect_left(self._starts, key[0])
            if i < len(self._starts) and self._starts[i] == key[0]:
                del self._starts[i]
        size = self._grace.pop(key, None)
        if size is not None:
            self._grace_bytes -= size

    def _trim_grace_locked(self) -> None:
        while len(self._grace) > 1 and (len(self._grace) > self.max_strong_objects
                                        or self._grace_bytes > self.max_strong_bytes):
            key, size = self._grace.popitem(last=False)
            self._grace_bytes -= size
            e = self._at.get(key[0], {}).get(key[1])
            if e is None:
                continue
            target = _weak_owner(e.strong)
            if target is None:                         # bytes: cannot be followed any further
                self._remove_locked(key)
                continue
            e.weak = weakref.ref(target)
            e.strong = None


#: the process's one table
TABLE = HostMemoryTable()


def register(ptr: int, nbytes: int, owner: Any, kind: str) -> None:
    """Register a host buffer in :data:`TABLE` (see :meth:`HostMemoryTable.register`)."""
    TABLE.register(ptr, nbytes, owner, kind)


def lookup(ptr: int, nbytes: int, what: str = "host pointer") -> HostRange:
    """The live range of :data:`TABLE` that holds ``[ptr, ptr + nbytes)``, else 100000."""
    return TABLE.lookup(ptr, nbytes, what)


def freed(ptr: int) -> tuple[int, int, str] | None:
    """The recently freed buffer of :data:`TABLE` that held ``ptr`` (see :meth:`HostMemoryTable.freed`)."""
    return TABLE.freed(ptr)


def release(ptr: int, kind: str = "malloc_host") -> HostRange:
    """Forget the ``kind`` buffer of :data:`TABLE` that starts at ``ptr``, else 100000."""
    return TABLE.release(ptr, kind)


__all__ = ["HostRange", "HostMemoryTable", "TABLE", "register", "lookup", "release", "freed", "invalid", "KINDS"]
