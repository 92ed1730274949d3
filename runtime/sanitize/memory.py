"""Allocation histories: what memcheck says about a pointer and what leakcheck finds alive.

One :class:`AllocTable` per device (device pointers) and one for the process's host buffers
(``acl.rt.malloc_host``): live allocations with the call site that made them, and the most recent
freed ones with where they were freed, so a refused access can be explained ("inside the 4096-byte
allocation at 0x.. that was freed at ...", "32 bytes after the end of the allocation at ...").
"""
from __future__ import annotations

import bisect
import itertools
from collections import OrderedDict
from dataclasses import dataclass

#: freed allocations remembered per table (the oldest are forgotten first)
FREED_HISTORY = 4096
_serial = itertools.count(1)


@dataclass(eq=False)
class Allocation:
    ptr: int
    size: int
    site: int                           #: where it was allocated
    kind: str = "device"                #: device | malloc_host
    free_site: int | None = None        #: where it was freed (None: live)
    serial: int = 0

    @property
    def end(self) -> int:
        return self.ptr + self.size


class AllocTable:
    """Live and recently freed allocations of one address space."""

    def __init__(self) -> None:
        self.live: dict[int, Allocation] = {}
        self._starts: list[int] = []
        self.freed: OrderedDict[int, Allocation] = OrderedDict()

    def add(self, ptr: int, size: int, site: int, kind: str = "device") -> Allocation:
        a = Allocation(ptr, size, site, kind, serial=next(_serial))
        if ptr in self.live:
            self._drop(ptr)
        self.live[ptr] = a
        bisect.insort(self._starts, ptr)
        self.freed.pop(ptr, None)
        return a

    def remove(self, ptr: int, site: int) -> Allocation | None:
        """The allocation that starts at ``ptr`` is freed (at ``site``); None when there is none."""
        a = self.live.get(ptr)
        if a is None:
            return None
        self._drop(ptr)
        a.free_site = site
        self.freed[ptr] = a
        while len(self.freed) > FREED_HISTORY:
            self.freed.popitem(last=False)
        return a

    def _drop(self, ptr: int) -> None:
        del self.live[ptr]
        del self._starts[bisect.bisect_left(self._starts, ptr)]

    def clear(self) -> list[Allocation]:
        """Forget everything (a device reset); returns what was live."""
        out = list(self.live.values())
        self.live.clear()
        self._starts.clear()
        self.freed.clear()
        return out

    def containing(self, ptr: int) -> Allocation | None:
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i >= 0:
            a = self.live[self._starts[i]]
            if a.ptr <= ptr < a.end:
                return a
        return None

    def valid(self, ptr: int, nbytes: int) -> bool:
        """Whether ``[ptr, ptr + nbytes)`` lies inside one live allocation."""
        a = self.containing(ptr)
        return a is not None and ptr + nbytes <= a.end

    def explain(self, ptr: int, nbytes: int = 1) -> tuple[str, Allocation | None]:
        """``(what, allocation)``: how ``[ptr, ptr + nbytes)`` relates to the allocations -- ``inside``
        (valid), ``overrun`` (starts inside, runs past the end), ``freed`` (inside a freed one: use after
        free), ``after`` / ``before`` (the nearest live allocation), or ``unknown``."""
        a = self.containing(ptr)
        if a is not None:
            return ("inside" if ptr + max(nbytes, 0) <= a.end else "overrun"), a
        for f in reversed(self.freed.values()):
            if f.ptr <= ptr < f.ptr + max(f.size, 1):
                return "freed", f
        i = bisect.bisect_right(self._starts, ptr) - 1
        below = self.live[self._starts[i]] if i >= 0 else None
        above = self.live[self._starts[i + 1]] if i + 1 < len(self._starts) else None
        if below is not None and (above is None or ptr - below.end <= above.ptr - ptr):
            return "after", below
        if above is not None:
            return "before", above
        return "unknown", None


def describe(what: str, a: Allocation | None, ptr: int, nbytes: int) -> str:
    """One line about an address, compute-sanitizer style."""
    if a is None:
        return f"Address 0x{ptr:x} is not inside any allocation this process made"
    where = f"the {a.size}-byte {'host buffer' if a.kind != 'device' else 'allocation'} at 0x{a.ptr:x}"
    if what == "inside":
        return f"Address 0x{ptr:x} is {ptr - a.ptr} bytes inside {where}"
    if what == "overrun":
        return (f"Access of {nbytes} bytes at 0x{ptr:x} runs {ptr + nbytes - a.end} bytes past the end of {where}")
    if what == "freed":
        return f"Address 0x{ptr:x} is {ptr - a.ptr} bytes inside {where}, which was freed (use after free)"
    if what == "after":
        return f"Address 0x{ptr:x} is out of bounds: {ptr - a.end} bytes after the end of {where}"
    return f"Address 0x{ptr:x} is out of bounds: {a.ptr - ptr} bytes before {where}"
