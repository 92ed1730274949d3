"""The acl layer's process state: init count, contexts, streams, events, allocations, function and
model handles, the model layer's host objects (loaded models, model descriptions, datasets, data
buffers, tensor descriptions), and the calling thread's current context.

pyACL hands out plain ints; this module maps them to :mod:`runtime.api` / :mod:`runtime.offline` objects
and checks them (an unknown or destroyed runtime handle is 107017, a stream of another context 107003;
an unknown or destroyed model-layer object -- a dangling pointer in C -- is the acl layer's 100000, as
its null-pointer checks answer).  Handles are never reused, so a destroyed one never names a newer
object.  The current context is per thread (``threading.local``), as in CANN; everything else is shared
by the process and guarded by :attr:`State.lock`.
"""
from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from devices.errors import (ACL_ERROR_GE_EXEC_MODEL_ID_INVALID, ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_CONTEXT_NULL,
                            ACL_ERROR_RT_STREAM_CONTEXT, ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, ACL_ERROR_UNINITIALIZE,
                            AclError, InvalidHandleError, ModelError)
from runtime import api, hostmem, sanitize

from ._args import as_int

log = logging.getLogger("vnpu.acl")

#: how long finalize waits for a context's streams before leaving them undestroyed
FINALIZE_SYNC_TIMEOUT_MS = 10_000


@dataclass(eq=False)
class Context:
    handle: int
    dev: api.Device
    index: int                         #: user (visible) device id
    default: bool                      #: the device's default context (from set_device)
    stream: "StreamRecord | None" = None  #: its default stream
    streams: set = field(default_factory=set)   #: handles of every stream created in it
    events: set = field(default_factory=set)
    models: set = field(default_factory=set)    #: ids of the models loaded in it
    op_instances: dict = field(default_factory=dict)  #: single-operator model id -> its OfflineModel here
    alive: bool = True


@dataclass(eq=False)
class StreamRecord:
    handle: int
    ctx: Context
    stream: api.Stream
    priority: int
    flags: int
    default: bool = False
    subscriber: int | None = None      #: thread id from subscribe_report
    async_error: AclError | None = None   #: failure of an async D2H copy, reported at synchronize


@dataclass(eq=False)
class EventRecord:
    handle: int
    ctx: Context
    event: api.Event
    flags: int


@dataclass(eq=False)
class ModelRecord:
    """A model loaded through acl.mdl: its offline model and the context that loaded it (the model goes
    when that context is released, as a context's resources do)."""
    model_id: int
    ctx: Context
    model: Any                         #: runtime.offline.OfflineModel


@dataclass(eq=False)
class ModelDescRecord:
    """aclmdlDesc: empty until get_desc fills it with a snapshot of the model's description."""
    handle: int
    model_id: int | None = None
    desc: Any = None                   #: runtime.offline.ModelDesc


@dataclass(eq=False)
class DataBufferRecord:
    """aclDataBuffer: an address and a size (not owned: destroying the buffer frees nothing)."""
    handle: int
    ptr: int
    size: int


@dataclass(eq=False)
class DatasetRecord:
    """aclmdlDataset: data buffer handles in order, and tensor descriptions set per index."""
    handle: int
    buffers: list = field(default_factory=list)
    tensor_descs: dict = field(default_factory=dict)


@dataclass(eq=False)
class TensorDescRecord:
    """aclTensorDesc: data type, dims (None: unknown rank), format and name."""
    handle: int
    dtype: int
    dims: tuple | None
    format: int
    name: str = ""
    const: bytes | None = None         #: the data of a constant tensor (acl.set_tensor_const)


class State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cv = threading.Condition(self.lock)     # subscriptions changed / finalize
        self.handles = itertools.count(0x1000)
        self.ever_init = False
        self.owns_rt = False               #: acl.init created STATE.rt: teardown closes it
        self.clear()

    def clear(self) -> None:
        self.init_count = 0
        self.rt: api.Runtime | None = None
        self.contexts: dict[int, Context] = {}
        self.streams: dict[int, StreamRecord] = {}
        self.events: dict[int, EventRecord] = {}
        self.dev_refs: dict[int, int] = {}
        self.default_ctx: dict[int, Context] = {}
        self.dev_allocs: dict[int, api.Device] = {}
        self.funcs: dict[int, str] = {}
        self.func_by_name: dict[str, int] = {}
        self.model_ris: dict[int, Any] = {}          # aclmdlRI handle -> runtime.graph.Graph
        self.models: dict[int, ModelRecord] = {}     # model id -> a model loaded through acl.mdl
        self.model_descs: dict[int, ModelDescRecord] = {}
        self.data_buffers: dict[int, DataBufferRecord] = {}
        self.datasets: dict[int, DatasetRecord] = {}
        self.tensor_descs: dict[int, TensorDescRecord] = {}
        self.aipp_sets: dict[int, Any] = {}         # aclmdlAIPP handle -> runtime.acl._aipp.AippSet
        self.op_models: list = []                    # single-operator models (runtime.acl._op.OpModel)
        self.op_attrs: dict[int, Any] = {}           # aclopAttr handle -> runtime.acl._op.AttrSet
        self.op_handles: dict[int, Any] = {}         # aclopHandle -> runtime.acl._op.OpHandle

    @property
    def initialized(self) -> bool:
        return self.init_count > 0

    def new_handle(self) -> int:
        return next(self.handles)


