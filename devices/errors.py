"""The one CANN error table and the typed exceptions that carry its codes.

Every layer raises :class:`AclError` subclasses with a CANN numeric code; the driver sends the code over
the wire and raises the same class on the other side (see :func:`error_for_code`).  Codes and names are
those of ``acl_base_rt.h`` / ``rt_error_codes.h`` (reference/cann_api.md section 2).
"""
from __future__ import annotations

# ---- ACL general codes (acl_base_rt.h) ----
ACL_SUCCESS = 0
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_UNINITIALIZE = 100001
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_INVALID_FILE = 100003
ACL_ERROR_PARSE_FILE = 100006
ACL_ERROR_OP_TYPE_NOT_MATCH = 100020
ACL_ERROR_OP_INPUT_NOT_MATCH = 100021
ACL_ERROR_OP_OUTPUT_NOT_MATCH = 100022
ACL_ERROR_OP_ATTR_NOT_MATCH = 100023
ACL_ERROR_OP_NOT_FOUND = 100024
ACL_ERROR_UNSUPPORTED_DATA_TYPE = 100026
ACL_ERROR_KERNEL_NOT_FOUND = 100029
ACL_ERROR_KERNEL_ALREADY_REGISTERED = 100031
ACL_ERROR_REPEAT_SUBSCRIBE = 100033
ACL_ERROR_REPEAT_FINALIZE = 100037
ACL_ERROR_INVALID_PROFILING_CONFIG = 100010
ACL_ERROR_PROF_ALREADY_RUN = 100042
ACL_ERROR_PROF_NOT_RUN = 100043
ACL_ERROR_BAD_ALLOC = 200000
ACL_ERROR_API_NOT_SUPPORT = 200001
ACL_ERROR_INVALID_RESOURCE_HANDLE = 200005
ACL_ERROR_FEATURE_UNSUPPORTED = 200006
ACL_ERROR_INTERNAL_ERROR = 500000
ACL_ERROR_FAILURE = 500001

# ---- runtime codes passed through (rt_error_codes.h) ----
ACL_ERROR_RT_PARAM_INVALID = 107000
ACL_ERROR_RT_INVALID_DEVICEID = 107001
ACL_ERROR_RT_CONTEXT_NULL = 107002
ACL_ERROR_RT_STREAM_CONTEXT = 107003
ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID = 107006
ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL = 107007
ACL_ERROR_RT_ADDR_UNALIGNED = 107008
ACL_ERROR_RT_STREAM_SUBSCRIBE = 107011
ACL_ERROR_RT_THREAD_SUBSCRIBE = 107012
ACL_ERROR_RT_STREAM_NO_CB_REG = 107015
ACL_ERROR_RT_INVALID_MEMORY_TYPE = 107016
ACL_ERROR_RT_INVALID_HANDLE = 107017
ACL_ERROR_RT_INVALID_MALLOC_TYPE = 107018
ACL_ERROR_RT_WAIT_TIMEOUT = 107019
ACL_ERROR_RT_TASK_TIMEOUT = 107020
ACL_ERROR_RT_DEVICE_TASK_ABORT = 107022
ACL_ERROR_RT_STREAM_ABORT = 107023
ACL_ERROR_RT_STREAM_CAPTURED = 107027
ACL_ERROR_RT_STREAM_NOT_CAPTURED = 107029
ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT = 107030
ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD = 107038
#: a launch that names a function (here: a launch template) the device does not hold (any more)
ACL_ERROR_RT_INVALID_DEVICE_FUNCTION = 107044
ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_MEMORY_FREE = 207002
ACL_ERROR_RT_NO_DEVICE = 207004
ACL_ERROR_RT_NO_PERMISSION = 207006
ACL_ERROR_RT_NO_EVENT_RESOURCE = 207007
ACL_ERROR_RT_NO_STREAM_RESOURCE = 207008
ACL_ERROR_RT_OVER_LIMIT = 207012
ACL_ERROR_RT_DEVICE_OOM = 207018
ACL_ERROR_RT_TIMEOUT = 207020
ACL_ERROR_RT_INTERNAL_ERROR = 507000
ACL_ERROR_RT_STREAM_TASK_FULL = 507002
ACL_ERROR_RT_EVENT_NOT_COMPLETE = 507006
ACL_ERROR_RT_LOST_HEARTBEAT = 507010
ACL_ERROR_RT_REPORT_TIMEOUT = 507012
ACL_ERROR_RT_AICORE_TIMEOUT = 507014
ACL_ERROR_RT_AICORE_EXCEPTION = 507015
ACL_ERROR_RT_KERNEL_LOOKUP = 507027
ACL_ERROR_RT_DEV_SETUP_ERROR = 507033
ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW = 507042
ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW = 507043
ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046
ACL_ERROR_RT_EVENT_SYNC_TIMEOUT = 507047
ACL_ERROR_RT_DEVICE_MEM_ERROR = 507053
ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR = 507054
ACL_ERROR_RT_LINK_ERROR = 507056
ACL_ERROR_RT_SUSPECT_REMOTE_ERROR = 507057
#: a driver call failed with a driver code the runtime does not map (rt_error_codes.h; e.g. drvMemsetD8 on a
#: freed host address: DRV_ERROR_PARA_ERROR -> RT_ERROR_DRV_ERR)
ACL_ERROR_RT_DRV_INTERNAL_ERROR = 507899
ACL_ERROR_RT_SOCKET_CLOSE = 507901
ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED = 507903

