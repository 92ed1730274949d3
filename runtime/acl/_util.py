"""The implementation of ``acl.util`` (:mod:`runtime.acl.util` lists the API and says what it does)."""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from devices.errors import AclError, InvalidParamError
from runtime import hostmem

from ._args import as_int, host_view
from ._calls import acl_call, record_error

ACL_NAMESPACE = "acl.util"           # these are acl.util.* calls (runtime.acl._calls names them so)

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
    if arr.nbytes:
        hostmem.register(ptr, arr.nbytes, arr, "numpy")
    return ptr


def numpy_contiguous_to_ptr(data_in):
    """-> (ptr, data_out), as pyACL's: ``data_out`` is ``data_in`` when it is C-contiguous, else a
    C-contiguous copy of it; ``ptr`` is the address of ``data_out``'s data (hold ``data_out`` while the
    address is used)."""
    if not isinstance(data_in, np.ndarray):
        raise TypeError(f"numpy_contiguous_to_ptr needs a numpy array, got {type(data_in).__name__}")
    data_out = np.ascontiguousarray(data_in)
    return numpy_to_ptr(data_out), data_out


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
    if n < 0 or any(d < 0 for d in shape):
        raise ValueError(f"negative shape {shape}")
    return _checked(lambda: host_view(ptr, n * dt.itemsize, "pointer"), "acl.util.ptr_to_numpy"
                    ).view(dt).reshape(shape)


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
    if n:
        hostmem.register(ptr, n, data, "bytes")
    return ptr


def ptr_to_bytes(ptr, size):
    """A copy of ``size`` bytes of host memory at ``ptr``."""
    size = int(size)
    if size < 0:
        raise ValueError(f"negative size {size}")
    return _checked(lambda: host_view(ptr, size, "pointer"), "acl.util.ptr_to_bytes").tobytes() if size else b""


def _checked(fn, name: str):
    """``fn()``; a host-pointer error is kept for get_recent_err_msg and raised."""
    try:
        return fn()
    except AclError as e:
        record_error(name, str(e))
        raise


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