#: the one process state
STATE = State()
_tls = threading.local()        # .ctx: the calling thread's current Context


# ---------------------------------------------------------------------------------------------- lookups
def runtime() -> api.Runtime:
    if STATE.rt is None:
        raise AclError("acl.init() has not been called", code=ACL_ERROR_UNINITIALIZE)
    return STATE.rt


def current_context() -> Context:
    """The calling thread's current context (107002 when it has none)."""
    c = getattr(_tls, "ctx", None)
    if c is None or not c.alive:
        _tls.ctx = None
        raise AclError("the calling thread has no current context: call acl.rt.set_device or "
                       "acl.rt.set_context first", code=ACL_ERROR_RT_CONTEXT_NULL)
    return c


def set_current_context(c: Context | None) -> None:
    _tls.ctx = c


def forget_current_context(c: Context) -> None:
    """The calling thread has no current context any more if it was ``c``."""
    if getattr(_tls, "ctx", None) is c:
        _tls.ctx = None


def stream_record(handle) -> StreamRecord:
    """The stream ``handle`` (0/None: the current context's default stream), checked against the
    calling thread's context."""
    c = current_context()
    if handle is None or handle == 0:
        return c.stream  # type: ignore[return-value]   # set when the context is made
    rec = STATE.streams.get(as_int(handle, "stream"))
    if rec is None:
        raise InvalidHandleError(f"unknown or destroyed stream 0x{int(handle):x}")
    if rec.ctx is not c:
        raise AclError(f"stream 0x{rec.handle:x} belongs to context 0x{rec.ctx.handle:x} (device {rec.ctx.index}),"
                       f" not the current context 0x{c.handle:x} (device {c.index})", code=ACL_ERROR_RT_STREAM_CONTEXT)
    return rec


def event_record(handle) -> EventRecord:
    rec = STATE.events.get(as_int(handle, "event")) if handle is not None else None
    if rec is None:
        raise InvalidHandleError(f"unknown or destroyed event {handle!r}")
    return rec


def model_record(model_id) -> ModelRecord:
    """A model loaded through acl.mdl (145003 ACL_ERROR_GE_EXEC_MODEL_ID_INVALID for an unknown or
    unloaded id, as GE answers)."""
    rec = STATE.models.get(as_int(model_id, "model id"))
    if rec is None:
        raise ModelError(f"no model with id {model_id!r} is loaded", code=ACL_ERROR_GE_EXEC_MODEL_ID_INVALID)
    return rec


def object_record(table: dict, handle, what: str):
    """The model-layer object ``handle`` of ``table`` (100000 for an unknown or destroyed one)."""
    rec = table.get(handle) if isinstance(handle, int) and not isinstance(handle, bool) else None
    if rec is None:
        raise AclError(f"{what} {handle!r} is unknown or was destroyed", code=ACL_ERROR_INVALID_PARAM)
    return rec


def add_object(table: dict, make) -> int:
    """Register a new model-layer object in ``table``: ``make(handle)`` builds its record under a fresh
    handle (while the state lock is held); returns the handle."""
    with STATE.lock:
        rec = make(STATE.new_handle())
        table[rec.handle] = rec
    return rec.handle


def drop_object(table: dict, handle, what: str) -> None:
    """Forget the model-layer object ``handle`` of ``table`` (100000 for an unknown or destroyed one)."""
    with STATE.lock:
        del table[object_record(table, handle, what).handle]


def context_record(handle) -> Context:
    c = STATE.contexts.get(as_int(handle, "context")) if handle is not None else None
    if c is None or not c.alive:
        raise InvalidHandleError(f"unknown or destroyed context {handle!r}")
    return c


