"""A pyACL-compatible ``acl`` module over the vnpu runtime.

A pyACL runtime program works after changing only its import line (``import acl`` ->
``from runtime import acl``).  The conventions are pyACL's (reference/cann_api.md 1.12):

- snake_case mirror of the C API in the namespaces ``acl`` (init, finalize, error messages),
  ``acl.rt`` (devices, contexts, memory, streams, events, callbacks, kernel launch) and ``acl.util``
  (host pointers <-> numpy/bytes, helper threads);
- outputs first and ``ret`` (an int aclError) last: ``ptr, ret = acl.rt.malloc(size, policy)``; a
  function with no outputs returns only ``ret``.  Errors are *returned* as CANN codes, never raised;
  ``acl.get_recent_err_msg()`` returns (and clears) the text of the calling thread's last error;
- pointers, contexts, streams, events and function handles are Python ints.  Device pointers are the
  arena's tagged integers (:mod:`devices.arena`); host pointers are real host addresses, e.g. from
  :func:`util.numpy_to_ptr`, :func:`util.bytes_to_ptr` or :func:`rt.malloc_host`, read and written
  with :mod:`ctypes`.

Process state (init count, contexts, streams, events, allocations) lives in this module; the current
context is per thread (``threading.local``), as in CANN.  The devices are those of
:func:`runtime.api.get_runtime` at the first ``acl.init()`` (so ``ASCEND_RT_VISIBLE_DEVICES`` applies).

vnpu behaviour choices (where CANN leaves room):

- ``acl.init`` is reference-counted as reference 1.2 documents for current CANN: every call adds 1
  and returns ACL_SUCCESS (classic pyACL returned ACL_ERROR_REPEAT_INITIALIZE=100002 on a second
  call); ``acl.finalize_reference()`` takes 1 away and tears down at 0; ``acl.finalize()`` tears
  everything down whatever the count.  Finalize without a live init returns 100037 (100001 if init
  was never called).
- ``rt.memcpy`` (synchronous) does not synchronize streams (like aclrtMemcpy): synchronize the stream
  that produced the data before a device-to-host copy.
- ``rt.memcpy_async``: host-to-device data is captured when the call is made (pageable-memory
  semantics, also for ``malloc_host`` memory); device-to-device on the stream's device is a stream
  task; device-to-host runs as a blocking host function on a runtime thread once the stream's earlier
  work is done, and the stream's later work waits for it.  Its errors (e.g. an out-of-bounds source)
  are reported by the next ``synchronize_stream``/``synchronize_device`` of that stream.  A copy
  between two devices synchronizes the stream first and then copies through host memory.
- ``rt.event_elapsed_time`` returns wall-clock milliseconds between the two records; with
  ``VNPU_CLOCK=modeled`` in the environment it returns the modeled device clock (the cost model's time).
- ``rt.launch_kernel`` takes vnpu tensor arguments, see its docstring.
"""
from __future__ import annotations

import ctypes
import functools
import itertools
import logging
import os
import sys
import threading
import time
import types
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from devices import errors as _errors
from devices.arena import (ACL_MEM_MALLOC_HUGE1G_ONLY, ACL_MEM_MALLOC_HUGE1G_ONLY_P2P,  # noqa: F401
                           ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEM_MALLOC_HUGE_FIRST_P2P, ACL_MEM_MALLOC_HUGE_ONLY,
                           ACL_MEM_MALLOC_HUGE_ONLY_P2P, ACL_MEM_MALLOC_NORMAL_ONLY,
                           ACL_MEM_MALLOC_NORMAL_ONLY_P2P, is_device_ptr, ptr_device)
from devices.errors import (ACL_ERROR_INTERNAL_ERROR, ACL_ERROR_INVALID_PARAM, ACL_ERROR_REPEAT_FINALIZE,
                            ACL_ERROR_REPEAT_SUBSCRIBE, ACL_ERROR_RT_CONTEXT_NULL, ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                            ACL_ERROR_RT_REPORT_TIMEOUT, ACL_ERROR_RT_STREAM_CONTEXT, ACL_ERROR_RT_STREAM_NO_CB_REG,
                            ACL_ERROR_UNINITIALIZE, ACL_ERROR_UNSUPPORTED_DATA_TYPE, ACL_SUCCESS, AclError,
                            InvalidHandleError, InvalidParamError)
from devices.kernel import ACL_DTYPE, DTYPES, TensorDesc, lookup, register_user_kernel

from runtime import api as _api_mod

log = logging.getLogger("vnpu.acl")

# ---------------------------------------------------------------------------------------------- constants
# every ACL_* error code of the one error table (devices.errors)
globals().update({_k: _v for _k, _v in vars(_errors).items() if _k.startswith("ACL_")})

# aclDataType (reference 1.1); the ones numpy holds come from devices.kernel.ACL_DTYPE
ACL_DT_UNDEFINED = -1
ACL_FLOAT = ACL_DTYPE["float32"]
ACL_FLOAT16 = ACL_DTYPE["float16"]
ACL_INT8 = ACL_DTYPE["int8"]
ACL_INT32 = ACL_DTYPE["int32"]
ACL_UINT8 = ACL_DTYPE["uint8"]
ACL_INT16 = ACL_DTYPE["int16"]
ACL_UINT16 = 7
ACL_UINT32 = 8
ACL_INT64 = ACL_DTYPE["int64"]
ACL_UINT64 = 10
ACL_DOUBLE = ACL_DTYPE["float64"]
ACL_BOOL = ACL_DTYPE["bool"]
ACL_STRING = 13
ACL_COMPLEX64 = 16
ACL_COMPLEX128 = 17
ACL_BF16 = 27

# aclFormat
ACL_FORMAT_UNDEFINED, ACL_FORMAT_NCHW, ACL_FORMAT_NHWC, ACL_FORMAT_ND = -1, 0, 1, 2
ACL_FORMAT_NC1HWC0, ACL_FORMAT_FRACTAL_Z, ACL_FORMAT_FRACTAL_NZ = 3, 4, 29

# aclrtMemMallocPolicy extras (the ACL_MEM_MALLOC_* values come from devices.arena)
ACL_MEM_TYPE_LOW_BAND_WIDTH = 0x0100
ACL_MEM_TYPE_HIGH_BAND_WIDTH = 0x1000
ACL_MEM_ACCESS_USER_SPACE_READONLY = 0x100000

# aclrtMemcpyKind
ACL_MEMCPY_HOST_TO_HOST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_MEMCPY_DEFAULT = 4
ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE = 5
ACL_MEMCPY_INNER_DEVICE_TO_DEVICE = 6
ACL_MEMCPY_INTER_DEVICE_TO_DEVICE = 7

