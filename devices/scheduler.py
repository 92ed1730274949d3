"""The task scheduler: streams (FIFO), events, and the AI Core worker threads that run blocks.

Design: one lock and one ready heap per device.  A stream hands at most one task at a time to the heap;
the AI Core workers pop ``(priority, seq)``-ordered blocks, run them outside the lock, and the worker that
finishes a task's last block completes it and advances its stream inline, so a chain of small tasks on one
stream runs back to back on one worker without a thread hand-off.  Event records and waits are resolved
inline while advancing a stream (they take no core).  Smaller priority number = scheduled first; a running
block is never preempted.

Host-side calls (:meth:`Scheduler.enqueue`, ``synchronize_*``) take the lock briefly; only the
``synchronize_*`` calls block the host, and they always take a deadline.

Faults are read from the device's :class:`~devices.faults.FaultState`: a core waits while a ``hang``
holds the cores, a ``slow`` fault stretches each block's wall time and each task's modeled time by its
factor, and ``task-fail`` fails whole tasks (one count per task, whatever its block count).

Streams and events record their owner (:mod:`devices.tenancy`): a handle is usable by its owner's tenant
only, and each tenant's count is held against its quota (``limit``: ACL_ERROR_RT_NO_STREAM_RESOURCE /
ACL_ERROR_RT_NO_EVENT_RESOURCE, as when the device runs out).  Each core publishes since when it runs its
current block (:meth:`Scheduler.longest_running`): a block that never returns is what a hung device looks
like from the outside.
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import (ACL_ERROR_RT_DEVICE_TASK_ABORT, ACL_ERROR_RT_EVENT_NOT_COMPLETE, ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
                     ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID, ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL,
                     ACL_ERROR_RT_NO_DEVICE, ACL_ERROR_RT_NO_EVENT_RESOURCE, ACL_ERROR_RT_NO_STREAM_RESOURCE,
                     ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, AclError, InvalidHandleError, InvalidParamError,
                     KernelError, error_for_code)
from .faults import FaultState
from .tenancy import Usage, same_tenant, tenant_of

#: task kinds that run on a core (records and waits resolve inline and are not "tasks" to a fault)
_CORE_TASKS = ("kernel", "copy")


@dataclass
class Task:
    """One unit of stream work.  ``kind``: kernel | copy | record | wait."""
    kind: str
    blocks: int = 1                                 #: run(b) calls the cores make (b in range(blocks))
    run: Callable[[int], None] | None = None        #: run(block_idx) for kernel/copy tasks
    duration: float = 0.0                           #: modeled seconds
    event: "Event | None" = None
    gen: int = 0
    name: str = ""
    # filled while running
    next_block: int = 0
    done_blocks: int = 0
    error: AclError | None = None
    stream: "Stream | None" = None
    prof: Any = None        #: a devices.profiling.TaskRecord while its owner profiles (else None)
    #: what a task that will not run does instead: ``skip(error)`` once, when its stream skips it (an earlier
    #: task failed) or an injected failure takes its place -- a collective gives its operator up, so that its
    #: peers are not left waiting for this rank.  Must not block (the scheduler's lock may be held).
    skip: Callable[[AclError], None] | None = None
    #: a kernel launch's block_dim as priced by the cost model and reported by the profiler (0: ``blocks``);
    #: a built-in kernel may run as fewer, larger blocks than it is priced at (devices.device.LaunchPlan)
    block_dim: int = 0
    #: the whole launch as one call (built-in kernels), for a runner that would otherwise call ``run`` for
    #: each block one after another on one thread (a graph replay)
    whole: Callable[[], None] | None = None
    #: the launch bound to its views as one block (built-in kernels): its runner, whose ``bare()`` call a graph
    #: replay makes once per replay without the per-call layers of ``whole`` (devices.kernel.KernelRunner)
    one: Callable[[], Any] | None = None


@dataclass
class Stream:
    sid: int
    priority: int
    owner: Any = ""
    queue: deque = field(default_factory=deque)
    running: Task | None = None
    parked_on: "Event | None" = None
    error: AclError | None = None          #: sticky until the host synchronizes
    model_time: float = 0.0                #: modeled device clock of this stream (s)
    tasks_done: int = 0
    submitted: int = 0


@dataclass
class Event:
    eid: int
    flags: int = 0
    owner: Any = ""
    recorded_gen: int = 0                  #: records enqueued so far
    completed_gen: int = 0                 #: highest record number completed (the timestamps are its)
    done_floor: int = 0                    #: every record number <= done_floor has completed
    done_above: set = field(default_factory=set)   #: completed record numbers > done_floor (records on
                                                   #: different streams may complete out of order)
    wall_ts: float | None = None           #: perf_counter() of the last completed record
    model_ts: float | None = None          #: modeled device time of the last completed record
    error: AclError | None = None
    record_stream: int | None = None
    waiters: list = field(default_factory=list)   # (stream, gen) parked on this event


def _is_done(e: Event, gen: int) -> bool:
    """Whether record number ``gen`` of ``e`` has completed (0, "never recorded", always has)."""
    return gen <= e.done_floor or gen in e.done_above


def _skip(t: Task, err: AclError) -> None:
    """``t`` will not run: let it give up what it promised others (:attr:`Task.skip`); never fails."""
    if t.skip is not None:
        try:
            t.skip(err)
        except Exception:  # noqa: BLE001 - a skip hook must not break the scheduler
            pass


def _copy(e: AclError) -> AclError:
    """A fresh exception of the same class and code (a stored error is raised once per waiter)."""
    return e.copy()


class Scheduler:
    """Streams, events and a pool of ``cores`` worker threads for one device.  ``faults`` is the device's
    fault state (a private one when not given)."""

    def __init__(self, device_id: int, cores: int, *, max_streams: int = 1984, max_events: int = 65536,
                 on_task_done: Callable[[Task, float], None] | None = None, name: str = "npu",
                 faults: FaultState | None = None):
        self.device_id = device_id
        self.cores = cores
        self.max_streams = max_streams
        self.max_events = max_events
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)      # workers wait here for ready blocks
        self._idle = threading.Condition(self._lock)      # hosts wait here for streams/events
        self._ready: list = []
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self.streams: dict[int, Stream] = {}
        self.events: dict[int, Event] = {}
        self._idle_workers = 0
        self._stop = False
        self._abort_error: AclError | None = None
        self._on_task_done = on_task_done
        self.busy_s = [0.0] * cores                      # wall seconds each core spent running blocks
        self.tasks_run = 0
        self.model_now = 0.0
        self._faults = faults if faults is not None else FaultState(0, device_id)
        self._stream_usage = Usage()                     # streams per tenant
        self._event_usage = Usage()                      # events per tenant
        self._epoch = 0                                  # bumped by abort: blocks taken before it do not run
        #: per core: (monotonic start, task name, stream id) of the block it runs, or None
        self.running_since: list[tuple[float, str, int] | None] = [None] * cores
        self._threads = [threading.Thread(target=self._worker, args=(i,), name=f"{name}{device_id}-core{i}",
                                          daemon=True) for i in range(cores)]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ resources
    def create_stream(self, priority: int = 0, owner="", limit: int = 0) -> int:
        """A new stream of ``owner``; ``limit`` (> 0): the most its tenant may hold."""
        if not isinstance(priority, int) or priority < 0:
            raise InvalidParamError(f"stream priority must be a non-negative integer, got {priority!r}")
        priority = min(priority, 7)   # CANN clamps to [0, 7]
        with self._lock:
            self._check_alive()
            if len(self.streams) >= self.max_streams:
                raise AclError(f"device {self.device_id}: {self.max_streams} streams already exist",
                               code=ACL_ERROR_RT_NO_STREAM_RESOURCE)
            if limit and self._stream_usage.get(owner) >= limit:
                raise AclError(f"device {self.device_id}: tenant {tenant_of(owner)!r} holds its quota of {limit} "
                               f"streams", code=ACL_ERROR_RT_NO_STREAM_RESOURCE)
            sid = next(self._ids)
            self.streams[sid] = Stream(sid, priority, owner)
            self._stream_usage.add(owner)
            return sid

    def destroy_stream(self, sid: int, owner=None) -> None:
        """Waits for the stream's queued work first (CANN asks callers to synchronize before)."""
        s = self._stream(sid, owner)
        self.synchronize_stream(sid, timeout=-1, owner=owner, raise_error=False)
        with self._lock:
            if self.streams.pop(s.sid, None) is not None:
                self._stream_usage.add(s.owner, -1)

    def usage(self, owner) -> dict[str, int]:
        """Streams and events the tenant of ``owner`` holds."""
        with self._lock:
            return {"streams": self._stream_usage.get(owner), "events": self._event_usage.get(owner)}

    def clear(self) -> None:
        """Forget every stream and event (device reset; call after :meth:`abort`)."""
        with self._lock:
            self.streams.clear()
            self.events.clear()
            self._stream_usage.clear()
            self._event_usage.clear()

    def quiesce(self, timeout_s: float) -> bool:
        """Wait (host-blocking, up to ``timeout_s``) until no core runs a block; True when none does."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while any(r is not None for r in self.running_since):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.01))
        return True

    def longest_running(self) -> tuple[float, str, int] | None:
        """``(seconds, task name, stream id)`` of the block that has been running longest, or None."""
        now = time.monotonic()
        runs = [r for r in list(self.running_since) if r is not None]
        if not runs:
            return None
        t0, name, sid = min(runs)
        return now - t0, name, sid

    def drop_owner(self, owner, timeout_s: float) -> bool:
        """Forget a departed client's streams and events: its queued work is dropped and its running
        work waited for (host-blocking, up to ``timeout_s``).  True when none of its work runs any more."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            mine = [s for s in self.streams.values() if s.owner == owner]
            for s in mine:
                s.queue.clear()
                e = s.parked_on
                if e is not None:
                    e.waiters = [(st, g) for st, g in e.waiters if st is not s]
                    s.parked_on = None
            while any(s.running is not None for s in mine):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            for s in mine:
                if self.streams.pop(s.sid, None) is not None:
                    self._stream_usage.add(s.owner, -1)
            for eid in [e.eid for e in self.events.values() if e.owner == owner]:
                e = self.events.pop(eid)
                self._event_usage.add(e.owner, -1)
            self._idle.notify_all()
        return True

    def create_event(self, flags: int = 0, owner="", limit: int = 0) -> int:
        """A new event of ``owner``; ``limit`` (> 0): the most its tenant may hold."""
        with self._lock:
            self._check_alive()
            if len(self.events) >= self.max_events:
                raise AclError(f"device {self.device_id}: {self.max_events} events already exist",
                               code=ACL_ERROR_RT_NO_EVENT_RESOURCE)
            if limit and self._event_usage.get(owner) >= limit:
                raise AclError(f"device {self.device_id}: tenant {tenant_of(owner)!r} holds its quota of {limit} "
                               f"events", code=ACL_ERROR_RT_NO_EVENT_RESOURCE)
            eid = next(self._ids)
            self.events[eid] = Event(eid, flags, owner)
            self._event_usage.add(owner)
            return eid

    def destroy_event(self, eid: int, owner=None) -> None:
        e = self.event(eid, owner)
        with self._lock:
            if self.events.pop(e.eid, None) is not None:
                self._event_usage.add(e.owner, -1)

    def _stream(self, sid: int, owner=None) -> Stream:
        s = self.streams.get(sid)
        if s is None or not same_tenant(s.owner, owner):
            raise InvalidHandleError(f"unknown stream {sid!r} on device {self.device_id}")
        return s

    def event(self, eid: int, owner=None) -> Event:
        """The event ``eid`` as ``owner`` may see it (its tenant's only), e.g. for the device's record/wait
        tasks.  Raises InvalidHandleError for an unknown or another tenant's event.  Host-only."""
        e = self.events.get(eid)
        if e is None or not same_tenant(e.owner, owner):
            raise InvalidHandleError(f"unknown event {eid!r} on device {self.device_id}")
        return e

    # ------------------------------------------------------------------ enqueue
    def enqueue(self, sid: int, tasks: list[Task], owner=None) -> None:
        """Append tasks to a stream; returns at once (only orders the device)."""
        with self._lock:
            self._check_alive()
            s = self._stream(sid, owner)
            for t in tasks:
                t.stream = s
                if t.kind == "record":
                    t.event.recorded_gen += 1
                    t.gen = t.event.recorded_gen
                    t.event.record_stream = s.sid
                elif t.kind == "wait" and t.gen == 0:
                    t.gen = t.event.recorded_gen
                s.queue.append(t)
            s.submitted += len(tasks)
            if s.running is None and s.parked_on is None:
                self._advance(s)

    def record(self, sid: int, eid: int, owner=None) -> None:
        self.enqueue(sid, [Task("record", event=self.event(eid, owner))], owner)

    def wait(self, sid: int, eid: int, gen: int = 0, owner=None) -> None:
        """Later tasks of ``sid`` wait for the event's latest record (or record number ``gen``)."""
        self.enqueue(sid, [Task("wait", event=self.event(eid, owner), gen=gen)], owner)

    def signal(self, eid: int, gen: int, owner=None) -> None:
        """Complete an event from the host up to record number ``gen`` (host-signalled gates)."""
        with self._lock:
            e = self.event(eid, owner)
            e.recorded_gen = max(e.recorded_gen, gen)
            if gen > e.done_floor:
                self._complete_event(e, gen, None, self.model_now, upto=True)

    # ------------------------------------------------------------------ core of the scheduler
    def _advance(self, s: Stream, worker: bool = False) -> None:
        """Run inline what needs no core, then hand the next task to the ready heap.  Lock held.
        ``worker``: called by a core that is about to look for work itself, so one block needs no
        wake-up (a hand-off to another thread would only add latency)."""
        q = s.queue
        while q:
            t = q[0]
            if t.kind == "record":
                q.popleft()
                s.tasks_done += 1
                self._complete_event(t.event, t.gen, s.error, s.model_time)
                continue
            if t.kind == "wait":
                e = t.event
                if _is_done(e, t.gen):
                    q.popleft()
                    s.tasks_done += 1
                    if e.model_ts is not None and t.gen > 0:
                        s.model_time = max(s.model_time, e.model_ts)
                    continue
                s.parked_on = e
                e.waiters.append((s, t.gen))
                return
            if s.error is not None:          # a failed stream skips work until the host synchronizes
                q.popleft()
                s.tasks_done += 1
                _skip(t, s.error)
                continue
            q.popleft()
            s.running = t
            t.next_block = 0
            t.done_blocks = 0
            heapq.heappush(self._ready, (s.priority, next(self._seq), t))
            wake = min(t.blocks - (1 if worker else 0), self._idle_workers)
            if wake > 0:
                self._work.notify(wake)
            return
        self._idle.notify_all()

    def _complete_event(self, e: Event, gen: int, err: AclError | None, model_ts: float,
                        upto: bool = False) -> None:
        """Record number ``gen`` of ``e`` completed (with ``upto``: every record up to ``gen``)."""
        if upto:
            e.done_floor = max(e.done_floor, gen)
        elif gen > e.done_floor:
            e.done_above.add(gen)
        while e.done_floor + 1 in e.done_above:
            e.done_floor += 1
            e.done_above.discard(e.done_floor)
        if upto and e.done_above:
            e.done_above = {g for g in e.done_above if g > e.done_floor}
        if gen >= e.completed_gen:                 # an older record completing late keeps the newer stamps
            e.completed_gen = gen
            e.wall_ts = time.perf_counter()
            e.model_ts = model_ts
            e.error = err
        if e.waiters:
            still = []
            for st, g in e.waiters:
                if _is_done(e, g):
                    st.parked_on = None
                    st.queue.popleft()       # the wait task
                    st.tasks_done += 1
                    st.model_time = max(st.model_time, model_ts)
                    if st.running is None:
                        self._advance(st)
                else:
                    still.append((st, g))
            e.waiters = still
        self._idle.notify_all()

    def _worker(self, core: int) -> None:
        lock = self._lock
        while True:
            with lock:
                while not self._ready and not self._stop:
                    self._idle_workers += 1
                    self._work.wait()
                    self._idle_workers -= 1
                if self._stop:
                    return
                _, _, t = self._ready[0]
                b = t.next_block
                t.next_block += 1
                if t.next_block >= t.blocks:
                    heapq.heappop(self._ready)
                if b == 0 and t.kind in _CORE_TASKS and self._faults.take_task_failure():
                    t.error = KernelError(f"{t.name or t.kind}: injected task failure (fault task-fail)")
                epoch = self._epoch
            self._faults.wait_running()
            if epoch != self._epoch:
                continue                    # aborted (reset, device lost) while the cores were held
            t0 = time.perf_counter()
            err = None
            self.running_since[core] = (time.monotonic(), t.name or t.kind, t.stream.sid if t.stream else -1)
            try:
                if t.error is None:
                    t.run(b)
                elif b == 0:
                    _skip(t, t.error)       # an injected failure takes the task's place
            except AclError as e:
                err = e
            except Exception as e:  # noqa: BLE001 - any failure is a task failure, never a dead core
                err = KernelError(f"{t.name or t.kind} failed: {type(e).__name__}: {e}")
            finally:
                self.running_since[core] = None
            dt = time.perf_counter() - t0
            slow = self._faults.slow_factor()
            if slow > 1.0:
                deadline = t0 + dt * slow
                while time.perf_counter() < deadline:   # emulated slowness burns the core's time
                    threading.Event().wait(max(0.0, deadline - time.perf_counter()))
                dt = time.perf_counter() - t0
            self.busy_s[core] += dt
            if t.prof is not None:
                t.prof.block(b, core, t0, t0 + dt)
            with lock:
                if epoch != self._epoch:
                    self._idle.notify_all()      # aborted while it ran: nothing to complete (quiesce waits)
                    continue
                if err is not None and t.error is None:
                    t.error = err
                t.done_blocks += 1
                if t.done_blocks == t.blocks:
                    self._finish(t)

    def _finish(self, t: Task) -> None:
        s = t.stream
        s.running = None
        s.tasks_done += 1
        self.tasks_run += 1
        m0 = s.model_time
        s.model_time += t.duration * self._faults.slow_factor()
        self.model_now = max(self.model_now, s.model_time)
        if t.prof is not None:
            t.prof.finish(m0, s.model_time, t.error)
        if t.error is not None and s.error is None:
            s.error = t.error
        if self._on_task_done is not None:
            self._on_task_done(t, s.model_time)
        if s.parked_on is None:
            self._advance(s, worker=True)

    # ------------------------------------------------------------------ host synchronization
    def _deadline(self, timeout_ms: float) -> float | None:
        return None if timeout_ms is None or timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0

    def _wait_until(self, pred, deadline: float | None) -> bool:
        """Lock held.  Wait for pred() or the deadline."""
        while not pred():
            if self._abort_error is not None:
                raise _copy(self._abort_error)
            if deadline is None:
                self._idle.wait(1.0)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return pred()
                self._idle.wait(left)
        return True

    def synchronize_stream(self, sid: int, timeout: float = -1, owner=None,
                           raise_error: bool = True) -> None:
        """Block the host until every task submitted to the stream has finished (timeout in ms, -1 =
        forever, 0 = poll).  Raises the stream's first task error (and clears it)."""
        with self._lock:
            s = self._stream(sid, owner)
            target = s.submitted
            ok = self._wait_until(lambda: s.tasks_done >= target, self._deadline(timeout))
            if not ok:
                raise error_for_code(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                                     f"stream {sid} did not finish within {timeout} ms")
            err, s.error = s.error, None
        if err is not None and raise_error:
            raise _copy(err)

    def stream_idle(self, sid: int, owner=None) -> bool:
        with self._lock:
            s = self._stream(sid, owner)
            return s.tasks_done >= s.submitted

    def synchronize_event(self, eid: int, timeout: float = -1, owner=None) -> None:
        """Block the host until the event's latest record has completed."""
        with self._lock:
            e = self.event(eid, owner)
            target = e.recorded_gen
            ok = self._wait_until(lambda: _is_done(e, target), self._deadline(timeout))
            if not ok:
                raise error_for_code(ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
                                     f"event {eid} did not complete within {timeout} ms")
            err = e.error
        if err is not None:
            raise _copy(err)

    def synchronize_device(self, timeout: float = -1, owner=None) -> None:
        """Wait for every stream (of ``owner``'s tenant), then raise the first stream error found."""
        first = None
        for sid in list(self.streams):
            s = self.streams.get(sid)
            if s is not None and same_tenant(s.owner, owner):
                try:
                    self.synchronize_stream(sid, timeout, owner)
                except AclError as e:
                    if e.code in (ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,):
                        raise
                    first = first or e
        if first is not None:
            raise first

    def query_event(self, eid: int, owner=None) -> bool:
        """True when the latest record has completed (also before the first record)."""
        with self._lock:
            e = self.event(eid, owner)
            return _is_done(e, e.recorded_gen)

    def event_times(self, eid: int, owner=None) -> tuple[float, float]:
        with self._lock:
            e = self.event(eid, owner)
            if e.recorded_gen == 0:
                raise AclError(f"event {eid} was never recorded", code=ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID)
            if not _is_done(e, e.recorded_gen) or e.wall_ts is None:
                raise AclError(f"event {eid} has not completed", code=ACL_ERROR_RT_EVENT_NOT_COMPLETE)
            return e.wall_ts, e.model_ts

    def elapsed(self, start: int, end: int, owner=None) -> tuple[float, float]:
        """(wall ms, modeled ms) between two completed events."""
        w0, m0 = self.event_times(start, owner)
        w1, m1 = self.event_times(end, owner)
        if w1 < w0:
            raise AclError("end event completed before start event", code=ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL)
        return (w1 - w0) * 1e3, max(0.0, m1 - m0) * 1e3

    # ------------------------------------------------------------------ abort and shutdown
    def abort(self, code: int = ACL_ERROR_RT_DEVICE_TASK_ABORT, message: str = "device task abort") -> None:
        """Fail every queued task and every waiter with ``code`` (aclrtDeviceTaskAbort / device loss)."""
        err = error_for_code(code, message)
        with self._lock:
            self._abort_error = err
            self._epoch += 1
            self._ready.clear()
            for s in self.streams.values():
                s.tasks_done = s.submitted
                s.queue.clear()
                s.running = None
                s.parked_on = None
                s.error = err
            for e in self.events.values():
                e.completed_gen = e.done_floor = e.recorded_gen
                e.done_above = set()
                e.error = err
                e.waiters = []
            self._idle.notify_all()

    def clear_abort(self) -> None:
        with self._lock:
            self._abort_error = None
            for s in self.streams.values():
                s.error = None

    def _check_alive(self) -> None:
        if self._stop:
            raise error_for_code(ACL_ERROR_RT_NO_DEVICE, f"device {self.device_id} is shut down")
        if self._abort_error is not None:
            raise _copy(self._abort_error)

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._work.notify_all()
            self._idle.notify_all()
        self._faults.close()                 # cores held by a hang are let go
        for t in self._threads:
            t.join(timeout=5)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"streams": len(self.streams), "events": len(self.events), "tasks_run": self.tasks_run,
                    "queued": sum(len(s.queue) + (s.running is not None) for s in self.streams.values()),
                    "model_now_s": self.model_now}
