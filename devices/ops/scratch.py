"""Per-thread scratch buffers that kernels reuse from launch to launch.

A decode step's kernels run the same shapes over and over; a fresh numpy temporary of a few MiB per
launch costs an allocation and, for the larger ones, page faults on first touch every time.  A kernel
asks :func:`scratch` for a named buffer instead: the calling thread's buffer of that name, grown when a
launch needs more and reused otherwise.  Each AI Core thread has its own (blocks of one launch and
launches of different devices in one process run on different threads), so a buffer is never shared
between two kernels running at once; within one thread a kernel owns its names until it returns, so a
name holds nothing from one launch to the next (every launch writes what it reads).

Buffers above :data:`KEEP_BYTES` are not kept (a prefill over a long context allocates as before); the
kept ones hold at most a few times that per thread.  Nothing here blocks.
"""
from __future__ import annotations

import math
import threading

import numpy as np

#: largest buffer kept between launches (bytes); a larger request gets a fresh array
KEEP_BYTES = 32 << 20

_LOCAL = threading.local()


def scratch(name: str, shape: tuple, dtype) -> np.ndarray:
    """A C-contiguous array of ``shape`` (a tuple of ints) and ``dtype`` whose contents are undefined:
    the calling thread's buffer ``name`` (grown when too small), or a fresh array above
    :data:`KEEP_BYTES`.  Asking again for the shape and dtype of the last call returns the same view."""
    views = getattr(_LOCAL, "views", None)
    if views is None:
        views = _LOCAL.views = {}
        _LOCAL.bufs = {}
    last = views.get(name)
    if last is not None and last.shape == shape and last.dtype == dtype:
        return last
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes > KEEP_BYTES:
        return np.empty(shape, dt)
    buf = _LOCAL.bufs.get(name)
    if buf is None or buf.nbytes < nbytes:
        buf = _LOCAL.bufs[name] = np.empty(max(nbytes, 4096), np.uint8)
    v = views[name] = buf[:nbytes].view(dt).reshape(shape)
    return v
