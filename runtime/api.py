"""The Pythonic runtime: Device, Stream, Event, Tensor.  Everything else (acl, jobs, CLI) builds on it.

Launches and stream-ordered copies are queued per device on the host and handed to the backend in
batches (:class:`LaunchQueue`): the host never waits for the device when it launches.  The queue is
flushed when the host synchronizes, reads device memory, queries or waits on an event, or when a batch
fills up; with the in-process backend the batch size is 1 (queuing is already cheap there).

Memory: tensors (:meth:`Device.empty`, :meth:`Device.from_numpy`) come from the device's caching pool
(:mod:`runtime.memory`, configured by ``VNPU_ALLOC_CONF``): they are relocatable handles whose ``ptr`` is
read when work is enqueued, so :meth:`Device.defragment` can move them (and re-bind captured graphs).
``Device.malloc``/``free`` stay raw driver calls (one allocation each, as ``aclrtMalloc``), never moved.

Errors are typed exceptions from :mod:`devices.errors` that carry the CANN code (``e.code``).

Host waits: every call that blocks the host has a deadline.  A wait asked for "until done" (``timeout_ms``
-1, the default of every ``synchronize`` and of :meth:`Tensor.numpy`) lasts at most the runtime's
:attr:`Runtime.sync_timeout_s` (``VNPU_SYNC_TIMEOUT_S``; default a minute more than the HCCL exec timeout,
the longest deadline the device puts on one task, so that a task's own error reaches the host first), then
raises ACL_ERROR_RT_STREAM_SYNC_TIMEOUT (507046; 507047 for an event) -- the work is left running, and a
later wait may still see it finish.
"""
from __future__ import annotations

import contextlib
import math
import os
import secrets
import threading
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from devices import segments
from devices.arena import is_device_ptr, ptr_device
from devices.errors import (ACL_ERROR_RT_STREAM_CAPTURED, ACL_ERROR_RT_STREAM_CONTEXT, ACL_ERROR_UNSUPPORTED_DATA_TYPE,
                            AclError, CaptureError, InvalidDeviceError, InvalidHandleError, InvalidParamError,
                            MemoryAccessError, TimeoutError_, UnsupportedError)
from devices.hccl import DEFAULT_EXEC_TIMEOUT_S
from devices.kernel import DTYPES, TensorDesc, check_launch, lookup
from devices.submit_order import OpOrder
from devices.tasks import CopyD2D, Launch, Memset, Record, Wait, WriteH2D

from . import graph as _graph
from . import sanitize as _sanitize
from . import profiler as _profiler
from .profiler import hooks as _prof
from .backend import Backend, DeviceHandle, create_backend, parse_visible_devices
from .memory import (SHORT, AllocConfig, CachingAllocator, DefragReport, Handle, HandleAllocator, HandleStreamOrder,
                     render_summary)

DTYPES_ITEMSIZE = {name: np.dtype(name).itemsize for name in DTYPES}
#: the longest a host wait asked for "until done" (timeout -1) lasts, in seconds (:attr:`Runtime.sync_timeout_s`)
SYNC_TIMEOUT_ENV = "VNPU_SYNC_TIMEOUT_S"
#: its default: a minute more than the longest deadline the device puts on one task (a collective waiting
#: for its peers, HCCL_EXEC_TIMEOUT), so that the task's own error reaches the host first
DEFAULT_SYNC_TIMEOUT_S = DEFAULT_EXEC_TIMEOUT_S + 60.0


# ---------------------------------------------------------------------------------------------- runtime
class Runtime:
    """The process's view of the devices: a backend plus the ``ASCEND_RT_VISIBLE_DEVICES`` mapping."""

    def __init__(self, backend: Backend, visible: str | None = None, batch_size: int | None = None,
                 sanitizer: "_sanitize.Session | None" = None, sync_timeout_s: float | None = None):
        """``sanitizer``: a :class:`runtime.sanitize.Session` that watches every device of this runtime
        (default: the process's session when ``VNPU_SANITIZE`` asks for one; else none, and nothing is
        watched).  ``sync_timeout_s``: :attr:`sync_timeout_s` (default ``VNPU_SYNC_TIMEOUT_S``, else
        :data:`DEFAULT_SYNC_TIMEOUT_S`); InvalidParamError unless a positive number of seconds."""
        #: the longest a host wait asked for "until done" (timeout -1) lasts, seconds; then it raises
        #: ACL_ERROR_RT_STREAM_SYNC_TIMEOUT / EVENT_SYNC_TIMEOUT (settable, like aclrtSetOpWaitTimeout)
        self.sync_timeout_s = _sync_timeout(sync_timeout_s)
        segments.sweep()              # what SIGKILLed vnpu processes of this user left in /dev/shm (cheap)
        self.backend = backend
        self.sanitizer = sanitizer if sanitizer is not None else _sanitize.from_environment()
        env = visible if visible is not None else os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
        self.physical = parse_visible_devices(env, backend.device_ids())
        default_batch = 1 if backend.name == "local" else 1024
        self.batch_size = batch_size or int(os.environ.get("VNPU_LAUNCH_BATCH", default_batch))
        self._devices: dict[int, Device] = {}
        self._lock = threading.Lock()
        _profiler.from_environment()          # under `vnpu prof` (VNPU_PROF): profile this client

    def device_count(self) -> int:
        return len(self.physical)

    def wait_ms(self, timeout_ms: float) -> float:
        """The deadline, in ms, of a host wait asked for with ``timeout_ms``: a negative one ("until done")
        becomes :attr:`sync_timeout_s`; 0 (poll) and positive ones stay (values that are not numbers are
        left for the backend to refuse)."""
        if isinstance(timeout_ms, (int, float, np.integer, np.floating)) and not isinstance(timeout_ms, bool) \
                and timeout_ms < 0:
            return self.sync_timeout_s * 1000.0
        return timeout_ms

    def device(self, index: int) -> "Device":
        """The device with user (visible) id ``index``."""
        if not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.physical):
            raise InvalidDeviceError(f"device id {index!r} out of range [0, {len(self.physical)})")
        with self._lock:
            d = self._devices.get(index)
            if d is None:
                handle = self.backend.device(self.physical[index])
                if self.sanitizer is not None:
                    handle = self.sanitizer.wrap(handle)
                d = self._devices[index] = Device(self, int(index), handle)
            return d

    def devices(self) -> list["Device"]:
        return [self.device(i) for i in range(self.device_count())]

    def restart_device(self, index: int) -> "Device":
        """Restart device ``index`` through the backend (a lost or sick device comes back empty and
        healthy) and return its new :class:`Device`; the old object stays lost.  UnsupportedError when the
        backend cannot restart devices.  Host-blocking for the restart."""
        restart = getattr(self.backend, "restart", None)
        if restart is None:
            raise UnsupportedError(f"the {self.backend.name} backend cannot restart a device")
        self.device(index)                                   # range check
        with self._lock:
            self._devices.pop(index, None)
        restart(self.physical[index])
        return self.device(index)

    def flush_all(self, raise_for: "Device | None" = None, skip: "Device | None" = None) -> None:
        """Send every device's queued ops (cross-device waits may depend on any of them), but
        ``skip``'s.  Errors of other devices are kept for their own next flush; ``raise_for``'s are
        raised now."""
        for d in list(self._devices.values()):
            if d is not skip:
                d.queue.flush(raise_errors=d is raise_for)

    def close(self) -> None:
        _profiler.runtime_closing(list(self._devices.values()))    # a running profile keeps their records
        for d in list(self._devices.values()):
            d.queue.flush(raise_errors=False)
        for d in list(self._devices.values()):
            d.close_pool()                                # cached pool segments are not the program's leaks
            if self.sanitizer is not None:
                self.sanitizer.release(d.handle)          # leak check: what the program still holds
        self.backend.close()


