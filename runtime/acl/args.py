"""Checks that turn pyACL arguments (ints, host addresses) into checked values; a bad one raises
InvalidParamError, which the calling convention (:mod:`runtime.acl.calls`) returns as 100000."""
from __future__ import annotations

import ctypes

import numpy as np

from devices.arena import is_device_ptr
from devices.errors import InvalidParamError


def as_int(x, what: str) -> int:
    """``x`` as an int (numpy integers too, not bool)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise InvalidParamError(f"{what} must be an integer, got {x!r}")
    return int(x)


def host_ptr(ptr, what: str) -> int:
    """``ptr`` as a host address (not 0, not a device pointer)."""
    p = as_int(ptr, what)
    if p <= 0 or p >= 1 << 64:
        raise InvalidParamError(f"{what} 0x{p:x} is not a valid host address")
    if is_device_ptr(p):
        raise InvalidParamError(f"{what} 0x{p:x} is a device pointer, not host memory")
    return p


def host_view(ptr: int, nbytes: int) -> np.ndarray:
    """A writable uint8 numpy view of ``nbytes`` of host memory at ``ptr`` (no copy)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))
