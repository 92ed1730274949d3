"""Checks that turn pyACL arguments (ints, host addresses) into checked values; a bad one raises
InvalidParamError (107000) or, for host memory, the acl layer's 100000, which the calling convention
(:mod:`runtime.acl._calls`) returns as the call's ``ret``."""
from __future__ import annotations

import numpy as np

from devices.arena import is_device_ptr
from devices.errors import InvalidParamError
from runtime import hostmem


def invalid(detail: str):
    """The acl layer's own parameter error, ACL_ERROR_INVALID_PARAM (100000): what CANN's acl functions
    answer for a null pointer, a zero size, an index out of range or an unknown enum value before the
    runtime (107000) is reached."""
    return hostmem.invalid(detail)


def as_int(x, what: str) -> int:
    """``x`` as an int (numpy integers too, not bool)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise InvalidParamError(f"{what} must be an integer, got {x!r}")
    return int(x)


def host_range(ptr, nbytes: int, what: str) -> hostmem.HostRange:
    """The live host buffer that holds ``[ptr, ptr + nbytes)`` (:mod:`runtime.hostmem`): 100000 for
    NULL, a device pointer, freed memory, an unknown address or a range past the end of its buffer.  Hold
    the returned range while its memory is used."""
    p = as_int(ptr, what)
    if p <= 0 or p >= 1 << 64:
        raise hostmem.invalid(f"{what} 0x{p:x} is not a valid host address")
    if is_device_ptr(p):
        raise hostmem.invalid(f"{what} 0x{p:x} is a device pointer, not host memory")
    return hostmem.lookup(p, nbytes, what)


def host_view(ptr, nbytes: int, what: str) -> np.ndarray:
    """A writable uint8 view of ``nbytes`` of checked host memory at ``ptr`` (no copy; the view keeps the
    buffer alive)."""
    return host_range(ptr, nbytes, what).view(int(ptr), nbytes)