def _sync_timeout(value: float | None) -> float:
    source = "sync_timeout_s"
    if value is None:
        raw = os.environ.get(SYNC_TIMEOUT_ENV)
        if raw is None:
            return DEFAULT_SYNC_TIMEOUT_S
        source = SYNC_TIMEOUT_ENV
        try:
            value = float(raw)
        except ValueError:
            raise InvalidParamError(f"{SYNC_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidParamError(f"{source} must be a positive number of seconds, got {value!r}")
    return float(value)


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime:
    """The process-wide runtime, created on first use over the backend that ``VNPU_BACKEND`` names
    (default ``local``: in-process devices; ``cluster``: the devices of the running vnpu cluster)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = Runtime(create_backend(os.environ.get("VNPU_BACKEND", "local")))
        return _runtime


def current_runtime() -> Runtime | None:
    """The process-wide runtime if one exists (created by :func:`get_runtime` or installed), else None;
    creates nothing."""
    with _runtime_lock:
        return _runtime


def set_runtime(rt: Runtime | None) -> Runtime | None:
    """Install ``rt`` as the process runtime (tests, jobs); returns the previous one."""
    global _runtime
    with _runtime_lock:
        old, _runtime = _runtime, rt
        return old


@contextlib.contextmanager
def runtime_scope(rt: Runtime):
    """``rt`` is the current runtime inside the block and is closed after it (also on errors)."""
    old = set_runtime(rt)
    try:
        yield rt
    finally:
        set_runtime(old)
        rt.close()


def device_count() -> int:
    return get_runtime().device_count()


def device(index: int = 0) -> "Device":
    return get_runtime().device(index)


# ---------------------------------------------------------------------------------------------- queue
class LaunchQueue:
    """Host-side batch of stream ops for one device.

    A wait takes the queued ops to send them with it (:meth:`take`), numbered; until the wait returns they
    *ride*: the next flush or wait of any other thread first sends them as one numbered Submit, and the
    device queues each number once whichever copy arrives first (:mod:`devices.submit_order`) -- so nothing
    sent later overtakes them, and a query sees what they record.  Nothing rides in a single-threaded
    program when it flushes: a flush's ops go unnumbered, a wait's (numbered) with the wait, one round trip."""

    def __init__(self, handle: DeviceHandle, batch_size: int):
        self.handle = handle
        self.batch_size = max(1, batch_size)
        self._ops: list = []
        self._lock = threading.Lock()
        self._deferred: AclError | None = None    # a failed flush's error, for this device's next flush
        self._session = secrets.randbits(62) + 1  # this queue's numbers, apart from other clients'
        self._numbered = 0                        # the last number given
        self._riding: dict[int, list] = {}        # first number -> ops a wait in progress took
        self.batches_sent = 0
        self.ops_sent = 0

    def put(self, op) -> None:
        prof = _prof.ACTIVE
        if prof is not None:
            prof.op(self, op)                 # the profiler's flow (runtime.profiler)
        if self.batch_size == 1:
            t0 = _now() if prof is not None else 0.0
            self.handle.submit((op,))
            if prof is not None:
                prof.submit(self.handle.id, 1, t0, _now())
            self.batches_sent += 1
            self.ops_sent += 1
            return
        with self._lock:
            self._ops.append(op)
            full = len(self._ops) >= self.batch_size
        if full:
            self.flush()

    def defer(self, err: AclError) -> None:
        """Report ``err`` at this device's next flush (an asynchronous error found on the host)."""
        with self._lock:
            self._deferred = self._deferred or err

    def take(self) -> "Ride | None":
        """The queued ops, numbered, handed over for a wait to send (counted as one batch); None when there
        are none.  Ops riding on other threads' waits are sent first (:meth:`_send_riding`), so a wait's
        message holds only its own.  A deferred error of an earlier flush is raised instead (after sending
        them).  The caller hands the ride back to :meth:`landed` when the wait returns or fails."""
        with self._lock:
            if self._deferred is None:
                self._send_riding()
                ops, self._ops = self._ops, []
                if not ops:
                    return None
                first = self._numbered + 1
                self._numbered += len(ops)
                self._riding[first] = ops
                self.batches_sent += 1
                self.ops_sent += len(ops)
                return Ride(ops, OpOrder(self._session, ((first, len(ops)),), own_from=first))
        self.flush()
        return None

    def landed(self, ride: "Ride") -> None:
        """The wait that took ``ride`` has returned or failed: its ops ride no longer (a failed wait's ops
        may or may not have reached the device, as for any failed call)."""
        with self._lock:
            self._riding.pop(ride.order.runs[0][0], None)

    def _send_riding(self) -> None:
        """Lock held: send the ops riding on waits in progress as one numbered Submit (host-blocking for the
        hand-over, in full: no launch-template references); delivered, they ride no longer.  Their errors are
        their waits' to report, not this caller's: the device keeps a carried op's validation error for its
        wait's own copy; a send that fails here (a lost device, an op that cannot be encoded) leaves them
        riding, and the wait's own copy still arrives or fails on its own."""
        if not self._riding:
            return
        ops: list = []
        runs: list[tuple[int, int]] = []
        for first, batch in self._riding.items():
            ops.extend(batch)
            runs.append((first, len(batch)))
        try:
            self.handle.submit(ops, order=OpOrder(self._session, tuple(runs)))
        except AclError:
            return
        self._riding.clear()

    def flush(self, raise_errors: bool = True) -> None:
        """Send the queued ops, behind the ops riding on other threads' waits (host-blocking for the hand-over,
        under this queue's lock: another thread's flush waits for it; only orders the device)."""
        with self._lock:
            self._send_riding()
            ops, self._ops = self._ops, []
            err, self._deferred = (self._deferred, None) if raise_errors else (None, self._deferred)
            if ops:
                prof = _prof.ACTIVE
                t0 = _now() if prof is not None else 0.0
                try:
                    self.handle.submit(ops)
                    if prof is not None:
                        prof.submit(self.handle.id, len(ops), t0, _now())
                except AclError as e:
                    if not raise_errors:
                        self._deferred = self._deferred or e
                        return
                    err = err or e
                finally:
                    self.batches_sent += 1
                    self.ops_sent += len(ops)
        if err is not None:
            raise err


@dataclass(frozen=True)
class Ride:
    """Ops a wait takes along (:meth:`LaunchQueue.take`), numbered by ``order``."""
    ops: list
    order: OpOrder


# ---------------------------------------------------------------------------------------------- host stats
@dataclass
class HostStats:
    """Where the host's time went for one device (seconds): queuing launches, uploads, waiting for
    the device, downloads.  Cheap counters (two clock reads per call) for the overhead breakdowns."""
    launches: int = 0
    launch_s: float = 0.0
    h2d_s: float = 0.0
    d2h_s: float = 0.0
    sync_s: float = 0.0

    def snapshot(self) -> "HostStats":
        return HostStats(self.launches, self.launch_s, self.h2d_s, self.d2h_s, self.sync_s)

    def since(self, before: "HostStats") -> "HostStats":
        return HostStats(self.launches - before.launches, self.launch_s - before.launch_s,
                         self.h2d_s - before.h2d_s, self.d2h_s - before.d2h_s, self.sync_s - before.sync_s)


_now = __import__("time").perf_counter


# ---------------------------------------------------------------------------------------------- memory table
class AllocTable:
    """Host-side mirror of the allocations made through this runtime, so that a launch whose tensor
    overruns its allocation, or names memory freed through this runtime (use after free), fails at launch
    time even when launches are batched (the device checks again when the batch arrives; pointers the
    table does not know are left to the device).  Raw allocations are listed here, and their freed
    ranges are remembered until this runtime allocates over them again (at most :attr:`MAX_FREED` of
    them; older ones are left to the device); memory of the device's caching pool is checked by the pool
    (``pool``), block by block (the device only sees the pool's segments)."""

    MAX_FREED = 1 << 14

    def __init__(self):
        import bisect
        self._bisect = bisect
        self._starts: list[int] = []
        self._sizes: dict[int, int] = {}
        self._freed_starts: list[int] = []
        self._freed: dict[int, int] = {}
        self._lock = threading.Lock()
        self._gen = 0
        self.pool: CachingAllocator | None = None

    @property
    def gen(self) -> int:
        """Changes on every free (raw or pool) and move: cached launch checks are good while unchanged."""
        pool = self.pool
        return self._gen + (pool.gen if pool is not None else 0)

    def add(self, ptr: int, size: int) -> None:
        with self._lock:
            # live ranges under it were freed behind this table's back (a device reset, another path): gone
            self._gen += self._drop_overlapping(self._starts, self._sizes, ptr, size)
            self._bisect.insort(self._starts, ptr)
            self._sizes[ptr] = size
            # freed ranges under the new allocation are live again
            self._drop_overlapping(self._freed_starts, self._freed, ptr, size)

    def _drop_overlapping(self, starts: list[int], sizes: dict[int, int], ptr: int, size: int) -> int:
        """Lock held: remove the ranges of ``starts``/``sizes`` that overlap [ptr, ptr + size); how many."""
        n = 0
        i = max(0, self._bisect.bisect_right(starts, ptr) - 1)
        while i < len(starts) and starts[i] < ptr + size:
            if starts[i] + sizes[starts[i]] > ptr:
                del sizes[starts[i]]
                del starts[i]
                n += 1
            else:
                i += 1
        return n

    def remove(self, ptr: int) -> int | None:
        """Forget the live allocation at ``ptr`` (remembered as freed); returns its size (None: not this
        table's)."""
        with self._lock:
            size = self._sizes.pop(ptr, None)
            if size is not None:
                del self._starts[self._bisect.bisect_left(self._starts, ptr)]
                if len(self._freed) >= self.MAX_FREED:
                    self._freed_starts.clear()
                    self._freed.clear()
                self._bisect.insort(self._freed_starts, ptr)
                self._freed[ptr] = size
            self._gen += 1
            return size

    def check(self, ptr: int, nbytes: int) -> None:
        """Raise MemoryAccessError (107000) for a range that overruns an allocation of this table or of
        the caching pool, or starts in memory freed through either; anything else is left to the device."""
        pool = self.pool
        if pool is not None and pool.check(ptr, nbytes):
            return
        with self._lock:
            i = self._bisect.bisect_right(self._starts, ptr) - 1
            start = self._starts[i] if i >= 0 else None
            size = self._sizes[start] if start is not None else 0
            j = self._bisect.bisect_right(self._freed_starts, ptr) - 1
            freed = (self._freed_starts[j], self._freed[self._freed_starts[j]]) if j >= 0 else None
        if start is not None and ptr < start + size:
            if ptr + nbytes > start + size:
                raise MemoryAccessError(f"access of {nbytes} B at 0x{ptr:x} overruns its allocation ({size} B at "
                                        f"0x{start:x}, {start + size - ptr} B left)")
            return
        if freed is not None and ptr < freed[0] + freed[1]:
            raise MemoryAccessError(f"0x{ptr:x} points to freed memory (use after free of the {freed[1]} B "
                                    f"allocation at 0x{freed[0]:x})")


# ---------------------------------------------------------------------------------------------- device
class Device:
    """One visible device.  Use :func:`device` to get it.

    Its public surface is what the runtime's siblings (graph capture, HCCL, the acl layer, models,
    tools) build on: streams, events, memory (``malloc``/``free``, host-synchronous ``memcpy_*`` and
    ``memset`` by pointer, :meth:`check_range`), :meth:`flush`, :meth:`synchronize`, health and
    :attr:`handle` -- the backend's :class:`~runtime.backend.DeviceHandle` (HCCL communicators, graphs).
    """

    def __init__(self, rt: Runtime, index: int, handle: DeviceHandle):
        self.rt = rt
        self.index = index
        self.handle = handle
        self.physical_id = handle.id
        self.queue = LaunchQueue(handle, rt.batch_size)
        self.allocs = AllocTable()
        self.checked: dict = {}               # launches validated here (host side), see Stream.launch
        self.host_stats = HostStats()
        self.live_streams: set[int] = set()   # handles created through this runtime: batched ops that
        self.live_events: set[int] = set()    # name unknown ones fail at enqueue, not at the next flush
        #: the open stream captures (aclmdlRI): its streams consult it (collect, invalidate, end, status)
        self.captures = _graph.CaptureTable()
        self.sanitizer = rt.sanitizer         # sees every op enqueued here (None: nothing is watched)
        #: streams with work queued since the host last saw them idle (the pool's fence hint)
        self.busy_streams: set[int] = set()
        #: captured graphs of this device (re-bound when defragmentation moves memory they use)
        self.graphs: "weakref.WeakSet[_graph.Graph]" = weakref.WeakSet()
        self._default: Stream | None = None
        self._pool: CachingAllocator | None = None
        self._lock = threading.Lock()
        _prof.note_device(self)               # a running profile attaches it (runtime.profiler)

    def __repr__(self) -> str:
        return f"<vnpu Device {self.index} (physical {self.physical_id})>"

    @property
    def default_stream(self) -> "Stream":
        with self._lock:
            if self._default is None:
                self._default = Stream(self, self.handle.create_stream(0), 0, default=True)
                self.live_streams.add(self._default.sid)
                if self.sanitizer is not None:
                    self.sanitizer.internal_stream(self.handle, self._default.sid)
            return self._default

    def stream(self, priority: int = 0) -> "Stream":
        s = Stream(self, self.handle.create_stream(priority), priority)
        self.live_streams.add(s.sid)
        return s

    def event(self, flags: int = 0) -> "Event":
        e = Event(self, self.handle.create_event(flags), flags)
        self.live_events.add(e.eid)
        return e

    @_prof.api("Device.malloc")
    def malloc(self, nbytes: int, policy: int = 0) -> int:
        """One raw driver allocation (``aclrtMalloc``; host-synchronous): not from the pool, never moved."""
        ptr = self.handle.malloc(nbytes, policy)
        self.allocs.add(ptr, int(nbytes))
        return ptr

    @_prof.api("Device.free")
    def free(self, ptr: int) -> None:
        """Free a raw allocation of :meth:`malloc` (after sending queued ops; does not wait for them to
        run).  Pool memory is freed through its Tensor."""
        pool = self._pool
        if pool is not None and isinstance(ptr, int) and pool.owns(ptr):
            raise InvalidParamError(f"0x{ptr:x} is memory of the caching pool (a Tensor's), not a raw allocation: "
                                    "free the Tensor")
        self.queue.flush()
        size = self.allocs.remove(ptr)          # first: once the device has it back, another thread's malloc
        try:                                    # may get the same address, and its entry must stay
            self.handle.free(ptr)
        except BaseException:
            if size is not None:
                self.allocs.add(ptr, size)      # refused: still allocated
            raise

    # -------------------------------------------------------------- pointer-level memory (host-synchronous)
    # Like aclrtMemcpy / aclrtMemset: the ops queued so far are sent first, but the streams are NOT
    # waited for -- synchronize the stream that produces (or still reads) the memory.
    @_prof.api("Device.memcpy_h2d", info=_prof.h2d_info)
    def memcpy_h2d(self, dst: int, data) -> None:
        """Copy host bytes (bytes, memoryview or an array, all of it) to device memory at ``dst``; blocks
        the host until the bytes are on the device."""
        self.queue.flush()
        t0 = _now()
        self.handle.memcpy_h2d(int(dst), data)
        self.host_stats.h2d_s += _now() - t0

    @_prof.api("Device.memcpy_d2h", info=_prof.d2h_info)
    def memcpy_d2h(self, src: int, nbytes: int, out: np.ndarray | None = None) -> np.ndarray:
        """``nbytes`` of device memory at ``src`` as a new uint8 array, or copied into ``out`` (a
        writable C-contiguous array of exactly ``nbytes`` bytes, returned).  Blocks the host."""
        nbytes = int(nbytes)
        if out is not None and not (isinstance(out, np.ndarray) and out.flags.c_contiguous
                                    and out.flags.writeable and out.nbytes == nbytes):
            raise InvalidParamError(f"memcpy_d2h: out must be a writable C-contiguous array of {nbytes} B")
        self.queue.flush()
        t0 = _now()
        res = self.handle.memcpy_d2h(int(src), nbytes, out=None if out is None else out.reshape(-1).view(np.uint8))
        self.host_stats.d2h_s += _now() - t0
        return res if out is None else out

    @_prof.api("Device.memcpy_d2d", info=_prof.sized_info)
    def memcpy_d2d(self, dst: int, src: int, nbytes: int) -> None:
        """Copy ``nbytes`` within this device's memory now (the stream-ordered form is
        :meth:`Stream.copy`)."""
        self.queue.flush()
        self.handle.memcpy_d2d(int(dst), int(src), int(nbytes))

    @_prof.api("Device.memset", info=_prof.sized_info)
    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        """Set ``nbytes`` at ``ptr`` to ``value & 0xFF`` now (the stream-ordered form is
        :meth:`Stream.memset`)."""
        self.queue.flush()
        self.handle.memset(int(ptr), int(value), int(nbytes))

    def check_range(self, ptr: int, nbytes: int) -> None:
        """Raise the CANN error (MemoryAccessError, 107000) when ``[ptr, ptr + nbytes)`` runs past the end
        of an allocation made through this runtime or lies in memory freed through it; pointers it did not
        allocate are left to the device (which checks everything again when the op arrives).  Host-only,
        never blocks."""
        self.allocs.check(int(ptr), int(nbytes))

    @property
    def alloc_gen(self) -> int:
        """Bumped by every free through this runtime: host-side range checks made while it had one value
        still hold while it keeps it (launch checks and graph replays cache on it)."""
        return self.allocs.gen

    def flush(self, raise_errors: bool = True) -> None:
        """Send this device's queued ops now (only orders the device; the host waits only for the
        hand-over).  A send that fails raises its error here, or with ``raise_errors=False`` keeps it
        for this device's next flush or synchronize."""
        self.queue.flush(raise_errors=raise_errors)

    def defer_error(self, err: AclError) -> None:
        """Raise ``err`` at this device's next flush or synchronize (an asynchronous error the host
        found itself, e.g. a graph replay over freed pool memory that it did not send)."""
        self.queue.defer(err)

    # -------------------------------------------------------------- the caching pool
    @property
    def pool(self) -> CachingAllocator:
        """This device's caching allocator (created on first use, configured by ``VNPU_ALLOC_CONF``; under
        a sanitizer it does not cache: every tensor is a driver allocation of its own, freed at once)."""
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    order = HandleStreamOrder(self.handle, put=self.queue.put,
                                              flush=lambda: self.queue.flush(raise_errors=False),
                                              wait_ms=self.rt.wait_ms)
                    cfg = AllocConfig.from_env()
                    if self.sanitizer is not None:      # it must see every tensor's bounds and free, as
                        cfg = replace(cfg, caching=False)   # compute-sanitizer runs with PyTorch's caching off
                    self._pool = CachingAllocator(HandleAllocator(self.handle), order, cfg,
                                                  device=self.index, quiet=self._stream_quiet)
                    self.allocs.pool = self._pool
                pool = self._pool
        return pool

    @property
    def relocations(self) -> int:
        """How many defragmentations moved this device's pool memory (cached descriptors are stale when it
        changes; tensors themselves always know where they are)."""
        pool = self._pool
        return pool.relocations if pool is not None else 0

    def _stream_quiet(self, sid: int) -> bool:
        """Nothing was queued on ``sid`` since the host last saw it idle (a stream or device synchronize)."""
        return sid not in self.busy_streams

    def stream_destroyed(self, sid: int) -> None:
        """Stream ``sid`` is gone: the pool stops ordering against it."""
        self.live_streams.discard(sid)
        self.busy_streams.discard(sid)
        if self._pool is not None:
            self._pool.stream_destroyed(sid)

    def alloc(self, nbytes: int, stream: "Stream | None" = None, lifetime: str = SHORT,
              pinned: bool = False) -> Handle:
        """A block of the caching pool for work on ``stream`` (default: the default stream).
        ``lifetime``: "short" (activations) or "long" (weights, KV caches: packed at the top of HBM);
        ``pinned``: never moved by :meth:`defragment`.  Returns at once unless the pool must call the
        driver (an RPC on the cluster backend)."""
        s = stream if stream is not None else (self._default or self.default_stream)
        if s.__class__ is not Stream or s.device is not self:
            raise InvalidParamError(f"{s!r} is not a stream of {self!r}")
        return (self._pool or self.pool).malloc(nbytes, s.sid, lifetime, pinned)

    def empty(self, shape: Sequence[int], dtype="float32", *, stream: "Stream | None" = None,
              lifetime: str = SHORT, pinned: bool = False) -> "Tensor":
        """An uninitialised tensor from the caching pool (see :meth:`alloc`)."""
        shape = _shape(shape)
        dt = _dtype(dtype)
        n = DTYPES_ITEMSIZE[dt]
        for x in shape:
            n *= x
        return Tensor(self, None, shape, dt, owned=True, handle=self.alloc(max(1, n), stream, lifetime, pinned))

    def from_numpy(self, arr: np.ndarray, *, stream: "Stream | None" = None, lifetime: str = SHORT) -> "Tensor":
        """Allocate from the pool and upload (host-synchronous)."""
        arr = np.ascontiguousarray(arr)
        t = self.empty(arr.shape, arr.dtype.name, stream=stream, lifetime=lifetime)
        try:
            t.copy_from(arr)
        except BaseException:
            t.free()
            raise
        return t

    def memory_stats(self) -> dict:
        """The pool's counters, ``torch.npu.memory_stats()`` keys (``allocated_bytes.all.current`` ...)."""
        return self.pool.memory_stats()

    def memory_summary(self, abbreviated: bool = False) -> str:
        """The pool's counters as a table (``torch.npu.memory_summary()``)."""
        return render_summary(self.pool.memory_stats(), self.index, abbreviated)

    def memory_snapshot(self) -> list[dict]:
        """The pool's segments and blocks (``torch.npu.memory_snapshot()``)."""
        return self.pool.snapshot()

    def memory_allocated(self) -> int:
        return self.pool.memory_stats()["allocated_bytes.all.current"]

    def memory_reserved(self) -> int:
        return self.pool.memory_stats()["reserved_bytes.all.current"]

    def reset_peak_memory_stats(self) -> None:
        self.pool.reset_peak_stats()

    def empty_cache(self, timeout_ms: float = -1) -> int:
        """Give the pool's unused cached segments back to the driver (host-blocking: waits for the work
        queued on their streams; with ``timeout_ms`` >= 0 what is not done by then stays cached; -1 waits
        up to the runtime's :attr:`~Runtime.sync_timeout_s`, then raises ACL_ERROR_RT_EVENT_SYNC_TIMEOUT).
        Returns how many segments went back."""
        return self.pool.empty_cache(timeout_ms) if self._pool is not None else 0

    def defragment(self) -> DefragReport:
        """Live defragmentation: move this runtime's pool blocks so the arena's free space is contiguous.

        Blocks the host for the whole move (the pause in the report): each block's copy is ordered after
        the work queued on the streams that use it (device events), runs device-to-device, never through
        the host, and is waited for; tensors are updated in place (their ``ptr`` changes) and captured
        graphs that use moved memory are re-bound in place.  Pinned tensors, raw ``malloc`` memory
        (``acl.rt.malloc``) and other clients' memory never move.  Refused (107027) while a capture is
        open on the device; other threads must not enqueue work on this device meanwhile."""
        open_caps = self.captures.open_streams()
        if open_caps:
            raise CaptureError(f"cannot defragment {self!r} while stream(s) {open_caps} capture",
                               code=ACL_ERROR_RT_STREAM_CAPTURED)
        return self.pool.defragment(rebind=self._rebind_graphs)

    def _rebind_graphs(self, moves: list[tuple[int, int, int]]) -> int:
        return sum(g.rebind(moves) for g in list(self.graphs))

    def close_pool(self) -> None:
        """Return the pool's cached memory and its events (the runtime closes; live tensors stay)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            self.allocs.pool = None
            try:
                pool.close()
            except AclError:
                pass

    def launch(self, kernel: str, inputs: Sequence["Tensor | TensorDesc"] = (),
               outputs: Sequence["Tensor | TensorDesc"] = (), attrs: dict | None = None, block_dim: int = 0,
               stream: "Stream | None" = None) -> None:
        (stream or self.default_stream).launch(kernel, inputs, outputs, attrs, block_dim)

    def wait_riding(self, wait: Callable[..., None], target: int, timeout_ms: float) -> None:
        """A stream or event wait on this device (``wait``: the handle's ``synchronize_stream`` or
        ``synchronize_event``; blocks the host): other devices' queues flushed first, this device's queued
        ops (counted as one batch, and as a submit in an active profile) travel with the wait -- one round
        trip on a remote device, two when other threads' waits have ops riding -- and ride in front of
        other threads' submissions until it returns (:class:`LaunchQueue`)."""
        self.rt.flush_all(skip=self)
        ride = self.queue.take()
        if ride is None:
            wait(target, timeout_ms)
            return
        prof = _prof.ACTIVE
        if prof is not None:
            now = _now()
            prof.submit(self.physical_id, len(ride.ops), now, now)
        try:
            wait(target, timeout_ms, ops=ride.ops, order=ride.order)
        finally:
            self.queue.landed(ride)

    @_prof.api("Device.synchronize")
    def synchronize(self, timeout_ms: float = -1) -> None:
        """Block the host until all this device's streams are done (-1: up to the runtime's
        :attr:`~Runtime.sync_timeout_s`); raises the first task error, or ACL_ERROR_RT_STREAM_SYNC_TIMEOUT."""
        self.captures.check_sync()
        t0 = _now()
        self.busy_streams.clear()
        try:
            self.rt.flush_all(raise_for=self)
            self.handle.synchronize_device(self.rt.wait_ms(timeout_ms))
        finally:
            self.host_stats.sync_s += _now() - t0

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of HBM."""
        return self.handle.mem_info()

    def telemetry(self) -> dict:
        return self.handle.telemetry()

    def info(self):
        return self.handle.info()

    def health(self) -> tuple[str, list[str]]:
        """(OK | Warning | Alarm | Critical, reasons) as the device reports it."""
        return self.handle.health()

    @property
    def is_lost(self) -> bool:
        """True once the device is known to be gone (lost or killed; an in-process device also once
        closed): it serves no more calls."""
        return self.handle.is_lost

    def abort_captures(self) -> int:
        """End every open stream capture of this device, dropping what they collected (recovery after a
        thread died mid-capture); returns how many there were."""
        return self.captures.discard_all()


# ---------------------------------------------------------------------------------------------- stream
class Stream:
    def __init__(self, dev: Device, sid: int, priority: int, default: bool = False):
        self.device = dev
        self.sid = sid
        self.priority = priority
        self.is_default = default
        self._destroyed = False

    def __repr__(self) -> str:
        return f"<vnpu Stream {self.sid} on device {self.device.index} prio {self.priority}>"

    def _check_live(self) -> None:
        if self._destroyed or self.sid not in self.device.live_streams:
            raise InvalidHandleError(f"unknown stream {self.sid} on device {self.device.index}"
                                     + (" (destroyed)" if self._destroyed else ""))

    def enqueue(self, op) -> None:
        """Queue one stream op (a :mod:`devices.tasks` dataclass whose ``stream`` is this stream): an
        open capture of the stream collects it, else the device's launch queue sends it (batched).
        Only orders the device; the host waits only when a full batch is handed over.  Raises
        InvalidHandleError for a destroyed stream or an event this runtime does not know, CaptureError
        when a capture refuses the op.  The typed methods (:meth:`launch`, :meth:`copy`, ...) validate
        their arguments first and then come here; siblings (graphs, HCCL) enqueue their own ops."""
        dev = self.device
        self._check_live()
        if op.stream != self.sid:
            raise InvalidParamError(f"{type(op).__name__} for stream {op.stream} enqueued on stream {self.sid}")
        ev = getattr(op, "event", None)
        if ev is not None and ev not in dev.live_events:
            raise InvalidHandleError(f"unknown event {ev} on device {dev.index}")
        if dev.sanitizer is not None:
            dev.sanitizer.note_enqueue(op)
        cap = dev.captures.get(self.sid)
        if cap is not None:
            cap.take(op)
            return
        dev.busy_streams.add(self.sid)
        dev.queue.put(op)

    def _failed(self, err: AclError, ranges: tuple = ()) -> None:
        """A call on this stream failed: an open capture of it is invalidated (end_capture -> 507903), and
        a sanitizer reports a refused bad access (``ranges``: the ``(ptr, nbytes)`` the call named)."""
        self.device.captures.invalidate(self.sid, err)
        if self.device.sanitizer is not None:
            self.device.sanitizer.api_error(err, self.device.handle, ranges=ranges)

    # -------------------------------------------------------------- capture (aclmdlRI)
    def begin_capture(self, mode: int = _graph.CAPTURE_MODE_GLOBAL) -> None:
        """aclmdlRICaptureBegin: later ops on this stream are collected into a graph, not run (see
        :mod:`runtime.graph`).  Work queued before is sent to the device first (it stays ahead of any
        replay)."""
        self._check_live()
        caps = self.device.captures
        caps.begin(self.sid, mode)
        try:
            self.device.flush()
        except BaseException:
            caps.discard(self.sid)
            raise

    def end_capture(self) -> "_graph.Graph":
        """aclmdlRICaptureEnd: stop capturing and build the graph on the device (host-synchronous)."""
        cap = self.device.captures.end(self.sid)
        return _graph.Graph(self.device, self.device.handle.graph_create(cap.ops), tuple(cap.ops))

    def capture(self, mode: int = _graph.CAPTURE_MODE_GLOBAL):
        """``with stream.capture() as cap: ...`` -- begin/end around a block; ``cap.graph`` afterwards
        (a block that raises leaves no capture and no graph behind)."""
        return _graph.capture(self, mode)

    def capture_status(self) -> int:
        """0 none, 1 active, 2 invalidated (aclmdlRICaptureStatus)."""
        return self.device.captures.status(self.sid)

    @_prof.api("Stream.launch")
    def launch(self, kernel: str, inputs: Sequence = (), outputs: Sequence = (), attrs: dict | None = None,
               block_dim: int = 0) -> None:
        """Queue a kernel launch (returns at once; only orders the device).  Shapes and dtypes of
        built-in kernels are checked here and bad ones raise InvalidParamError."""
        t0 = _now()
        dev = self.device
        try:
            ins = tuple(_desc(x, dev) for x in inputs)
            outs = tuple(_desc(x, dev) for x in outputs)
            attrs = dict(attrs) if attrs else {}
            k = lookup(kernel)
            key: tuple | None
            try:
                key = (kernel, ins, outs, tuple(sorted(attrs.items())) if attrs else (), block_dim)
                hit = dev.checked.get(key)
            except TypeError:                 # unhashable attrs (lists): no caching
                key = hit = None
            if hit is None or hit[0] != dev.allocs.gen or hit[1] is not k:
                check_launch(k, ins, outs, attrs, block_dim or 1)
                check = dev.allocs.check
                for d in ins + outs:
                    _own_ptr(d.ptr, dev)
                    check(d.ptr, d.nbytes)
                if key is not None:
                    if len(dev.checked) > 8192:
                        dev.checked.clear()
                    dev.checked[key] = (dev.allocs.gen, k)
        except AclError as e:
            self._failed(e, _ranges(inputs, outputs))
            raise
        self.enqueue(Launch(self.sid, kernel, ins, outs, attrs, int(block_dim)))
        hs = dev.host_stats
        hs.launches += 1
        hs.launch_s += _now() - t0

    def record(self, event: "Event") -> None:
        event.record(self)

    def wait(self, event: "Event") -> None:
        """Later tasks on this stream wait for the event's latest record (may be on another stream of
        the same device)."""
        if event.device is not self.device:
            raise UnsupportedError("a stream can only wait on events of its own device "
                                   "(cross-device ordering goes through HCCL)")
        self.enqueue(Wait(self.sid, event.eid, 0))

    @_prof.api("Stream.copy", info=_prof.sized_info)
    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Stream-ordered device-to-device copy on this device."""
        try:
            for p in (dst, src):
                _own_ptr(p, self.device)
                self.device.check_range(p, nbytes)
        except AclError as e:
            self._failed(e, ((dst, nbytes), (src, nbytes)))
            raise
        self.enqueue(CopyD2D(self.sid, int(dst), int(src), int(nbytes)))

    @_prof.api("Stream.memset", info=_prof.sized_info)
    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        """Stream-ordered memset of this device's memory (only orders the device)."""
        try:
            _own_ptr(ptr, self.device)
            self.device.check_range(ptr, nbytes)
        except AclError as e:
            self._failed(e, ((ptr, nbytes),))
            raise
        self.enqueue(Memset(self.sid, int(ptr), int(value), int(nbytes)))

    @_prof.api("Stream.write", info=_prof.write_info)
    def write(self, dst: int, data: bytes) -> None:
        """Stream-ordered host-to-device copy of all of ``data`` (bytes, memoryview or a C-contiguous
        array); the bytes are captured now.  From a pinned buffer (:func:`runtime.hostbuf.pinned_empty`)
        it is an asynchronous copy at pinned bandwidth on the modeled clock."""
        n = data.nbytes if isinstance(data, (np.ndarray, memoryview)) else len(data)
        try:
            _own_ptr(dst, self.device)
            self.device.check_range(dst, n)
        except AclError as e:
            self._failed(e, ((dst, n),))
            raise
        self.enqueue(WriteH2D(self.sid, int(dst), bytes(data)))

    @_prof.api("Stream.synchronize")
    def synchronize(self, timeout_ms: float = -1) -> None:
        """Block the host until all work queued on this stream is done (-1: up to the runtime's
        :attr:`~Runtime.sync_timeout_s`); raises its first task error, or ACL_ERROR_RT_STREAM_SYNC_TIMEOUT."""
        self.device.captures.check_sync(self.sid)
        t0 = _now()
        dev = self.device
        timeout_ms = dev.rt.wait_ms(timeout_ms)
        dev.busy_streams.discard(self.sid)
        try:
            dev.wait_riding(dev.handle.synchronize_stream, self.sid, timeout_ms)
        finally:
            self.device.host_stats.sync_s += _now() - t0

    def query(self) -> bool:
        """True when every queued task has completed."""
        self.device.captures.check_sync(self.sid)
        self.device.queue.flush()
        return self.device.handle.query_stream(self.sid)

    def launch_host_func(self, fn: Callable[[], Any], blocking: bool = True) -> None:
        """Run ``fn`` on a runtime thread once the work queued so far is done; with ``blocking`` the
        stream's later tasks wait for it to return.  Work not done within the runtime's
        :attr:`~Runtime.sync_timeout_s`: ``fn`` is abandoned (not run; ACL_ERROR_RT_STREAM_SYNC_TIMEOUT logged
        by the runtime thread, logger ``vnpu``) and the stream released."""
        callbacks_for(self.device).launch(self, lambda _u: fn(), None, blocking, direct=True)

    def destroy(self) -> None:
        """Waits for the stream's queued work first (up to the runtime's :attr:`~Runtime.sync_timeout_s`:
        then ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, and the stream stays); its task errors go with it."""
        if self.is_default or self._destroyed:
            return
        dev = self.device
        dev.queue.flush(raise_errors=False)
        try:
            dev.handle.synchronize_stream(self.sid, dev.rt.wait_ms(-1))
        except TimeoutError_:
            raise
        except AclError:
            pass                  # the stream's own error goes with it (a lost device fails the destroy)
        dev.captures.discard(self.sid)
        dev.handle.destroy_stream(self.sid)
        self._destroyed = True
        self.device.stream_destroyed(self.sid)


