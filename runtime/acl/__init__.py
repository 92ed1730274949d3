"""A pyACL-compatible ``acl`` module over the vnpu runtime.

A pyACL runtime program works after changing only its import line (``import acl`` ->
``from runtime import acl``).  The conventions are pyACL's (reference/cann_api.md 1.12):

- snake_case mirror of the C API in the namespaces ``acl`` (init, finalize, error messages, the
  ``ACL_*`` constants, data buffers, tensor descriptions, ``data_type_size``, ``app_log``), ``acl.rt``
  (devices, contexts, memory, streams, events, callbacks, kernel launch), ``acl.util`` (host pointers
  <-> numpy/bytes, helper threads) and ``acl.mdl`` (offline models: load, describe, datasets, execute,
  dynamic batch; and model run instances) and ``acl.media`` (DVPP: JPEG / PNG decode, JPEG encode, the
  VPC, H.264 / H.265 VDEC and VENC);
- outputs first and ``ret`` (an int aclError) last: ``ptr, ret = acl.rt.malloc(size, policy)``; a
  function with no outputs returns only ``ret``; a C function that returns a value rather than an
  aclError returns just that value (``acl.mdl.get_num_inputs(desc)``, ``acl.create_data_buffer(p, n)``),
  its C failure value (0, -1, "") on failure.  Errors are *returned* as CANN codes, never raised;
  ``acl.get_recent_err_msg()`` returns (and clears) the text of the calling thread's last error
  (one template for all of it: :func:`runtime.acl._calls.acl_call`);
- pointers, contexts, streams, events and function handles are Python ints.  Device pointers are the
  arena's tagged integers (:mod:`devices.arena`); host pointers are real host addresses, e.g. from
  :func:`util.numpy_to_ptr`, :func:`util.bytes_to_ptr` or :func:`rt.malloc_host`, read and written
  with :mod:`ctypes`.

The package, one public module per namespace: this ``__init__`` (``acl.*``), :mod:`.rt`, :mod:`.util`,
:mod:`.mdl`, :mod:`.prof` and :mod:`.media`.  Each holds its API and nothing else -- ``dir(acl.rt)`` lists exactly the
functions of ``acl.rt`` (tests/reference/pyacl_api.txt; the ``ACL_*`` constants are ``acl``'s), as a
program that enumerates pyACL's modules expects -- and takes it from a private module that implements it
(:mod:`._rt`, :mod:`._util`, :mod:`._mdl`, :mod:`._prof`, :mod:`._media*`; ``acl.*`` from :mod:`._buffers` (data buffers,
``data_type_size``), :mod:`._tensor_desc`, :mod:`._applog` (``app_log``) and this file, whose own imports
are aliased ``_name``).  Beside them: :mod:`._constants` (every ``ACL_*`` value), :mod:`._calls` (the
calling convention), :mod:`._args` (argument checks) and :mod:`._state` (process state: init count,
contexts, streams, events, allocations, models and their host objects; the current context is per
thread, as in CANN); host pointers are checked in :mod:`runtime.hostmem`.  A new namespace is one more
public module that imports its API from one more private module of
:func:`~runtime.acl._calls.acl_call` functions (``ACL_NAMESPACE`` names the calls).  The devices are
those of :func:`runtime.api.get_runtime` at the first ``acl.init()`` (so ``ASCEND_RT_VISIBLE_DEVICES``
applies).

vnpu behaviour choices (where CANN leaves room):

- parameter errors are answered where CANN answers them: the acl layer's own checks (NULL pointers, a
  zero size, an unknown memcpy kind, an index out of range, a destroyed model-layer handle) return
  ACL_ERROR_INVALID_PARAM (100000); what the runtime checks (``count`` > ``dest_max``, freeing memory it
  did not allocate, an unknown stream) returns its own codes (107000, 207002, 107017 ...).
- ``rt.get_run_mode()`` answers ACL_HOST, also before ``acl.init()``.

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
import json as _json

from devices.errors import AclError as _AclError
from runtime import api as _api

from . import mdl, media, op, prof, rt, util  # noqa: F401 - acl.rt, acl.util, acl.mdl, acl.op, acl.prof, acl.media
from ._applog import app_log  # noqa: F401 - acl.app_log
from ._buffers import (create_data_buffer, data_type_size, destroy_data_buffer,  # noqa: F401 - acl.*
                       get_data_buffer_addr, get_data_buffer_size, get_data_buffer_size_v2, update_data_buffer)
from ._calls import acl_call as _acl_call, record_error as _record_error, take_error as _take_error
from ._constants import (  # noqa: F401 - acl.ACL_* (every constant of ._constants)
    ACL_BF16, ACL_BOOL, ACL_CALLBACK_BLOCK, ACL_CALLBACK_NO_BLOCK, ACL_COMPLEX128, ACL_COMPLEX32, ACL_COMPLEX64,
    ACL_DDR_MEM, ACL_DDR_MEM_HUGE, ACL_DDR_MEM_NORMAL, ACL_DDR_MEM_P2P_HUGE, ACL_DDR_MEM_P2P_NORMAL, ACL_DEBUG,
    ACL_DEVICE, ACL_DEVICE_STATUS_ABNORMAL, ACL_DEVICE_STATUS_NORMAL, ACL_DOUBLE, ACL_DT_UNDEFINED,
    ACL_DYNAMIC_AIPP_NAME, ACL_DYNAMIC_TENSOR_NAME, ACL_ERROR, ACL_ERROR_API_NOT_SUPPORT, ACL_ERROR_BAD_ALLOC,
    ACL_ERROR_DESERIALIZE_MODEL, ACL_ERROR_FAILURE, ACL_ERROR_FEATURE_UNSUPPORTED, ACL_ERROR_GE_DATATYPE_INVALID,
    ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID, ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID,
    ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID, ACL_ERROR_GE_EXEC_MODEL_ADDR_INVALID,
    ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID, ACL_ERROR_GE_EXEC_MODEL_ID_INVALID,
    ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID, ACL_ERROR_GE_FORMAT_INVALID, ACL_ERROR_GE_INTERNAL_ERROR,
    ACL_ERROR_GE_LOAD_MODEL, ACL_ERROR_GE_MEMORY_ALLOCATION, ACL_ERROR_GE_PARAM_INVALID,
    ACL_ERROR_GE_SHAPE_INVALID, ACL_ERROR_INTERNAL_ERROR, ACL_ERROR_INVALID_FILE, ACL_ERROR_INVALID_MODEL_ID,
    ACL_ERROR_INVALID_PARAM, ACL_ERROR_INVALID_RESOURCE_HANDLE, ACL_ERROR_KERNEL_ALREADY_REGISTERED,
    ACL_ERROR_KERNEL_NOT_FOUND, ACL_ERROR_MODEL_INPUT_NOT_MATCH, ACL_ERROR_MODEL_NOT_DYNAMIC,
    ACL_ERROR_MODEL_OUTPUT_NOT_MATCH, ACL_ERROR_MODEL_SIZE_INVALID, ACL_ERROR_OP_NOT_FOUND, ACL_ERROR_PARSE_FILE,
    ACL_ERROR_OP_ATTR_NOT_MATCH, ACL_ERROR_OP_INPUT_NOT_MATCH, ACL_ERROR_OP_OUTPUT_NOT_MATCH, ACL_ERROR_OP_TYPE_NOT_MATCH,
    ACL_ERROR_PARSE_MODEL, ACL_ERROR_READ_MODEL_FAILURE, ACL_ERROR_REPEAT_FINALIZE, ACL_ERROR_REPEAT_INITIALIZE,
    ACL_ERROR_INVALID_PROFILING_CONFIG, ACL_ERROR_PROF_ALREADY_RUN, ACL_ERROR_PROF_NOT_RUN,
    ACL_ERROR_REPEAT_SUBSCRIBE, ACL_ERROR_RT_ADDR_UNALIGNED, ACL_ERROR_RT_AICORE_EXCEPTION,
    ACL_ERROR_RT_AICORE_TIMEOUT, ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW, ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW,
    ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT, ACL_ERROR_RT_CONTEXT_NULL, ACL_ERROR_RT_DEVICE_MEM_ERROR,
    ACL_ERROR_RT_DEVICE_OOM, ACL_ERROR_RT_DEVICE_TASK_ABORT, ACL_ERROR_RT_DEV_SETUP_ERROR,
    ACL_ERROR_RT_DRV_INTERNAL_ERROR,
    ACL_ERROR_RT_EVENT_NOT_COMPLETE, ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID,
    ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL, ACL_ERROR_RT_FEATURE_NOT_SUPPORT, ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR,
    ACL_ERROR_RT_INTERNAL_ERROR, ACL_ERROR_RT_INVALID_DEVICEID, ACL_ERROR_RT_INVALID_DEVICE_FUNCTION,
    ACL_ERROR_RT_INVALID_HANDLE, ACL_ERROR_RT_INVALID_MALLOC_TYPE, ACL_ERROR_RT_INVALID_MEMORY_TYPE,
    ACL_ERROR_RT_KERNEL_LOOKUP, ACL_ERROR_RT_LINK_ERROR, ACL_ERROR_RT_LOST_HEARTBEAT,
    ACL_ERROR_RT_MEMORY_ALLOCATION, ACL_ERROR_RT_MEMORY_FREE, ACL_ERROR_RT_NO_DEVICE,
    ACL_ERROR_RT_NO_EVENT_RESOURCE, ACL_ERROR_RT_NO_PERMISSION, ACL_ERROR_RT_NO_STREAM_RESOURCE,
    ACL_ERROR_RT_OVER_LIMIT, ACL_ERROR_RT_PARAM_INVALID, ACL_ERROR_RT_REPORT_TIMEOUT, ACL_ERROR_RT_SOCKET_CLOSE,
    ACL_ERROR_RT_STREAM_ABORT, ACL_ERROR_RT_STREAM_CAPTURED, ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
    ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD, ACL_ERROR_RT_STREAM_CONTEXT, ACL_ERROR_RT_STREAM_NOT_CAPTURED,
    ACL_ERROR_RT_STREAM_NO_CB_REG, ACL_ERROR_RT_STREAM_SUBSCRIBE, ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
    ACL_ERROR_RT_STREAM_TASK_FULL, ACL_ERROR_RT_SUSPECT_REMOTE_ERROR, ACL_ERROR_RT_TASK_TIMEOUT,
    ACL_ERROR_RT_THREAD_SUBSCRIBE, ACL_ERROR_RT_TIMEOUT, ACL_ERROR_RT_WAIT_TIMEOUT, ACL_ERROR_UNINITIALIZE,
    ACL_ERROR_UNSUPPORTED_DATA_TYPE, ACL_EVENT_CAPTURE_STREAM_PROGRESS, ACL_EVENT_DEVICE_USE_ONLY,
    ACL_EVENT_EXTERNAL, ACL_EVENT_IPC, ACL_EVENT_RECORDED_STATUS_COMPLETE, ACL_EVENT_RECORDED_STATUS_NOT_READY,
    ACL_EVENT_RECORD_DEFAULT, ACL_EVENT_RECORD_EXTERNAL, ACL_EVENT_STATUS_COMPLETE, ACL_EVENT_STATUS_NOT_READY,
    ACL_EVENT_STATUS_RESERVED, ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE, ACL_EVENT_WAIT_STATUS_COMPLETE,
    ACL_EVENT_WAIT_STATUS_NOT_READY, ACL_EVENT_WAIT_STATUS_RESERVED, ACL_FLOAT, ACL_FLOAT16, ACL_FLOAT4_E1M2,
    ACL_FLOAT4_E2M1, ACL_FLOAT6_E2M3, ACL_FLOAT6_E3M2, ACL_FLOAT8_E4M3FN, ACL_FLOAT8_E5M2, ACL_FLOAT8_E8M0,
    ACL_FORMAT_FRACTAL_NZ, ACL_FORMAT_FRACTAL_Z, ACL_FORMAT_HWCN, ACL_FORMAT_NC, ACL_FORMAT_NC1HWC0,
    ACL_FORMAT_NC1HWC0_C04, ACL_FORMAT_NCDHW, ACL_FORMAT_NCHW, ACL_FORMAT_NCL, ACL_FORMAT_ND, ACL_FORMAT_NDC1HWC0,
    ACL_FORMAT_NDHWC, ACL_FORMAT_NHWC, ACL_FORMAT_UNDEFINED, ACL_HBM_MEM, ACL_HBM_MEM_HUGE, ACL_HBM_MEM_HUGE1G,
    ACL_HBM_MEM_NORMAL, ACL_HBM_MEM_P2P_HUGE, ACL_HBM_MEM_P2P_HUGE1G, ACL_HBM_MEM_P2P_NORMAL, ACL_HIFLOAT8,
    ACL_HOST, ACL_INFO, ACL_INT16, ACL_INT32, ACL_INT4, ACL_INT64, ACL_INT8, ACL_MAX_BATCH_NUM, ACL_MAX_DIM_CNT,
    ACL_MAX_HW_NUM, ACL_MAX_TENSOR_NAME_LEN, ACL_MEMCPY_DEFAULT, ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE, ACL_MEMCPY_HOST_TO_DEVICE,
    ACL_MEMCPY_HOST_TO_HOST, ACL_MEMCPY_INNER_DEVICE_TO_DEVICE, ACL_MEMCPY_INTER_DEVICE_TO_DEVICE,
    ACL_MEM_ACCESS_USER_SPACE_READONLY, ACL_MEM_MALLOC_HUGE1G_ONLY, ACL_MEM_MALLOC_HUGE1G_ONLY_P2P,
    ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEM_MALLOC_HUGE_FIRST_P2P, ACL_MEM_MALLOC_HUGE_ONLY,
    ACL_MEM_MALLOC_HUGE_ONLY_P2P, ACL_MEM_MALLOC_NORMAL_ONLY, ACL_MEM_MALLOC_NORMAL_ONLY_P2P,
    ACL_MEM_TYPE_HIGH_BAND_WIDTH, ACL_MEM_TYPE_LOW_BAND_WIDTH, ACL_RT_DEVICE_STATUS_ABNORMAL,
    ACL_RT_DEVICE_STATUS_END, ACL_RT_DEVICE_STATUS_NORMAL, ACL_STREAM_CPU_SCHEDULE, ACL_STREAM_DEVICE_USE_ONLY,
    ACL_STREAM_FAST_LAUNCH, ACL_STREAM_FAST_SYNC, ACL_STREAM_HUGE, ACL_STREAM_PERSISTENT,
    ACL_STREAM_STATUS_COMPLETE, ACL_STREAM_STATUS_NOT_READY, ACL_STREAM_STATUS_RESERVED, ACL_STRING, ACL_SUCCESS,
    ACL_UINT1, ACL_UINT16, ACL_UINT32, ACL_UINT64, ACL_UINT8, ACL_UNKNOWN_RANK, ACL_VERSION, ACL_WARNING,
    STREAM_PRIORITY_GREATEST, STREAM_PRIORITY_LEAST,
    ACL_PROF_ACL_API, ACL_PROF_TASK_TIME, ACL_PROF_AICORE_METRICS, ACL_PROF_AICPU, ACL_PROF_L2CACHE,
    ACL_PROF_HCCL_TRACE, ACL_PROF_TRAINING_TRACE, ACL_PROF_MSPROFTX, ACL_PROF_RUNTIME_API, ACL_PROF_GE_API_L0,
    ACL_PROF_TASK_TIME_L0, ACL_PROF_TASK_MEMORY, ACL_PROF_TASK_TIME_L2, ACL_PROF_OP_ATTR, ACL_PROF_TASK_TIME_L3,
    ACL_PROF_GE_API_L1, ACL_PROF_API_STATS, ACL_AICORE_ARITHMETIC_UTILIZATION, ACL_AICORE_PIPE_UTILIZATION,
    ACL_AICORE_MEMORY_BANDWIDTH, ACL_AICORE_L0B_AND_WIDTH, ACL_AICORE_RESOURCE_CONFLICT_RATIO, ACL_AICORE_MEMORY_UB,
    ACL_AICORE_L2_CACHE, ACL_AICORE_PIPE_EXECUTE_UTILIZATION, ACL_AICORE_MEMORY_ACCESS, ACL_AICORE_NONE,
    ACL_PROF_STORAGE_LIMIT, ACL_PROF_SYS_HARDWARE_MEM_FREQ,
)
from ._media_state import teardown as _media_teardown
from ._prof import teardown as _prof_teardown
from ._state import STATE as _STATE, teardown as _teardown
from ._tensor_desc import (create_tensor_desc, destroy_tensor_desc, get_tensor_desc_dim,  # noqa: F401 - acl.*
                           get_tensor_desc_dim_v2, get_tensor_desc_element_count, get_tensor_desc_format,
                           get_tensor_desc_name, get_tensor_desc_num_dims, get_tensor_desc_size, get_tensor_desc_type,
                           set_tensor_const, set_tensor_desc_name)


# ---------------------------------------------------------------------------------------------- acl.*
@_acl_call(init=False)
def init(config_path: str | None = None) -> None:
    """aclInit.  Reference-counted (reference 1.2, current CANN): each call adds 1 and succeeds;
    ``finalize_reference`` takes 1 away, ``finalize`` tears down whatever the count.  ``config_path``
    (optional, may be "") must name a readable JSON file; its settings (dump, profiling) are ignored."""
    if config_path:
        try:
            with open(config_path, encoding="utf-8") as f:
                text = f.read()
            if text.strip():
                _json.loads(text)
        except (OSError, ValueError) as e:
            raise _AclError(f"bad acl config file {config_path!r}: {e}", code=ACL_ERROR_INVALID_PARAM) from None
    with _STATE.lock:
        if _STATE.init_count == 0:
            _STATE.owns_rt = _api.current_runtime() is None    # made here: finalize closes it (its arenas)
            _STATE.rt = _api.get_runtime()
        _STATE.init_count += 1
        _STATE.ever_init = True


@_acl_call(init=False)
def finalize() -> None:
    """aclFinalize: release every context, stream, event, function handle and allocation made through
    this module, whatever the init count.  A runtime that ``acl.init`` created (none was installed) is
    closed too: its in-process devices and their ``/dev/shm`` arenas go, or its cluster clients and
    leases; the next ``acl.init`` makes a new one.  The ``acl.prof`` session ends too, as aclFinalize's
    MsprofFinalize ends it: a running profile is stopped and written, and ``acl.prof.init`` is needed
    again after the next ``acl.init``."""
    if _STATE.init_count <= 0:
        raise _AclError("acl is not initialized" + (" (already finalized)" if _STATE.ever_init else ""),
                        code=ACL_ERROR_REPEAT_FINALIZE if _STATE.ever_init else ACL_ERROR_UNINITIALIZE)
    _finalize_all()


@_acl_call(outs=(0,), init=False)
def finalize_reference() -> int:
    """aclFinalizeReference -> (remaining init count, ret); tears down when it reaches 0."""
    with _STATE.lock:
        if _STATE.init_count <= 0:
            raise _AclError("acl is not initialized",
                            code=ACL_ERROR_REPEAT_FINALIZE if _STATE.ever_init else ACL_ERROR_UNINITIALIZE)
        _STATE.init_count -= 1
        left = _STATE.init_count
    if left == 0:
        _finalize_all()
    return left


def _finalize_all() -> None:
    """aclFinalize's teardown: profiling first (MsprofFinalize: a running profile is written while its
    devices are still open), then every acl resource and the runtime acl.init made."""
    try:
        _prof_teardown()
    finally:
        _media_teardown()
        _teardown()


@_acl_call(outs=(0, 0, 0), init=False)
def get_version():
    """aclrtGetVersion -> (major, minor, patch, ret): the AscendCL API version vnpu follows (pyACL names it
    ``acl.get_version``)."""
    return ACL_VERSION


def get_recent_err_msg() -> str:
    """The calling thread's last error text ("" when none); reading it clears it."""
    return _take_error()


def get_soc_name() -> str | None:
    """aclrtGetSocName: the chip name of device 0 (e.g. "Ascend910B3"); None before init."""
    if _STATE.rt is None or _STATE.rt.device_count() == 0:
        _record_error("acl.get_soc_name", "acl.init() has not been called" if _STATE.rt is None else "no device")
        return None
    try:
        return _STATE.rt.device(0).info().chip
    except _AclError as e:
        _record_error("acl.get_soc_name", str(e))
        return None


