"""Failover: logical devices bound to physical ones, health monitoring, re-binding on loss.

A :class:`DevicePool` owns a set of physical devices (the device actors of a cluster, addressed by their
``where`` dicts).  The first ``logical`` of them are bound to logical ids 0..n-1; the rest are spares.
Every live physical device has a health watch (``RemoteDevice.watch_health``): a broken stream (the
process died) marks it lost in milliseconds; missed heartbeats beyond ``hang_deadline_s`` (checked by the
pool's own monitor thread every ``monitor_period_s``) mark a hung one lost; health conditions carried by the
heartbeats (an Alarm/Critical level, or a condition in ``unhealthy_conditions`` such as a down link) mark a
device unhealthy -- the pool reads the structured conditions, never the human text.  A lost or unhealthy
device's logical id is re-bound at once: to a healthy spare if there is one, else to an in-process CPU
fallback device (the same kernels, ``devices.device.Device``).  The lost device itself is recovered in the
background: the pool waits (bounded) for Ray to restart the actor (it comes back with a new gRPC address and
an empty HBM) or for a hung/unhealthy one to come back, resets it, probes it with a tiny task, and returns it
to the spares; a logical id running on the CPU fallback moves back to a device as soon as one is free.

Errors that the job layer sees (``report_error``) feed a per-device circuit breaker: more than
``max_errors`` failures within ``error_window_s`` quarantine the device for ``quarantine_s``; an HBM ECC
error (ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR) takes the device out at once (it is reset before it serves again).
Request latencies (``report_latency``) find stragglers: a device is quarantined as slow only when its recent
median is ``slow_factor`` x its peers' AND the excess is above both an absolute floor
(``slow_min_excess_ms``) and ``slow_mad_k`` robust sigmas of the peers' own latencies, and it stays so for
``slow_persist_s`` -- the rule and why are in :mod:`runtime.cluster.straggler`.

Bindings carry a generation; the job layer asks :meth:`DevicePool.binding` for the current one and,
after a failure, reports it with the generation it used, so that one failure is never handled twice.
Every detection and re-binding is recorded in :attr:`DevicePool.events` (monotonic timestamps).
"""
from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from devices.errors import (ACL_ERROR_RT_DEVICE_TASK_ABORT, ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR,
                            ACL_ERROR_RT_LOST_HEARTBEAT, AclError, HcclError)
from devices.health import Condition
from runtime.cluster import rayenv
from runtime.cluster.straggler import StragglerRule, StragglerWatch

log = logging.getLogger("vnpu.failover")

CPU_ID_BASE = 0x7F00          #: physical ids of CPU fallback devices (pointer tags stay distinct)
#: a device that comes back gets a new client; calls in flight on the old one (not lost) get this long to
#: finish before it closes (the recovery thread waits; nothing else does)
REVIVE_DRAIN_S = 2.0


def wait_polled(cv: threading.Condition, pred, timeout: float, poll_s: float = 0.05) -> bool:
    """Wait on ``cv`` until ``pred()`` holds or ``timeout`` passes; re-checked on every notify and every
    ``poll_s`` (for state that changes without a notify).  Host-blocking; returns whether it held."""
    end = time.monotonic() + timeout
    with cv:
        while not pred():
            left = end - time.monotonic()
            if left <= 0:
                return False
            cv.wait(min(left, poll_s))
        return True