# ---------------------------------------------------------------------------------------------- event
@dataclass(frozen=True)
class Elapsed:
    wall_ms: float
    modeled_ms: float


class Event:
    def __init__(self, dev: Device, eid: int, flags: int = 0):
        self.device = dev
        self.eid = eid
        self.flags = flags

    def record(self, stream: Stream) -> None:
        if stream.device is not self.device:
            raise AclError("event and stream belong to different devices", code=ACL_ERROR_RT_STREAM_CONTEXT)
        stream.enqueue(Record(stream.sid, self.eid))

    @_prof.api("Event.synchronize")
    def synchronize(self, timeout_ms: float = -1) -> None:
        """Block the host until the latest record has completed (-1: up to the runtime's
        :attr:`~Runtime.sync_timeout_s`); ACL_ERROR_RT_EVENT_SYNC_TIMEOUT when it has not by then.  Work
        queued for this device (also work queued after the record) travels with the wait: one round trip
        on a remote device (see :meth:`Device.wait_riding`)."""
        t0 = _now()
        dev = self.device
        try:
            dev.wait_riding(dev.handle.synchronize_event, self.eid, dev.rt.wait_ms(timeout_ms))
        finally:
            dev.host_stats.sync_s += _now() - t0

    def query(self) -> bool:
        """True when the latest record has completed (also when never recorded)."""
        self.device.queue.flush()
        return self.device.handle.query_event(self.eid)

    def elapsed(self, end: "Event") -> Elapsed:
        """Time from this event to ``end`` (both completed), in wall and modeled milliseconds.  Queued
        records are sent first (host-synchronous; does not wait for them)."""
        self.device.queue.flush()
        w, m = self.device.handle.event_elapsed(self.eid, end.eid)
        return Elapsed(w, m)

    def timestamp(self) -> tuple[float, float]:
        return self.device.handle.event_timestamp(self.eid)

    def destroy(self) -> None:
        self.device.queue.flush(raise_errors=False)
        self.device.handle.destroy_event(self.eid)
        self.device.live_events.discard(self.eid)