#: code -> (name, one-line meaning).  The single error table of the project.
ERROR_TABLE: dict[int, tuple[str, str]] = {
    ACL_SUCCESS: ("ACL_SUCCESS", "success"),
    ACL_ERROR_INVALID_PARAM: ("ACL_ERROR_INVALID_PARAM", "invalid parameter"),
    ACL_ERROR_UNINITIALIZE: ("ACL_ERROR_UNINITIALIZE", "acl.init has not been called"),
    ACL_ERROR_REPEAT_INITIALIZE: ("ACL_ERROR_REPEAT_INITIALIZE", "repeated initialization"),
    ACL_ERROR_INVALID_FILE: ("ACL_ERROR_INVALID_FILE", "invalid file"),
    ACL_ERROR_PARSE_FILE: ("ACL_ERROR_PARSE_FILE", "cannot parse file"),
    ACL_ERROR_OP_TYPE_NOT_MATCH: ("ACL_ERROR_OP_TYPE_NOT_MATCH", "operator type does not match"),
    ACL_ERROR_OP_INPUT_NOT_MATCH: ("ACL_ERROR_OP_INPUT_NOT_MATCH", "operator inputs do not match"),
    ACL_ERROR_OP_OUTPUT_NOT_MATCH: ("ACL_ERROR_OP_OUTPUT_NOT_MATCH", "operator outputs do not match"),
    ACL_ERROR_OP_ATTR_NOT_MATCH: ("ACL_ERROR_OP_ATTR_NOT_MATCH", "operator attributes do not match"),
    ACL_ERROR_OP_NOT_FOUND: ("ACL_ERROR_OP_NOT_FOUND", "operator not found"),
    ACL_ERROR_UNSUPPORTED_DATA_TYPE: ("ACL_ERROR_UNSUPPORTED_DATA_TYPE", "unsupported data type"),
    ACL_ERROR_KERNEL_NOT_FOUND: ("ACL_ERROR_KERNEL_NOT_FOUND", "kernel not found"),
    ACL_ERROR_KERNEL_ALREADY_REGISTERED: ("ACL_ERROR_KERNEL_ALREADY_REGISTERED", "kernel already registered"),
    ACL_ERROR_REPEAT_SUBSCRIBE: ("ACL_ERROR_REPEAT_SUBSCRIBE", "repeated subscription"),
    ACL_ERROR_REPEAT_FINALIZE: ("ACL_ERROR_REPEAT_FINALIZE", "repeated finalize"),
    ACL_ERROR_INVALID_PROFILING_CONFIG: ("ACL_ERROR_INVALID_PROFILING_CONFIG", "invalid profiling configuration"),
    ACL_ERROR_PROF_ALREADY_RUN: ("ACL_ERROR_PROF_ALREADY_RUN", "profiling is already running"),
    ACL_ERROR_PROF_NOT_RUN: ("ACL_ERROR_PROF_NOT_RUN", "profiling has not been started"),
    ACL_ERROR_BAD_ALLOC: ("ACL_ERROR_BAD_ALLOC", "host memory allocation failed"),
    ACL_ERROR_API_NOT_SUPPORT: ("ACL_ERROR_API_NOT_SUPPORT", "API not supported"),
    ACL_ERROR_INVALID_RESOURCE_HANDLE: ("ACL_ERROR_INVALID_RESOURCE_HANDLE", "invalid resource handle"),
    ACL_ERROR_FEATURE_UNSUPPORTED: ("ACL_ERROR_FEATURE_UNSUPPORTED", "feature not supported"),
    ACL_ERROR_INTERNAL_ERROR: ("ACL_ERROR_INTERNAL_ERROR", "internal error"),
    ACL_ERROR_FAILURE: ("ACL_ERROR_FAILURE", "failure"),
    ACL_ERROR_RT_PARAM_INVALID: ("ACL_ERROR_RT_PARAM_INVALID", "invalid parameter"),
    ACL_ERROR_RT_INVALID_DEVICEID: ("ACL_ERROR_RT_INVALID_DEVICEID", "invalid device id"),
    ACL_ERROR_RT_CONTEXT_NULL: ("ACL_ERROR_RT_CONTEXT_NULL", "no current context: call set_device first"),
    ACL_ERROR_RT_STREAM_CONTEXT: ("ACL_ERROR_RT_STREAM_CONTEXT", "stream not in the current context"),
    ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID: ("ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID", "event not recorded"),
    ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL: ("ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL", "end event before start"),
    ACL_ERROR_RT_ADDR_UNALIGNED: ("ACL_ERROR_RT_ADDR_UNALIGNED", "address not aligned"),
    ACL_ERROR_RT_STREAM_SUBSCRIBE: ("ACL_ERROR_RT_STREAM_SUBSCRIBE", "stream subscription failed"),
    ACL_ERROR_RT_THREAD_SUBSCRIBE: ("ACL_ERROR_RT_THREAD_SUBSCRIBE", "thread subscription failed"),
    ACL_ERROR_RT_STREAM_NO_CB_REG: ("ACL_ERROR_RT_STREAM_NO_CB_REG", "stream has no subscribed callback thread"),
    ACL_ERROR_RT_INVALID_MEMORY_TYPE: ("ACL_ERROR_RT_INVALID_MEMORY_TYPE", "invalid memory type"),
    ACL_ERROR_RT_INVALID_HANDLE: ("ACL_ERROR_RT_INVALID_HANDLE", "invalid handle"),
    ACL_ERROR_RT_INVALID_MALLOC_TYPE: ("ACL_ERROR_RT_INVALID_MALLOC_TYPE", "invalid malloc policy"),
    ACL_ERROR_RT_WAIT_TIMEOUT: ("ACL_ERROR_RT_WAIT_TIMEOUT", "wait timed out"),
    ACL_ERROR_RT_TASK_TIMEOUT: ("ACL_ERROR_RT_TASK_TIMEOUT", "task timed out"),
    ACL_ERROR_RT_DEVICE_TASK_ABORT: ("ACL_ERROR_RT_DEVICE_TASK_ABORT", "device task abort (device lost)"),
    ACL_ERROR_RT_STREAM_ABORT: ("ACL_ERROR_RT_STREAM_ABORT", "stream is being aborted"),
    ACL_ERROR_RT_STREAM_CAPTURED: ("ACL_ERROR_RT_STREAM_CAPTURED", "operation not allowed on a capturing stream"),
    ACL_ERROR_RT_STREAM_NOT_CAPTURED: ("ACL_ERROR_RT_STREAM_NOT_CAPTURED", "stream is not capturing"),
    ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT: ("ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT",
                                            "operation not allowed while capturing"),
    ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD: ("ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD",
                                               "capture ended from another thread"),
    ACL_ERROR_RT_INVALID_DEVICE_FUNCTION: ("ACL_ERROR_RT_INVALID_DEVICE_FUNCTION",
                                           "unknown launch template (the device dropped it): send the launch in full"),
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT: ("ACL_ERROR_RT_FEATURE_NOT_SUPPORT", "feature not supported"),
    ACL_ERROR_RT_MEMORY_ALLOCATION: ("ACL_ERROR_RT_MEMORY_ALLOCATION", "device memory allocation failed"),
    ACL_ERROR_RT_MEMORY_FREE: ("ACL_ERROR_RT_MEMORY_FREE", "device memory free failed"),
    ACL_ERROR_RT_NO_DEVICE: ("ACL_ERROR_RT_NO_DEVICE", "device unavailable"),
    ACL_ERROR_RT_NO_PERMISSION: ("ACL_ERROR_RT_NO_PERMISSION", "no permission"),
    ACL_ERROR_RT_NO_EVENT_RESOURCE: ("ACL_ERROR_RT_NO_EVENT_RESOURCE", "event resources exhausted"),
    ACL_ERROR_RT_NO_STREAM_RESOURCE: ("ACL_ERROR_RT_NO_STREAM_RESOURCE", "stream resources exhausted"),
    ACL_ERROR_RT_OVER_LIMIT: ("ACL_ERROR_RT_OVER_LIMIT", "over limit"),
    ACL_ERROR_RT_DEVICE_OOM: ("ACL_ERROR_RT_DEVICE_OOM", "device out of memory"),
    ACL_ERROR_RT_TIMEOUT: ("ACL_ERROR_RT_TIMEOUT", "driver call timed out"),
    ACL_ERROR_RT_INTERNAL_ERROR: ("ACL_ERROR_RT_INTERNAL_ERROR", "runtime internal error"),
    ACL_ERROR_RT_STREAM_TASK_FULL: ("ACL_ERROR_RT_STREAM_TASK_FULL", "stream task queue full"),
    ACL_ERROR_RT_EVENT_NOT_COMPLETE: ("ACL_ERROR_RT_EVENT_NOT_COMPLETE", "event not complete"),
    ACL_ERROR_RT_LOST_HEARTBEAT: ("ACL_ERROR_RT_LOST_HEARTBEAT", "device heartbeat lost"),
    ACL_ERROR_RT_REPORT_TIMEOUT: ("ACL_ERROR_RT_REPORT_TIMEOUT", "process_report timed out"),
    ACL_ERROR_RT_AICORE_TIMEOUT: ("ACL_ERROR_RT_AICORE_TIMEOUT", "AI Core task timed out"),
    ACL_ERROR_RT_AICORE_EXCEPTION: ("ACL_ERROR_RT_AICORE_EXCEPTION", "AI Core exception"),
    ACL_ERROR_RT_KERNEL_LOOKUP: ("ACL_ERROR_RT_KERNEL_LOOKUP", "kernel lookup failed"),
    ACL_ERROR_RT_DEV_SETUP_ERROR: ("ACL_ERROR_RT_DEV_SETUP_ERROR", "device setup error"),
    ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW: ("ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW", "kernel read out of bounds"),
    ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW: ("ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW",
                                              "kernel write out of bounds"),
    ACL_ERROR_RT_STREAM_SYNC_TIMEOUT: ("ACL_ERROR_RT_STREAM_SYNC_TIMEOUT", "stream synchronize timed out"),
    ACL_ERROR_RT_EVENT_SYNC_TIMEOUT: ("ACL_ERROR_RT_EVENT_SYNC_TIMEOUT", "event synchronize timed out"),
    ACL_ERROR_RT_DEVICE_MEM_ERROR: ("ACL_ERROR_RT_DEVICE_MEM_ERROR", "device memory UCE error"),
    ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR: ("ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR", "HBM multi-bit ECC error"),
    ACL_ERROR_RT_LINK_ERROR: ("ACL_ERROR_RT_LINK_ERROR", "inter-device link error"),
    ACL_ERROR_RT_SUSPECT_REMOTE_ERROR: ("ACL_ERROR_RT_SUSPECT_REMOTE_ERROR", "suspected remote (peer) error"),
    ACL_ERROR_RT_DRV_INTERNAL_ERROR: ("ACL_ERROR_RT_DRV_INTERNAL_ERROR", "driver internal error"),
    ACL_ERROR_RT_SOCKET_CLOSE: ("ACL_ERROR_RT_SOCKET_CLOSE", "device connection closed"),
    ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED: ("ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED",
                                              "capture invalidated by a failed call"),
}