# aclrtMemAttr
ACL_DDR_MEM, ACL_HBM_MEM, ACL_DDR_MEM_HUGE, ACL_DDR_MEM_NORMAL, ACL_HBM_MEM_HUGE, ACL_HBM_MEM_NORMAL = 0, 1, 2, 3, 4, 5
ACL_DDR_MEM_P2P_HUGE, ACL_DDR_MEM_P2P_NORMAL, ACL_HBM_MEM_P2P_HUGE, ACL_HBM_MEM_P2P_NORMAL = 6, 7, 8, 9
ACL_HBM_MEM_HUGE1G, ACL_HBM_MEM_P2P_HUGE1G = 10, 11

# aclrtCallbackBlockType
ACL_CALLBACK_NO_BLOCK = 0
ACL_CALLBACK_BLOCK = 1

# events: flags and the three status enums (aclrtEventRecordedStatus has the REVERSED numbering)
ACL_EVENT_SYNC = 0x1
ACL_EVENT_CAPTURE_STREAM_PROGRESS = 0x2
ACL_EVENT_TIME_LINE = 0x8
ACL_EVENT_DEVICE_USE_ONLY = 0x10
ACL_EVENT_EXTERNAL = 0x20
ACL_EVENT_IPC = 0x40
ACL_EVENT_RECORD_DEFAULT = 0
ACL_EVENT_RECORD_EXTERNAL = 1
ACL_EVENT_STATUS_COMPLETE = 0
ACL_EVENT_STATUS_NOT_READY = 1
ACL_EVENT_STATUS_RESERVED = 2
ACL_EVENT_RECORDED_STATUS_NOT_READY = 0
ACL_EVENT_RECORDED_STATUS_COMPLETE = 1
ACL_EVENT_WAIT_STATUS_COMPLETE = 0
ACL_EVENT_WAIT_STATUS_NOT_READY = 1
ACL_EVENT_WAIT_STATUS_RESERVED = 0xFFFF

# streams
ACL_STREAM_FAST_LAUNCH = 0x1
ACL_STREAM_FAST_SYNC = 0x2
ACL_STREAM_PERSISTENT = 0x4
ACL_STREAM_HUGE = 0x8
ACL_STREAM_CPU_SCHEDULE = 0x10
ACL_STREAM_DEVICE_USE_ONLY = 0x20
ACL_STREAM_STATUS_COMPLETE = 0
ACL_STREAM_STATUS_NOT_READY = 1
ACL_STREAM_STATUS_RESERVED = 0xFFFF
STREAM_PRIORITY_LEAST = 7
STREAM_PRIORITY_GREATEST = 0

# devices
ACL_RT_DEVICE_STATUS_NORMAL = 0
ACL_RT_DEVICE_STATUS_ABNORMAL = 1
ACL_RT_DEVICE_STATUS_END = 0xFFFF
ACL_DEVICE_STATUS_NORMAL = ACL_RT_DEVICE_STATUS_NORMAL
ACL_DEVICE_STATUS_ABNORMAL = ACL_RT_DEVICE_STATUS_ABNORMAL
ACL_DEVICE = 0          # aclrtRunMode
ACL_HOST = 1

ACL_VERSION = (1, 15, 0)

_DTYPE_BY_ACL = {v: k for k, v in ACL_DTYPE.items()}
_NP_TYPES = (np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.intc, np.uintc, np.int_, np.uint,
             np.longlong, np.ulonglong, np.float16, np.float32, np.float64, np.complex64, np.complex128)
_DTYPE_BY_NPY_NUM = {np.dtype(t).num: np.dtype(t) for t in _NP_TYPES}

# ---------------------------------------------------------------------------------------------- state


@dataclass(eq=False)
class _Ctx:
    handle: int
    dev: _api_mod.Device
    index: int                         #: user (visible) device id
    default: bool                      #: the device's default context (from set_device)
    stream: "_StreamRec | None" = None  #: its default stream
    streams: set = field(default_factory=set)   #: handles of every stream created in it
    events: set = field(default_factory=set)
    alive: bool = True


@dataclass(eq=False)
class _StreamRec:
    handle: int
    ctx: _Ctx
    stream: _api_mod.Stream
    priority: int
    flags: int
    default: bool = False
    subscriber: int | None = None      #: thread id from subscribe_report
    async_error: AclError | None = None   #: failure of an async D2H copy, reported at synchronize


@dataclass(eq=False)
class _EventRec:
    handle: int
    ctx: _Ctx
    event: _api_mod.Event
    flags: int


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cv = threading.Condition(self.lock)     # subscriptions changed / finalize
        self.handles = itertools.count(0x1000)
        self.clear()
        self.ever_init = False

    def clear(self) -> None:
        self.init_count = 0
        self.rt: _api_mod.Runtime | None = None
        self.contexts: dict[int, _Ctx] = {}
        self.streams: dict[int, _StreamRec] = {}
        self.events: dict[int, _EventRec] = {}
        self.dev_refs: dict[int, int] = {}
        self.default_ctx: dict[int, _Ctx] = {}
        self.dev_allocs: dict[int, _api_mod.Device] = {}
        self.host_allocs: dict[int, np.ndarray] = {}
        self.funcs: dict[int, str] = {}
        self.func_by_name: dict[str, int] = {}
        self.model_ris: dict[int, Any] = {}          # aclmdlRI handle -> runtime.graph.Graph

    def new_handle(self) -> int:
        return next(self.handles)


_S = _State()
_tls = threading.local()        # .ctx: the calling thread's current _Ctx; .err: its last error text
_threads: dict[int, threading.Thread] = {}

# objects whose address util.numpy_to_ptr / util.bytes_to_ptr handed out, kept alive (bounded LRU)
_KEEP_MAX_OBJECTS = 1024
_KEEP_MAX_BYTES = 256 << 20
_keep: "OrderedDict[int, Any]" = OrderedDict()
_keep_bytes = 0
_keep_lock = threading.Lock()

FINALIZE_SYNC_TIMEOUT_MS = 10_000


# ---------------------------------------------------------------------------------------------- the wrapper
def _api(outs: tuple = (), init: bool = True):
    """Make ``fn`` a pyACL call: AclError (and bad-argument errors) become returned CANN codes and the
    calling thread's error text; ``outs`` are the outputs returned with a failing ``ret``.  ``fn``
    returns ``None`` (no outputs), one value (one output) or a tuple (several outputs)."""
    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                if init and _S.init_count <= 0:
                    raise AclError("acl.init() has not been called", code=ACL_ERROR_UNINITIALIZE)
                res = fn(*args, **kwargs)
            except AclError as e:
                return _failed(wrapper.__qualname__, e.code, str(e), outs)
            except (TypeError, ValueError, OverflowError) as e:
                if e.__traceback__ is not None and e.__traceback__.tb_next is None:
                    raise                 # wrong arguments to the call itself: a Python error, as in pyACL
                return _failed(wrapper.__qualname__, ACL_ERROR_INVALID_PARAM, f"{type(e).__name__}: {e}", outs)
            except Exception as e:  # noqa: BLE001 - an API call never raises
                log.debug("%s failed", wrapper.__qualname__, exc_info=True)
                return _failed(wrapper.__qualname__, ACL_ERROR_INTERNAL_ERROR, f"{type(e).__name__}: {e}", outs)
            if not outs:
                return ACL_SUCCESS
            if len(outs) == 1:
                return res, ACL_SUCCESS
            return (*res, ACL_SUCCESS)
        return wrapper
    return deco


