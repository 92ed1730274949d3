"""The implementation of ``acl.rt`` (:mod:`runtime.acl.rt` lists the API and says what it does)."""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from devices import errors
from devices.arena import is_device_ptr, ptr_device
from devices.errors import AclError, InvalidHandleError, InvalidParamError
from devices.kernel import ACL_DTYPE, DTYPES, TensorDesc, lookup, register_user_kernel
from runtime import api, hostbuf, hostmem, sanitize

from ._args import as_int, host_range, host_view, invalid
from ._calls import acl_call
from ._constants import (ACL_CALLBACK_BLOCK, ACL_CALLBACK_NO_BLOCK, ACL_DDR_MEM, ACL_ERROR_REPEAT_SUBSCRIBE,
                         ACL_ERROR_RT_CONTEXT_NULL, ACL_ERROR_RT_DRV_INTERNAL_ERROR, ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                         ACL_ERROR_RT_REPORT_TIMEOUT, ACL_ERROR_RT_STREAM_NO_CB_REG, ACL_ERROR_UNSUPPORTED_DATA_TYPE,
                         ACL_EVENT_RECORDED_STATUS_COMPLETE, ACL_EVENT_RECORDED_STATUS_NOT_READY,
                         ACL_EVENT_STATUS_COMPLETE, ACL_EVENT_STATUS_NOT_READY, ACL_EVENT_STATUS_RESERVED,
                         ACL_HBM_MEM_P2P_HUGE1G,
                         ACL_HOST, ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEMCPY_DEFAULT, ACL_MEMCPY_DEVICE_TO_DEVICE,
                         ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE, ACL_MEMCPY_HOST_TO_DEVICE,
                         ACL_MEMCPY_HOST_TO_HOST,
                         ACL_RT_DEVICE_STATUS_ABNORMAL, ACL_RT_DEVICE_STATUS_NORMAL, ACL_STREAM_STATUS_COMPLETE,
                         ACL_STREAM_STATUS_NOT_READY, ACL_STREAM_STATUS_RESERVED, STREAM_PRIORITY_GREATEST,
                         STREAM_PRIORITY_LEAST)
from ._state import (STATE, EventRecord, context_record, current_context, event_record, forget_current_context,
                     new_context, new_stream, release_context, runtime, set_current_context, stream_record)

ACL_NAMESPACE = "acl.rt"           # these are acl.rt.* calls (runtime.acl._calls names them so)

log = logging.getLogger("vnpu.acl")

_DTYPE_BY_ACL = {v: k for k, v in ACL_DTYPE.items()}


# ---------------------------------------------------------------- devices
@acl_call(outs=(0,))
def get_device_count():
    return runtime().device_count()


@acl_call()
def set_device(device_id):
    """Bind device ``device_id`` to the calling thread (its default context, shared by every thread
    of the process that sets the device) and add 1 to the device's reference count."""
    device_id = as_int(device_id, "device id")
    runtime().device(device_id)                       # 107001 for a bad id
    with STATE.lock:
        c = STATE.default_ctx.get(device_id)
        if c is None:
            c = STATE.default_ctx[device_id] = new_context(device_id, default=True)
        STATE.dev_refs[device_id] = STATE.dev_refs.get(device_id, 0) + 1
    set_current_context(c)


@acl_call()
def reset_device(device_id):
    """Take 1 from the device's reference count; at 0 wait for the default context's streams, then
    destroy them, its events and the context.  Resetting a device whose count is already 0 returns
    ACL_ERROR_RT_CONTEXT_NULL."""
    _reset(device_id, force=False)


@acl_call()
def reset_device_force(device_id):
    """Release the device's default context whatever its reference count."""
    _reset(device_id, force=True)


@acl_call(outs=(-1,))
def get_device():
    return current_context().index


@acl_call(outs=(0,), init=False)
def get_run_mode():
    """-> (ACL_HOST, ret): a vnpu program always runs on the host, devices are reached through the
    runtime (EP mode).  Works before ``acl.init()``, as aclrtGetRunMode does (it checks no init), so
    programs that read it at import time take the host path (H2D / D2H copies)."""
    return ACL_HOST


@acl_call(outs=(ACL_RT_DEVICE_STATUS_ABNORMAL,))
def query_device_status(device_id):
    dev = runtime().device(as_int(device_id, "device id"))
    if dev.is_lost:
        return ACL_RT_DEVICE_STATUS_ABNORMAL
    try:
        level, _reasons = dev.health()
    except AclError:
        return ACL_RT_DEVICE_STATUS_ABNORMAL
    return ACL_RT_DEVICE_STATUS_NORMAL if level in ("OK", "Warning") else ACL_RT_DEVICE_STATUS_ABNORMAL