def code_band(code: int) -> int:
    """The numbering band of a code (reference 2): 1 = user environment or logic error, 2 = resources
    exhausted or API/hardware mismatch, 3 = business state, 5 = internal software/hardware fault."""
    return int(code) // ACL_ERROR_INVALID_PARAM


def error_name(code: int) -> str:
    """The CANN name of ``code`` (``ACL_ERROR_UNKNOWN_<code>`` when the table does not hold it)."""
    entry = ERROR_TABLE.get(code)
    return entry[0] if entry else f"ACL_ERROR_UNKNOWN_{code}"


class AclError(Exception):
    """A CANN runtime error: ``code`` is the aclError value, ``name`` its symbolic name."""

    default_code = ACL_ERROR_INTERNAL_ERROR

    def __init__(self, message: str = "", code: int | None = None):
        self.code = int(code if code is not None else self.default_code)
        self.name = error_name(self.code)
        self.detail = message or ERROR_TABLE.get(self.code, ("", "error"))[1]
        super().__init__(f"[{self.code} {self.name}] {self.detail}")

    def __reduce__(self):
        return (error_for_code, (self.code, self.detail, type(self).__name__))

    def copy(self) -> "AclError":
        """A fresh exception of the same class, code and detail (a stored error is raised once per waiter)."""
        return error_for_code(self.code, self.detail, type(self).__name__)