def _failed(name: str, code: int, text: str, outs: tuple):
    _tls.err = f"{name}: {text}"
    log.debug("%s -> %d: %s", name, code, text)
    return (*outs, code) if outs else code


def _namespace(name: str, cls: type) -> types.ModuleType:
    """Turn a class body of functions into a module object ``runtime.acl.<name>`` (``acl.<name>``)."""
    mod = types.ModuleType(f"{__name__}.{name}", cls.__doc__)
    for k, v in vars(cls).items():
        if callable(v) and not k.startswith("__"):
            if not v.__qualname__.startswith("acl."):        # aliases keep their first name
                v.__qualname__ = f"acl.{name}.{k}"
                v.__module__ = mod.__name__
            setattr(mod, k, v)
    sys.modules[mod.__name__] = mod
    return mod


# ---------------------------------------------------------------------------------------------- helpers
def _rt() -> _api_mod.Runtime:
    if _S.rt is None:
        raise AclError("acl.init() has not been called", code=ACL_ERROR_UNINITIALIZE)
    return _S.rt


def _ctx() -> _Ctx:
    c = getattr(_tls, "ctx", None)
    if c is None or not c.alive:
        _tls.ctx = None
        raise AclError("the calling thread has no current context: call acl.rt.set_device or "
                       "acl.rt.set_context first", code=ACL_ERROR_RT_CONTEXT_NULL)
    return c


def _int(x, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise InvalidParamError(f"{what} must be an integer, got {x!r}")
    return int(x)


def _stream(handle) -> _StreamRec:
    """The stream ``handle`` (0/None: the current context's default stream), checked against the
    calling thread's context."""
    c = _ctx()
    if handle is None or handle == 0:
        return c.stream
    rec = _S.streams.get(_int(handle, "stream"))
    if rec is None:
        raise InvalidHandleError(f"unknown or destroyed stream 0x{int(handle):x}")
    if rec.ctx is not c:
        raise AclError(f"stream 0x{rec.handle:x} belongs to context 0x{rec.ctx.handle:x} (device {rec.ctx.index}),"
                       f" not the current context 0x{c.handle:x} (device {c.index})", code=ACL_ERROR_RT_STREAM_CONTEXT)
    return rec


def _event(handle) -> _EventRec:
    rec = _S.events.get(_int(handle, "event")) if handle is not None else None
    if rec is None:
        raise InvalidHandleError(f"unknown or destroyed event {handle!r}")
    return rec


def _context(handle) -> _Ctx:
    c = _S.contexts.get(_int(handle, "context")) if handle is not None else None
    if c is None or not c.alive:
        raise InvalidHandleError(f"unknown or destroyed context {handle!r}")
    return c


def _new_stream(c: _Ctx, priority: int, flags: int, default: bool = False) -> _StreamRec:
    s = c.dev.stream(priority)
    with _S.lock:
        rec = _StreamRec(_S.new_handle(), c, s, priority, flags, default)
        _S.streams[rec.handle] = rec
        c.streams.add(rec.handle)
    return rec


def _new_context(dev_index: int, default: bool) -> _Ctx:
    dev = _rt().device(dev_index)          # InvalidDeviceError (107001) for a bad id
    with _S.lock:
        c = _Ctx(_S.new_handle(), dev, dev_index, default)
        _S.contexts[c.handle] = c
    c.stream = _new_stream(c, 0, 0, default=True)
    return c


def _release_context(c: _Ctx, timeout_ms: float = -1) -> None:
    """Wait for and destroy every stream and event of a context (and forget it)."""
    with _S.lock:
        c.alive = False
        _S.contexts.pop(c.handle, None)
        if _S.default_ctx.get(c.index) is c:
            del _S.default_ctx[c.index]
        srecs = [_S.streams.pop(h) for h in list(c.streams) if h in _S.streams]
        erecs = [_S.events.pop(h) for h in list(c.events) if h in _S.events]
        c.streams.clear()
        c.events.clear()
        _S.cv.notify_all()
    for rec in srecs:
        try:
            rec.stream.synchronize(timeout_ms)
        except AclError as e:
            if e.code == _errors.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT:
                log.warning("stream 0x%x still busy after %s ms: left undestroyed", rec.handle, timeout_ms)
                continue
        try:
            rec.stream.destroy()
        except AclError:
            pass
    for rec in erecs:
        try:
            rec.event.destroy()
        except AclError:
            pass


def _device_of_ptr(ptr: int) -> _api_mod.Device:
    phys = ptr_device(ptr)
    rt = _rt()
    try:
        index = rt.physical.index(phys)
    except ValueError:
        raise InvalidParamError(f"device pointer 0x{ptr:x} belongs to physical device {phys}, which is not "
                                f"visible to this process") from None
    return rt.device(index)


def _host_ptr(ptr, what: str) -> int:
    p = _int(ptr, what)
    if p <= 0 or p >= 1 << 64:
        raise InvalidParamError(f"{what} 0x{p:x} is not a valid host address")
    if is_device_ptr(p):
        raise InvalidParamError(f"{what} 0x{p:x} is a device pointer, not host memory")
    return p


def _host_view(ptr: int, nbytes: int) -> np.ndarray:
    """A writable uint8 numpy view of ``nbytes`` of host memory at ``ptr`` (no copy)."""
    return np.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=np.uint8)


def _d2h(dev: _api_mod.Device, src: int, dst: int, count: int) -> None:
    out = _host_view(dst, count)
    res = dev.handle.memcpy_d2h(src, count, out=out)
    if res is not None and res is not out:
        np.copyto(out, res.view(np.uint8).ravel() if isinstance(res, np.ndarray) else np.frombuffer(res, np.uint8))


def _direction(kind: int, dst: int, src: int) -> str:
    """'h2h' | 'h2d' | 'd2h' | 'd2d' for ``kind`` and the pointers (107000 when they disagree)."""
    kind = _int(kind, "memcpy kind")
    d_dev, s_dev = is_device_ptr(dst), is_device_ptr(src)
    actual = ("d" if s_dev else "h") + "2" + ("d" if d_dev else "h")
    want = {ACL_MEMCPY_HOST_TO_HOST: "h2h", ACL_MEMCPY_HOST_TO_DEVICE: "h2d", ACL_MEMCPY_DEVICE_TO_HOST: "d2h",
            ACL_MEMCPY_DEVICE_TO_DEVICE: "d2d", ACL_MEMCPY_DEFAULT: actual, ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE: "h2d",
            ACL_MEMCPY_INNER_DEVICE_TO_DEVICE: "d2d", ACL_MEMCPY_INTER_DEVICE_TO_DEVICE: "d2d"}.get(kind)
    if want is None:
        raise InvalidParamError(f"unknown memcpy kind {kind}")
    if want != actual:
        raise InvalidParamError(f"memcpy kind {kind} ({want}) does not match the pointers: src 0x{src:x} is "
                                f"{'device' if s_dev else 'host'} memory, dst 0x{dst:x} is "
                                f"{'device' if d_dev else 'host'} memory")
    return want