# ---------------------------------------------------------------------------------------------- tensor
class Tensor:
    """A typed view of device memory.

    Tensors of :meth:`Device.empty` / :meth:`Device.from_numpy` own a block of the device's caching pool
    and are relocatable: ``ptr`` (and ``desc``) are read when work is enqueued and change when
    :meth:`Device.defragment` moves the block (views follow their base).  A tensor made over a raw
    pointer (``Tensor(dev, ptr, shape, dtype)``) never moves.  Descriptors or pointers kept by the caller
    are not updated: take them again after a defragmentation, or :meth:`pin` the tensor."""

    def __init__(self, dev: Device, ptr: int | None, shape: tuple[int, ...], dtype: str, owned: bool = False, *,
                 handle: Handle | None = None, offset: int = 0):
        if handle is None and not isinstance(ptr, (int, np.integer)):
            raise InvalidParamError(f"a tensor needs a device pointer or a pool handle, got {ptr!r}")
        self.device = dev
        self._raw = int(ptr) if handle is None and ptr is not None else 0     # a raw tensor's address
        self._handle = handle
        self._offset = int(offset)
        self.shape = tuple(shape)
        self.dtype = dtype
        self._owned = owned
        self._freed = False
        self._desc: TensorDesc | None = None

    def __repr__(self) -> str:
        return f"<vnpu Tensor {self.shape} {self.dtype} on device {self.device.index} @0x{self.ptr:x}>"

    @property
    def ptr(self) -> int:
        """Where the bytes are now (read it when enqueuing work: defragmentation may move them)."""
        h = self._handle
        return self._raw if h is None else h.ptr + self._offset

    @property
    def desc(self) -> TensorDesc:
        """A launch argument for the tensor as it is now."""
        p = self.ptr
        d = self._desc
        if d is None or d.ptr != p:
            d = self._desc = TensorDesc(p, self.shape, self.dtype)
        return d

    @property
    def handle(self) -> Handle | None:
        """The pool block under the tensor (None for a tensor over a raw pointer)."""
        return self._handle

    @property
    def numel(self) -> int:
        return int(math.prod(self.shape))     # (math.prod: np.prod costs ~10 us a call on a tuple)

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize

    def view(self, shape: Sequence[int], dtype: str | None = None, offset_bytes: int = 0) -> "Tensor":
        """Another tensor over the same memory (no copy, not owned; moves with its base)."""
        shape, dt = _shape(shape), _dtype(dtype or self.dtype)
        if self._handle is not None:
            return Tensor(self.device, None, shape, dt, handle=self._handle, offset=self._offset + offset_bytes)
        return Tensor(self.device, self.ptr + offset_bytes, shape, dt)

    def record_stream(self, stream: Stream) -> None:
        """``stream`` uses this tensor too: when it is freed, its memory is not handed out again before
        the work queued on ``stream`` by then has completed (``torch.Tensor.record_stream``).  Only
        bookkeeping: returns at once."""
        if not isinstance(stream, Stream) or stream.device is not self.device:
            raise InvalidParamError(f"{stream!r} is not a stream of {self.device!r}")
        if self._handle is not None:
            self.device.pool.record_stream(self._handle, stream.sid)

    def pin(self) -> None:
        """Never move this tensor (its address was handed to something defragmentation cannot update)."""
        if self._handle is not None:
            self.device.pool.pin(self._handle)

    def check_access(self, nbytes: int) -> None:
        """Host-side: the pool's block is live and holds ``nbytes`` from this tensor's start."""
        h = self._handle
        if h is None:
            return
        if h.freed:
            raise MemoryAccessError(f"{self!r}: its memory was freed (use after free)")
        if self._offset < 0 or self._offset + nbytes > h.nbytes:
            raise MemoryAccessError(f"access of {nbytes} B at offset {self._offset} overruns the tensor's "
                                    f"{h.nbytes} B allocation at 0x{h.ptr:x}")

    def copy_from(self, arr: np.ndarray) -> None:
        """Host-synchronous upload of ``arr`` (same number of bytes).  Pool memory freed by an earlier
        owner whose stream still had work queued is waited for first."""
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        if arr.nbytes != self.nbytes:
            raise InvalidParamError(f"host array has {arr.nbytes} B, tensor {self.shape} {self.dtype} "
                                    f"has {self.nbytes} B")
        self.check_access(arr.nbytes)
        dev = self.device
        if self._handle is not None:
            dev.flush()
            dev.pool.host_fence(self._handle)
            dev.check_range(self.ptr, arr.nbytes)
        dev.memcpy_h2d(self.ptr, arr)

    def numpy(self, stream: Stream | None = None) -> np.ndarray:
        """Wait for ``stream`` (default: the whole device; up to the runtime's
        :attr:`~Runtime.sync_timeout_s`, then ACL_ERROR_RT_STREAM_SYNC_TIMEOUT), then copy to the host."""
        self.check_access(self.nbytes)
        if stream is not None:
            stream.synchronize()
        else:
            self.device.synchronize()
        if self._handle is not None:
            self.device.check_range(self.ptr, self.nbytes)
        raw = self.device.memcpy_d2h(self.ptr, self.nbytes)
        return raw.view(self.dtype).reshape(self.shape)

    def free(self) -> None:
        """Give the memory back (to the pool: reused at once on its stream; a raw pointer: to the driver)."""
        if self._owned and not self._freed:
            self._freed = True
            if self._handle is not None:
                self.device.pool.free(self._handle)
            else:
                self.device.free(self._raw)


