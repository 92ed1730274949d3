"""The wire: the one module that imports the generated gRPC/protobuf code, and the one codec.

Everything that crosses the network goes through here: the stubs, servicer bases and ``add_*_to_server``
functions of the two services (``vnpu.v1.DeviceManagement`` = DMS, ``vnpu.v1.ResourceManagement`` = RMS)
and of the Open Inference Protocol's ``inference.GRPCInferenceService`` that ``vnpu serve`` answers
(:data:`inference`: its messages, built into a descriptor pool of their own, see :mod:`driver.protogen`;
``runtime.serve.v2.grpc_codec`` converts them),
the conversions between :mod:`devices.tasks` ops / :class:`~devices.kernel.TensorDesc` / telemetry dicts /
health reports / fault parameters and protobuf messages, the structured error detail every failed call
carries, the metadata keys, the message-size limits and the mapping between CANN error codes and gRPC
status codes (used in both directions).  Every mapping is a table.

The generated code is made at set-up (``scripts/setup.sh``), never here: importing this module without it
(or with code older than ``proto/``) raises :class:`driver.protogen.GeneratedCodeError`.

Nothing here opens a socket; :mod:`driver.service` and :mod:`driver.client` do.
"""
from __future__ import annotations

import itertools
import json
import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")     # no INFO chatter (GOAWAY...) when a device goes away

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from google.protobuf import message_factory  # noqa: E402

from driver import protogen  # noqa: E402

protogen.check()

from driver._gen.inference import grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc  # noqa: E402
from driver._gen.vnpu.v1 import dms_pb2, dms_pb2_grpc, rms_pb2, rms_pb2_grpc, status_pb2  # noqa: E402

from devices import errors  # noqa: E402
from devices.errors import (ACL_ERROR_API_NOT_SUPPORT, ACL_ERROR_INTERNAL_ERROR,  # noqa: E402
                            ACL_ERROR_RT_DEVICE_TASK_ABORT, ACL_ERROR_RT_INVALID_DEVICE_FUNCTION,
                            ACL_ERROR_RT_NO_PERMISSION, ACL_ERROR_RT_OVER_LIMIT, ACL_ERROR_RT_PARAM_INVALID,
                            ACL_ERROR_RT_TIMEOUT, AclError, InvalidHandleError, InvalidParamError, code_band)
from devices.faults import FAULT_KINDS  # noqa: E402
from devices.health import Condition, HealthCondition, HealthReport  # noqa: E402
from devices.kernel import (MAX_ATTR_ELEMENTS, MAX_TENSOR_DIMS, TensorDesc,  # noqa: E402
                            check_launch_counts)
from devices.submit_order import OpOrder  # noqa: E402
from devices.tasks import (Collective, CopyD2D, ExecGraph, Launch, Memset, Record, Wait, WriteH2D,  # noqa: E402
                           launch_key)

# ---------------------------------------------------------------- services
DMS_SERVICE = dms_pb2.DESCRIPTOR.services_by_name["DeviceManagement"]
RMS_SERVICE = rms_pb2.DESCRIPTOR.services_by_name["ResourceManagement"]
DMS_NAME = DMS_SERVICE.full_name            #: "vnpu.v1.DeviceManagement"
RMS_NAME = RMS_SERVICE.full_name            #: "vnpu.v1.ResourceManagement"

DeviceManagementStub = dms_pb2_grpc.DeviceManagementStub
DeviceManagementServicer = dms_pb2_grpc.DeviceManagementServicer
add_DeviceManagementServicer_to_server = dms_pb2_grpc.add_DeviceManagementServicer_to_server
ResourceManagementStub = rms_pb2_grpc.ResourceManagementStub
ResourceManagementServicer = rms_pb2_grpc.ResourceManagementServicer
add_ResourceManagementServicer_to_server = rms_pb2_grpc.add_ResourceManagementServicer_to_server

dms = dms_pb2      #: message classes of the DMS
rms = rms_pb2      #: message classes of the RMS

INFERENCE_SERVICE = grpc_predict_v2_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
INFERENCE_NAME = INFERENCE_SERVICE.full_name      #: "inference.GRPCInferenceService" (KServe v2, Triton)
GRPCInferenceServiceStub = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub
GRPCInferenceServiceServicer = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceServicer
add_GRPCInferenceServiceServicer_to_server = grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server
inference = grpc_predict_v2_pb2    #: message classes of the Open Inference Protocol