class InvalidParamError(AclError):
    default_code = ACL_ERROR_RT_PARAM_INVALID


class InvalidDeviceError(AclError):
    default_code = ACL_ERROR_RT_INVALID_DEVICEID


class InvalidHandleError(AclError):
    default_code = ACL_ERROR_RT_INVALID_HANDLE


class MemoryAllocationError(AclError):
    default_code = ACL_ERROR_RT_MEMORY_ALLOCATION


class MemoryAccessError(InvalidParamError):
    """An access outside any live allocation: out of bounds, use after free, wrong device."""
    default_code = ACL_ERROR_RT_PARAM_INVALID


class KernelError(AclError):
    """A task failed on the device (kernel exception, trap, lookup failure)."""
    default_code = ACL_ERROR_RT_AICORE_EXCEPTION


class TimeoutError_(AclError):
    default_code = ACL_ERROR_RT_STREAM_SYNC_TIMEOUT


class DeviceLostError(AclError):
    """The device died, hung or was aborted: pending work failed."""
    default_code = ACL_ERROR_RT_DEVICE_TASK_ABORT


class UninitializedError(AclError):
    default_code = ACL_ERROR_UNINITIALIZE


class UnsupportedError(AclError):
    default_code = ACL_ERROR_RT_FEATURE_NOT_SUPPORT