# ---------------------------------------------------------------------------------------------- callbacks
class HostCallbacks:
    """Host callbacks on a device's streams, built from device events.

    ``launch`` records an event after the work queued so far and, when blocking, makes the stream wait
    on a second, host-signalled event.  Callbacks run either in the thread that calls :meth:`process`
    (pyACL's subscribe_report / process_report) or, for ``direct`` ones, on a runtime thread.
    """

    def __init__(self, dev: Device):
        self.dev = dev
        self._cv = threading.Condition()
        self._pending: list[tuple] = []          # (stream, done_eid, gate_eid|None, fn, user_data, direct)
        self._thread: threading.Thread | None = None
        self._stop = False

    def launch(self, stream: Stream, fn, user_data, blocking: bool, direct: bool = False) -> None:
        h = self.dev.handle
        done = h.create_event(0)
        self.dev.live_events.add(done)
        stream.enqueue(Record(stream.sid, done))
        gate = None
        if blocking:
            gate = h.create_event(0)
            self.dev.live_events.add(gate)
            stream.enqueue(Wait(stream.sid, gate, 1))
        self.dev.queue.flush()
        with self._cv:
            self._pending.append((stream, done, gate, fn, user_data, direct))
            self._cv.notify_all()
            if direct and self._thread is None:
                self._thread = threading.Thread(target=self._run_direct, daemon=True,
                                                name=f"vnpu-hostfunc-{self.dev.index}")
                self._thread.start()

    def _take(self, streams: set | None, direct: bool, timeout_s: float | None) -> tuple | None:
        import time
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cv:
            while True:
                for i, item in enumerate(self._pending):
                    if item[5] == direct and (streams is None or item[0].sid in streams):
                        if direct or self.dev.handle.query_event(item[1]):
                            return self._pending.pop(i)
                if self._stop:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                # subscribed callbacks are taken only once their work is done: poll the device
                wait = 1.0 if direct else 0.002
                self._cv.wait(min(left, wait) if left is not None else wait)

    def _fire(self, item: tuple) -> None:
        """Run one callback once the work before it is done.  The runtime thread that runs it waits up to the
        runtime's :attr:`~Runtime.sync_timeout_s` for that work; when it is not done by then the callback is
        abandoned: it does not run, a blocking one's stream is released (its later tasks run when the work
        before them ends), and ACL_ERROR_RT_STREAM_SYNC_TIMEOUT is raised (logged by the runtime thread)."""
        stream, done, gate, fn, user_data, _ = item
        h = self.dev.handle
        abandoned = None
        try:
            h.synchronize_event(done, self.dev.rt.wait_ms(-1))
        except TimeoutError_:
            abandoned = TimeoutError_(f"host callback on stream {stream.sid} abandoned: the work queued before it "
                                      f"was not done within the runtime's sync timeout "
                                      f"({self.dev.rt.sync_timeout_s:g} s)")      # ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
        except AclError:
            pass                                  # the stream failed (or the device is gone): release it
        try:
            if abandoned is not None:
                raise abandoned
            fn(user_data)
        finally:
            if gate is not None:
                h.signal_event(gate, 1)
            h.destroy_event(done)
            self.dev.live_events.discard(done)
            if gate is not None:
                h.destroy_event(gate)
                self.dev.live_events.discard(gate)

    def process(self, streams: set | None, timeout_s: float | None) -> bool:
        """Run one subscribed callback, waiting up to ``timeout_s`` (None: up to the runtime's
        :attr:`~Runtime.sync_timeout_s`); False on timeout.  Blocks the calling host thread."""
        if timeout_s is None:
            timeout_s = self.dev.rt.sync_timeout_s
        item = self._take(streams, False, timeout_s)
        if item is None:
            return False
        self._fire(item)
        return True

    def _run_direct(self) -> None:
        import logging
        while not self._stop:
            item = self._take(None, True, None)
            if item is None:
                return
            try:
                self._fire(item)
            except Exception:  # noqa: BLE001 - a failing (or abandoned) host function must not stop later ones
                logging.getLogger("vnpu").exception("host function failed")


