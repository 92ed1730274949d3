"""The sanitizer as a device-handle layer: :class:`SanitizedHandle` wraps any
:class:`~runtime.backend.DeviceHandle` (the in-process device or the cluster's gRPC client alike),
forwards every call unchanged, and tells its :class:`~runtime.sanitize.tracker.DeviceTracker` what the
call did once the device accepted it: allocations, stream ops in the order the host issued them, host
accesses, synchronizations.  A call the device refuses is reported to memcheck (with the ranges it named)
and re-raised as it was.  Without a session there is no layer: the runtime talks to its backend's handle
directly and pays nothing.

What blocks is what the wrapped handle's call blocks; the checks run on the calling thread, after the
forwarded call returns, under the session lock.
"""
from __future__ import annotations

import numpy as np

from devices.errors import ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, AclError
from devices.submit_order import OpOrder, OrderFilter

from .shadow import Hits

#: errors of a synchronize that did not wait for the work (no ordering edge)
_NOT_WAITED = (ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, ACL_ERROR_RT_EVENT_SYNC_TIMEOUT)


def _nbytes(data) -> int:
    n = getattr(data, "nbytes", None)
    return int(n) if n is not None else len(data)


class SanitizedHandle:
    """A DeviceHandle that feeds a :class:`~runtime.sanitize.session.Session` (see the module doc)."""

    def __init__(self, session, inner):
        self.session = session
        self.inner = inner
        self.tracker = session.tracker(inner.id)
        self._order = OrderFilter()

    def __getattr__(self, name):                  # what a backend's handle has beyond the protocol
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"<sanitized {self.inner!r}>"

    # ------------------------------------------------------------------ helpers
    def _refused(self, err: AclError, site: int, ranges=()) -> None:
        self.session.refused(err, site, self.tracker, tuple(ranges))

    def _host(self, fn, *args) -> None:
        """Run ``fn(tracker, *args, hits)`` under the lock and report what it found."""
        s = self.session
        hits = Hits()
        with s.lock:
            fn(*args, hits)
            if hits:
                s.collect(self.tracker, hits)

    def _op_ranges(self, op) -> tuple:
        return tuple((a.ptr, a.nbytes) for a in self.tracker.accesses(op))

    # ------------------------------------------------------------------ identity, health, lifecycle
    @property
    def id(self) -> int:
        return self.inner.id

    @property
    def is_lost(self) -> bool:
        return self.inner.is_lost

    def mark_lost(self, reason: str) -> bool:
        return self.inner.mark_lost(reason)

    def info(self):
        return self.inner.info()

    def telemetry(self) -> dict:
        return self.inner.telemetry()

    def health(self):
        return self.inner.health()

    def health_report(self):
        return self.inner.health_report()

    def inject_fault(self, kind: str, **params) -> None:
        self.inner.inject_fault(kind, **params)

    def clear_fault(self, kind: str | None = None) -> None:
        self.inner.clear_fault(kind)

    def reset(self) -> None:
        """The device drops everything: what the client held is checked for leaks (as at a device
        reset in CUDA) and the device is watched afresh."""
        self.inner.reset()
        self.session.leak_check(self.tracker)
        self.tracker = self.session.tracker(self.inner.id)

    def close(self) -> None:
        self.session.leak_check(self.tracker)
        self.inner.close()

    # ------------------------------------------------------------------ memory (host-synchronous)
    def malloc(self, size: int, policy: int = 0, placement: int = 0) -> int:
        site = self.session.site()
        try:
            ptr = self.inner.malloc(size, policy, placement=placement)
        except AclError as e:
            self._refused(e, site)
            raise
        with self.session.lock:
            self.tracker.malloc(ptr, int(size), site)
        return ptr

    def free(self, ptr: int) -> None:
        site = self.session.site()
        try:
            self.inner.free(ptr)
        except AclError as e:
            self._refused(e, site, ((ptr, 1),))
            raise
        self._host(self.tracker.free, ptr, site)

    def memcpy_h2d(self, dst: int, data) -> None:
        site = self.session.site()
        n = _nbytes(data)
        try:
            self.inner.memcpy_h2d(dst, data)
        except AclError as e:
            self._refused(e, site, ((dst, n),))
            raise
        self._host(self.tracker.host_access, dst, n, True, "memcpy_h2d", site)

    def memcpy_d2h(self, src: int, nbytes: int, *, out: np.ndarray | None = None) -> np.ndarray:
        site = self.session.site()
        try:
            res = self.inner.memcpy_d2h(src, nbytes, out=out)
        except AclError as e:
            self._refused(e, site, ((src, nbytes),))
            raise
        self._host(self.tracker.host_access, src, int(nbytes), False, "memcpy_d2h", site)
        return res

    def memcpy_d2d(self, dst: int, src: int, nbytes: int) -> None:
        site = self.session.site()
        try:
            self.inner.memcpy_d2d(dst, src, nbytes)
        except AclError as e:
            self._refused(e, site, ((dst, nbytes), (src, nbytes)))
            raise

        def both(hits):
            self.tracker.host_access(src, nbytes, False, "memcpy_d2d", site, hits)
            self.tracker.host_access(dst, nbytes, True, "memcpy_d2d", site, hits)
        self._host(both)

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        site = self.session.site()
        try:
            self.inner.memset(ptr, value, nbytes)
        except AclError as e:
            self._refused(e, site, ((ptr, nbytes),))
            raise
        self._host(self.tracker.host_access, ptr, nbytes, True, "memset", site)

    def mem_info(self) -> tuple[int, int]:
        return self.inner.mem_info()

    # ------------------------------------------------------------------ streams and events
    def create_stream(self, priority: int = 0) -> int:
        site = self.session.site()
        sid = self.inner.create_stream(priority)
        with self.session.lock:
            self.tracker.stream_created(sid, site)
        return sid

    def destroy_stream(self, sid: int) -> None:
        self.inner.destroy_stream(sid)
        self._host(self.tracker.stream_destroyed, sid)

    def create_event(self, flags: int = 0) -> int:
        site = self.session.site()
        eid = self.inner.create_event(flags)
        with self.session.lock:
            self.tracker.event_created(eid, site)
        return eid

    def destroy_event(self, eid: int) -> None:
        self.inner.destroy_event(eid)
        with self.session.lock:
            self.tracker.event_destroyed(eid)

    def submit(self, ops, *, order: OpOrder | None = None) -> None:
        if order is not None:          # each numbered op issued once, in number order (devices.submit_order)
            self._order.queue(None, ops, order, self.submit)
            return
        s = self.session
        sites = [s.site_of(op) for op in ops]
        try:
            self.inner.submit(ops)
        except AclError as e:
            self._refused_batch(e, ops, sites)
            raise
        self._issued(ops, sites)

    def _issued(self, ops, sites) -> None:
        s = self.session
        with s.lock:
            t = self.tracker
            for op, site in zip(ops, sites):            # one collection per op: counts do not depend on
                hits = Hits()                            # how the runtime batched the ops
                t.issue(op, site, hits)
                if hits:
                    s.collect(t, hits)
            s.clocks.host_released()

    def _refused_batch(self, err: AclError, ops, sites) -> None:
        """Report a refused batch at the op whose ranges are bad (the first op when none is)."""
        for op, site in zip(ops, sites):
            ranges = self._op_ranges(op)
            if ranges and self.session.bad_ranges(self.tracker, ranges, err):
                self._refused(err, site, ranges)
                return
        self._refused(err, sites[0] if sites else self.session.site())

    def synchronize_stream(self, sid: int, timeout_ms: float = -1, *, ops=(), order: OpOrder | None = None) -> None:
        """Ops riding on the synchronize are submitted first (one more round trip on a remote device)."""
        if ops:
            self.submit(ops, order=order)
        site = self.session.site()
        try:
            self.inner.synchronize_stream(sid, timeout_ms)
        except AclError as e:
            if e.code not in _NOT_WAITED:
                self._host(self.tracker.synced_stream, sid)
            self._refused(e, site)
            raise
        self._host(self.tracker.synced_stream, sid)

    def synchronize_event(self, eid: int, timeout_ms: float = -1, *, ops=(), order: OpOrder | None = None) -> None:
        """Ops riding on the synchronize are submitted first (one more round trip on a remote device)."""
        if ops:
            self.submit(ops, order=order)
        site = self.session.site()
        try:
            self.inner.synchronize_event(eid, timeout_ms)
        except AclError as e:
            if e.code not in _NOT_WAITED:
                self._host(self.tracker.synced_event, eid)
            self._refused(e, site)
            raise
        self._host(self.tracker.synced_event, eid)

    def synchronize_device(self, timeout_ms: float = -1) -> None:
        site = self.session.site()
        try:
            self.inner.synchronize_device(timeout_ms)
        except AclError as e:
            if e.code not in _NOT_WAITED:
                self._host(self.tracker.synced_device)
            self._refused(e, site)
            raise
        self._host(self.tracker.synced_device)

    def query_event(self, eid: int) -> bool:
        done = self.inner.query_event(eid)
        if done:                                        # the host saw it complete: an edge
            self._host(self.tracker.synced_event, eid)
        return done

    def query_stream(self, sid: int) -> bool:
        done = self.inner.query_stream(sid)
        if done:
            self._host(self.tracker.synced_stream, sid)
        return done

    def event_elapsed(self, start: int, end: int) -> tuple[float, float]:
        return self.inner.event_elapsed(start, end)

    def event_timestamp(self, eid: int) -> tuple[float, float]:
        return self.inner.event_timestamp(eid)

    def signal_event(self, eid: int, gen: int) -> None:
        self.inner.signal_event(eid, gen)
        s = self.session
        hits = Hits()
        with s.lock:
            self.tracker.signal(eid, gen, hits)
            s.clocks.host_released()
            if hits:
                s.collect(self.tracker, hits)

    # ------------------------------------------------------------------ captured graphs
    def graph_create(self, ops) -> int:
        s = self.session
        sites = [s.site_of(op) for op in ops]
        site = s.site()
        try:
            gid = self.inner.graph_create(ops)
        except AclError as e:
            self._refused_batch(e, ops, sites)
            raise
        with s.lock:
            self.tracker.graph_created(gid, list(zip(ops, sites)), site)
        return gid

    def graph_destroy(self, gid: int) -> None:
        self.inner.graph_destroy(gid)
        with self.session.lock:
            self.tracker.graph_destroyed(gid)

    def graph_info(self, gid: int) -> dict:
        return self.inner.graph_info(gid)

    def graph_rebind(self, gid: int, moves) -> int:
        n = self.inner.graph_rebind(gid, moves)
        if n:
            with self.session.lock:
                self.tracker.graph_rebound(gid, moves)
        return n

    # ------------------------------------------------------------------ HCCL communicators
    def profile(self, action: str) -> dict:
        return self.inner.profile(action)

    def hccl_info(self) -> dict:
        return self.inner.hccl_info()

    def hccl_comm_init(self, comm_id: str, rank: int, peers: list[dict], config: dict | None = None) -> None:
        self.inner.hccl_comm_init(comm_id, rank, peers, config)
        with self.session.lock:
            self.tracker.comm(comm_id, rank, len(peers))

    def hccl_comm_join(self, comm_id: str, rank: int, nranks: int, root: dict, config: dict | None = None,
                       timeout_s: float = 120.0) -> list[dict]:
        peers = self.inner.hccl_comm_join(comm_id, rank, nranks, root, config, timeout_s)
        with self.session.lock:
            self.tracker.comm(comm_id, rank, nranks)
        return peers

    def hccl_comm_destroy(self, comm_id: str) -> None:
        self.inner.hccl_comm_destroy(comm_id)

    def hccl_async_error(self, comm_id: str) -> int:
        return self.inner.hccl_async_error(comm_id)
