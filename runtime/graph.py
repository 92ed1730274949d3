"""Stream capture and replay: CANN's model run instances (``aclmdlRICaptureBegin`` / ``End`` /
``ExecuteAsync``, "aclgraph"), the CUDA-graph equivalent.

Between :meth:`Stream.begin_capture` and :meth:`Stream.end_capture` the ops queued on that stream are
**not executed**: they are validated on the host as usual (a bad launch still raises at once, and
invalidates the capture) and collected.  ``end_capture`` hands them to the device in one call, which
validates and binds them once and returns a :class:`Graph`.  ``graph.execute_async(stream)`` queues the
whole sequence as ONE stream task (only orders the device); ``graph.execute()`` runs it and blocks the
host until it is done.  Replays read whatever the captured buffers hold at the time, so per-step values
(token ids, positions, lengths) go into device memory before each replay.

Rules, as CANN states them (reference 1.10): Begin and End on the same stream, from the same thread
unless the mode is RELAXED; synchronizing or querying a capturing stream fails (107027, and in GLOBAL
mode any device-wide synchronize while a capture is open); unsafe calls on a capturing stream -- host
writes of pageable data, and here also event records and waits -- fail with 107030; a call that fails
while capturing invalidates the capture and ``end_capture`` then raises 507903 and keeps nothing.

Each :class:`runtime.api.Device` keeps its open captures in a :class:`CaptureTable` (the rules above
live there); :class:`runtime.api.Stream` consults it when it enqueues, synchronizes or queries.  This
module imports nothing from :mod:`runtime.api` (the api builds on it).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

from devices.errors import (ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT, ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
                            ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD, ACL_ERROR_RT_STREAM_CAPTURED,
                            ACL_ERROR_RT_STREAM_CONTEXT, ACL_ERROR_RT_STREAM_NOT_CAPTURED, AclError, CaptureError,
                            InvalidHandleError, InvalidParamError)
from devices.graph import PointerMap, remap_ops
from devices.tasks import Collective, CopyD2D, ExecGraph, Launch, Memset

from .profiler import hooks as _prof

#: aclmdlRICaptureMode
CAPTURE_MODE_GLOBAL, CAPTURE_MODE_THREAD_LOCAL, CAPTURE_MODE_RELAXED = 0, 1, 2
#: aclmdlRICaptureStatus
CAPTURE_STATUS_NONE, CAPTURE_STATUS_ACTIVE, CAPTURE_STATUS_INVALIDATED = 0, 1, 2

_CAPTURABLE = (Launch, CopyD2D, Memset, Collective)


@dataclass
class Capture:
    """An open capture of one stream."""
    sid: int
    mode: int
    thread: int
    ops: list = field(default_factory=list)
    error: AclError | None = None          #: the call that invalidated it

    @property
    def status(self) -> int:
        return CAPTURE_STATUS_INVALIDATED if self.error is not None else CAPTURE_STATUS_ACTIVE

    def take(self, op) -> None:
        """Collect ``op`` (what the stream enqueues while capturing)."""
        if self.error is not None:
            raise CaptureError("the capture of this stream was invalidated by an earlier failed call: "
                               f"{self.error}", code=ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED)
        if not isinstance(op, _CAPTURABLE):
            err = CaptureError(f"{type(op).__name__} is not allowed on a capturing stream (capturable: "
                               "kernel launches, D2D copies, memsets, HCCL operators)",
                               code=ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT)
            self.error = err
            raise err
        self.ops.append(op)


class CaptureTable:
    """The open stream captures of one device and the rules CANN sets for them.  A
    :class:`runtime.api.Device` holds one; its streams consult it on every enqueue and synchronize."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._caps: dict[int, Capture] = {}

    def get(self, sid: int) -> Capture | None:
        """The open capture of stream ``sid`` (the enqueue path: cheap when nothing is captured)."""
        return self._caps.get(sid) if self._caps else None

    def begin(self, sid: int, mode: int = CAPTURE_MODE_GLOBAL) -> None:
        """aclmdlRICaptureBegin's checks and bookkeeping: ops of stream ``sid`` are collected from now on."""
        if mode not in (CAPTURE_MODE_GLOBAL, CAPTURE_MODE_THREAD_LOCAL, CAPTURE_MODE_RELAXED):
            raise InvalidParamError(f"capture mode must be 0 (global), 1 (thread local) or 2 (relaxed), "
                                    f"got {mode!r}")
        with self._lock:
            if sid in self._caps:
                raise CaptureError(f"stream {sid} is already capturing", code=ACL_ERROR_RT_STREAM_CAPTURED)
            self._caps[sid] = Capture(sid, int(mode), threading.get_ident())

    def end(self, sid: int) -> Capture:
        """aclmdlRICaptureEnd's checks: close the capture of ``sid`` and hand over what it collected
        (507903 when it was invalidated: nothing is kept)."""
        with self._lock:
            cap = self._caps.get(sid)
            if cap is None:
                raise CaptureError(f"stream {sid} is not capturing", code=ACL_ERROR_RT_STREAM_NOT_CAPTURED)
            if cap.mode != CAPTURE_MODE_RELAXED and cap.thread != threading.get_ident():
                raise CaptureError("capture must end on the thread that began it (mode is not relaxed)",
                                   code=ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD)
            del self._caps[sid]
        if cap.error is not None:
            raise CaptureError(f"capture invalidated: {cap.error}", code=ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED)
        return cap

    def status(self, sid: int) -> int:
        """aclmdlRICaptureGetInfo's status: NONE, ACTIVE or INVALIDATED."""
        cap = self._caps.get(sid)
        return CAPTURE_STATUS_NONE if cap is None else cap.status

    def invalidate(self, sid: int, err: AclError) -> None:
        """A call on stream ``sid`` failed: its open capture (if any) is invalidated by ``err``."""
        cap = self.get(sid)
        if cap is not None and cap.error is None:
            cap.error = err

    def discard(self, sid: int) -> Capture | None:
        """Forget the capture of ``sid`` (its stream is destroyed, or a begin is undone)."""
        with self._lock:
            return self._caps.pop(sid, None)

    def open_streams(self) -> list[int]:
        """The streams that capture now."""
        return sorted(self._caps)

    def discard_all(self) -> int:
        """Forget every open capture; returns how many there were."""
        with self._lock:
            n = len(self._caps)
            self._caps.clear()
            return n

    def check_sync(self, sid: int | None = None) -> None:
        """Refuse a host synchronization that a capture forbids (107027): of stream ``sid`` while it
        captures, or (``sid`` None) device-wide while a GLOBAL capture, or a THREAD_LOCAL one of the
        calling thread, is open."""
        caps = self._caps
        if not caps:
            return
        if sid is not None:
            if sid in caps:
                raise CaptureError(f"stream {sid} is capturing: it cannot be synchronized or queried",
                                   code=ACL_ERROR_RT_STREAM_CAPTURED)
            return
        me = threading.get_ident()
        for cap in list(caps.values()):
            if cap.mode == CAPTURE_MODE_GLOBAL or (cap.mode == CAPTURE_MODE_THREAD_LOCAL and cap.thread == me):
                raise CaptureError(f"stream {cap.sid} of this device is capturing: no device-wide synchronize",
                                   code=ACL_ERROR_RT_STREAM_CAPTURED)