#: the services by the short names the rest of the driver uses ("dms" | "rms")
SERVICES = {"dms": DMS_SERVICE, "rms": RMS_SERVICE}


def rpc_names(service: str) -> list[str]:
    """The methods of ``service`` ("dms" | "rms"), in proto order."""
    return [m.name for m in SERVICES[service].methods]


def rpc_messages(service: str, rpc: str) -> tuple[type, type]:
    """(request class, reply class) of method ``rpc`` of ``service`` (KeyError when it has none such)."""
    m = SERVICES[service].methods_by_name[rpc]
    return message_factory.GetMessageClass(m.input_type), message_factory.GetMessageClass(m.output_type)


def rpc_is_unary(service: str, rpc: str) -> bool:
    """Whether ``rpc`` takes one request and answers one reply (no stream either way)."""
    m = SERVICES[service].methods_by_name[rpc]
    return not (m.client_streaming or m.server_streaming)


def rpc_path(service: str, rpc: str) -> str:
    """The method's path as gRPC names it: ``/vnpu.v1.ResourceManagement/Malloc``."""
    return f"/{SERVICES[service].full_name}/{rpc}"


def json_field(text: str, what: str):
    """The JSON document a string field carries (an empty field: None); one that does not parse is a
    parameter error (InvalidParamError)."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        raise InvalidParamError(f"{what} is not JSON") from None


def message(cls, **fields):
    """A message of ``cls`` with ``fields``; a value a field cannot hold (wrong type, integer out of
    range) is a parameter error (InvalidParamError, ACL_ERROR_RT_PARAM_INVALID)."""
    try:
        return cls(**fields)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidParamError(f"{cls.__name__}: {e}") from None

# ---------------------------------------------------------------- conventions
AUTH_KEY = "authorization"          #: metadata: "Bearer <credential>" (a tenant credential or the cluster token)
CLIENT_KEY = "vnpu-client"          #: metadata: the client (session) within the credential's tenant
WATCH_KEY = "vnpu-watch"            #: initial metadata of an accepted WatchHealth: "lease" or "watch"
DEVICE_KEY = "vnpu-device"          #: metadata (optional): the device id the caller means to reach
ERROR_KEY = "vnpu-error-bin"       #: trailing metadata of a failed call: a serialized ErrorDetail
ACL_CODE_KEY = "vnpu-acl-code"      #: ... and its aclError code as text (for tools that do not decode it)
ANONYMOUS = "anonymous"             #: client id of calls that carry none

CHUNK_BYTES = 2 << 20               #: copy chunk size (H2D client stream, D2H server stream)
MAX_MESSAGE_BYTES = 64 << 20        #: per-message limit, both directions, both ends
SUBMIT_SPLIT_BYTES = 32 << 20       #: a submit batch carrying more inline data goes as several RPCs
SERVER_MAX_WAIT_MS = 60_000         #: the server bounds one synchronize wait (-1 included) to this
MAX_BATCH_OPS = 1 << 16             #: stream ops per Submit / GraphCreate / synchronize (clients split)
CLIENT_WAIT_SLICE_MS = 20_000       #: clients wait "forever" as a loop of waits of this length


def channel_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            # pings only while a call is open (the health watch): a peer that vanished without a FIN
            # (node lost) breaks the stream within ~keepalive_time + timeout
            ("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 0), ("grpc.http2.max_pings_without_data", 0),
            ("grpc.enable_retries", 0)]


def server_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.http2.max_ping_strikes", 0)]


# ---------------------------------------------------------------- errors <-> status
_S = grpc.StatusCode
#: status -> the CANN codes that travel under it
_CODES_BY_STATUS: dict[grpc.StatusCode, tuple[str, ...]] = {
    _S.NOT_FOUND: ("ACL_ERROR_RT_INVALID_HANDLE", "ACL_ERROR_INVALID_RESOURCE_HANDLE",
                   "ACL_ERROR_RT_INVALID_DEVICE_FUNCTION", "ACL_ERROR_OP_NOT_FOUND", "ACL_ERROR_KERNEL_NOT_FOUND",
                   "ACL_ERROR_RT_KERNEL_LOOKUP"),
    _S.DEADLINE_EXCEEDED: ("ACL_ERROR_RT_WAIT_TIMEOUT", "ACL_ERROR_RT_TASK_TIMEOUT", "ACL_ERROR_RT_TIMEOUT",
                           "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT", "ACL_ERROR_RT_EVENT_SYNC_TIMEOUT",
                           "ACL_ERROR_RT_AICORE_TIMEOUT"),
    _S.ABORTED: ("ACL_ERROR_RT_DEVICE_TASK_ABORT", "ACL_ERROR_RT_STREAM_ABORT"),
    _S.UNAVAILABLE: ("ACL_ERROR_RT_NO_DEVICE", "ACL_ERROR_RT_LOST_HEARTBEAT", "ACL_ERROR_RT_SOCKET_CLOSE"),
    _S.PERMISSION_DENIED: ("ACL_ERROR_RT_NO_PERMISSION",),
    _S.UNIMPLEMENTED: ("ACL_ERROR_RT_FEATURE_NOT_SUPPORT", "ACL_ERROR_API_NOT_SUPPORT",
                       "ACL_ERROR_FEATURE_UNSUPPORTED"),
    _S.FAILED_PRECONDITION: ("ACL_ERROR_UNINITIALIZE", "ACL_ERROR_RT_CONTEXT_NULL",
                             "ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID", "ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL",
                             "ACL_ERROR_RT_EVENT_NOT_COMPLETE"),
    _S.DATA_LOSS: ("ACL_ERROR_RT_DEVICE_MEM_ERROR", "ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR"),
}
_STATUS_BY_CODE: dict[int, grpc.StatusCode] = {getattr(errors, name): status
                                               for status, names in _CODES_BY_STATUS.items() for name in names}
#: numbering band (devices.errors.code_band) -> status, for codes the table above does not name
_STATUS_BY_BAND = {1: _S.INVALID_ARGUMENT, 2: _S.RESOURCE_EXHAUSTED, 3: _S.RESOURCE_EXHAUSTED}


def status_for_code(code: int) -> grpc.StatusCode:
    """The gRPC status a CANN code travels under (the code itself rides in the error detail)."""
    st = _STATUS_BY_CODE.get(code)
    return st if st is not None else _STATUS_BY_BAND.get(code_band(code), _S.INTERNAL)


#: CANN code for a failure that arrived without ``vnpu-acl-code`` (raised by gRPC itself).
_CODE_BY_STATUS: dict[grpc.StatusCode, int] = {
    _S.UNAVAILABLE: ACL_ERROR_RT_DEVICE_TASK_ABORT,        # connection refused / reset: device lost
    _S.CANCELLED: ACL_ERROR_RT_DEVICE_TASK_ABORT,          # server shut down under the call
    _S.DEADLINE_EXCEEDED: ACL_ERROR_RT_TIMEOUT,
    _S.UNAUTHENTICATED: ACL_ERROR_RT_NO_PERMISSION,
    _S.PERMISSION_DENIED: ACL_ERROR_RT_NO_PERMISSION,
    _S.RESOURCE_EXHAUSTED: ACL_ERROR_RT_OVER_LIMIT,        # message larger than the limit
    _S.INVALID_ARGUMENT: ACL_ERROR_RT_PARAM_INVALID,
    _S.UNIMPLEMENTED: ACL_ERROR_API_NOT_SUPPORT,
}


def code_for_status(status: grpc.StatusCode) -> int:
    return _CODE_BY_STATUS.get(status, ACL_ERROR_INTERNAL_ERROR)


def error_trailers(code: int, error_class: str = "", hccl_code: int | None = None) -> tuple:
    """The trailing metadata of a failed call: the structured detail and the code as text."""
    detail = status_pb2.ErrorDetail(acl_code=int(code), error_class=error_class)
    if hccl_code is not None:
        detail.hccl_code = int(hccl_code)
    return ((ERROR_KEY, detail.SerializeToString()), (ACL_CODE_KEY, str(int(code))))


def error_trailers_of(e: AclError) -> tuple:
    return error_trailers(e.code, type(e).__name__, getattr(e, "hccl_code", None))


def error_from_trailers(metadata) -> tuple[int, str | None, int | None] | None:
    """``(acl code, exception class, HcclResult or None)`` from a failed call's trailing metadata; None
    when the call failed without them (gRPC itself failed it)."""
    code = None
    for k, v in metadata or ():
        if k == ERROR_KEY:
            d = status_pb2.ErrorDetail.FromString(v)
            return d.acl_code, d.error_class or None, d.hccl_code if d.HasField("hccl_code") else None
        if k == ACL_CODE_KEY:
            code = int(v)
    return None if code is None else (code, None, None)


# ---------------------------------------------------------------- health / info / telemetry
HEALTH_NAMES = ("OK", "Warning", "Alarm", "Critical", "Unknown")
_HEALTH_BY_NAME = {n: i for i, n in enumerate(HEALTH_NAMES)}


def health_to_pb(name: str) -> int:
    return _HEALTH_BY_NAME.get(name, dms_pb2.HEALTH_UNKNOWN)


def health_name(value: int) -> str:
    return HEALTH_NAMES[value] if 0 <= value < len(HEALTH_NAMES) else "Unknown"


_CONDITION_PB = {
    Condition.ECC: dms_pb2.CONDITION_ECC, Condition.LINK_DOWN: dms_pb2.CONDITION_LINK_DOWN,
    Condition.OVERHEAT: dms_pb2.CONDITION_OVERHEAT, Condition.HANG: dms_pb2.CONDITION_HANG,
    Condition.SLOW: dms_pb2.CONDITION_SLOW, Condition.TASK_FAILURES: dms_pb2.CONDITION_TASK_FAILURES,
    Condition.CANARY: dms_pb2.CONDITION_CANARY,
}
_CONDITION_BY_PB = {v: k for k, v in _CONDITION_PB.items()}


def condition_to_pb(c: HealthCondition) -> dict:
    return {"kind": _CONDITION_PB[c.kind], "level": health_to_pb(c.level), "detail": c.detail, "peer": c.peer,
            "value": float(c.value)}


def conditions_from_pb(ms) -> list[HealthCondition]:
    """Conditions of a kind this side does not know (a newer device) are left out."""
    return [HealthCondition(_CONDITION_BY_PB[m.kind], health_name(m.level), m.detail, m.peer, m.value)
            for m in ms if m.kind in _CONDITION_BY_PB]


def health_status_to_pb(report: HealthReport) -> "dms_pb2.HealthStatus":
    return dms_pb2.HealthStatus(health=health_to_pb(report.level), reasons=report.reasons,
                                conditions=[condition_to_pb(c) for c in report.conditions])


def health_report_from_pb(m) -> HealthReport:
    return HealthReport(health_name(m.health), tuple(conditions_from_pb(m.conditions)))


def health_status_from_pb(m) -> tuple[str, list[str]]:
    """``(level, reasons)`` as ``Device.health()`` returns them."""
    return health_name(m.health), list(m.reasons)


def info_to_pb(info, **extra) -> "dms_pb2.DeviceInfo":
    """``devices.device.DeviceInfo`` (+ arena_size, node_address, host_pid, hostname, boot_id)."""
    return dms_pb2.DeviceInfo(device_id=info.device_id, chip=info.chip, short_name=info.short_name,
                              ai_cores=info.ai_cores, vector_cores=info.vector_cores, hbm_total=info.hbm_total,
                              bus_id=info.bus_id, arena_name=info.arena_name, node=info.node, **extra)


def info_from_pb(m) -> dict:
    return {f.name: getattr(m, f.name) for f in m.DESCRIPTOR.fields}


_TELE_FIELDS = [f.name for f in dms_pb2.Telemetry.DESCRIPTOR.fields
                if f.name not in ("health", "extra", "conditions", "holders")]
_TELE_SCALARS = [n for n in _TELE_FIELDS if n != "aicore_util"]
_TELE_KNOWN = frozenset(_TELE_FIELDS) | {"health", "conditions", "holders"}


def telemetry_to_pb(t: dict) -> "dms_pb2.Telemetry":
    """A ``Device.telemetry()`` dict -> message.  Numeric keys the schema lacks go to ``extra``."""
    kw = {n: t[n] for n in _TELE_FIELDS if n in t}
    m = dms_pb2.Telemetry(**kw, conditions=[condition_to_pb(c) for c in t.get("conditions", ())],
                          holders=[dms_pb2.MemoryHolder(**h) for h in t.get("holders", ())])
    if "health" in t:
        m.health = health_to_pb(t["health"])
    for k, v in t.items():
        if k not in _TELE_KNOWN and isinstance(v, (int, float, np.integer, np.floating)) \
                and not isinstance(v, bool):
            m.extra[k] = float(v)
    return m


def telemetry_from_pb(m) -> dict:
    """Message -> the same dict ``Device.telemetry()`` returns (same keys, same types)."""
    d = {n: getattr(m, n) for n in _TELE_SCALARS}
    d["health"] = health_name(m.health)
    d["conditions"] = conditions_from_pb(m.conditions)
    d["aicore_util"] = list(m.aicore_util)
    d["holders"] = [{"tenant": h.tenant, "client": h.client, "hbm_bytes": h.hbm_bytes, "allocations": h.allocations}
                    for h in m.holders]
    d.update(m.extra)
    return d


# ---------------------------------------------------------------- faults
#: InjectFaultRequest fields that carry fault parameters (every one of them is `optional`: presence = given)
FAULT_FIELDS = tuple(f.name for f in dms_pb2.InjectFaultRequest.DESCRIPTOR.fields if f.name != "kind")


def fault_request(kind: str, params: dict) -> "dms_pb2.InjectFaultRequest":
    """``inject_fault(kind, **params)`` -> request (InvalidParamError for a parameter or value the message
    cannot carry; the device checks the rest against devices.faults.FAULT_KINDS)."""
    unknown = sorted(set(params) - set(FAULT_FIELDS))
    if unknown:
        k = FAULT_KINDS.get(kind)
        takes = ", ".join(k.accepts) if k is not None else "its parameters"
        raise InvalidParamError(f"fault {kind!r} takes {takes or 'no parameters'}; not {', '.join(unknown)}")
    try:
        return dms_pb2.InjectFaultRequest(kind=kind, **params)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidParamError(f"fault {kind!r}: {e}") from None


def fault_params(m) -> dict:
    """Request -> the parameters that were given (presence, not value, tells)."""
    return {n: getattr(m, n) for n in FAULT_FIELDS if m.HasField(n)}


# ---------------------------------------------------------------- attrs
# Encoders build plain dicts, which the upb constructor of the enclosing message turns into protobuf in C:
# that is ~2x cheaper than building and then copying nested message objects.
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


def _int_list(vals: list, key: str) -> dict:
    for v in vals:
        if not _INT64_MIN <= v <= _INT64_MAX:
            raise InvalidParamError(f"attr {key!r}: list element {v} does not fit in int64")
    return {"ints": {"values": vals}}


def attr_to_pb(key: str, v) -> dict:
    """An attr value -> the dict form of an ``AttrValue``.  Kinds: int, float, bool, str, None and
    lists/tuples/1-d arrays of ints, floats, bools or strings (numpy scalars are accepted)."""
    t = type(v)
    if t is int:
        if _INT64_MIN <= v <= _INT64_MAX:
            return {"i": v}
        if 0 <= v <= _UINT64_MAX:
            return {"u": v}
        raise InvalidParamError(f"attr {key!r}: integer {v} does not fit in 64 bits")
    if t is float:
        return {"f": v}
    if t is bool:
        return {"b": v}
    if t is str:
        return {"s": v}
    if v is None:
        return {"none": True}
    if t is tuple or t is list or t is np.ndarray:
        if t is np.ndarray and v.ndim != 1:
            raise InvalidParamError(f"attr {key!r}: only 1-d arrays can be attributes")
        vals = v.tolist() if t is np.ndarray else list(v)
        if len(vals) > MAX_ATTR_ELEMENTS:
            raise InvalidParamError(f"attr {key!r} holds {len(vals)} elements; at most {MAX_ATTR_ELEMENTS}")
        kinds = set(map(type, vals))
        if not kinds or kinds == {int}:
            return _int_list(vals, key)
        if kinds <= {int, float}:
            return {"floats": {"values": vals}}
        if kinds == {bool}:
            return {"bools": {"values": vals}}
        if kinds == {str}:
            return {"strings": {"values": vals}}
        if any(isinstance(x, np.generic) for x in vals):
            return attr_to_pb(key, [x.item() if isinstance(x, np.generic) else x for x in vals])
        raise InvalidParamError(f"attr {key!r}: unsupported list element types "
                                f"{sorted(k.__name__ for k in kinds)}")
    if isinstance(v, np.generic):
        return attr_to_pb(key, v.item())
    for base in (bool, int, float, str):     # subclasses (IntEnum, ...)
        if isinstance(v, base):
            return attr_to_pb(key, base(v))
    raise InvalidParamError(f"attr {key!r}: unsupported value type {t.__name__}")


def _list(values) -> tuple:
    if len(values) > MAX_ATTR_ELEMENTS:
        raise InvalidParamError(f"an attribute holds {len(values)} elements; at most {MAX_ATTR_ELEMENTS}")
    return tuple(values)


_ATTR_DECODE = {
    "i": lambda a: a.i, "f": lambda a: a.f, "b": lambda a: a.b, "s": lambda a: a.s, "u": lambda a: a.u,
    "ints": lambda a: _list(a.ints.values), "floats": lambda a: _list(a.floats.values),
    "bools": lambda a: _list(a.bools.values), "strings": lambda a: _list(a.strings.values),
    "none": lambda a: None, None: lambda a: None,
}


def attr_from_pb(a):
    """``AttrValue`` -> Python (lists come back as tuples)."""
    return _ATTR_DECODE[a.WhichOneof("value")](a)


# ---------------------------------------------------------------- stream ops
def _launch_to_pb(op: Launch) -> dict:
    attrs = op.attrs
    check_launch_counts(len(op.inputs) + len(op.outputs), len(attrs) if attrs else 0)
    for d in op.inputs + op.outputs:
        if len(getattr(d, "shape", ())) > MAX_TENSOR_DIMS:
            raise InvalidParamError(f"a tensor has at most {MAX_TENSOR_DIMS} dimensions, not {len(d.shape)}")
    launch = {"kernel": op.kernel,
              "inputs": [{"ptr": d.ptr, "shape": d.shape, "dtype": d.dtype} for d in op.inputs],
              "outputs": [{"ptr": d.ptr, "shape": d.shape, "dtype": d.dtype} for d in op.outputs],
              "block_dim": op.block_dim}
    if attrs:
        launch["attrs"] = {k: attr_to_pb(k, v) for k, v in attrs.items()}
    return {"stream": op.stream, "launch": launch}


_ENCODE = {
    Launch: _launch_to_pb,
    Record: lambda op: {"stream": op.stream, "record": {"event": op.event}},
    Wait: lambda op: {"stream": op.stream, "wait": {"event": op.event, "gen": op.gen}},
    CopyD2D: lambda op: {"stream": op.stream, "copy_d2d": {"dst": op.dst, "src": op.src, "nbytes": op.nbytes}},
    Memset: lambda op: {"stream": op.stream, "memset": {"ptr": op.ptr, "value": op.value, "nbytes": op.nbytes}},
    WriteH2D: lambda op: {"stream": op.stream, "write_h2d": {"dst": op.dst, "data": bytes(op.data)}},
    ExecGraph: lambda op: {"stream": op.stream, "exec_graph": {"graph": op.graph}},
    Collective: lambda op: {"stream": op.stream, "collective": {
        "comm": op.comm, "op": op.op, "send": op.send, "recv": op.recv, "count": op.count, "dtype": op.dtype,
        "redop": op.redop, "root": op.root, "peer": op.peer}},
}


def _op_dict(op) -> dict:
    enc = _ENCODE.get(type(op))
    if enc is None:
        raise InvalidParamError(f"unknown stream op {type(op).__name__}")
    return enc(op)


class LaunchTemplates:
    """Client side of launch templates: a launch seen before travels as ``launch_ref{tid}`` (a few
    bytes) instead of its kernel name, tensors and attributes; decode and validation on the device
    side are then cached too.  ``reset()`` forgets everything (e.g. the server lost its table)."""

    MAX = 1 << 16

    def __init__(self):
        self._tids: dict = {}
        self._ids = itertools.count(1)   # never reused, also across reset(): a message that refers to an id
                                         # whose definition is still on its way is refused (unknown), never misread

    def reset(self) -> None:
        self._tids = {}

    def encode(self, op) -> dict:
        if type(op) is not Launch:
            return _op_dict(op)
        key = launch_key(op)
        if key is None:
            return _op_dict(op)
        tid = self._tids.get(key)
        if tid is not None:
            return {"stream": op.stream, "launch_ref": {"tid": tid}}
        if len(self._tids) >= self.MAX:
            return _op_dict(op)
        tid = self._tids[key] = next(self._ids)
        d = _launch_to_pb(op)
        d["launch"]["tid"] = tid
        return d


class TemplateTable:
    """Server side: per-client templates (bounded by the client's own numbering)."""

    def __init__(self):
        self._by_owner: dict = {}

    def decode(self, ms, owner) -> list:
        """Decode a batch, resolving references; an unknown reference fails the whole batch before
        anything is queued (ACL_ERROR_RT_INVALID_DEVICE_FUNCTION: the client resends in full).  A batch
        or a launch beyond the limits (:data:`MAX_BATCH_OPS`, ``devices.kernel.MAX_*``) is refused before
        any of it is decoded."""
        if len(ms) > MAX_BATCH_OPS:
            raise InvalidParamError(f"a batch holds at most {MAX_BATCH_OPS} stream ops, not {len(ms)}")
        table = self._by_owner.setdefault(owner, {})
        out = []
        for m in ms:
            which = m.WhichOneof("op")
            if which == "launch_ref":
                t = table.get(m.launch_ref.tid)
                if t is None:
                    raise InvalidHandleError(f"unknown launch template {m.launch_ref.tid}",
                                             code=ACL_ERROR_RT_INVALID_DEVICE_FUNCTION)
                out.append(Launch(m.stream, t.kernel, t.inputs, t.outputs, t.attrs, t.block_dim))
                continue
            op = op_from_pb(m)
            if which == "launch" and m.launch.tid:
                if len(table) >= LaunchTemplates.MAX:
                    table.clear()
                table[m.launch.tid] = op
            out.append(op)
        return out

    def drop(self, owner) -> None:
        self._by_owner.pop(owner, None)


def is_unknown_template(e: AclError) -> bool:
    """Whether a submit failed because the device does not hold a launch template this client used (it
    restarted or dropped the client's templates): the client then resends the launches in full."""
    return e.code == ACL_ERROR_RT_INVALID_DEVICE_FUNCTION


def submit_request(ops, templates: LaunchTemplates | None = None, plain: int = 0) -> "rms_pb2.SubmitRequest":
    """A batch of :mod:`devices.tasks` ops -> ``SubmitRequest`` (the one encoder of stream ops); the first
    ``plain`` ops in full, never as template references (ops carried for another thread's wait: the
    templates they would refer to may still be on their way in that wait's message).  Malformed ops (wrong
    types, out-of-range integers) and launches beyond the limits raise InvalidParamError."""
    if len(ops) > MAX_BATCH_OPS:
        raise InvalidParamError(f"a batch holds at most {MAX_BATCH_OPS} stream ops, not {len(ops)}")
    enc = templates.encode if templates is not None else _op_dict
    try:
        if plain:
            return rms_pb2.SubmitRequest(ops=[_op_dict(op) for op in ops[:plain]] + [enc(op) for op in ops[plain:]])
        return rms_pb2.SubmitRequest(ops=[enc(op) for op in ops])
    except (TypeError, ValueError, OverflowError, AttributeError) as e:
        raise InvalidParamError(f"cannot encode stream ops: {e}") from None


def set_order(msg, order: OpOrder | None) -> None:
    """Number a ``SubmitRequest``'s or ``SynchronizeRequest``'s ops (:mod:`devices.submit_order`)."""
    if order is not None:
        o = msg.order
        o.session = order.session
        o.run_first.extend(f for f, _ in order.runs)
        o.run_count.extend(c for _, c in order.runs)
        o.own_from = order.own_from
        o.run_end.extend(order.ends)


def order_of(msg) -> OpOrder | None:
    """The numbers of a request's ops, or None (queued as sent); malformed runs: InvalidParamError."""
    if not msg.HasField("order"):
        return None
    o = msg.order
    if len(o.run_first) != len(o.run_count):
        raise InvalidParamError("op order: run_first and run_count differ in length")
    return OpOrder(o.session, tuple(zip(o.run_first, o.run_count)), o.own_from, tuple(o.run_end))


def op_to_pb(op) -> "rms_pb2.StreamOp":
    """One op -> ``StreamOp`` message."""
    return submit_request((op,)).ops[0]


def _desc(m, _new=object.__new__, _cls=TensorDesc) -> TensorDesc:
    d = _new(_cls)             # TensorDesc is a frozen dataclass: fill its __dict__ without __init__
    v = d.__dict__
    v["ptr"] = m.ptr
    v["shape"] = tuple(m.shape)
    v["dtype"] = m.dtype
    return d


try:   # the fast path relies on TensorDesc keeping its fields in __dict__; fall back if it ever stops
    _probe = rms_pb2.TensorDesc(ptr=64, shape=[2, 3], dtype="float32")
    if _desc(_probe) != TensorDesc(64, (2, 3), "float32"):
        raise TypeError
except (AttributeError, TypeError):  # pragma: no cover
    def _desc(m) -> TensorDesc:  # noqa: F811
        return TensorDesc(m.ptr, tuple(m.shape), m.dtype)


def desc_from_pb(m) -> TensorDesc:
    return _desc(m)


def _launch_from_pb(s, m):
    ins, outs, attrs = m.inputs, m.outputs, m.attrs
    check_launch_counts(len(ins) + len(outs), len(attrs))        # before decoding any of it
    for d in ins:
        if len(d.shape) > MAX_TENSOR_DIMS:
            raise InvalidParamError(f"a tensor has at most {MAX_TENSOR_DIMS} dimensions, not {len(d.shape)}")
    for d in outs:
        if len(d.shape) > MAX_TENSOR_DIMS:
            raise InvalidParamError(f"a tensor has at most {MAX_TENSOR_DIMS} dimensions, not {len(d.shape)}")
    return Launch(s, m.kernel, tuple(map(_desc, m.inputs)), tuple(map(_desc, m.outputs)),
                  {k: _ATTR_DECODE[a.WhichOneof("value")](a) for k, a in attrs.items()} if attrs else {},
                  m.block_dim)


_DECODE = {
    "launch": lambda s, m: _launch_from_pb(s, m.launch),
    "record": lambda s, m: Record(s, m.record.event),
    "wait": lambda s, m: Wait(s, m.wait.event, m.wait.gen),
    "copy_d2d": lambda s, m: CopyD2D(s, m.copy_d2d.dst, m.copy_d2d.src, m.copy_d2d.nbytes),
    "memset": lambda s, m: Memset(s, m.memset.ptr, m.memset.value, m.memset.nbytes),
    "write_h2d": lambda s, m: WriteH2D(s, m.write_h2d.dst, m.write_h2d.data),
    "exec_graph": lambda s, m: ExecGraph(s, m.exec_graph.graph),
    "collective": lambda s, m: Collective(s, m.collective.comm, m.collective.op, m.collective.send,
                                          m.collective.recv, m.collective.count, m.collective.dtype,
                                          m.collective.redop, m.collective.root, m.collective.peer),
}


def op_from_pb(m):
    """``StreamOp`` -> the :mod:`devices.tasks` op (an empty oneof raises InvalidParamError)."""
    which = m.WhichOneof("op")
    if which is None:
        raise InvalidParamError("stream op without an operation")
    return _DECODE[which](m.stream, m)


def ops_from_pb(ms) -> list:
    return [op_from_pb(m) for m in ms]


def op_wire_bytes(op) -> int:
    """Rough encoded size of an op (to split very large batches under the message limit)."""
    if type(op) is WriteH2D:
        return len(op.data) + 32
    return 256


# ---------------------------------------------------------------- moved ranges (live defragmentation)
def graph_rebind_request(gid: int, moves) -> "rms_pb2.GraphRebindRequest":
    """``(old, new, nbytes)`` triples -> ``GraphRebindRequest`` (bad values: InvalidParamError 107000)."""
    try:
        return rms_pb2.GraphRebindRequest(graph=gid, moves=[{"old": o, "new": n, "nbytes": k} for o, n, k in moves])
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidParamError(f"cannot encode moved ranges: {e}") from None


def moves_from_pb(ms) -> list[tuple[int, int, int]]:
    return [(m.old, m.new, m.nbytes) for m in ms]