class CaptureError(AclError):
    """Stream capture (aclmdlRI) misuse: 107027 / 107029 / 107030 / 107038 / 507903."""
    default_code = ACL_ERROR_RT_STREAM_CAPTURED


_CLASS_BY_CODE: dict[int, type[AclError]] = {
    ACL_ERROR_RT_PARAM_INVALID: InvalidParamError,
    ACL_ERROR_INVALID_PARAM: InvalidParamError,
    ACL_ERROR_UNSUPPORTED_DATA_TYPE: InvalidParamError,
    ACL_ERROR_RT_ADDR_UNALIGNED: InvalidParamError,
    ACL_ERROR_RT_INVALID_DEVICEID: InvalidDeviceError,
    ACL_ERROR_RT_INVALID_HANDLE: InvalidHandleError,
    ACL_ERROR_INVALID_RESOURCE_HANDLE: InvalidHandleError,
    ACL_ERROR_RT_INVALID_DEVICE_FUNCTION: InvalidHandleError,
    ACL_ERROR_RT_MEMORY_ALLOCATION: MemoryAllocationError,
    ACL_ERROR_RT_DEVICE_OOM: MemoryAllocationError,
    ACL_ERROR_RT_MEMORY_FREE: MemoryAccessError,
    ACL_ERROR_RT_AICORE_EXCEPTION: KernelError,
    ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW: KernelError,
    ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW: KernelError,
    ACL_ERROR_RT_KERNEL_LOOKUP: KernelError,
    ACL_ERROR_KERNEL_NOT_FOUND: KernelError,
    ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR: KernelError,
    ACL_ERROR_RT_DEVICE_MEM_ERROR: KernelError,
    ACL_ERROR_RT_STREAM_SYNC_TIMEOUT: TimeoutError_,
    ACL_ERROR_RT_EVENT_SYNC_TIMEOUT: TimeoutError_,
    ACL_ERROR_RT_WAIT_TIMEOUT: TimeoutError_,
    ACL_ERROR_RT_TIMEOUT: TimeoutError_,
    ACL_ERROR_RT_DEVICE_TASK_ABORT: DeviceLostError,
    ACL_ERROR_RT_NO_DEVICE: DeviceLostError,
    ACL_ERROR_RT_LOST_HEARTBEAT: DeviceLostError,
    ACL_ERROR_RT_SOCKET_CLOSE: DeviceLostError,
    ACL_ERROR_UNINITIALIZE: UninitializedError,
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT: UnsupportedError,
    ACL_ERROR_FEATURE_UNSUPPORTED: UnsupportedError,
    ACL_ERROR_RT_STREAM_CAPTURED: CaptureError,
    ACL_ERROR_RT_STREAM_NOT_CAPTURED: CaptureError,
    ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT: CaptureError,
    ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD: CaptureError,
    ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED: CaptureError,
}


def _subclasses(cls) -> dict[str, type]:
    out = {cls.__name__: cls}
    for sub in cls.__subclasses__():
        out.update(_subclasses(sub))
    return out


def error_for_code(code: int, message: str = "", class_name: str | None = None, *,
                   hccl_code: int | None = None) -> AclError:
    """Rebuild the typed exception for a code (used across the wire and when unpickling).
    ``class_name`` (sent beside the code) restores a subclass that shares its code with another;
    ``hccl_code`` (the HcclResult of a failed collective, sent as a field) restores an :class:`HcclError`
    whose ``detail`` is ``message`` as it was."""
    cls = _CLASS_BY_CODE.get(int(code), AclError)
    if hccl_code is not None or class_name == "HcclError":
        return _rebuild_hccl(message, HCCL_E_INTERNAL if hccl_code is None else hccl_code, int(code))
    if class_name:
        named = _subclasses(AclError).get(class_name)
        if named is not None and issubclass(named, AclError):
            cls = named
    return cls(message, code=int(code))