def _check_counts(dest_max, count) -> tuple[int, int]:
    dest_max, count = _int(dest_max, "dest_max"), _int(count, "count")
    if count < 0 or dest_max < 0:
        raise InvalidParamError(f"negative size (dest_max={dest_max}, count={count})")
    if count > dest_max:
        raise InvalidParamError(f"count {count} exceeds dest_max {dest_max}")
    return dest_max, count


def _raise_async_error(recs) -> None:
    for rec in recs:
        err, rec.async_error = rec.async_error, None
        if err is not None:
            raise _errors.error_for_code(err.code, err.detail)


def _dtype_name(x) -> str:
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        name = _DTYPE_BY_ACL.get(int(x))
        if name is None:
            raise AclError(f"aclDataType {int(x)} is not supported by vnpu kernels",
                           code=ACL_ERROR_UNSUPPORTED_DATA_TYPE)
        return name
    name = np.dtype(x).name
    if name not in DTYPES:
        raise AclError(f"unsupported dtype {name!r}", code=ACL_ERROR_UNSUPPORTED_DATA_TYPE)
    return name


def _tensor_arg(a) -> TensorDesc:
    if isinstance(a, TensorDesc):
        return a
    try:
        ptr, shape, dtype = a
    except (TypeError, ValueError):
        raise InvalidParamError(f"kernel argument must be (dev_ptr, shape, acl_dtype), got {a!r}") from None
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    return TensorDesc(_int(ptr, "kernel argument pointer"), tuple(_int(d, "dimension") for d in shape),
                      _dtype_name(dtype))


def _thread_ids() -> set[int]:
    return {threading.get_ident(), threading.get_native_id()}


def _keep_alive(addr: int, obj: Any, nbytes: int) -> None:
    global _keep_bytes
    with _keep_lock:
        old = _keep.pop(addr, None)
        if old is not None:
            _keep_bytes -= old[1]
        _keep[addr] = (obj, nbytes)
        _keep_bytes += nbytes
        while len(_keep) > 1 and (len(_keep) > _KEEP_MAX_OBJECTS or _keep_bytes > _KEEP_MAX_BYTES):
            _, (_, n) = _keep.popitem(last=False)
            _keep_bytes -= n


# ---------------------------------------------------------------------------------------------- acl.*
@_api(init=False)
def init(config_path: str | None = None) -> None:
    """aclInit.  Reference-counted (reference 1.2, current CANN): each call adds 1 and succeeds;
    ``finalize_reference`` takes 1 away, ``finalize`` tears down whatever the count.  ``config_path``
    (optional, may be "") must name a readable JSON file; its settings (dump, profiling) are ignored."""
    if config_path:
        import json
        try:
            with open(config_path, encoding="utf-8") as f:
                text = f.read()
            if text.strip():
                json.loads(text)
        except (OSError, ValueError) as e:
            raise AclError(f"bad acl config file {config_path!r}: {e}", code=ACL_ERROR_INVALID_PARAM) from None
    with _S.lock:
        if _S.init_count == 0:
            _S.rt = _api_mod.get_runtime()
        _S.init_count += 1
        _S.ever_init = True


def _teardown() -> None:
    with _S.lock:
        ctxs = list(_S.contexts.values())
        allocs = list(_S.dev_allocs.items())
        _S.clear()
        _S.cv.notify_all()
    for c in ctxs:
        _release_context(c, FINALIZE_SYNC_TIMEOUT_MS)
    for ptr, dev in allocs:
        try:
            dev.free(ptr)
        except AclError:
            pass
    with _keep_lock:
        global _keep_bytes
        _keep.clear()
        _keep_bytes = 0


@_api(init=False)
def finalize() -> None:
    """aclFinalize: release every context, stream, event, function handle and allocation made through
    this module, whatever the init count."""
    if _S.init_count <= 0:
        raise AclError("acl is not initialized" + (" (already finalized)" if _S.ever_init else ""),
                       code=ACL_ERROR_REPEAT_FINALIZE if _S.ever_init else ACL_ERROR_UNINITIALIZE)
    _teardown()


@_api(outs=(0,), init=False)
def finalize_reference() -> int:
    """aclFinalizeReference -> (remaining init count, ret); tears down when it reaches 0."""
    with _S.lock:
        if _S.init_count <= 0:
            raise AclError("acl is not initialized",
                           code=ACL_ERROR_REPEAT_FINALIZE if _S.ever_init else ACL_ERROR_UNINITIALIZE)
        _S.init_count -= 1
        left = _S.init_count
    if left == 0:
        _teardown()
    return left


def get_recent_err_msg() -> str:
    """The calling thread's last error text ("" when none); reading it clears it."""
    msg = getattr(_tls, "err", None) or ""
    _tls.err = None
    return msg


def get_soc_name() -> str | None:
    """aclrtGetSocName: the chip name of device 0 (e.g. "Ascend910B3"); None before init."""
    if _S.rt is None or _S.rt.device_count() == 0:
        _tls.err = "acl.get_soc_name: " + ("acl.init() has not been called" if _S.rt is None else "no device")
        return None
    try:
        return _S.rt.device(0).info().chip
    except AclError as e:
        _tls.err = f"acl.get_soc_name: {e}"
        return None