@acl_call()
def synchronize_device():
    """Wait for every stream of the current device; returns the first task error."""
    _sync_device(-1)


@acl_call()
def synchronize_device_with_timeout(timeout_ms):
    """ACL_ERROR_RT_STREAM_SYNC_TIMEOUT (507046) on timeout."""
    _sync_device(as_int(timeout_ms, "timeout"))


@acl_call(outs=(0, 0))
def device_get_stream_priority_range():
    """-> (least priority 7, greatest priority 0, ret): a smaller number is a higher priority."""
    return STREAM_PRIORITY_LEAST, STREAM_PRIORITY_GREATEST


# ---------------------------------------------------------------- contexts
@acl_call(outs=(0,))
def create_context(device_id):
    """A new explicit context on ``device_id`` (with its own default stream); it becomes the calling
    thread's current context."""
    c = new_context(as_int(device_id, "device id"), default=False)
    set_current_context(c)
    return c.handle


@acl_call()
def destroy_context(context):
    c = context_record(context)
    if c.default:
        raise InvalidParamError("the default context of a device is released by reset_device, not "
                                "destroy_context")
    release_context(c)
    forget_current_context(c)


@acl_call()
def set_context(context):
    set_current_context(context_record(context))


@acl_call(outs=(0,))
def get_context():
    return current_context().handle


@acl_call(outs=(0,))
def ctx_get_current_default_stream():
    return stream_record(0).handle


# ---------------------------------------------------------------- memory
@acl_call(outs=(0,))
def malloc(size, policy=ACL_MEM_MALLOC_HUGE_FIRST):
    """Device memory on the current device -> (dev_ptr, ret)."""
    return _malloc(size, policy)


@acl_call(outs=(0,))
def malloc_cached(size, policy=ACL_MEM_MALLOC_HUGE_FIRST):
    return _malloc(size, policy)


@acl_call(outs=(0,))
def malloc_align32(size, policy=ACL_MEM_MALLOC_HUGE_FIRST):
    return _malloc(size, policy)


@acl_call()
def free(dev_ptr):
    """Free device memory from malloc*.  No implicit synchronization: make sure the streams that use
    it are done.  NULL is the acl layer's 100000 (aclrtFree's null check), anything else it cannot free
    the runtime's 107000 / 207002."""
    ptr = _non_null(dev_ptr, "device pointer")
    current_context()
    dev = _device_of_ptr(ptr)
    dev.free(ptr)
    with STATE.lock:
        STATE.dev_allocs.pop(ptr, None)