# ---- HCCL (hccl_types.h HcclResult) ----
HCCL_SUCCESS = 0
HCCL_E_PARA = 1
HCCL_E_PTR = 2
HCCL_E_MEMORY = 3
HCCL_E_INTERNAL = 4
HCCL_E_NOT_SUPPORT = 5
HCCL_E_NOT_FOUND = 6
HCCL_E_UNAVAIL = 7
HCCL_E_TIMEOUT = 9
HCCL_E_RUNTIME = 15
HCCL_E_NETWORK = 19
HCCL_E_REMOTE = 21

HCCL_RESULT_NAMES: dict[int, str] = {
    0: "HCCL_SUCCESS", 1: "HCCL_E_PARA", 2: "HCCL_E_PTR", 3: "HCCL_E_MEMORY", 4: "HCCL_E_INTERNAL",
    5: "HCCL_E_NOT_SUPPORT", 6: "HCCL_E_NOT_FOUND", 7: "HCCL_E_UNAVAIL", 8: "HCCL_E_SYSCALL",
    9: "HCCL_E_TIMEOUT", 10: "HCCL_E_OPEN_FILE_FAILURE", 11: "HCCL_E_TCP_CONNECT", 12: "HCCL_E_ROCE_CONNECT",
    13: "HCCL_E_TCP_TRANSFER", 14: "HCCL_E_ROCE_TRANSFER", 15: "HCCL_E_RUNTIME", 16: "HCCL_E_DRV",
    17: "HCCL_E_PROFILING", 18: "HCCL_E_CCE", 19: "HCCL_E_NETWORK", 20: "HCCL_E_AGAIN", 21: "HCCL_E_REMOTE",
    22: "HCCL_E_SUSPENDING", 23: "HCCL_E_OPRETRY_FAIL", 24: "HCCL_E_OOM",
}

#: HcclResult -> the aclError a stream synchronize reports for a failed collective task
_HCCL_TO_ACL = {HCCL_E_PARA: ACL_ERROR_RT_PARAM_INVALID, HCCL_E_PTR: ACL_ERROR_RT_PARAM_INVALID,
                HCCL_E_TIMEOUT: ACL_ERROR_RT_TASK_TIMEOUT, HCCL_E_REMOTE: ACL_ERROR_RT_SUSPECT_REMOTE_ERROR,
                HCCL_E_NETWORK: ACL_ERROR_RT_LINK_ERROR, HCCL_E_MEMORY: ACL_ERROR_RT_MEMORY_ALLOCATION,
                HCCL_E_NOT_SUPPORT: ACL_ERROR_RT_FEATURE_NOT_SUPPORT}


def hccl_result_name(code: int) -> str:
    return HCCL_RESULT_NAMES.get(code, f"HCCL_E_UNKNOWN_{code}")


class HcclError(AclError):
    """A failed collective: ``hccl_code`` is the HcclResult, ``code`` the aclError a stream reports."""

    def __init__(self, message: str = "", hccl_code: int = HCCL_E_INTERNAL, code: int | None = None):
        self.hccl_code = int(hccl_code)
        super().__init__(f"{hccl_result_name(self.hccl_code)}: {message}",
                         code=code if code is not None else _HCCL_TO_ACL.get(self.hccl_code,
                                                                             ACL_ERROR_RT_INTERNAL_ERROR))

    def __reduce__(self):
        return (_rebuild_hccl, (self.detail, self.hccl_code, self.code))

    def copy(self) -> "HcclError":
        return _rebuild_hccl(self.detail, self.hccl_code, self.code)


def _rebuild_hccl(detail: str, hccl_code: int, code: int) -> "HcclError":
    e = HcclError("", hccl_code, code)
    e.detail = detail
    e.args = (f"[{code} {e.name}] {detail}",)
    return e


# ---- offline models: acl model codes (acl_base_rt.h) and GE codes (ge_error_codes.h) ----
# GE codes pass through pyACL unchanged; values from ge_error_codes.h of current CANN (145020-145022 are
# FORMAT/SHAPE/DATATYPE_INVALID there; older headers numbered that range differently).
ACL_ERROR_INVALID_MODEL_ID = 100011
ACL_ERROR_DESERIALIZE_MODEL = 100012
ACL_ERROR_PARSE_MODEL = 100013
ACL_ERROR_READ_MODEL_FAILURE = 100014
ACL_ERROR_MODEL_SIZE_INVALID = 100015
ACL_ERROR_MODEL_INPUT_NOT_MATCH = 100017
ACL_ERROR_MODEL_OUTPUT_NOT_MATCH = 100018
ACL_ERROR_MODEL_NOT_DYNAMIC = 100019
ACL_ERROR_GE_PARAM_INVALID = 145000
ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID = 145002
ACL_ERROR_GE_EXEC_MODEL_ID_INVALID = 145003
ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID = 145006
ACL_ERROR_GE_EXEC_MODEL_ADDR_INVALID = 145007
ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID = 145011
ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID = 145012
ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID = 145013
ACL_ERROR_GE_FORMAT_INVALID = 145020
ACL_ERROR_GE_SHAPE_INVALID = 145021
ACL_ERROR_GE_DATATYPE_INVALID = 145022
ACL_ERROR_GE_MEMORY_ALLOCATION = 245000
ACL_ERROR_GE_INTERNAL_ERROR = 545000
ACL_ERROR_GE_LOAD_MODEL = 545001