@dataclass(frozen=True)
class FailoverOptions:
    heartbeat_ms: int = 100            #: health-watch interval
    #: a device that stops (hangs) is declared lost within this long: the monitor acts once no heartbeat
    #: came for ``silence_limit_s`` = deadline - one heartbeat interval - one monitor period, so that the
    #: detection itself, wherever the hang falls between two beats, stays within the deadline
    hang_deadline_s: float = 0.5
    monitor_period_s: float = 0.02     #: how often the pool checks heartbeat ages
    error_window_s: float = 10.0       #: circuit breaker window
    max_errors: int = 3                #: more failures than this in the window: quarantine
    quarantine_s: float = 5.0          #: how long a quarantined device stays out
    restart_wait_s: float = 30.0       #: bounded wait for a lost device to come back (Ray restart, hang end)
    probe_timeout_ms: float = 300.0    #: a recovering device must run a tiny task within this
    cpu_fallback: bool = True          #: last link of the chain: in-process CPU devices
    cpu_arena_bytes: int = 256 << 20   #: sparse shm: costs only what is used
    rpc_timeout_s: float = 30.0
    unhealthy_levels: tuple = ("Alarm", "Critical")
    #: conditions that take a bound device out of service whatever their level
    unhealthy_conditions: tuple = (Condition.LINK_DOWN,)
    #: straggler rule (:mod:`runtime.cluster.straggler`): a device is taken out as slow only when the median
    #: of its recent request latencies is ``slow_factor`` x its peers' median AND the excess is above
    #: ``slow_min_excess_ms`` AND above ``slow_mad_k`` robust standard deviations (1.4826 MAD) of its
    #: peers' latencies, on every request it completes for ``slow_persist_s`` -- a ratio alone quarantines
    #: healthy devices on tiny, noisy requests
    slow_factor: float = 2.0
    slow_min_excess_ms: float = 2.0    #: absolute floor on the excess over the peers' median
    slow_mad_k: float = 3.5            #: excess over the peers' noise, in robust sigmas (0: rule off)
    slow_persist_s: float = 2.0        #: judged slow without a break for this long (pool clock) before acting
    slow_min_samples: int = 8          #: requests a device (and each peer compared) must have reported
    slow_window: int = 9               #: recent requests per device whose median is its latency

    def __post_init__(self) -> None:
        if self.heartbeat_ms <= 0 or self.monitor_period_s <= 0:
            raise ValueError("heartbeat_ms and monitor_period_s must be positive")
        for name, low, strict in (("slow_factor", 1.0, True), ("slow_min_excess_ms", 0.0, False),
                                  ("slow_mad_k", 0.0, False), ("slow_persist_s", 0.0, False)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < low or (strict and value == low):
                raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, got {value!r}")
        for name in ("slow_min_samples", "slow_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.silence_limit_s < 2 * self.heartbeat_ms / 1000.0:
            raise ValueError(f"hang deadline {self.hang_deadline_s * 1000:g} ms is too short for {self.heartbeat_ms} ms "
                             f"heartbeats: it must allow two missed beats plus one beat and one monitor period "
                             f"(>= {(3 * self.heartbeat_ms / 1000.0 + self.monitor_period_s) * 1000:g} ms)")

    def straggler_rule(self) -> StragglerRule:
        """The straggler rule these options set (:mod:`runtime.cluster.straggler`)."""
        return StragglerRule(factor=self.slow_factor, min_excess_s=self.slow_min_excess_ms / 1000.0,
                             mad_k=self.slow_mad_k, persist_s=self.slow_persist_s,
                             min_samples=self.slow_min_samples, window=self.slow_window)

    @property
    def silence_limit_s(self) -> float:
        """No heartbeat for this long = hung (see ``hang_deadline_s``)."""
        return self.hang_deadline_s - self.heartbeat_ms / 1000.0 - self.monitor_period_s


@dataclass
class Binding:
    """One logical device's current physical device."""
    logical: int
    physical: int                   #: physical id (>= CPU_ID_BASE for the CPU fallback)
    gen: int
    handle: object                  #: RemoteDevice or devices.device.Device
    device: object                  #: runtime.api.Device over the handle
    kind: str = "npu"               #: npu | cpu

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"


@dataclass
class _Phys:
    pid: int
    where: dict
    handle: object = None
    watch: object = None
    state: str = "spare"            #: bound | spare | recovering | quarantined | dead
    last_beat: float = 0.0
    health: str = "OK"
    reasons: tuple = ()
    conditions: tuple = ()
    errors: collections.deque = field(default_factory=collections.deque)
    lost_at: float | None = None
    recovering: bool = False


class _OneBackend:
    """A backend with one device, so that runtime.api.Device wraps any handle."""

    def __init__(self, handle, name: str):
        self.handle, self.name = handle, name

    def device_ids(self):
        return [self.handle.id]

    def device(self, physical_id):
        return self.handle

    def close(self):
        pass


def wrap_handle(handle, kind: str = "npu"):
    """A ``runtime.api.Device`` over a bare device handle."""
    from runtime.api import Runtime
    rt = Runtime(_OneBackend(handle, "local" if kind == "cpu" else "cluster"), visible="0")
    return rt.device(0)


def flush_all(devices) -> None:
    """Send every queued launch of these pool devices.  Each binding has its own runtime (a lost device's
    queue must never fail another device's synchronize), so ranks of a collective driven from one thread
    must be flushed together before any of them is waited on."""
    for d in devices:
        d.queue.flush()


def is_failover_error(e: BaseException) -> bool:
    """Errors after which a request is replayed elsewhere (device loss, collectives, ECC, task failure)."""
    return isinstance(e, AclError)


class DevicePool:
    """Logical -> physical binding with spares, CPU fallback, health monitoring and quarantine."""

    def __init__(self, where: list[dict], token: str, logical: int, options: FailoverOptions = FailoverOptions(),
                 *, actor_lookup=None, on_event=None, client_id: str | None = None, clock=time.monotonic):
        if logical < 1 or logical > len(where) + (1 << 10):
            raise ValueError(f"bad logical device count {logical}")
        self.opts = options
        self.token = token
        self._clock = clock                       #: times the straggler rule's persistence (tests inject one)
        self._stragglers = StragglerWatch(options.straggler_rule())
        self.client_id = client_id
        self._lookup = actor_lookup or _ray_where
        self._on_event = on_event
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        self._closed = threading.Event()
        self.events: list[dict] = []              #: detection / rebind / recovery records
        self.arenas_seen: set[str] = set()        #: every arena segment name met (cleanup of killed ones)
        self.phys: dict[int, _Phys] = {}
        for w in sorted(where, key=lambda w: w["device_id"]):
            self.phys[w["device_id"]] = _Phys(w["device_id"], dict(w))
            self.arenas_seen.add(w.get("arena", ""))
        self.bindings: dict[int, Binding] = {}
        self._gen = 0
        self._cpu: dict[int, object] = {}
        self._threads: list[threading.Thread] = []
        ids = sorted(self.phys)
        if options.cpu_fallback:
            for lid in range(logical):
                self._cpu_device(lid)                 # ready before it is needed (no delay at failover)
        for pid in ids:
            self._connect(self.phys[pid])
        for lid in range(logical):
            if lid < len(ids):
                self._bind(lid, self.phys[ids[lid]], reason="initial")
            else:
                self._bind_cpu(lid, reason="initial")
        self._monitor = threading.Thread(target=self._monitor_loop, name="vnpu-failover-monitor", daemon=True)
        self._monitor.start()

    # ------------------------------------------------------------------ records
    def _record(self, kind: str, **kw) -> dict:
        ev = dict(kind=kind, t=time.monotonic(), **kw)
        with self._lock:
            self.events.append(ev)
        if self._on_event is not None:
            try:
                self._on_event(ev)
            except Exception:  # noqa: BLE001 - a listener must not break failover
                log.exception("failover event listener failed")
        return ev

    # ------------------------------------------------------------------ physical devices
    def _connect(self, p: _Phys) -> None:
        from driver.client import RemoteDevice
        h = RemoteDevice(p.where["address"], self.token, p.pid, client_id=self.client_id,
                         timeout_s=self.opts.rpc_timeout_s)
        p.handle = h
        self._stragglers.forget(p.pid)
        p.last_beat = time.monotonic()
        p.health, p.reasons, p.conditions = "OK", (), ()
        # the watch is also the pool's lease: jobs allocate through the bound handles (and the recovery
        # probe does), which needs one, and what they leave is released when the pool goes
        p.watch = h.watch_health(self.opts.heartbeat_ms, lambda ev, p=p, h=h: self._beat(p, h, ev),
                                 stale_after_s=max(2 * self.opts.hang_deadline_s, 1.0), lease=True)

    def _beat(self, p: _Phys, h, ev) -> None:
        if p.handle is not h:
            return                                 # a beat of an older client of this device
        if ev.lost:
            self._lost(p, h, f"health stream broke: {ev.reasons[0] if ev.reasons else ''}", cause="stream")
            return
        if ev.error is not None:
            return
        p.last_beat = time.monotonic()
        p.health, p.reasons, p.conditions = ev.health, tuple(ev.reasons), tuple(ev.conditions)
        if p.state == "bound" and self._is_unhealthy(ev.health, ev.conditions):
            self._unhealthy(p, h, f"telemetry: {ev.health} {'; '.join(ev.reasons)}",
                            ecc=any(c.kind is Condition.ECC for c in ev.conditions))

    def _is_unhealthy(self, level: str, conditions) -> bool:
        return level in self.opts.unhealthy_levels or any(c.kind in self.opts.unhealthy_conditions
                                                          for c in conditions)

    def _monitor_loop(self) -> None:
        while not self._closed.wait(self.opts.monitor_period_s):
            now = time.monotonic()
            with self._lock:
                cands = [(p, p.handle) for p in self.phys.values()
                         if p.state in ("bound", "spare") and p.handle is not None]
            limit = self.opts.silence_limit_s
            for p, h in cands:
                if now - p.last_beat > limit and not h.lost.is_set():
                    self._lost(p, h, f"no heartbeat for {now - p.last_beat:.3f} s (hang deadline "
                                     f"{self.opts.hang_deadline_s:g} s)", cause="heartbeat")
            self._rebalance()

    def _lost(self, p: _Phys, h, reason: str, cause: str) -> None:
        """Device ``p`` (client ``h``) is lost: flag it, re-bind its logical id, recover it in the background."""
        with self._lock:
            if p.handle is not h or p.state in ("recovering", "dead", "quarantined"):
                return
            was = p.state
            p.state = "recovering"
            p.lost_at = time.monotonic()
        with contextlib.suppress(Exception):
            h.mark_lost(reason)                   # wakes blocked synchronizes: they raise the device-lost code
        code = ACL_ERROR_RT_LOST_HEARTBEAT if cause == "heartbeat" else ACL_ERROR_RT_DEVICE_TASK_ABORT
        self._record("detected", physical=p.pid, cause=cause, reason=reason, code=code, state_was=was)
        self._replace(p)
        self._start_recovery(p, reset=False)

    def _unhealthy(self, p: _Phys, h, reason: str, ecc: bool) -> None:
        """Telemetry says the device is unwell: take it out of service (work in flight may finish)."""
        with self._lock:
            if p.handle is not h or p.state != "bound":
                return
            p.state = "recovering"
            p.lost_at = time.monotonic()
        self._record("detected", physical=p.pid, cause="ecc" if ecc else "telemetry", reason=reason,
                     code=ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR if ecc else 0, state_was="bound")
        self._replace(p)
        self._start_recovery(p, reset=True, wait_healthy=True)

    def _replace(self, p: _Phys) -> None:
        """Re-bind the logical id bound to ``p`` (if any): a spare, else the CPU fallback."""
        with self._lock:
            lids = [b.logical for b in self.bindings.values() if b.physical == p.pid]
            for lid in lids:
                spare = self._take_spare()
                if spare is not None:
                    self._bind(lid, spare, reason=f"device {p.pid} out")
                elif self.opts.cpu_fallback:
                    self._bind_cpu(lid, reason=f"device {p.pid} out")
                else:
                    self._unbind(lid)
            self._cv.notify_all()

    def _take_spare(self) -> _Phys | None:
        for pid in sorted(self.phys):
            q = self.phys[pid]
            if q.state == "spare" and q.handle is not None and not q.handle.lost.is_set() \
                    and q.health not in self.opts.unhealthy_levels:
                return q
        return None

    def _start_recovery(self, p: _Phys, reset: bool, wait_healthy: bool = False, delay_s: float = 0.0) -> None:
        with self._lock:
            if p.recovering or self._closed.is_set():
                return
            p.recovering = True
        t = threading.Thread(target=self._recover, args=(p, reset, wait_healthy, delay_s),
                             name=f"vnpu-recover-{p.pid}", daemon=True)
        self._threads.append(t)
        t.start()

    def _recover(self, p: _Phys, reset: bool, wait_healthy: bool, delay_s: float) -> None:
        """Bring ``p`` back: same process (hang over / unhealthy state cleared) or a restarted actor."""
        try:
            if delay_s and self._closed.wait(delay_s):
                return
            deadline = time.monotonic() + self.opts.restart_wait_s
            old = p.handle
            old_pid = p.where.get("pid")
            last_err = None
            while not self._closed.is_set() and time.monotonic() < deadline:
                try:
                    w = self._lookup(p.pid, timeout=max(0.5, min(5.0, deadline - time.monotonic())))
                except Exception as e:  # noqa: BLE001 - dying / restarting / gone: ask again until the deadline
                    last_err = e
                    if self._closed.wait(0.1):
                        return
                    continue
                restarted = w.get("pid") != old_pid or w.get("address") != p.where.get("address")
                if wait_healthy and not restarted and old is not None and not old.lost.is_set():
                    try:
                        report = old.health_report()
                        health, conds = report.level, report.conditions
                    except AclError:
                        health, conds = "Unknown", ()
                    ecc = any(c.kind is Condition.ECC for c in conds)     # poison stays until a reset: reset now
                    if not ecc and self._is_unhealthy(health, conds):
                        if self._closed.wait(0.05):
                            return
                        continue
                if self._try_revive(p, w, restarted, reset or wait_healthy):
                    return
                if self._closed.wait(0.05):
                    return
            self._record("dead", physical=p.pid, reason=f"did not come back in time ({last_err})"[:300])
            with self._lock:
                p.state = "dead"
        finally:
            p.recovering = False

    def _try_revive(self, p: _Phys, w: dict, restarted: bool, reset: bool) -> bool:
        old = p.handle
        with self._lock:
            self.arenas_seen.add(w.get("arena", ""))
            p.where = dict(w)
        try:
            # the new client replaces the old one first, then the old one closes -- after the calls in
            # flight on it finish (bounded): a caller that took the old handle just before (a job, or
            # someone clearing the fault that made the device unhealthy) gets its answer, not 207004
            self._connect(p)
            h = p.handle
            if reset or not restarted:
                h.reset()                          # abort what hangs there, drop old allocations / poison
            self._probe(h)
        except AclError as e:
            log.info("device %d not back yet: %s", p.pid, e)
            return False
        finally:
            if old is not None and old is not p.handle:
                # the watch thread must not be joined from itself; close from here is safe
                with contextlib.suppress(Exception):
                    old.close(drain_s=0.0 if old.lost.is_set() else REVIVE_DRAIN_S)
        with self._lock:
            if self._closed.is_set():
                return True
            p.state = "spare"
            p.errors.clear()
            t_lost = p.lost_at
        self._record("recovered", physical=p.pid, restarted=restarted,
                     after_s=(time.monotonic() - t_lost) if t_lost else None)
        self._rebalance()
        return True

    def _probe(self, h) -> None:
        """A tiny task must run to completion within the probe timeout (a hung device fails this)."""
        ptr = h.malloc(64)
        try:
            from devices.tasks import Memset
            sid = h.create_stream(0)
            try:
                h.submit((Memset(sid, ptr, 0, 64),))
                h.synchronize_stream(sid, self.opts.probe_timeout_ms)
            finally:
                with contextlib.suppress(AclError):
                    h.destroy_stream(sid)
        finally:
            with contextlib.suppress(AclError):
                h.free(ptr)

    # ------------------------------------------------------------------ bindings
    def _bind(self, lid: int, p: _Phys, reason: str) -> Binding:
        with self._lock:
            self._gen += 1
            p.state = "bound"
            old = self.bindings.get(lid)
            b = Binding(lid, p.pid, self._gen, p.handle, wrap_handle(p.handle), "npu")
            self.bindings[lid] = b
            self._cv.notify_all()
        self._record("bound", logical=lid, physical=p.pid, gen=b.gen, reason=reason,
                     previous=None if old is None else old.physical)
        return b

    def _bind_cpu(self, lid: int, reason: str) -> Binding:
        with self._lock:
            cpu = self._cpu_device(lid)
            self._gen += 1
            old = self.bindings.get(lid)
            b = Binding(lid, cpu.id, self._gen, cpu, wrap_handle(cpu, "cpu"), "cpu")
            self.bindings[lid] = b
            self._cv.notify_all()
        self._record("bound", logical=lid, physical=cpu.id, gen=b.gen, reason=reason, cpu=True,
                     previous=None if old is None else old.physical)
        return b

    def _cpu_device(self, lid: int):
        from devices.device import Device, DeviceConfig
        with self._lock:
            cpu = self._cpu.get(lid)
            if cpu is None:
                cfg = replace(DeviceConfig(), device_id=CPU_ID_BASE + lid, arena_bytes=self.opts.cpu_arena_bytes)
                cpu = self._cpu[lid] = Device(cfg)
            return cpu

    def _unbind(self, lid: int) -> None:
        with self._lock:
            self.bindings.pop(lid, None)
            self._cv.notify_all()

    def _rebalance(self) -> None:
        """Move logical ids off the CPU fallback (or unbound) onto free devices."""
        if self._closed.is_set():
            return
        with self._lock:
            for lid in sorted(self.bindings):
                b = self.bindings[lid]
                if b.is_cpu:
                    spare = self._take_spare()
                    if spare is None:
                        return
                    self._bind(lid, spare, reason="back from CPU fallback")

    def binding(self, lid: int, timeout: float | None = None, newer_than: int = 0) -> Binding | None:
        """The current binding of logical id ``lid``; waits up to ``timeout`` while it has none or while its
        generation is not above ``newer_than`` (after a device loss: until the pool has re-bound it)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while (lid not in self.bindings or self.bindings[lid].gen <= newer_than) \
                    and not self._closed.is_set():
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cv.wait(left if left is not None else 0.5)
            return self.bindings.get(lid)

    def report_error(self, b: Binding, err: BaseException) -> None:
        """The job layer saw ``err`` on binding ``b``: feed the circuit breaker, take the device out if due."""
        now = time.monotonic()
        if b.is_cpu:
            return
        with self._lock:
            p = self.phys.get(b.physical)
            if p is None or p.handle is not b.handle:
                return
            p.errors.append(now)
            while p.errors and now - p.errors[0] > self.opts.error_window_s:
                p.errors.popleft()
            code = getattr(err, "code", 0)
            lost = b.handle.lost.is_set() if hasattr(b.handle, "lost") else False
            ecc = code == ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR
            trip = len(p.errors) > self.opts.max_errors
            hccl = isinstance(err, HcclError)
        if lost or code == ACL_ERROR_RT_DEVICE_TASK_ABORT and not hccl:
            # loss seen by a call before the watch noticed: handle it now (the watch will agree)
            self._lost(p, b.handle, f"call failed: {err}", cause="call")
            return
        if not ecc:
            self._record("detected", physical=p.pid, cause="task-error", code=code, reason=str(err)[:200],
                         state_was=p.state)
        if ecc:
            self._take_out(p, b.handle, f"HBM ECC error: {err}", cause="ecc", quarantine=False)
        elif trip:
            self._take_out(p, b.handle, f"{len(p.errors)} errors in {self.opts.error_window_s:g} s",
                           cause="breaker", quarantine=True)

    def report_latency(self, b: Binding, seconds: float) -> None:
        """A request took ``seconds`` on binding ``b``: a straggler -- a device far slower than its peers by
        the rule of :mod:`runtime.cluster.straggler` (ratio AND absolute floor AND peers' noise), on every
        request it completed for ``slow_persist_s`` of the pool's clock -- is taken out of service for
        ``quarantine_s`` (its work in flight still completes) when a spare can take its place.  Host-side
        bookkeeping only: nothing waits on a device."""
        if b.is_cpu:
            return
        with self._lock:
            p = self.phys.get(b.physical)
            if p is None or p.handle is not b.handle or p.state != "bound":
                return
            peers = [q.pid for q in self.phys.values() if q is not p and q.state == "bound"]
            v = self._stragglers.report(p.pid, seconds, self._clock(), peers)
            if v is None:
                return
            if self._take_spare() is None:
                return                              # nothing better to run on: keep the slow device
        self._take_out(p, b.handle, v.describe(), cause="slow", quarantine=True)

    def _take_out(self, p: _Phys, h, reason: str, cause: str, quarantine: bool) -> None:
        with self._lock:
            if p.handle is not h or p.state not in ("bound", "spare"):
                return
            p.state = "quarantined" if quarantine else "recovering"
            p.lost_at = time.monotonic()
        self._record("detected", physical=p.pid, cause=cause, reason=reason,
                     code=ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR if cause == "ecc" else 0, state_was="bound")
        if quarantine:
            self._record("quarantined", physical=p.pid, for_s=self.opts.quarantine_s)
        self._replace(p)
        self._start_recovery(p, reset=True, delay_s=self.opts.quarantine_s if quarantine else 0.0)

    # ------------------------------------------------------------------ views
    def logical_ids(self) -> list[int]:
        with self._lock:
            return sorted(self.bindings)

    def healthy_physical(self) -> list[int]:
        """Physical devices in service or ready (bound or spare, not lost)."""
        with self._lock:
            return [pid for pid, p in sorted(self.phys.items())
                    if p.state in ("bound", "spare") and p.handle is not None and not p.handle.lost.is_set()]

    def state(self) -> dict:
        with self._lock:
            return {"bindings": {lid: (b.physical, b.kind, b.gen) for lid, b in self.bindings.items()},
                    "physical": {pid: p.state for pid, p in self.phys.items()}}

    def handle(self, pid: int):
        with self._lock:
            return self.phys[pid].handle

    def wait_for(self, pred, timeout: float) -> bool:
        """Wait until ``pred(pool)`` holds (re-checked on every binding change and every 50 ms)."""
        return wait_polled(self._cv, lambda: pred(self), timeout)

    def hbm_used(self, every: bool = False) -> dict[int, int | None]:
        """HBM bytes in use per physical device: the healthy ones, or (``every``) every device of the pool
        -- a restarted one through its new client -- with None for one that cannot be asked."""
        out: dict[int, int | None] = {}
        for pid in (sorted(self.phys) if every else self.healthy_physical()):
            h = self.phys[pid].handle
            try:
                if h is None or h.lost.is_set():
                    raise AclError(f"device {pid} is not reachable")
                free, total = h.mem_info()
                out[pid] = total - free
            except AclError:
                if every:
                    out[pid] = None
        return out

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            self._cv.notify_all()
        self._monitor.join(timeout=5)
        for t in list(self._threads):
            t.join(timeout=5)
        for p in self.phys.values():
            if p.handle is not None:
                with contextlib.suppress(Exception):
                    p.handle.close()
        for cpu in self._cpu.values():
            with contextlib.suppress(Exception):
                cpu.close()
        self._cpu.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _ray_where(pid: int, timeout: float) -> dict:
    """Where device actor ``npu<pid>`` is now (blocks while Ray restarts it)."""
    rayenv.prepare()
    import ray
    from driver.host import NAMESPACE, actor_name
    h = ray.get_actor(actor_name(pid), namespace=NAMESPACE)
    return ray.get(h.where.remote(), timeout=timeout)


def percentiles(xs, ps=(50, 99)) -> dict:
    if not xs:
        return {f"p{p}": None for p in ps} | {"max": None, "n": 0}
    a = np.asarray(xs, dtype=float)
    out = {f"p{p}": float(np.percentile(a, p)) for p in ps}
    out["max"] = float(a.max())
    out["n"] = len(xs)
    return out


__all__ = ["FailoverOptions", "DevicePool", "Binding", "wrap_handle", "flush_all", "is_failover_error", "percentiles",
           "CPU_ID_BASE"]
