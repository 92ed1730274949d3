"""What the pool needs from the streams: device events to order reuse, and copies for defragmentation.

:class:`StreamOrder` is the interface; :class:`HandleStreamOrder` implements it over one device handle.
Stream ops go through ``put`` (default: submit at once).  The runtime passes its launch queue's ``put``
so that an event recorded by the pool lands after the work the host queued before it (the queue keeps
order), and its ``flush`` so that a query or synchronize sees everything queued.

Events come from a small pool: one is reused only once it is known to have completed, so a host-side
wait on it never waits for a later record.

``record``, ``wait`` and ``copy`` only order the device (they return at once); ``query`` is a
host-synchronous driver call that does not wait; ``synchronize`` and ``sync_stream`` block the host, with a
deadline: a wait "until done" lasts what the owner's ``wait_ms`` makes of it (the runtime's host-wait
limit), then raises the timeout's CANN code.
"""
from __future__ import annotations

import threading
from typing import Callable, Protocol

from devices.errors import (ACL_ERROR_RT_DEVICE_TASK_ABORT, ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, ACL_ERROR_RT_NO_DEVICE,
                            AclError)
from devices.tasks import CopyD2D, Record, Wait


#: codes that mean the device itself is gone (raised even where a failed stream is not an error)
_LOST = (ACL_ERROR_RT_DEVICE_TASK_ABORT, ACL_ERROR_RT_NO_DEVICE)


class StreamOrder(Protocol):
    def record(self, stream: int) -> int:
        """An event recorded now on ``stream`` (after the work queued on it so far)."""

    def wait(self, stream: int, event: int) -> None:
        """Later work on ``stream`` waits for ``event`` (device-side; the host does not wait)."""

    def link(self, src: int, dst: int) -> None:
        """Later work on ``dst`` waits for the work queued on ``src`` so far (device-side only)."""

    def query(self, event: int) -> bool:
        """Whether ``event`` has completed (host-synchronous, does not wait)."""

    def synchronize(self, event: int, timeout_ms: float = -1) -> bool:
        """Block the host until ``event`` has completed (a failed stream is not an error here); False when
        ``timeout_ms`` (>= 0) passed first."""

    def release(self, event: int) -> None:
        """The caller no longer needs ``event``."""

    def copy(self, stream: int, dst: int, src: int, nbytes: int) -> None:
        """Device-to-device copy ordered on ``stream``."""

    def copy_stream(self) -> int:
        """A stream of the pool's own for copies (created on first use)."""

    def sync_stream(self, stream: int) -> None:
        """Block the host until ``stream`` is idle; raises its first error."""

    def close(self) -> None:
        """Destroy the events and the stream made here."""


class HandleStreamOrder:
    """:class:`StreamOrder` over a device handle (events pooled, reused once known complete)."""

    def __init__(self, handle, put: Callable | None = None, flush: Callable[[], None] | None = None,
                 wait_ms: Callable[[float], float] | None = None):
        """``wait_ms``: the deadline (ms) of a host wait asked for with a timeout (-1: "until done"; default:
        as asked, -1 waiting as long as the handle does)."""
        self.handle = handle
        self._wait_ms = wait_ms or (lambda t: t)
        self._put = put or (lambda op: handle.submit((op,)))
        self._flush = flush or (lambda: None)
        self._lock = threading.Lock()
        self._idle: list[int] = []          # known complete: reusable at once
        self._retired: list[int] = []       # released, maybe still pending
        self._all: set[int] = set()
        self._copy_stream: int | None = None
        self._links: dict[int, int] = {}    # source stream -> its ordering event (re-recorded at will)
        self.events_created = 0

    def _acquire(self) -> int:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            oldest = self._retired[0] if self._retired else None
        if oldest is not None and self.query(oldest):
            with self._lock:
                if oldest in self._retired:
                    self._retired.remove(oldest)
                    return oldest
        eid = self.handle.create_event(0)
        with self._lock:
            self._all.add(eid)
            self.events_created += 1
        return eid

    def record(self, stream: int) -> int:
        eid = self._acquire()
        self._put(Record(stream, eid))
        return eid

    def wait(self, stream: int, event: int) -> None:
        self._put(Wait(stream, event, 0))

    def link(self, src: int, dst: int) -> None:
        """One event per source stream, recorded again for every link: a wait binds to the record it
        follows in the queue (the device resolves "latest record" when the wait is queued), so no host
        query is ever needed to reuse it."""
        with self._lock:
            eid = self._links.get(src)
        if eid is None:
            eid = self.handle.create_event(0)
            with self._lock:
                self._links[src] = eid
                self._all.add(eid)
                self.events_created += 1
        self._put(Record(src, eid))
        self._put(Wait(dst, eid, 0))

    def query(self, event: int) -> bool:
        self._flush()
        return bool(self.handle.query_event(event))

    def synchronize(self, event: int, timeout_ms: float = -1) -> bool:
        """See :class:`StreamOrder`; a wait "until done" that reaches its deadline raises its timeout."""
        self._flush()
        try:
            self.handle.synchronize_event(event, self._wait_ms(timeout_ms))
        except AclError as e:
            code = getattr(e, "code", None)
            if code in _LOST:
                raise
            if code == ACL_ERROR_RT_EVENT_SYNC_TIMEOUT:
                if timeout_ms < 0:
                    raise
                return False
            # the event completed behind a failed task: the stream's own error is its owner's to see
        return True

    def release(self, event: int) -> None:
        with self._lock:
            if event in self._all:
                self._retired.append(event)

    def copy(self, stream: int, dst: int, src: int, nbytes: int) -> None:
        self._put(CopyD2D(stream, int(dst), int(src), int(nbytes)))

    def copy_stream(self) -> int:
        with self._lock:
            if self._copy_stream is None:
                self._copy_stream = self.handle.create_stream(0)
            return self._copy_stream

    def sync_stream(self, stream: int) -> None:
        self._flush()
        self.handle.synchronize_stream(stream, self._wait_ms(-1))

    def close(self) -> None:
        with self._lock:
            events, self._all = list(self._all), set()
            self._idle, self._retired, self._links = [], [], {}
            sid, self._copy_stream = self._copy_stream, None
        self._flush()
        for eid in events:
            try:
                self.handle.destroy_event(eid)
            except AclError:
                pass
        if sid is not None:
            try:
                self.handle.destroy_stream(sid)
            except AclError:
                pass