ERROR_TABLE.update({
    ACL_ERROR_INVALID_MODEL_ID: ("ACL_ERROR_INVALID_MODEL_ID", "invalid model id"),
    ACL_ERROR_DESERIALIZE_MODEL: ("ACL_ERROR_DESERIALIZE_MODEL", "cannot deserialize the model"),
    ACL_ERROR_PARSE_MODEL: ("ACL_ERROR_PARSE_MODEL", "cannot parse the model"),
    ACL_ERROR_READ_MODEL_FAILURE: ("ACL_ERROR_READ_MODEL_FAILURE", "cannot read the model file"),
    ACL_ERROR_MODEL_SIZE_INVALID: ("ACL_ERROR_MODEL_SIZE_INVALID", "invalid model size"),
    ACL_ERROR_MODEL_INPUT_NOT_MATCH: ("ACL_ERROR_MODEL_INPUT_NOT_MATCH", "model inputs do not match"),
    ACL_ERROR_MODEL_OUTPUT_NOT_MATCH: ("ACL_ERROR_MODEL_OUTPUT_NOT_MATCH", "model outputs do not match"),
    ACL_ERROR_MODEL_NOT_DYNAMIC: ("ACL_ERROR_MODEL_NOT_DYNAMIC", "the model is not dynamic"),
    ACL_ERROR_GE_PARAM_INVALID: ("ACL_ERROR_GE_PARAM_INVALID", "invalid parameter"),
    ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID: ("ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID", "invalid model path"),
    ACL_ERROR_GE_EXEC_MODEL_ID_INVALID: ("ACL_ERROR_GE_EXEC_MODEL_ID_INVALID", "invalid model id"),
    ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID: ("ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID",
                                                "invalid model data size"),
    ACL_ERROR_GE_EXEC_MODEL_ADDR_INVALID: ("ACL_ERROR_GE_EXEC_MODEL_ADDR_INVALID", "invalid model address"),
    ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID: ("ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID",
                                              "invalid dynamic-gear input address"),
    ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID: ("ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID",
                                                "invalid dynamic-gear input length"),
    ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID: ("ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID",
                                              "batch size is not one of the model's gears"),
    ACL_ERROR_GE_FORMAT_INVALID: ("ACL_ERROR_GE_FORMAT_INVALID", "invalid format"),
    ACL_ERROR_GE_SHAPE_INVALID: ("ACL_ERROR_GE_SHAPE_INVALID", "invalid shape"),
    ACL_ERROR_GE_DATATYPE_INVALID: ("ACL_ERROR_GE_DATATYPE_INVALID", "invalid data type"),
    ACL_ERROR_GE_MEMORY_ALLOCATION: ("ACL_ERROR_GE_MEMORY_ALLOCATION", "memory allocation failed"),
    ACL_ERROR_GE_INTERNAL_ERROR: ("ACL_ERROR_GE_INTERNAL_ERROR", "internal error"),
    ACL_ERROR_GE_LOAD_MODEL: ("ACL_ERROR_GE_LOAD_MODEL", "cannot load the model"),
})


class ModelError(AclError):
    """Loading, describing or executing an offline model failed (acl 1000xx model codes, GE 145xxx)."""
    default_code = ACL_ERROR_PARSE_MODEL


_CLASS_BY_CODE.update({code: ModelError for code in (
    ACL_ERROR_INVALID_MODEL_ID, ACL_ERROR_DESERIALIZE_MODEL, ACL_ERROR_PARSE_MODEL, ACL_ERROR_READ_MODEL_FAILURE,
    ACL_ERROR_MODEL_SIZE_INVALID, ACL_ERROR_MODEL_INPUT_NOT_MATCH, ACL_ERROR_MODEL_OUTPUT_NOT_MATCH,
    ACL_ERROR_MODEL_NOT_DYNAMIC, ACL_ERROR_GE_PARAM_INVALID, ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID,
    ACL_ERROR_GE_EXEC_MODEL_ID_INVALID, ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID,
    ACL_ERROR_GE_EXEC_MODEL_ADDR_INVALID, ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID,
    ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID, ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID, ACL_ERROR_GE_FORMAT_INVALID,
    ACL_ERROR_GE_SHAPE_INVALID, ACL_ERROR_GE_DATATYPE_INVALID, ACL_ERROR_GE_INTERNAL_ERROR, ACL_ERROR_GE_LOAD_MODEL)})
