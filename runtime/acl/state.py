"""The acl layer's process state: init count, contexts, streams, events, allocations, function and
model handles, and the calling thread's current context.

pyACL hands out plain ints; this module maps them to :mod:`runtime.api` objects and checks them (an
unknown or destroyed handle is 107017, a stream of another context 107003).  The current context is per
thread (``threading.local``), as in CANN; everything else is shared by the process and guarded by
:attr:`State.lock`.
"""
from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from devices.errors import (ACL_ERROR_RT_CONTEXT_NULL, ACL_ERROR_RT_STREAM_CONTEXT, ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                            ACL_ERROR_UNINITIALIZE, AclError, InvalidHandleError)
from runtime import api

from . import hostmem
from .args import as_int

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


def context_record(handle) -> Context:
    c = STATE.contexts.get(as_int(handle, "context")) if handle is not None else None
    if c is None or not c.alive:
        raise InvalidHandleError(f"unknown or destroyed context {handle!r}")
    return c


# ---------------------------------------------------------------------------------------------- lifecycle
def new_stream(c: Context, priority: int, flags: int, default: bool = False) -> StreamRecord:
    s = c.dev.stream(priority)
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


def release_context(c: Context, timeout_ms: float = -1) -> None:
    """Wait for and destroy every stream and event of a context (and forget it)."""
    with STATE.lock:
        c.alive = False
        STATE.contexts.pop(c.handle, None)
        if STATE.default_ctx.get(c.index) is c:
            del STATE.default_ctx[c.index]
        srecs = [STATE.streams.pop(h) for h in list(c.streams) if h in STATE.streams]
        erecs = [STATE.events.pop(h) for h in list(c.events) if h in STATE.events]
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
    """Release every context, stream, event and allocation made through acl and forget all handles
    (aclFinalize), and close the runtime if acl.init created it; host-blocking, each context's streams
    for up to FINALIZE_SYNC_TIMEOUT_MS."""
    with STATE.lock:
        ctxs = list(STATE.contexts.values())
        allocs = list(STATE.dev_allocs.items())
        rt, owned = STATE.rt, STATE.owns_rt
        STATE.clear()
        STATE.owns_rt = False
        STATE.cv.notify_all()
    for c in ctxs:
        release_context(c, FINALIZE_SYNC_TIMEOUT_MS)
    for ptr, dev in allocs:
        try:
            dev.free(ptr)
        except AclError:
            pass
    hostmem.TABLE.clear(kind="malloc_host")      # acl's host allocations go with it
    if owned and rt is not None:
        if api.current_runtime() is rt:
            api.set_runtime(None)
        try:
            rt.close()
        except AclError:
            log.warning("closing the runtime at finalize failed", exc_info=True)