_callbacks: "weakref.WeakKeyDictionary[Device, HostCallbacks]" = weakref.WeakKeyDictionary()
_cb_lock = threading.Lock()


def callbacks_for(dev: Device) -> HostCallbacks:
    with _cb_lock:
        cb = _callbacks.get(dev)
        if cb is None:
            cb = _callbacks[dev] = HostCallbacks(dev)
        return cb


# ---------------------------------------------------------------------------------------------- helpers
def _shape(shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    out = tuple(int(x) for x in shape)
    if any(x < 0 for x in out):
        raise InvalidParamError(f"negative dimension in {out}")
    return out


_DTYPE_NAMES: dict = {}     # dtype argument (hashable) -> checked name: the tensor hot path skips numpy


def _dtype(dtype) -> str:
    try:
        hit = _DTYPE_NAMES.get(dtype)
    except TypeError:
        hit = None
    if hit is not None:
        return hit
    name = _dtype_name(dtype)
    try:
        if len(_DTYPE_NAMES) < 256:
            _DTYPE_NAMES[dtype] = name
    except TypeError:
        pass
    return name


def _dtype_name(dtype) -> str:
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise InvalidParamError(f"unknown dtype {dtype!r}", code=ACL_ERROR_UNSUPPORTED_DATA_TYPE) from None
    if name not in DTYPES:
        raise InvalidParamError(f"unsupported dtype {name!r}", code=ACL_ERROR_UNSUPPORTED_DATA_TYPE)
    return name


def _ranges(*groups) -> tuple:
    """``(ptr, nbytes)`` of the tensors among ``groups`` (what a failed launch named; others skipped)."""
    return tuple((x.ptr, x.nbytes) for g in groups for x in g if isinstance(x, (Tensor, TensorDesc)))


def _own_ptr(ptr: int, dev: Device) -> None:
    """A pointer of another device fails at enqueue (the device would refuse the whole batch)."""
    if is_device_ptr(ptr) and ptr_device(ptr) != dev.physical_id:
        raise MemoryAccessError(f"pointer 0x{ptr:x} belongs to device {ptr_device(ptr)}, not device "
                                f"{dev.physical_id}")


def _desc(x, dev: Device) -> TensorDesc:
    if isinstance(x, Tensor):
        if x.device is not dev and x.device.physical_id != dev.physical_id:
            raise InvalidParamError(f"{x!r} lives on device {x.device.index}, not device {dev.index}")
        x.check_access(x.nbytes)
        return x.desc
    if isinstance(x, TensorDesc):
        return x
    raise InvalidParamError(f"kernel arguments must be Tensors, got {type(x).__name__}")