@dataclass
class CaptureScope:
    """What ``with stream.capture() as cap:`` yields; ``cap.graph`` is set when the block ends."""
    graph: "Graph | None" = None


@contextlib.contextmanager
def capture(stream, mode: int = CAPTURE_MODE_GLOBAL):
    """Capture the block's ops on ``stream`` (a :class:`runtime.api.Stream`) into ``cap.graph``.  If the
    block raises, the capture is closed and discarded and the block's own exception propagates."""
    scope = CaptureScope()
    stream.begin_capture(mode)
    try:
        yield scope
    except BaseException:
        try:
            stream.end_capture().destroy()
        except AclError:
            pass                          # invalidated by the failure: nothing was kept
        raise
    scope.graph = stream.end_capture()


class Graph:
    """A captured model run instance on one device (``aclmdlRI``).  It keeps its ops so that live
    defragmentation can re-point them in place (:meth:`rebind`); the device lists it in ``dev.graphs``."""

    def __init__(self, dev, gid: int, ops: tuple):
        self.device = dev
        self.gid = gid
        self.ops = tuple(ops)
        self.num_tasks = len(self.ops)
        self.rebinds = 0
        self._destroyed = False
        self._checked_gen = -1
        dev.graphs.add(self)

    def __repr__(self) -> str:
        return f"<vnpu Graph {self.gid} on device {self.device.index}: {self.num_tasks} tasks>"

    def _live(self) -> None:
        if self._destroyed:
            raise InvalidHandleError(f"graph {self.gid} was destroyed")

    def _ranges(self):
        """The device memory the captured ops touch: (ptr, nbytes) pairs (collectives: their buffers'
        starts only; the device checks their extents)."""
        for op in self.ops:
            if isinstance(op, Launch):
                for d in op.inputs + op.outputs:
                    yield d.ptr, d.nbytes
            elif isinstance(op, CopyD2D):
                yield op.dst, op.nbytes
                yield op.src, op.nbytes
            elif isinstance(op, Memset):
                yield op.ptr, op.nbytes
            elif isinstance(op, Collective):
                for p in (op.send, op.recv):
                    if p:
                        yield p, 0

    def _stale(self) -> AclError | None:
        """A replay must not touch caching-pool memory freed since the capture (the device cannot tell:
        the pool keeps the segment).  Checked on the host whenever the device's memory changed since the
        last check (free or move)."""
        dev = self.device
        gen = dev.allocs.gen
        if gen == self._checked_gen:
            return None
        for ptr, n in self._ranges():
            try:
                dev.check_range(ptr, n)
            except AclError as e:
                return e
        self._checked_gen = gen
        return None

    @_prof.api("Graph.execute_async")
    def execute_async(self, stream) -> None:
        """aclmdlRIExecuteAsync: queue one replay on ``stream`` (returns at once; only orders the device).
        Errors of the replayed ops surface at the stream's next synchronize (also a replay over pool
        memory freed since the capture, which the host catches and does not send)."""
        self._live()
        if stream.device is not self.device:
            raise AclError("graph and stream belong to different devices", code=ACL_ERROR_RT_STREAM_CONTEXT)
        err = self._stale()
        if err is not None:
            self.device.defer_error(type(err)(f"graph {self.gid} replay: {err.detail}", code=err.code))
            return
        stream.enqueue(ExecGraph(stream.sid, self.gid))

    def rebind(self, moves) -> int:
        """Memory moved (``(old, new, nbytes)`` ranges, from :meth:`runtime.api.Device.defragment`):
        re-point the captured ops that use it, here and on the device, in place -- the graph object and
        its id stay, replays queued later use the new addresses.  Host-synchronous; returns 1 if the
        graph changed, else 0."""
        if self._destroyed:
            return 0
        ops, changed = remap_ops(self.ops, PointerMap(moves))
        if not changed:
            return 0
        self.device.flush()
        self.device.handle.graph_rebind(self.gid, list(moves))
        self.ops = ops
        self.rebinds += 1
        return 1

    def execute(self, timeout_ms: float = -1) -> None:
        """aclmdlRIExecute: replay on the device's default stream and block the host until it is done."""
        s = self.device.default_stream
        self.execute_async(s)
        s.synchronize(timeout_ms)

    def info(self) -> dict:
        """aclmdlRIDebugPrint: the graph's tasks as the device holds them."""
        self._live()
        self.device.flush()
        return self.device.handle.graph_info(self.gid)

    def __enter__(self) -> "Graph":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def destroy(self) -> None:
        """aclmdlRIDestroy (replays already queued still run)."""
        if self._destroyed:
            return
        self.device.flush(raise_errors=False)
        self._destroyed = True
        self.device.graphs.discard(self)
        self.device.handle.graph_destroy(self.gid)