@acl_call(outs=(0,))
def malloc_host(size):
    """Host memory (64 B aligned, uninitialised) -> (host_ptr, ret); valid until free_host or finalize
    (registered in the host-pointer table, :mod:`runtime.hostmem`: acl calls check every host range
    against it)."""
    size = _positive(size, "malloc_host size")
    raw = np.empty(size + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    buf = raw[start:start + size]
    hostmem.register(buf.ctypes.data, size, buf, "malloc_host")
    hostbuf.register(buf)                                # page-locked for the runtime (modeled pinned copies)
    san = sanitize.current()
    if san is not None:                                  # host buffer history (memcheck, leakcheck)
        san.host_allocated(buf.ctypes.data, size)
    return buf.ctypes.data


@acl_call()
def free_host(host_ptr):
    """Free malloc_host memory: NULL is the acl layer's 100000; a pointer that is not the start of a
    live malloc_host buffer (freed already, or never allocated) is ACL_ERROR_RT_PARAM_INVALID (107000),
    as the runtime's free answers.  An asynchronous copy queued before keeps the buffer until it ran."""
    ptr = _non_null(host_ptr, "host pointer")
    try:
        hostmem.release(ptr, kind="malloc_host")
    except AclError as e:
        raise InvalidParamError(e.detail) from None
    san = sanitize.current()
    if san is not None:
        san.host_freed(ptr)


@acl_call()
def memcpy(dst, dest_max, src, count, kind):
    """Synchronous copy of ``count`` bytes.  As in current CANN, ``kind`` only has to be a valid
    ACL_MEMCPY_* value (else 100000): the direction comes from the addresses (device memory, or a host
    buffer acl knows), so a kind that contradicts them is corrected, not refused.  Does not wait for
    streams.  ``count`` 0 copies nothing and succeeds; NULL is 100000; ``count`` > ``dest_max`` 107000."""
    cp = _copy_args(dst, dest_max, src, count, kind)
    if cp is None:
        return
    current_context()
    way, n = cp.way, cp.count
    if way == "h2h":
        cp.dst_view()[:] = cp.src_view()                       # memmove: overlap is fine
    elif way == "h2d":
        _device_of_ptr(cp.dst).memcpy_h2d(cp.dst, cp.src_view())
    elif way == "d2h":
        _device_of_ptr(cp.src).memcpy_d2h(cp.src, n, out=cp.dst_view())
    else:
        ddev, sdev = _device_of_ptr(cp.dst), _device_of_ptr(cp.src)
        if sdev is ddev:
            ddev.memcpy_d2d(cp.dst, cp.src, n)
        else:                                    # between devices: through host memory
            ddev.memcpy_h2d(cp.dst, sdev.memcpy_d2h(cp.src, n))


@acl_call()
def memcpy_async(dst, dest_max, src, count, kind, stream):
    """Stream-ordered copy (see the package docstring for how each direction is ordered).  The kind is
    checked against the addresses as current CANN's runtime does (MemcpyKindAutoCorrect): between
    device memory and malloc_host (pinned) memory it is corrected to the real direction; with pageable
    host memory (``util.numpy_to_ptr`` / ``bytes_to_ptr``) it must be one the pair allows (e.g. H2D or
    D2D into device memory, D2H or D2D out of it; DEFAULT always), else 107000 and nothing is queued.
    A host-to-host copy is 207000 (not supported asynchronously in EP mode)."""
    cp = _copy_args(dst, dest_max, src, count, kind)
    if cp is None:
        return
    rec = stream_record(stream)
    s = rec.stream
    _check_async_kind(cp)
    way, dst, src, n = cp.way, cp.dst, cp.src, cp.count
    if way == "h2h":
        raise AclError("asynchronous host-to-host copies are not supported in host (EP) mode",
                       code=ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
    if way == "h2d":
        data = cp.src_view().tobytes()
        if _device_of_ptr(dst) is s.device:
            s.write(dst, data)
        else:                                    # another device's memory: in order, then direct
            s.synchronize()
            _device_of_ptr(dst).memcpy_h2d(dst, data)
    elif way == "d2d":
        ddev, sdev = _device_of_ptr(dst), _device_of_ptr(src)
        if ddev is s.device and sdev is s.device:
            s.copy(dst, src, n)
        else:
            s.synchronize()
            ddev.memcpy_h2d(dst, sdev.memcpy_d2h(src, n))
    else:
        sdev = _device_of_ptr(src)
        hdst = cp.host("dst")                   # checked now; held (kept mapped) until the copy ran

        def copy_now() -> None:
            try:
                sdev.memcpy_d2h(src, n, out=hdst.view(dst, n))
            except AclError as e:
                rec.async_error = rec.async_error or e
            except Exception as e:  # noqa: BLE001 - runs on a runtime thread: keep it alive
                rec.async_error = rec.async_error or AclError(f"async D2H copy failed: {e}")

        s.launch_host_func(copy_now, blocking=True)


@acl_call()
def memset(dev_ptr, max_count, value, count):
    """Set ``count`` bytes to ``value & 0xFF``, device or host memory: the address decides (host memory
    must lie in a live host buffer acl knows, e.g. from malloc_host).  ``count`` 0 sets nothing and
    succeeds; NULL is 100000; ``count`` > ``max_count`` 107000; ``malloc_host`` memory already freed
    507899, as CANN answers on the A2 (910B) driver: aclrtMemset -> drvMemsetD8 on a freed SVM host
    address fails in the driver's page-reference check (EINVAL -> DRV_ERROR_PARA_ERROR), a driver code
    the runtime does not map (RT_ERROR_DRV_ERR -> ACL_ERROR_RT_DRV_INTERNAL_ERROR); any other host
    address acl does not know is 100000 (on hardware a wild write).  Does not wait for streams."""
    ptr, count, value = _memset_args(dev_ptr, max_count, value, count)
    if not count:
        return
    current_context()
    if is_device_ptr(ptr):
        _device_of_ptr(ptr).memset(ptr, value, count)
        return
    try:
        view = host_view(ptr, count, "pointer")
    except AclError as e:
        was = hostmem.freed(ptr)
        if was is None or was[2] != "malloc_host":
            raise
        raise AclError(e.detail, code=ACL_ERROR_RT_DRV_INTERNAL_ERROR) from None
    view[:] = value & 0xFF


@acl_call()
def memset_async(dev_ptr, max_count, value, count, stream):
    """Stream-ordered memset of device memory.  Host memory (the address decides, as for ``memset``) is
    set at once, not queued: CANN puts no host-memory memset on a stream (aclrtMemsetD32Async: "the
    initialization of host memory is not issued to the stream"), so synchronize the stream first when
    it still writes that memory."""
    ptr, count, value = _memset_args(dev_ptr, max_count, value, count)
    if not count:
        return
    rec = stream_record(stream)
    if not is_device_ptr(ptr):
        host_view(ptr, count, "pointer")[:] = value & 0xFF
        return
    dev = _device_of_ptr(ptr)
    if dev is rec.stream.device:
        rec.stream.memset(ptr, value, count)
    else:
        rec.stream.synchronize()
        dev.memset(ptr, value, count)


@acl_call(outs=(0, 0))
def get_mem_info(attr):
    """-> (free, total, ret) bytes of the current device (every attribute answers for its HBM)."""
    attr = as_int(attr, "memory attribute")
    if not ACL_DDR_MEM <= attr <= ACL_HBM_MEM_P2P_HUGE1G:
        raise InvalidParamError(f"unknown aclrtMemAttr {attr}")
    return current_context().dev.mem_info()


# ---------------------------------------------------------------- streams
@acl_call(outs=(0,))
def create_stream():
    return new_stream(current_context(), 0, 0).handle


@acl_call(outs=(0,))
def create_stream_with_config(priority, flag):
    """Priority 0 (highest) .. 7 (lowest); larger values are clamped to 7.  Flags are recorded."""
    priority, flag = as_int(priority, "priority"), as_int(flag, "flag")
    if priority < 0 or flag < 0:
        raise InvalidParamError(f"bad stream priority {priority} or flag {flag}")
    return new_stream(current_context(), min(priority, STREAM_PRIORITY_LEAST), flag).handle


@acl_call()
def destroy_stream(stream):
    """Waits for the stream's work, then destroys it.  The default stream cannot be destroyed."""
    if stream is None or stream == 0:
        raise InvalidParamError("the default stream cannot be destroyed")
    rec = stream_record(stream)
    if rec.default:
        raise InvalidParamError("the default stream cannot be destroyed")
    with STATE.lock:
        STATE.streams.pop(rec.handle, None)
        rec.ctx.streams.discard(rec.handle)
        STATE.cv.notify_all()
    rec.stream.destroy()


destroy_stream_force = destroy_stream

@acl_call()
def synchronize_stream(stream):
    rec = stream_record(stream)
    rec.stream.synchronize()
    _raise_async_error([rec])


@acl_call()
def synchronize_stream_with_timeout(stream, timeout_ms):
    """-1 waits up to the runtime's sync timeout (VNPU_SYNC_TIMEOUT_S, default the HCCL exec timeout + 60 s:
    no host wait is unbounded), 0 polls; ACL_ERROR_RT_STREAM_SYNC_TIMEOUT (507046) on timeout."""
    rec = stream_record(stream)
    rec.stream.synchronize(as_int(timeout_ms, "timeout"))
    _raise_async_error([rec])


@acl_call(outs=(ACL_STREAM_STATUS_RESERVED,))
def stream_query(stream):
    return ACL_STREAM_STATUS_COMPLETE if stream_record(stream).stream.query() else ACL_STREAM_STATUS_NOT_READY


@acl_call()
def stream_wait_event(stream, event):
    stream_record(stream).stream.wait(event_record(event).event)


@acl_call(outs=(0,))
def get_stream_priority(stream):
    return stream_record(stream).priority


stream_get_priority = get_stream_priority

@acl_call(outs=(0,))
def stream_get_flags(stream):
    return stream_record(stream).flags


# ---------------------------------------------------------------- events
@acl_call(outs=(0,))
def create_event():
    return _create_event(0)


@acl_call(outs=(0,))
def create_event_with_flag(flag):
    return _create_event(as_int(flag, "flag"))


@acl_call(outs=(0,))
def create_event_ex_with_flag(flag):
    return _create_event(as_int(flag, "flag"))


@acl_call()
def destroy_event(event):
    rec = event_record(event)
    with STATE.lock:
        STATE.events.pop(rec.handle, None)
        rec.ctx.events.discard(rec.handle)
    rec.event.destroy()


@acl_call()
def record_event(event, stream):
    """Capture the work submitted to ``stream`` so far (same device as the event, else 107003)."""
    rec = event_record(event)
    rec.event.record(stream_record(stream).stream)


@acl_call()
def reset_event(event, stream):
    """Checked, then a stream-ordered no-op: a vnpu event needs no reset before it is recorded again
    (each record replaces the captured work)."""
    event_record(event)
    stream_record(stream)


@acl_call(outs=(ACL_EVENT_RECORDED_STATUS_NOT_READY,))
def query_event_status(event):
    """-> (aclrtEventRecordedStatus, ret): NOT_READY=0, COMPLETE=1 (COMPLETE before the first record)."""
    return ACL_EVENT_RECORDED_STATUS_COMPLETE if event_record(event).event.query() else \
        ACL_EVENT_RECORDED_STATUS_NOT_READY


@acl_call(outs=(ACL_EVENT_STATUS_RESERVED,))
def query_event(event):
    """Deprecated aclrtQueryEvent -> (aclrtEventStatus, ret): COMPLETE=0, NOT_READY=1."""
    return ACL_EVENT_STATUS_COMPLETE if event_record(event).event.query() else ACL_EVENT_STATUS_NOT_READY


@acl_call()
def synchronize_event(event):
    event_record(event).event.synchronize()


@acl_call()
def synchronize_event_with_timeout(event, timeout_ms):
    """ACL_ERROR_RT_EVENT_SYNC_TIMEOUT (507047) on timeout."""
    event_record(event).event.synchronize(as_int(timeout_ms, "timeout"))


@acl_call(outs=(0.0,))
def event_elapsed_time(start, end):
    """-> (ms, ret) between two completed records: wall clock, or the modeled device clock when
    ``VNPU_CLOCK=modeled``.  107006 when an event was never recorded, 107007 when ``end`` completed
    before ``start``, 507006 when one has not completed yet."""
    s, e = event_record(start), event_record(end)
    if s.event.device is not e.event.device:
        raise InvalidParamError("start and end events belong to different devices")
    el = s.event.elapsed(e.event)
    return float(el.modeled_ms if os.environ.get("VNPU_CLOCK", "wall") == "modeled" else el.wall_ms)


# ---------------------------------------------------------------- host callbacks
@acl_call()
def subscribe_report(thread_id, stream):
    """Make thread ``thread_id`` (``threading.get_ident()``/``get_native_id()`` of that thread, or a
    ``util.start_thread`` id) the one that runs ``stream``'s callbacks in ``process_report``."""
    tid = as_int(thread_id, "thread id")
    rec = stream_record(stream)
    with STATE.lock:
        if rec.subscriber is not None:
            raise AclError(f"stream 0x{rec.handle:x} is already subscribed by thread {rec.subscriber}",
                           code=ACL_ERROR_REPEAT_SUBSCRIBE)
        rec.subscriber = tid
        STATE.cv.notify_all()


@acl_call()
def unsubscribe_report(thread_id, stream):
    tid = as_int(thread_id, "thread id")
    rec = stream_record(stream)
    with STATE.lock:
        if rec.subscriber is None:
            raise AclError(f"stream 0x{rec.handle:x} has no subscribed thread", code=ACL_ERROR_RT_STREAM_NO_CB_REG)
        if rec.subscriber != tid:
            raise InvalidParamError(f"stream 0x{rec.handle:x} is subscribed by thread {rec.subscriber}, "
                                    f"not {tid}")
        rec.subscriber = None
        STATE.cv.notify_all()


@acl_call()
def launch_callback(fn, user_data, block_type, stream):
    """Run ``fn(user_data)`` in the subscribed thread's ``process_report`` once the work submitted to
    ``stream`` so far is done; with ACL_CALLBACK_BLOCK the stream's later work waits for it."""
    if not callable(fn):
        raise InvalidParamError("callback is not callable")
    block_type = as_int(block_type, "block type")
    if block_type not in (ACL_CALLBACK_NO_BLOCK, ACL_CALLBACK_BLOCK):
        raise InvalidParamError(f"unknown aclrtCallbackBlockType {block_type}")
    rec = stream_record(stream)
    if rec.subscriber is None:
        raise AclError(f"stream 0x{rec.handle:x} has no thread subscribed (subscribe_report)",
                       code=ACL_ERROR_RT_STREAM_NO_CB_REG)
    api.callbacks_for(rec.ctx.dev).launch(rec.stream, fn, user_data, block_type == ACL_CALLBACK_BLOCK)


@acl_call()
def process_report(timeout_ms):
    """Run one ready callback of the streams the calling thread subscribed to, waiting up to
    ``timeout_ms`` (-1: forever); ACL_ERROR_RT_REPORT_TIMEOUT (507012) when none came."""
    _process_report(as_int(timeout_ms, "timeout"))


@acl_call()
def launch_host_func(stream, fn, args):
    """Run ``fn(args)`` on a runtime thread once ``stream``'s earlier work is done; later work waits."""
    if not callable(fn):
        raise InvalidParamError("host function is not callable")

    def call() -> None:
        try:
            fn(args)
        except Exception:  # noqa: BLE001 - must not kill the runtime's host-function thread
            log.exception("host function %r failed", fn)

    stream_record(stream).stream.launch_host_func(call, blocking=True)


# ---------------------------------------------------------------- kernels
@acl_call(outs=(0,))
def binary_get_function(bin_handle, kernel_name):
    """-> (func_handle, ret) for a built-in or registered kernel (``bin_handle`` may be 0/None: vnpu
    kernels live in one process-wide registry).  ACL_ERROR_RT_KERNEL_LOOKUP (507027) when unknown."""
    if not isinstance(kernel_name, str) or not kernel_name:
        raise InvalidParamError(f"kernel name must be a non-empty string, got {kernel_name!r}")
    lookup(kernel_name)
    with STATE.lock:
        h = STATE.func_by_name.get(kernel_name)
        if h is None:
            h = STATE.func_by_name[kernel_name] = STATE.new_handle()
            STATE.funcs[h] = kernel_name
    return h


@acl_call()
def launch_kernel(func_handle, num_blocks, args, stream, num_outputs=1, attrs=None):
    """Queue kernel ``func_handle`` as ``num_blocks`` blocks on ``stream`` (returns at once).

    vnpu argument format (real aclrtLaunchKernel takes a packed argument blob): ``args`` is a
    sequence of tensors, inputs first and then the ``num_outputs`` outputs; each tensor is a
    ``(dev_ptr, shape_tuple, acl_dtype)`` triple (``acl_dtype`` an ACL_FLOAT-style int, or a numpy
    dtype) or a :class:`devices.kernel.TensorDesc`.  ``attrs`` (dict) are the kernel's keyword
    attributes.  ``num_blocks`` 0 lets the device choose.  Shape/dtype errors of built-in kernels
    return here; faults while running are reported by the next synchronize."""
    name = STATE.funcs.get(as_int(func_handle, "function handle"))
    if name is None:
        raise InvalidHandleError(f"unknown function handle {func_handle!r} (use binary_get_function)")
    tensors = [_tensor_arg(a) for a in args]
    num_outputs = as_int(num_outputs, "num_outputs")
    if not 0 <= num_outputs <= len(tensors):
        raise InvalidParamError(f"num_outputs {num_outputs} with {len(tensors)} tensor arguments")
    split = len(tensors) - num_outputs
    stream_record(stream).stream.launch(name, tensors[:split], tensors[split:], attrs or {},
                                  as_int(num_blocks, "num_blocks"))


@acl_call(init=False)
def register_kernel(name, fn, replace=False):
    """vnpu extension: register ``fn(ctx, *tensors, **attrs)`` as kernel ``name`` (per-block SPMD,
    bounds-checked tensors; see devices.kernel.register_user_kernel)."""
    register_user_kernel(name, fn, replace=bool(replace))


# ---------------------------------------------------------------------------------------------- helpers
def _device_of_ptr(ptr: int) -> api.Device:
    phys = ptr_device(ptr)
    rt = runtime()
    try:
        index = rt.physical.index(phys)
    except ValueError:
        raise InvalidParamError(f"device pointer 0x{ptr:x} belongs to physical device {phys}, which is not "
                                f"visible to this process") from None
    return rt.device(index)


#: the copy kinds aclrtMemcpy / aclrtMemcpyAsync take, by name (MemcpyKindTranslate in CANN's memory.cpp:
#: the device-to-device variants INNER / INTER are not among them); any other value is the acl layer's
#: 100000
_KINDS = {ACL_MEMCPY_HOST_TO_HOST: "HOST_TO_HOST", ACL_MEMCPY_HOST_TO_DEVICE: "HOST_TO_DEVICE",
          ACL_MEMCPY_DEVICE_TO_HOST: "DEVICE_TO_HOST", ACL_MEMCPY_DEVICE_TO_DEVICE: "DEVICE_TO_DEVICE",
          ACL_MEMCPY_DEFAULT: "DEFAULT", ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE: "HOST_TO_BUF_TO_DEVICE"}

#: memcpy_async with pageable host memory: the kinds each (src, dst) location pair accepts besides
#: DEFAULT (CANN's MemcpyKindReviseMap; "host" is malloc_host memory, for which -- as for device memory
#: -- any kind is corrected to the real direction)
_PAGEABLE_KINDS = {
    ("pageable", "device"): {ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_DEVICE},
    ("device", "pageable"): {ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_DEVICE_TO_DEVICE},
    ("host", "pageable"): {ACL_MEMCPY_HOST_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE},
    ("pageable", "host"): {ACL_MEMCPY_HOST_TO_HOST, ACL_MEMCPY_DEVICE_TO_HOST},
    ("pageable", "pageable"): {ACL_MEMCPY_HOST_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST,
                               ACL_MEMCPY_DEVICE_TO_DEVICE},
}


@dataclass(frozen=True)
class _Copy:
    """A checked copy: addresses, byte count, the kind given, the real direction and the host ranges."""
    dst: int
    src: int
    count: int
    kind: int
    way: str                                   #: "h2h" | "h2d" | "d2h" | "d2d", from the addresses
    dst_range: hostmem.HostRange | None        #: the host buffers (held while the copy needs them)
    src_range: hostmem.HostRange | None

    def host(self, which: str) -> hostmem.HostRange:
        """The host buffer of ``which`` ("dst" / "src"); InvalidParamError for device memory."""
        r = self.dst_range if which == "dst" else self.src_range
        if r is None:
            raise InvalidParamError(f"{which} 0x{self.dst if which == 'dst' else self.src:x} is device memory")
        return r

    def dst_view(self):
        return self.host("dst").view(self.dst, self.count)

    def src_view(self):
        return self.host("src").view(self.src, self.count)

    def location(self, which: str) -> str:
        """"device", "host" (malloc_host: pinned) or "pageable" (any other host buffer acl knows)."""
        r = self.dst_range if which == "dst" else self.src_range
        return "device" if r is None else ("host" if r.kind == "malloc_host" else "pageable")


def _copy_args(dst, dest_max, src, count, kind) -> "_Copy | None":
    """Check a copy's arguments in CANN's order: ``count`` 0 -> nothing to do (None); NULL -> 100000; an
    unknown kind -> 100000 (the acl layer); ``count`` > ``dest_max`` -> 107000 (the runtime); host
    addresses outside a live host buffer -> 100000."""
    dest_max, count = as_int(dest_max, "dest_max"), as_int(count, "count")
    if count == 0:
        return None
    dst, src = _non_null(dst, "dst"), _non_null(src, "src")
    kind = as_int(kind, "memcpy kind")
    if kind not in _KINDS:
        raise invalid(f"unknown memcpy kind {kind} (ACL_MEMCPY_HOST_TO_HOST 0 .. HOST_TO_BUF_TO_DEVICE 5)")
    if count < 0 or dest_max < 0:
        raise InvalidParamError(f"negative size (dest_max={dest_max}, count={count})")
    if count > dest_max:
        raise InvalidParamError(f"count {count} exceeds dest_max {dest_max}")
    d_dev, s_dev = is_device_ptr(dst), is_device_ptr(src)
    way = ("d" if s_dev else "h") + "2" + ("d" if d_dev else "h")
    return _Copy(dst, src, count, kind, way, None if d_dev else host_range(dst, count, "dst"),
                 None if s_dev else host_range(src, count, "src"))


def _check_async_kind(cp: _Copy) -> None:
    """memcpy_async's kind check (see memcpy_async): 107000 for a kind the addresses do not allow."""
    src_loc, dst_loc = cp.location("src"), cp.location("dst")
    if cp.kind == ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE:          # staged H2D: not corrected
        ok = cp.way == "h2d"
    elif cp.kind == ACL_MEMCPY_DEFAULT:
        ok = True
    else:
        allowed = _PAGEABLE_KINDS.get((src_loc, dst_loc))
        ok = allowed is None or cp.kind in allowed           # device / pinned memory: corrected
    if not ok:
        raise InvalidParamError(f"memcpy kind ACL_MEMCPY_{_KINDS[cp.kind]} does not fit the addresses: src "
                                f"0x{cp.src:x} is {src_loc} memory, dst 0x{cp.dst:x} is {dst_loc} memory")


def _memset_args(ptr, max_count, value, count) -> tuple[int, int, int]:
    """(ptr, count, value); count 0 needs nothing else; NULL -> 100000; count > max_count -> 107000."""
    max_count, count, value = as_int(max_count, "max_count"), as_int(count, "count"), as_int(value, "value")
    if count == 0:
        return 0, 0, value
    ptr = _non_null(ptr, "pointer")
    if count < 0 or max_count < 0:
        raise InvalidParamError(f"negative size (max_count={max_count}, count={count})")
    if count > max_count:
        raise InvalidParamError(f"count {count} exceeds max_count {max_count}")
    return ptr, count, value


def _non_null(ptr, what: str) -> int:
    """An address argument; NULL (0 / None) is the acl layer's 100000 (ACL_REQUIRES_NOT_NULL)."""
    p = 0 if ptr is None else as_int(ptr, what)
    if p == 0:
        raise invalid(f"{what} is NULL")
    return p


def _positive(size, what: str) -> int:
    """A size argument; 0 or less is the acl layer's 100000 (ACL_REQUIRES_POSITIVE)."""
    n = as_int(size, what)
    if n <= 0:
        raise invalid(f"{what} must be positive, got {n}")
    return n


def _raise_async_error(recs) -> None:
    for rec in recs:
        err, rec.async_error = rec.async_error, None
        if err is not None:
            raise errors.error_for_code(err.code, err.detail)


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
    return TensorDesc(as_int(ptr, "kernel argument pointer"), tuple(as_int(d, "dimension") for d in shape),
                      _dtype_name(dtype))


def _thread_ids() -> set[int]:
    return {threading.get_ident(), threading.get_native_id()}


def _reset(device_id, force: bool) -> None:
    device_id = as_int(device_id, "device id")
    runtime().device(device_id)
    with STATE.lock:
        n = STATE.dev_refs.get(device_id, 0)
        c = STATE.default_ctx.get(device_id)
        if n <= 0 or c is None:
            raise AclError(f"device {device_id} is not set (reference count is 0)", code=ACL_ERROR_RT_CONTEXT_NULL)
        n = 0 if force else n - 1
        if n:
            STATE.dev_refs[device_id] = n
            return
        STATE.dev_refs.pop(device_id, None)
    release_context(c)
    forget_current_context(c)


def _sync_device(timeout_ms: int) -> None:
    c = current_context()
    c.dev.synchronize(timeout_ms)
    with STATE.lock:
        recs = [r for r in STATE.streams.values() if r.ctx.dev is c.dev]
    _raise_async_error(recs)


def _malloc(size, policy) -> int:
    size = _positive(size, "malloc size")
    c = current_context()
    ptr = c.dev.malloc(size, as_int(policy, "policy"))
    with STATE.lock:
        STATE.dev_allocs[ptr] = c.dev
    return ptr


def _create_event(flags: int) -> int:
    c = current_context()
    ev = c.dev.event(flags)
    with STATE.lock:
        rec = EventRecord(STATE.new_handle(), c, ev, flags)
        STATE.events[rec.handle] = rec
        c.events.add(rec.handle)
    return rec.handle


def _subscribed(me: set[int]) -> dict:
    groups: dict = {}
    for rec in STATE.streams.values():
        if rec.subscriber in me:
            groups.setdefault(rec.ctx.dev, set()).add(rec.stream.sid)
    return groups


def _process_report(timeout_ms: int) -> None:
    deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
    me = _thread_ids()

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    while True:
        with STATE.cv:
            groups = _subscribed(me)
            if not groups:
                rem = left()
                if rem == 0.0 or STATE.init_count <= 0:
                    raise AclError(f"no callback within {timeout_ms} ms (thread subscribed to no stream)",
                                   code=ACL_ERROR_RT_REPORT_TIMEOUT)
                STATE.cv.wait(rem)
                continue
        if len(groups) == 1:
            (dev, sids), = groups.items()
            if api.callbacks_for(dev).process(sids, left()):
                return
        else:                                    # streams on several devices: take turns in short slices
            for dev, sids in groups.items():
                rem = left()
                if api.callbacks_for(dev).process(sids, 0.005 if rem is None else min(rem, 0.005)):
                    return
            if left() != 0.0:
                continue
        raise AclError(f"no callback within {timeout_ms} ms", code=ACL_ERROR_RT_REPORT_TIMEOUT)