_CLASS_BY_CODE[ACL_ERROR_GE_MEMORY_ALLOCATION] = MemoryAllocationError


# ---- ATC (model conversion) messages: the E-codes ATC prints, with their CANN error_code.json texts ----
# ``{}`` fields are named after the json's Arglist.  "EZ9010" is the ONNX parser's "no parser for this
# op type" (older CANN printed it as E19010); "EZ0009" is an operator's shape check.
ATC_MESSAGES: dict[str, str] = {
    "E10001": "Value {value} for parameter {parameter} is invalid. Reason: {reason}",
    "E10002": "Value {shape} for parameter --input_shape is invalid. Reason: {reason}. The value must be "
              "formatted as {sample}.",
    "E10003": "Value {value} for parameter --{parameter} is invalid. Reason: {reason}",
    "E10004": "Value for --{parameter} is empty.",
    "E10006": "Value {value} for parameter --{parameter} is invalid. The value must be either 1 or 0.",
    "E10007": "--{parameter} is required. The value must be {support}.",
    "E10009": "--dynamic_batch_size, --dynamic_image_size, --input_shape_range, and --dynamic_dims are mutually "
              "exclusive.",
    "E10010": "Value {loglevel} for parameter --log is invalid.",
    "E10011": "Value {shape} for parameter --input_shape is invalid. Shape values must be positive integers. "
              "The error value in the shape is {result}.",
    "E10016": "Opname {opname} specified in --{parameter} is not found in the model. Confirm whether this node "
              "name exists, or the node is not split with the specified delimiter ';'.",
    "E10018": "Value {shape} for shape {index} is invalid. When --dynamic_batch_size is included, only batch "
              "size N can be -1 in --input_shape.",
    "E10019": "When --dynamic_image_size is included, only the height and width axes can be -1 in --input_shape.",
    "E10020": "Value {dynamic_image_size} for parameter --dynamic_image_size is invalid. The value must be formatted "
              "as \"imagesize1_height,imagesize1_width;imagesize2_height,imagesize2_width\" (two dimensions in "
              "each profile).",
    "E10031": "--dynamic_batch_size is included, but none of the nodes specified in --input_shape has a batch "
              "size equaling -1.",
    "E10035": "--dynamic_batch_size, --dynamic_image_size, or --dynamic_dims has {shapesize} profiles, which is "
              "less than the minimum {minshapesize}.",
    "E10036": "--dynamic_batch_size, --dynamic_image_size, or --dynamic_dims has {shapesize} profiles, which is "
              "greater than the maximum {maxshapesize}.",
    "E10038": "Dimension size {dim} is invalid. The value must be greater than 0.",
    "E10039": "The --dynamic_batch_size, --dynamic_image_size, or --dynamic_dims argument have duplicate "
              "profiles.",
    "E10041": "Failed to load the model from {parameter}.",
    "E10055": "The operation is not supported. Reason: {reason}.",
    "E19999": "Inner Error! {reason}",
    "EZ0007": "Input parameter {param_name} of operator {op_name} has incorrect dtype {data_dtype}. The correct "
              "one should be {expected_dtype_list}.",
    "EZ0009": "Parameter {param_name} of operator {op_name} has incorrect shape [{incorrect_shape}]. "
              "Reason: {reason}.",
    "EZ9010": "No parser is registered for Op [{opname}, optype [{optype}]].",
}


def atc_message(ecode: str, **fields) -> str:
    """``"E10004: Value for --model is empty."``: an ATC error line."""
    return f"{ecode}: {ATC_MESSAGES[ecode].format(**fields)}"


class AtcError(AclError):
    """Model conversion failed.  ``ecode`` is the ATC E-code (``"EZ9010"``); ``code`` the aclError that a
    load of the same model through acl.mdl reports."""
    default_code = ACL_ERROR_PARSE_MODEL

    def __init__(self, ecode: str, code: int | None = None, **fields):
        self.ecode = ecode
        self.fields = fields
        self.line = atc_message(ecode, **fields)
        super().__init__(self.line, code=code)

    def __reduce__(self):
        return (_rebuild_atc, (self.ecode, self.code, self.fields))


def _rebuild_atc(ecode: str, code: int, fields: dict) -> "AtcError":
    return AtcError(ecode, code, **fields)
