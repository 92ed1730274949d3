"""The collector: one profile of one process -- host API records, launch flows, device task records.

Host records are tuples appended to lists (``list.append`` is atomic under the GIL, so any thread may
record without a lock): API calls ``(name, category, level, tid, t0, t1, depth, info)`` with ``depth`` 0
for a call made by user code and more for calls made inside another recorded call (``acl.rt.malloc`` ->
``Device.malloc``), and flows ``(device index, physical id, stream, seq, tid, t, op name, event)`` -- one
per stream op queued for a device; ops that become device tasks are numbered per stream in submission
order from 0 at the start of the device's session, exactly as the device numbers its task records
(:mod:`devices.profiling`), so that ``(physical id, stream, seq)`` is the flow id that links a launch to
its device task (event records and waits: seq -1 and their event id).  Submits ``rtSubmit`` (a batch
handed to a device: the doorbell) are API records with ``{"ops", "device"}``.

Devices: :meth:`Collector.attach` flushes what the runtime device had queued and opens a session for
this client on the device (``DeviceHandle.profile("start")``); :meth:`Collector.stop` closes every
session and fetches its records.  Both are host-synchronous (one round trip per device).  Times are
``time.perf_counter()`` seconds.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from devices.errors import AclError

_now = time.perf_counter
_ident = threading.get_ident

#: stream op types that become device tasks (event records and waits take no core and get no record)
TASK_OPS = frozenset({"Launch", "CopyD2D", "Memset", "WriteH2D", "Collective", "ExecGraph"})


@dataclass
class RawProfile:
    """What one process collected: the input of the exporters (``as_dict`` / ``from_dict`` for JSON)."""
    pid: int
    argv: list[str]
    t_start: float
    t_stop: float
    api: list[tuple] = field(default_factory=list)
    flows: list[tuple] = field(default_factory=list)
    devices: list[dict] = field(default_factory=list)     #: {"index", "device", "tasks", "dropped"}
    threads: dict[int, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"format": "vnpu-prof-raw/1", "pid": self.pid, "argv": self.argv, "t_start": self.t_start,
                "t_stop": self.t_stop, "api": [list(a) for a in self.api], "flows": [list(f) for f in self.flows],
                "devices": self.devices, "threads": {str(k): v for k, v in self.threads.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "RawProfile":
        return cls(int(d["pid"]), list(d.get("argv", [])), float(d["t_start"]), float(d["t_stop"]),
                   [tuple(a) for a in d.get("api", [])], [tuple(f) for f in d.get("flows", [])],
                   list(d.get("devices", [])), {int(k): v for k, v in d.get("threads", {}).items()})


class Collector:
    """Records of one profile (see the module docstring).  ``record_api`` / ``record_tasks`` follow
    ``ACL_PROF_ACL_API`` / ``ACL_PROF_TASK_TIME`` (both on by default)."""

    def __init__(self, record_api: bool = True, record_tasks: bool = True, devices: set[int] | None = None,
                 runtime: Any = None):
        self.record_api = record_api
        self.record_tasks = record_tasks
        self.only = devices                  #: user device ids to profile (None: all)
        self.runtime = runtime               #: the one runtime whose devices are profiled (None: all)
        self.api: list[tuple] = []
        self._ops: list[tuple] = []          #: (runtime device, op type, stream, kernel, event, thread, time)
        self._attached: dict[int, Any] = {}  #: id(runtime device) -> runtime device
        self._queues: dict[int, Any] = {}    #: id(its launch queue) -> the runtime device
        self._lock = threading.Lock()
        self._devices: list[dict] = []       #: records of sessions closed early (detach)
        self.t_start = time.perf_counter()
        self.t_stop = 0.0
        self.stopped = False

    # ------------------------------------------------------------------ hooks (any thread)
    # Kept to a few appends each: nesting depth, flow numbering and thread names are worked out once, in
    # stop() (a call nests in another when it lies inside it on the same thread).
    def call(self, name: str, cat: str, level: str, fn, args, kwargs, info):
        """Run ``fn(*args, **kwargs)`` and record it as API ``name``."""
        t0 = _now()
        try:
            return fn(*args, **kwargs)
        finally:
            t1 = _now()
            if self.record_api:
                self.api.append((name, cat, level, _ident(), t0, t1, 0,
                                 None if info is None else _info(info, args, kwargs)))

    def submit(self, device: int, nops: int, t0: float, t1: float) -> None:
        """A batch of ``nops`` stream ops was handed to physical device ``device`` (the doorbell)."""
        if self.record_api:
            self.api.append(("rtSubmit", "launch", "Runtime", _ident(), t0, t1, 0, {"ops": nops, "device": device}))

    def op(self, queue, op) -> None:
        """Stream op ``op`` enters launch queue ``queue`` (every op a runtime device sends passes one:
        the program's and the memory pool's alike): note it (numbered in :meth:`stop`: ops that become
        device tasks get their stream's next ``seq``, the flow id; event records and waits get seq -1 and
        their event, which orders streams in the modeled replay)."""
        dev = self._queues.get(id(queue))
        if dev is not None:                    # not the op itself: a WriteH2D holds its bytes
            self._ops.append((dev, type(op).__name__, op.stream, getattr(op, "kernel", None),
                              getattr(op, "event", -1), _ident(), _now()))

    # ------------------------------------------------------------------ devices
    def attach(self, dev) -> None:
        """Open this client's session on runtime device ``dev`` (flushes its queued ops first: they
        belong to no session).  Host-synchronous.  A device that cannot profile is skipped."""
        with self._lock:
            if self.stopped or id(dev) in self._attached or not self.record_tasks:
                return
            if self.only is not None and dev.index not in self.only:
                return
            if self.runtime is not None and getattr(dev, "rt", None) is not self.runtime:
                return
            self._attached[id(dev)] = dev
            self._queues[id(dev.queue)] = dev
            self._ops.append((dev, None, 0, None, -1, 0, 0.0))   # its session starts: numbering restarts
        try:
            dev.flush(raise_errors=False)
            dev.handle.profile("start")
        except (AclError, AttributeError) as e:
            with self._lock:
                self._attached.pop(id(dev), None)
                self._queues.pop(id(dev.queue), None)
            print(f"vnpu prof: device {dev.index} not profiled: {e}", file=sys.stderr)

    def detach(self, devs) -> None:
        """Close the sessions of runtime devices ``devs`` now and keep their records (a runtime that is
        closing while the profile still runs)."""
        with self._lock:
            mine = [self._attached.pop(id(d)) for d in devs if id(d) in self._attached]
            for d in mine:
                self._queues.pop(id(d.queue), None)
        self._devices.extend(self._fetch(mine))

    def stop(self) -> RawProfile:
        """Close every device session (after sending what is queued) and return everything recorded."""
        with self._lock:
            if self.stopped:
                raise RuntimeError("profile already stopped")
            self.stopped = True
            devs = list(self._attached.values())
            self._attached.clear()
            self._queues.clear()
        devices = self._devices + self._fetch(devs)
        self.t_stop = time.perf_counter()
        api = _with_depths(list(self.api))
        names = {t.ident: t.name for t in threading.enumerate()}
        threads = {tid: names.get(tid, f"thread {tid}") for tid in {a[3] for a in api}}
        return RawProfile(os.getpid(), list(sys.argv), self.t_start, self.t_stop, api, _flows(list(self._ops)),
                          devices, threads)

    def _fetch(self, devs) -> list[dict]:
        devices = []
        for dev in devs:
            try:
                dev.flush(raise_errors=False)     # tasks still running then are not in the profile
            except AclError:
                pass
            try:
                got = dev.handle.profile("stop")
            except (AclError, AttributeError) as e:
                print(f"vnpu prof: device {dev.index}: records lost: {e}", file=sys.stderr)
                continue
            devices.append({"index": dev.index, "device": got.get("device", dev.physical_id),
                            "tasks": got.get("tasks", []), "dropped": got.get("dropped", 0)})
        return devices


def _info(info, args, kwargs):
    try:
        return info(*args, **kwargs)
    except Exception:  # noqa: BLE001 - a profile never breaks the call it records
        return None


def _with_depths(api: list[tuple]) -> list[tuple]:
    """Set each record's depth: how many records of its thread it lies inside."""
    out = []
    by_thread: dict[int, list[tuple]] = {}
    for a in api:
        by_thread.setdefault(a[3], []).append(a)
    for recs in by_thread.values():
        recs.sort(key=lambda a: (a[4], -a[5]))
        stack: list[float] = []
        for a in recs:
            while stack and a[4] >= stack[-1]:
                stack.pop()
            out.append(a[:6] + (len(stack),) + a[7:])
            stack.append(a[5])
    out.sort(key=lambda a: a[4])
    return out


def _flows(ops: list[tuple]) -> list[tuple]:
    """Number the noted ops as the devices number their task records (see the module docstring)."""
    seq: dict[tuple[int, int], int] = {}
    out = []
    for dev, kind, stream, kernel, event, tid, t in ops:
        if kind is None:                      # a session (re)started on this device
            for key in [k for k in seq if k[0] == dev.physical_id]:
                del seq[key]
            continue
        if kind in TASK_OPS:
            key = (dev.physical_id, stream)
            n = seq.get(key, 0)
            seq[key] = n + 1
            event = -1
        else:
            n, event = -1, int(event)
        out.append((dev.index, dev.physical_id, stream, n, tid, t, kernel or kind, event))
    return out