# ---------------------------------------------------------------------------------------------- lifecycle
def new_stream(c: Context, priority: int, flags: int, default: bool = False) -> StreamRecord:
    s = c.dev.stream(priority)
    if default and c.dev.sanitizer is not None:        # a context's default stream is acl's own, not a leak
        c.dev.sanitizer.internal_stream(c.dev.handle, s.sid)
    with STATE.lock:
        rec = StreamRecord(STATE.new_handle(), c, s, priority, flags, default)
        STATE.streams[rec.handle] = rec
        c.streams.add(rec.handle)
    return rec


def new_context(dev_index: int, default: bool) -> Context:
    dev = runtime().device(dev_index)          # InvalidDeviceError (107001) for a bad id
    with STATE.lock:
        c = Context(STATE.new_handle(), dev, dev_index, default)
        STATE.contexts[c.handle] = c
    c.stream = new_stream(c, 0, 0, default=True)
    return c


def unload_models(recs) -> None:
    """Unload models (waiting for their queued executions); a failure is logged, not raised."""
    for rec in recs:
        try:
            rec.model.unload()
        except AclError:
            log.warning("unloading model %d failed", rec.model_id, exc_info=True)


def release_context(c: Context, timeout_ms: float = -1, tables: tuple[dict, dict, dict] | None = None) -> None:
    """Unload the context's models, then wait for and destroy its streams and events (and forget it).
    ``tables`` (models, streams, events) are the handle tables to take them from: the live ones of
    :data:`STATE` by default, a snapshot taken before :meth:`State.clear` at finalize."""
    models, streams, events = tables if tables is not None else (STATE.models, STATE.streams, STATE.events)
    with STATE.lock:
        mrecs = [models.pop(m) for m in list(c.models) if m in models]
        c.models.clear()
        ops = list(c.op_instances.values())
        c.op_instances.clear()
    unload_models(mrecs)
    for m in ops:                          # single-operator models run in this context (acl.op)
        try:
            m.unload()
        except AclError:
            log.warning("unloading a single-operator model failed", exc_info=True)
    with STATE.lock:
        c.alive = False
        STATE.contexts.pop(c.handle, None)
        if STATE.default_ctx.get(c.index) is c:
            del STATE.default_ctx[c.index]
        srecs = [streams.pop(h) for h in list(c.streams) if h in streams]
        erecs = [events.pop(h) for h in list(c.events) if h in events]
        c.streams.clear()
        c.events.clear()
        STATE.cv.notify_all()
    for rec in srecs:
        try:
            rec.stream.synchronize(timeout_ms)
        except AclError as e:
            if e.code == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT:
                log.warning("stream 0x%x still busy after %s ms: left undestroyed", rec.handle, timeout_ms)
                continue
        try:
            rec.stream.destroy()
        except AclError:
            pass
    for erec in erecs:
        try:
            erec.event.destroy()
        except AclError:
            pass


def teardown() -> None:
    """Release every context (its models, streams and events) and allocation made through acl and forget
    all handles -- model descriptions, datasets, data buffers and tensor descriptions too (aclFinalize),
    and close the runtime if acl.init created it; host-blocking, each context's streams for up to
    FINALIZE_SYNC_TIMEOUT_MS."""
    with STATE.lock:
        ctxs = list(STATE.contexts.values())
        tables = (dict(STATE.models), dict(STATE.streams), dict(STATE.events))
        allocs = list(STATE.dev_allocs.items())
        rt, owned = STATE.rt, STATE.owns_rt
        hosts = [r.start for r in hostmem.TABLE.live() if r.kind == "malloc_host"]
        STATE.clear()                      # calls from now on see acl uninitialized
        STATE.owns_rt = False
        STATE.cv.notify_all()
    for c in ctxs:
        release_context(c, FINALIZE_SYNC_TIMEOUT_MS, tables)
    unload_models(tables[0].values())      # models of contexts released before (none, normally)
    for ptr, dev in allocs:
        try:
            dev.free(ptr)
        except AclError:
            pass
    hostmem.TABLE.clear(kind="malloc_host")      # acl's host allocations go with it
    san = sanitize.current()
    if san is not None:                                  # finalize released the malloc_host buffers too
        for ptr in hosts:
            san.host_freed(ptr)
    if owned and rt is not None:
        if api.current_runtime() is rt:
            api.set_runtime(None)
        try:
            rt.close()
        except AclError:
            log.warning("closing the runtime at finalize failed", exc_info=True)