# ---------------------------------------------------------------------------------------------- acl.rt
class _Rt:
    """acl.rt: devices, contexts, memory, streams, events, callbacks and kernel launch."""

    # ---------------------------------------------------------------- version / devices
    @_api(outs=(0, 0, 0), init=False)
    def get_version():
        """-> (major, minor, patch, ret)"""
        return ACL_VERSION

    @_api(outs=(0,))
    def get_device_count():
        return _rt().device_count()

    @_api()
    def set_device(device_id):
        """Bind device ``device_id`` to the calling thread (its default context, shared by every thread
        of the process that sets the device) and add 1 to the device's reference count."""
        device_id = _int(device_id, "device id")
        _rt().device(device_id)                       # 107001 for a bad id
        with _S.lock:
            c = _S.default_ctx.get(device_id)
            if c is None:
                c = _S.default_ctx[device_id] = _new_context(device_id, default=True)
            _S.dev_refs[device_id] = _S.dev_refs.get(device_id, 0) + 1
        _tls.ctx = c

    @_api()
    def reset_device(device_id):
        """Take 1 from the device's reference count; at 0 wait for the default context's streams, then
        destroy them, its events and the context.  Resetting a device whose count is already 0 returns
        ACL_ERROR_RT_CONTEXT_NULL."""
        _reset(device_id, force=False)

    @_api()
    def reset_device_force(device_id):
        """Release the device's default context whatever its reference count."""
        _reset(device_id, force=True)

    @_api(outs=(-1,))
    def get_device():
        return _ctx().index

    @_api(outs=(0,))
    def get_run_mode():
        return ACL_HOST

    @_api(outs=(ACL_RT_DEVICE_STATUS_ABNORMAL,))
    def query_device_status(device_id):
        dev = _rt().device(_int(device_id, "device id"))
        try:
            level, _reasons = dev.handle.health()
        except AclError:
            return ACL_RT_DEVICE_STATUS_ABNORMAL
        if getattr(dev.handle, "closed", False):
            return ACL_RT_DEVICE_STATUS_ABNORMAL
        return ACL_RT_DEVICE_STATUS_NORMAL if level in ("OK", "Warning") else ACL_RT_DEVICE_STATUS_ABNORMAL

    @_api()
    def synchronize_device():
        """Wait for every stream of the current device; returns the first task error."""
        _sync_device(-1)

    @_api()
    def synchronize_device_with_timeout(timeout_ms):
        """ACL_ERROR_RT_STREAM_SYNC_TIMEOUT (507046) on timeout."""
        _sync_device(_int(timeout_ms, "timeout"))

    @_api(outs=(0, 0))
    def device_get_stream_priority_range():
        """-> (least priority 7, greatest priority 0, ret): a smaller number is a higher priority."""
        return STREAM_PRIORITY_LEAST, STREAM_PRIORITY_GREATEST

    # ---------------------------------------------------------------- contexts
    @_api(outs=(0,))
    def create_context(device_id):
        """A new explicit context on ``device_id`` (with its own default stream); it becomes the calling
        thread's current context."""
        c = _new_context(_int(device_id, "device id"), default=False)
        _tls.ctx = c
        return c.handle

    @_api()
    def destroy_context(context):
        c = _context(context)
        if c.default:
            raise InvalidParamError("the default context of a device is released by reset_device, not "
                                    "destroy_context")
        _release_context(c)
        if getattr(_tls, "ctx", None) is c:
            _tls.ctx = None

    @_api()
    def set_context(context):
        _tls.ctx = _context(context)

    @_api(outs=(0,))
    def get_context():
        return _ctx().handle

    @_api(outs=(0,))
    def ctx_get_current_default_stream():
        return _ctx().stream.handle

    # ---------------------------------------------------------------- memory
    @_api(outs=(0,))
    def malloc(size, policy=ACL_MEM_MALLOC_HUGE_FIRST):
        """Device memory on the current device -> (dev_ptr, ret)."""
        return _malloc(size, policy)

    @_api(outs=(0,))
    def malloc_cached(size, policy=ACL_MEM_MALLOC_HUGE_FIRST):
        return _malloc(size, policy)

    @_api(outs=(0,))
    def malloc_align32(size, policy=ACL_MEM_MALLOC_HUGE_FIRST):
        return _malloc(size, policy)

    @_api()
    def free(dev_ptr):
        """Free device memory from malloc*.  No implicit synchronization: make sure the streams that use
        it are done."""
        _ctx()
        ptr = _int(dev_ptr, "device pointer")
        dev = _device_of_ptr(ptr)
        dev.free(ptr)
        with _S.lock:
            _S.dev_allocs.pop(ptr, None)

    @_api(outs=(0,))
    def malloc_host(size):
        """Host memory (64 B aligned, uninitialised) -> (host_ptr, ret); kept alive until free_host or
        finalize."""
        size = _int(size, "size")
        if size <= 0:
            raise InvalidParamError(f"malloc_host size must be positive, got {size}")
        raw = np.empty(size + 64, dtype=np.uint8)
        start = (-raw.ctypes.data) % 64
        buf = raw[start:start + size]
        with _S.lock:
            _S.host_allocs[buf.ctypes.data] = buf
        return buf.ctypes.data

    @_api()
    def free_host(host_ptr):
        with _S.lock:
            if _S.host_allocs.pop(_int(host_ptr, "host pointer"), None) is None:
                raise InvalidParamError(f"0x{int(host_ptr):x} was not allocated by malloc_host")

    @_api()
    def memcpy(dst, dest_max, src, count, kind):
        """Synchronous copy of ``count`` bytes; ``kind`` is an ACL_MEMCPY_* value (DEFAULT: from the
        addresses).  Does not wait for streams."""
        dst, src = _int(dst, "dst"), _int(src, "src")
        _dest_max, count = _check_counts(dest_max, count)
        way = _direction(kind, dst, src)
        _ctx()
        if count == 0:
            return
        if way == "h2h":
            ctypes.memmove(_host_ptr(dst, "dst"), _host_ptr(src, "src"), count)
        elif way == "h2d":
            dev = _device_of_ptr(dst)
            dev.queue.flush()
            dev.handle.memcpy_h2d(dst, _host_view(_host_ptr(src, "src"), count))
        elif way == "d2h":
            dev = _device_of_ptr(src)
            dev.queue.flush()
            _d2h(dev, src, _host_ptr(dst, "dst"), count)
        else:
            ddev, sdev = _device_of_ptr(dst), _device_of_ptr(src)
            ddev.queue.flush()
            if sdev is ddev:
                ddev.handle.memcpy_d2d(dst, src, count)
            else:
                sdev.queue.flush()
                ddev.handle.memcpy_h2d(dst, sdev.handle.memcpy_d2h(src, count))

    @_api()
    def memcpy_async(dst, dest_max, src, count, kind, stream):
        """Stream-ordered copy (see the module docstring for how each direction is ordered)."""
        dst, src = _int(dst, "dst"), _int(src, "src")
        _dest_max, count = _check_counts(dest_max, count)
        way = _direction(kind, dst, src)
        rec = _stream(stream)
        s = rec.stream
        if way == "h2h":
            raise AclError("asynchronous host-to-host copies are not supported in host (EP) mode",
                           code=ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
        if count == 0:
            return
        if way == "h2d":
            data = ctypes.string_at(_host_ptr(src, "src"), count)
            if _device_of_ptr(dst) is s.device:
                s.write(dst, data)
            else:                                    # another device's memory: in order, then direct
                s.synchronize()
                _device_of_ptr(dst).handle.memcpy_h2d(dst, data)
        elif way == "d2d":
            ddev, sdev = _device_of_ptr(dst), _device_of_ptr(src)
            if ddev is s.device and sdev is s.device:
                s.copy(dst, src, count)
            else:
                s.synchronize()
                sdev.queue.flush()
                ddev.queue.flush()
                ddev.handle.memcpy_h2d(dst, sdev.handle.memcpy_d2h(src, count))
        else:
            sdev = _device_of_ptr(src)
            hdst = _host_ptr(dst, "dst")

            def copy_now() -> None:
                try:
                    _d2h(sdev, src, hdst, count)
                except AclError as e:
                    rec.async_error = rec.async_error or e
                except Exception as e:  # noqa: BLE001 - runs on a runtime thread: keep it alive
                    rec.async_error = rec.async_error or AclError(f"async D2H copy failed: {e}")

            s.launch_host_func(copy_now, blocking=True)

    @_api()
    def memset(dev_ptr, max_count, value, count):
        """Set ``count`` bytes to ``value & 0xFF`` (device or host memory, from the address)."""
        ptr = _int(dev_ptr, "pointer")
        _max, count = _check_counts(max_count, count)
        value = _int(value, "value")
        _ctx()
        if count == 0:
            return
        if is_device_ptr(ptr):
            dev = _device_of_ptr(ptr)
            dev.queue.flush()
            dev.handle.memset(ptr, value, count)
        else:
            ctypes.memset(_host_ptr(ptr, "pointer"), value & 0xFF, count)

    @_api()
    def memset_async(dev_ptr, max_count, value, count, stream):
        ptr = _int(dev_ptr, "pointer")
        _max, count = _check_counts(max_count, count)
        value = _int(value, "value")
        rec = _stream(stream)
        if not is_device_ptr(ptr):
            raise AclError("memset_async needs device memory", code=ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
        if count == 0:
            return
        dev = _device_of_ptr(ptr)
        if dev is rec.stream.device:
            rec.stream.memset(ptr, value, count)
        else:
            rec.stream.synchronize()
            dev.handle.memset(ptr, value, count)

    @_api(outs=(0, 0))
    def get_mem_info(attr):
        """-> (free, total, ret) bytes of the current device (every attribute answers for its HBM)."""
        attr = _int(attr, "memory attribute")
        if not ACL_DDR_MEM <= attr <= ACL_HBM_MEM_P2P_HUGE1G:
            raise InvalidParamError(f"unknown aclrtMemAttr {attr}")
        return _ctx().dev.mem_info()

    # ---------------------------------------------------------------- streams
    @_api(outs=(0,))
    def create_stream():
        return _new_stream(_ctx(), 0, 0).handle

    @_api(outs=(0,))
    def create_stream_with_config(priority, flag):
        """Priority 0 (highest) .. 7 (lowest); larger values are clamped to 7.  Flags are recorded."""
        priority, flag = _int(priority, "priority"), _int(flag, "flag")
        if priority < 0 or flag < 0:
            raise InvalidParamError(f"bad stream priority {priority} or flag {flag}")
        return _new_stream(_ctx(), min(priority, STREAM_PRIORITY_LEAST), flag).handle

    @_api()
    def destroy_stream(stream):
        """Waits for the stream's work, then destroys it.  The default stream cannot be destroyed."""
        if stream is None or stream == 0:
            raise InvalidParamError("the default stream cannot be destroyed")
        rec = _stream(stream)
        if rec.default:
            raise InvalidParamError("the default stream cannot be destroyed")
        with _S.lock:
            _S.streams.pop(rec.handle, None)
            rec.ctx.streams.discard(rec.handle)
            _S.cv.notify_all()
        rec.stream.destroy()

    destroy_stream_force = destroy_stream

    @_api()
    def synchronize_stream(stream):
        rec = _stream(stream)
        rec.stream.synchronize()
        _raise_async_error([rec])

    @_api()
    def synchronize_stream_with_timeout(stream, timeout_ms):
        """-1 waits forever, 0 polls; ACL_ERROR_RT_STREAM_SYNC_TIMEOUT (507046) on timeout."""
        rec = _stream(stream)
        rec.stream.synchronize(_int(timeout_ms, "timeout"))
        _raise_async_error([rec])

    @_api(outs=(ACL_STREAM_STATUS_RESERVED,))
    def stream_query(stream):
        return ACL_STREAM_STATUS_COMPLETE if _stream(stream).stream.query() else ACL_STREAM_STATUS_NOT_READY

    @_api()
    def stream_wait_event(stream, event):
        _stream(stream).stream.wait(_event(event).event)

    @_api(outs=(0,))
    def get_stream_priority(stream):
        return _stream(stream).priority

    stream_get_priority = get_stream_priority

    @_api(outs=(0,))
    def stream_get_flags(stream):
        return _stream(stream).flags

    # ---------------------------------------------------------------- events
    @_api(outs=(0,))
    def create_event():
        return _create_event(0)

    @_api(outs=(0,))
    def create_event_with_flag(flag):
        return _create_event(_int(flag, "flag"))

    @_api(outs=(0,))
    def create_event_ex_with_flag(flag):
        return _create_event(_int(flag, "flag"))

    @_api()
    def destroy_event(event):
        rec = _event(event)
        with _S.lock:
            _S.events.pop(rec.handle, None)
            rec.ctx.events.discard(rec.handle)
        rec.event.destroy()

    @_api()
    def record_event(event, stream):
        """Capture the work submitted to ``stream`` so far (same device as the event, else 107003)."""
        rec = _event(event)
        rec.event.record(_stream(stream).stream)

    @_api()
    def reset_event(event, stream):
        """Checked, then a stream-ordered no-op: a vnpu event needs no reset before it is recorded again
        (each record replaces the captured work)."""
        _event(event)
        _stream(stream)

    @_api(outs=(ACL_EVENT_RECORDED_STATUS_NOT_READY,))
    def query_event_status(event):
        """-> (aclrtEventRecordedStatus, ret): NOT_READY=0, COMPLETE=1 (COMPLETE before the first record)."""
        return ACL_EVENT_RECORDED_STATUS_COMPLETE if _event(event).event.query() else \
            ACL_EVENT_RECORDED_STATUS_NOT_READY

    @_api(outs=(ACL_EVENT_STATUS_RESERVED,))
    def query_event(event):
        """Deprecated aclrtQueryEvent -> (aclrtEventStatus, ret): COMPLETE=0, NOT_READY=1."""
        return ACL_EVENT_STATUS_COMPLETE if _event(event).event.query() else ACL_EVENT_STATUS_NOT_READY

    @_api()
    def synchronize_event(event):
        _event(event).event.synchronize()

    @_api()
    def synchronize_event_with_timeout(event, timeout_ms):
        """ACL_ERROR_RT_EVENT_SYNC_TIMEOUT (507047) on timeout."""
        _event(event).event.synchronize(_int(timeout_ms, "timeout"))

    @_api(outs=(0.0,))
    def event_elapsed_time(start, end):
        """-> (ms, ret) between two completed records: wall clock, or the modeled device clock when
        ``VNPU_CLOCK=modeled``.  107006 when an event was never recorded, 107007 when ``end`` completed
        before ``start``, 507006 when one has not completed yet."""
        s, e = _event(start), _event(end)
        if s.event.device is not e.event.device:
            raise InvalidParamError("start and end events belong to different devices")
        s.event.device.queue.flush()
        el = s.event.elapsed(e.event)
        return float(el.modeled_ms if os.environ.get("VNPU_CLOCK", "wall") == "modeled" else el.wall_ms)

    # ---------------------------------------------------------------- host callbacks
    @_api()
    def subscribe_report(thread_id, stream):
        """Make thread ``thread_id`` (``threading.get_ident()``/``get_native_id()`` of that thread, or a
        ``util.start_thread`` id) the one that runs ``stream``'s callbacks in ``process_report``."""
        tid = _int(thread_id, "thread id")
        rec = _stream(stream)
        with _S.lock:
            if rec.subscriber is not None:
                raise AclError(f"stream 0x{rec.handle:x} is already subscribed by thread {rec.subscriber}",
                               code=ACL_ERROR_REPEAT_SUBSCRIBE)
            rec.subscriber = tid
            _S.cv.notify_all()

    @_api()
    def unsubscribe_report(thread_id, stream):
        tid = _int(thread_id, "thread id")
        rec = _stream(stream)
        with _S.lock:
            if rec.subscriber is None:
                raise AclError(f"stream 0x{rec.handle:x} has no subscribed thread", code=ACL_ERROR_RT_STREAM_NO_CB_REG)
            if rec.subscriber != tid:
                raise InvalidParamError(f"stream 0x{rec.handle:x} is subscribed by thread {rec.subscriber}, "
                                        f"not {tid}")
            rec.subscriber = None
            _S.cv.notify_all()

    @_api()
    def launch_callback(fn, user_data, block_type, stream):
        """Run ``fn(user_data)`` in the subscribed thread's ``process_report`` once the work submitted to
        ``stream`` so far is done; with ACL_CALLBACK_BLOCK the stream's later work waits for it."""
        if not callable(fn):
            raise InvalidParamError("callback is not callable")
        block_type = _int(block_type, "block type")
        if block_type not in (ACL_CALLBACK_NO_BLOCK, ACL_CALLBACK_BLOCK):
            raise InvalidParamError(f"unknown aclrtCallbackBlockType {block_type}")
        rec = _stream(stream)
        if rec.subscriber is None:
            raise AclError(f"stream 0x{rec.handle:x} has no thread subscribed (subscribe_report)",
                           code=ACL_ERROR_RT_STREAM_NO_CB_REG)
        _api_mod.callbacks_for(rec.ctx.dev).launch(rec.stream, fn, user_data, block_type == ACL_CALLBACK_BLOCK)

    @_api()
    def process_report(timeout_ms):
        """Run one ready callback of the streams the calling thread subscribed to, waiting up to
        ``timeout_ms`` (-1: forever); ACL_ERROR_RT_REPORT_TIMEOUT (507012) when none came."""
        _process_report(_int(timeout_ms, "timeout"))

    @_api()
    def launch_host_func(stream, fn, args):
        """Run ``fn(args)`` on a runtime thread once ``stream``'s earlier work is done; later work waits."""
        if not callable(fn):
            raise InvalidParamError("host function is not callable")

        def call() -> None:
            try:
                fn(args)
            except Exception:  # noqa: BLE001 - must not kill the runtime's host-function thread
                log.exception("host function %r failed", fn)

        _stream(stream).stream.launch_host_func(call, blocking=True)

    # ---------------------------------------------------------------- kernels
    @_api(outs=(0,))
    def binary_get_function(bin_handle, kernel_name):
        """-> (func_handle, ret) for a built-in or registered kernel (``bin_handle`` may be 0/None: vnpu
        kernels live in one process-wide registry).  ACL_ERROR_RT_KERNEL_LOOKUP (507027) when unknown."""
        if not isinstance(kernel_name, str) or not kernel_name:
            raise InvalidParamError(f"kernel name must be a non-empty string, got {kernel_name!r}")
        lookup(kernel_name)
        with _S.lock:
            h = _S.func_by_name.get(kernel_name)
            if h is None:
                h = _S.func_by_name[kernel_name] = _S.new_handle()
                _S.funcs[h] = kernel_name
        return h

    @_api()
    def launch_kernel(func_handle, num_blocks, args, stream, num_outputs=1, attrs=None):
        """Queue kernel ``func_handle`` as ``num_blocks`` blocks on ``stream`` (returns at once).

        vnpu argument format (real aclrtLaunchKernel takes a packed argument blob): ``args`` is a
        sequence of tensors, inputs first and then the ``num_outputs`` outputs; each tensor is a
        ``(dev_ptr, shape_tuple, acl_dtype)`` triple (``acl_dtype`` an ACL_FLOAT-style int, or a numpy
        dtype) or a :class:`devices.kernel.TensorDesc`.  ``attrs`` (dict) are the kernel's keyword
        attributes.  ``num_blocks`` 0 lets the device choose.  Shape/dtype errors of built-in kernels
        return here; faults while running are reported by the next synchronize."""
        name = _S.funcs.get(_int(func_handle, "function handle"))
        if name is None:
            raise InvalidHandleError(f"unknown function handle {func_handle!r} (use binary_get_function)")
        tensors = [_tensor_arg(a) for a in args]
        num_outputs = _int(num_outputs, "num_outputs")
        if not 0 <= num_outputs <= len(tensors):
            raise InvalidParamError(f"num_outputs {num_outputs} with {len(tensors)} tensor arguments")
        split = len(tensors) - num_outputs
        _stream(stream).stream.launch(name, tensors[:split], tensors[split:], attrs or {},
                                      _int(num_blocks, "num_blocks"))

    @_api(init=False)
    def register_kernel(name, fn, replace=False):
        """vnpu extension: register ``fn(ctx, *tensors, **attrs)`` as kernel ``name`` (per-block SPMD,
        bounds-checked tensors; see devices.kernel.register_user_kernel)."""
        register_user_kernel(name, fn, replace=bool(replace))


def _reset(device_id, force: bool) -> None:
    device_id = _int(device_id, "device id")
    _rt().device(device_id)
    with _S.lock:
        n = _S.dev_refs.get(device_id, 0)
        c = _S.default_ctx.get(device_id)
        if n <= 0 or c is None:
            raise AclError(f"device {device_id} is not set (reference count is 0)", code=ACL_ERROR_RT_CONTEXT_NULL)
        n = 0 if force else n - 1
        if n:
            _S.dev_refs[device_id] = n
            return
        _S.dev_refs.pop(device_id, None)
    _release_context(c)
    if getattr(_tls, "ctx", None) is c:
        _tls.ctx = None


def _sync_device(timeout_ms: int) -> None:
    c = _ctx()
    c.dev.synchronize(timeout_ms)
    with _S.lock:
        recs = [r for r in _S.streams.values() if r.ctx.dev is c.dev]
    _raise_async_error(recs)


def _malloc(size, policy) -> int:
    c = _ctx()
    ptr = c.dev.malloc(_int(size, "size"), _int(policy, "policy"))
    with _S.lock:
        _S.dev_allocs[ptr] = c.dev
    return ptr


def _create_event(flags: int) -> int:
    c = _ctx()
    ev = c.dev.event(flags)
    with _S.lock:
        rec = _EventRec(_S.new_handle(), c, ev, flags)
        _S.events[rec.handle] = rec
        c.events.add(rec.handle)
    return rec.handle


def _subscribed(me: set[int]) -> dict:
    groups: dict = {}
    for rec in _S.streams.values():
        if rec.subscriber in me:
            groups.setdefault(rec.ctx.dev, set()).add(rec.stream.sid)
    return groups


def _process_report(timeout_ms: int) -> None:
    deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
    me = _thread_ids()

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    while True:
        with _S.cv:
            groups = _subscribed(me)
            if not groups:
                rem = left()
                if rem == 0.0 or _S.init_count <= 0:
                    raise AclError(f"no callback within {timeout_ms} ms (thread subscribed to no stream)",
                                   code=ACL_ERROR_RT_REPORT_TIMEOUT)
                _S.cv.wait(rem)
                continue
        if len(groups) == 1:
            (dev, sids), = groups.items()
            if _api_mod.callbacks_for(dev).process(sids, left()):
                return
        else:                                    # streams on several devices: take turns in short slices
            for dev, sids in groups.items():
                rem = left()
                if _api_mod.callbacks_for(dev).process(sids, 0.005 if rem is None else min(rem, 0.005)):
                    return
            if left() != 0.0:
                continue
        raise AclError(f"no callback within {timeout_ms} ms", code=ACL_ERROR_RT_REPORT_TIMEOUT)


# ---------------------------------------------------------------------------------------------- acl.util
class _Util:
    """acl.util: host pointers <-> numpy arrays and bytes; helper threads for process_report."""

    def numpy_to_ptr(arr):
        """The address of a C-contiguous array's data (the array is also kept alive for a while)."""
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"numpy_to_ptr needs a numpy array, got {type(arr).__name__}")
        if not arr.flags.c_contiguous:
            raise ValueError("numpy_to_ptr needs a C-contiguous array (use np.ascontiguousarray)")
        ptr = arr.ctypes.data
        _keep_alive(ptr, arr, arr.nbytes)
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
        p = _host_ptr(ptr, "pointer")
        return np.frombuffer((ctypes.c_uint8 * (n * dt.itemsize)).from_address(p), dtype=dt, count=n).reshape(shape)

    def bytes_to_ptr(data):
        """The address of the buffer of ``data`` (bytes: its internal buffer, as pyACL does, so a
        device-to-host copy into it changes the bytes object; bytearray/writable buffers: their memory).
        The object is kept alive for a while (bounded), but the caller should hold it too."""
        if isinstance(data, bytes):
            ptr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
            n = len(data)
        else:
            mv = memoryview(data)
            if mv.readonly or not mv.c_contiguous:
                raise ValueError("bytes_to_ptr needs bytes or a writable contiguous buffer")
            n = mv.nbytes
            ptr = ctypes.addressof((ctypes.c_char * max(n, 1)).from_buffer(mv.cast("B")))
        _keep_alive(ptr, data, n)
        return ptr

    def ptr_to_bytes(ptr, size):
        """A copy of ``size`` bytes of host memory at ``ptr``."""
        size = int(size)
        if size < 0:
            raise ValueError(f"negative size {size}")
        return ctypes.string_at(_host_ptr(ptr, "pointer"), size) if size else b""

    @_api(outs=(0,), init=False)
    def start_thread(func, args):
        """Start a thread running ``func(args)`` -> (thread_id, ret); the id is what subscribe_report and
        stop_thread take."""
        if not callable(func):
            raise InvalidParamError("thread function is not callable")
        t = threading.Thread(target=func, args=(args,), daemon=True, name="acl-util-thread")
        t.start()
        _threads[t.ident] = t
        return t.ident

    @_api(init=False)
    def stop_thread(thread_id):
        """Wait for a start_thread thread to return (the caller makes its loop end first)."""
        t = _threads.pop(_int(thread_id, "thread id"), None)
        if t is None:
            raise InvalidParamError(f"unknown thread id {thread_id!r}")
        if t is not threading.current_thread():
            t.join()


class _Mdl:
    """acl.mdl: model run instances captured from a stream (aclmdlRI*, "aclgraph"; see runtime.graph)."""

    @_api()
    def ri_capture_begin(stream, mode=0):
        """aclmdlRICaptureBegin: later tasks on ``stream`` are recorded, not run."""
        _stream(stream).stream.begin_capture(_int(mode, "mode"))

    @_api(outs=(0, 0))
    def ri_capture_get_info(stream):
        """aclmdlRICaptureGetInfo -> (status, model_ri, ret): status 0 none / 1 active / 2 invalidated;
        model_ri is 0 until the capture ends."""
        return _stream(stream).stream.capture_status(), 0

    @_api(outs=(0,))
    def ri_capture_end(stream):
        """aclmdlRICaptureEnd -> (model_ri, ret)."""
        g = _stream(stream).stream.end_capture()
        h = _S.new_handle()
        _S.model_ris[h] = g
        return h

    @_api()
    def ri_execute_async(model_ri, stream):
        """aclmdlRIExecuteAsync: queue one replay on ``stream`` (returns at once)."""
        _model_ri(model_ri).execute_async(_stream(stream).stream)

    @_api()
    def ri_execute(model_ri, timeout):
        """aclmdlRIExecute: replay and wait (``timeout`` ms, -1 forever)."""
        _model_ri(model_ri).execute(_int(timeout, "timeout"))

    @_api()
    def ri_debug_print(model_ri):
        """aclmdlRIDebugPrint: log the model's tasks (also returned by runtime.graph.Graph.info)."""
        log.info("model RI 0x%x: %s", int(model_ri), _model_ri(model_ri).info())

    @_api()
    def ri_destroy(model_ri):
        """aclmdlRIDestroy (replays already queued still run)."""
        g = _model_ri(model_ri)
        _S.model_ris.pop(int(model_ri), None)
        g.destroy()


def _model_ri(handle):
    g = _S.model_ris.get(_int(handle, "model_ri"))
    if g is None:
        raise InvalidParamError(f"unknown or destroyed model run instance {handle!r}")
    return g


for _f in (init, finalize, finalize_reference, get_recent_err_msg, get_soc_name):
    _f.__qualname__ = f"acl.{_f.__name__}"
rt = _namespace("rt", _Rt)
util = _namespace("util", _Util)
mdl = _namespace("mdl", _Mdl)
del _Rt, _Util, _Mdl, _f
