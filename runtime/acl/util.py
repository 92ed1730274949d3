"""``acl.util``: host pointers <-> numpy arrays and bytes, and helper threads for ``process_report``.

Host pointers are real host addresses (read and written with :mod:`ctypes`); the objects whose address
``numpy_to_ptr`` / ``bytes_to_ptr`` hand out are kept alive for a while (bounded), but the caller
should hold them too.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from devices.errors import InvalidParamError

from .args import as_int, host_ptr, host_view
from .calls import acl_call
from .state import STATE

_NP_TYPES = (np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.intc, np.uintc, np.int_, np.uint,
             np.longlong, np.ulonglong, np.float16, np.float32, np.float64, np.complex64, np.complex128)
_DTYPE_BY_NPY_NUM: dict[int, np.dtype] = {np.dtype(t).num: np.dtype(t) for t in _NP_TYPES}
_threads: dict[int, threading.Thread] = {}        # start_thread's threads, by id


def numpy_to_ptr(arr):
    """The address of a C-contiguous array's data (the array is also kept alive for a while)."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"numpy_to_ptr needs a numpy array, got {type(arr).__name__}")
    if not arr.flags.c_contiguous:
        raise ValueError("numpy_to_ptr needs a C-contiguous array (use np.ascontiguousarray)")
    ptr = arr.ctypes.data
    STATE.kept.add(ptr, arr, arr.nbytes)
    return ptr


numpy_contiguous_to_ptr = numpy_to_ptr

def ptr_to_numpy(ptr, shape, np_type):
    """A numpy array viewing host memory at ``ptr`` (no copy).  ``np_type`` is a numpy type number
    (as in pyACL: ``np.dtype(x).num``, e.g. 11 = float32) or anything ``np.dtype`` accepts."""
    if isinstance(np_type, (int, np.integer)) and not isinstance(np_type, bool):
        dt = _DTYPE_BY_NPY_NUM.get(int(np_type))
        if dt is None:
            raise ValueError(f"unknown numpy type number {np_type}")
    else:
        dt = np.dtype(np_type)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    p = host_ptr(ptr, "pointer")
    return host_view(p, n * dt.itemsize).view(dt).reshape(shape)


def bytes_to_ptr(data):
    """The address of the buffer of ``data`` (bytes: its internal buffer, as pyACL does, so a
    device-to-host copy into it changes the bytes object; bytearray/writable buffers: their memory).
    The object is kept alive for a while (bounded), but the caller should hold it too."""
    if isinstance(data, bytes):
        ptr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0      # never NULL for bytes
        n = len(data)
    else:
        mv = memoryview(data)
        if mv.readonly or not mv.c_contiguous:
            raise ValueError("bytes_to_ptr needs bytes or a writable contiguous buffer")
        n = mv.nbytes
        ptr = ctypes.addressof((ctypes.c_char * max(n, 1)).from_buffer(mv.cast("B")))
    STATE.kept.add(ptr, data, n)
    return ptr


def ptr_to_bytes(ptr, size):
    """A copy of ``size`` bytes of host memory at ``ptr``."""
    size = int(size)
    if size < 0:
        raise ValueError(f"negative size {size}")
    return ctypes.string_at(host_ptr(ptr, "pointer"), size) if size else b""


@acl_call(outs=(0,), init=False)
def start_thread(func, args):
    """Start a thread running ``func(args)`` -> (thread_id, ret); the id is what subscribe_report and
    stop_thread take."""
    if not callable(func):
        raise InvalidParamError("thread function is not callable")
    t = threading.Thread(target=func, args=(args,), daemon=True, name="acl-util-thread")
    t.start()
    tid = threading.get_ident() if t.ident is None else t.ident       # set once started
    _threads[tid] = t
    return tid


@acl_call(init=False)
def stop_thread(thread_id):
    """Wait for a start_thread thread to return (the caller makes its loop end first)."""
    t = _threads.pop(as_int(thread_id, "thread id"), None)
    if t is None:
        raise InvalidParamError(f"unknown thread id {thread_id!r}")
    if t is not threading.current_thread():
        t.join()


