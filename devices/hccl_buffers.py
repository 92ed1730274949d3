"""Device memory the HCCL engine holds for communicators, and what of this rank's memory its peers may read.

Work buffers up to :data:`CCL_CACHE_MAX` are kept per communicator (HCCL's CCL buffer, two of them used
alternately) instead of allocated per operator: a free bumps the arena generation, which would invalidate
every cached launch plan, captured graph binding and client range check of the device after each small
collective.  Larger ones (and the private copy of an in-place AllToAll's input) are allocated per
operator.  Either way the owner is :data:`HCCL_OWNER` (no tenant can name them) and the bytes count
against the quota of the client that owns the communicator.

A peer's read (the cross-node transport's ``HcclRead``) is served only for ranges this rank exposes: the
buffers of an operator of that communicator while it runs (:meth:`CommBuffers.expose` ..
:meth:`CommBuffers.unexpose`) and the communicator's own work buffers -- never any other memory, and not
after the operator ended.  Nothing here blocks but on the communicators' lock.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .arena import ptr_device, ptr_offset
from .errors import ACL_ERROR_RT_NO_PERMISSION, HCCL_E_PARA, AclError, HcclError, InvalidParamError
from .hccl_comm import Comm

#: owner of the engine's own buffers (no tenant can name them); their bytes count against the comm's owner
HCCL_OWNER = "hccl"
#: work buffers up to this size are the communicator's (see the module doc)
CCL_CACHE_MAX = 4 << 20
_CCL_MIN = 64 << 10


class CommBuffers:
    """Allocations and exposed ranges of one device's communicators.  ``quota(owner)``: the HBM quota of
    ``owner``'s tenant; ``lock``: the communicators' lock (:attr:`devices.hccl_comm.Communicators.lock`)."""

    def __init__(self, arena, quota: Callable[[object], int], lock, device_id: int):
        self.arena = arena
        self._quota = quota
        self._lock = lock
        self._device_id = device_id

    def alloc(self, c: Comm, nbytes: int) -> int:
        """An engine buffer for communicator ``c``: nobody else can name it; its bytes count against the
        quota of the client that owns ``c``."""
        return self.arena.malloc(nbytes, owner=HCCL_OWNER, quota=self._quota(c.owner), charge=c.owner)

    def work_buffer(self, c: Comm, nbytes: int) -> tuple[int, bool]:
        """(pointer, persistent): this operator's work buffer; small ones are the communicator's CCL
        buffers, used alternately: not the one of the last operator completed here (a peer may still read
        it, oneshot has no closing barrier), but the one before, which every peer finished reading before
        it could join that last operator's "ready" round.  Alternated by operators completed, not by
        sequence number: an operator that failed or was skipped had no such round."""
        if nbytes > CCL_CACHE_MAX:
            return self.alloc(c, nbytes), False
        if c.ccl_bytes < nbytes:
            self.free_ccl(c)
            size = _CCL_MIN
            while size < nbytes:
                size *= 2
            c.ccl_epoch = self.arena.epoch
            c.ccl = [self.alloc(c, size) for _ in range(2)]
            c.ccl_bytes = size
        return c.ccl[1 - c.ccl_last], True

    def completed(self, c: Comm, work_ptr: int | None) -> None:
        """An operator that used CCL buffer ``work_ptr`` completed here (the next one uses the other)."""
        if work_ptr in c.ccl:
            c.ccl_last = c.ccl.index(work_ptr)

    def free_ccl(self, c: Comm) -> None:
        bufs, c.ccl, c.ccl_bytes = c.ccl, [], 0
        for ptr in bufs:
            self.arena.free(ptr, epoch=c.ccl_epoch)

    def expose(self, c: Comm, ranges) -> object:
        """Let peers read ``[(ptr, nbytes)]`` of this rank until :meth:`unexpose` (one operator's buffers)."""
        token = object()
        with self._lock:
            c.exposed[token] = [(ptr_offset(p), n) for p, n in ranges if p and n > 0]
        return token

    def unexpose(self, c: Comm, token) -> None:
        with self._lock:
            c.exposed.pop(token, None)

    def read_for_peer(self, c: Comm | None, ptr: int, nbytes: int) -> np.ndarray:
        """A view of ``[ptr, ptr + nbytes)`` for a peer of communicator ``c``: only a range ``c`` exposes
        (ACL_ERROR_RT_NO_PERMISSION otherwise), and only inside live allocations."""
        if c is None:
            raise HcclError("unknown communicator", HCCL_E_PARA)
        if not isinstance(nbytes, int) or nbytes < 0 or ptr_device(ptr) != self._device_id:
            raise InvalidParamError(f"bad peer read of {nbytes!r} B at {ptr!r}"[:200])
        off = ptr_offset(ptr)
        with self._lock:
            ranges = [r for rs in c.exposed.values() for r in rs]
            ranges += [(ptr_offset(p), c.ccl_bytes) for p in c.ccl]
        if not any(s <= off and off + nbytes <= s + n for s, n in ranges):
            raise AclError(f"0x{ptr:x}+{nbytes} is not exposed by a running operator of this communicator",
                           code=ACL_ERROR_RT_NO_PERMISSION)
        return self.arena.view(ptr, nbytes)


__all__ = ["HCCL_OWNER", "CCL_CACHE_MAX", "CommBuffers"]
