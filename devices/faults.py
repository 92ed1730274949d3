"""A device's fault state (chaos): one table of fault kinds, and the object that holds what is active.

:data:`FAULT_KINDS` is the registry: fault kind -> the parameters it takes, whether ``duration_ms``
applies, how a second injection of the same fault combines with the first, the extra checks it needs,
and the health condition it shows while active.  Every entry point that injects faults (the in-process
backend, DMS ``InjectFault``, ``vnpu chaos``) goes through :meth:`devices.device.Device.inject_fault`,
which validates against this table and applies to the device's :class:`FaultState`.

The device's components *read* the state; nothing outside it edits them:

- the scheduler: ``hang`` (:meth:`FaultState.wait_running` holds the cores), ``slow``
  (:meth:`FaultState.slow_factor`), ``task-fail`` (:meth:`FaultState.take_task_failure`);
- the HBM arena: ``ecc`` (:attr:`FaultState.ecc`, the poisoned ranges);
- the HCCL engine: ``link-down`` (:meth:`FaultState.link_down`);
- the thermal model: ``overheat`` (:meth:`FaultState.overheat_c`).

Every edit (apply, clear, a count running down, expiry) holds the state's lock; the readers on hot paths
read snapshots that edits publish under that lock.  ``duration_ms`` is handled here: a timed fault expires
on the state's clock (injectable), checked whenever the state is read; cores held by a timed hang wake up
by themselves when it expires.  No timer threads.

``kill`` holds nothing: applying it tells the state's listeners, and the device marks itself lost (or,
hosted by a device actor, lets the host process die).

Nothing here orders device work; :meth:`FaultState.wait_running` blocks the calling core thread only.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Mapping

from .errors import InvalidParamError
from .health import Condition, HealthCondition


@dataclass(frozen=True)
class Param:
    """One parameter of a fault kind (the fields of DMS ``InjectFaultRequest``)."""
    name: str
    type: type                          #: int or float
    default: float | None = None        #: None: the parameter is required
    minimum: float = 0.0
    doc: str = ""

    def read(self, kind: str, value) -> int | float:
        if isinstance(value, (bool, str, bytes)):
            raise InvalidParamError(f"fault {kind!r}: {self.name} must be a number, got {value!r}")
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise InvalidParamError(f"fault {kind!r}: {self.name} must be a number, got {value!r}") from None
        if not math.isfinite(v):
            raise InvalidParamError(f"fault {kind!r}: {self.name} must be finite, got {value!r}")
        if self.type is int:
            if v != int(v):
                raise InvalidParamError(f"fault {kind!r}: {self.name} must be an integer, got {value!r}")
            v = int(v)
        if v < self.minimum:
            raise InvalidParamError(f"fault {kind!r}: {self.name} must be >= {self.minimum:g}, got {value!r}")
        return v


#: the parameter of every timed fault
DURATION = Param("duration_ms", float, 0.0, 0.0, "the fault clears itself after this many ms (0: until cleared)")


@dataclass(frozen=True)
class FaultKind:
    """One entry of :data:`FAULT_KINDS`."""
    name: str
    doc: str
    params: tuple[Param, ...] = ()
    timed: bool = False                 #: takes ``duration_ms``
    held: bool = True                   #: False: an action that leaves nothing active (``kill``)
    #: one active entry per key (a second injection with the same key replaces or merges into it)
    key: Callable[[dict], Hashable] = lambda p: None
    #: ``(old, new) -> params`` of a second injection with the same key (default: the new one replaces)
    merge: Callable[[dict, dict], dict] | None = None
    #: extra checks against the device: ``check(params, state)`` raises InvalidParamError
    check: Callable[[dict, "FaultState"], None] | None = None
    #: the health condition the fault shows while active
    condition: Callable[[dict], HealthCondition] | None = None

    @property
    def accepts(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params) + ((DURATION.name,) if self.timed else ())

    def read_params(self, params: Mapping) -> dict:
        """Validate ``params`` against this kind and fill in defaults (InvalidParamError on anything else)."""
        spec = {p.name: p for p in self.params + ((DURATION,) if self.timed else ())}
        unknown = sorted(set(params) - set(spec))
        if unknown:
            takes = ", ".join(spec) or "no parameters"
            raise InvalidParamError(f"fault {self.name!r} takes {takes}; not {', '.join(unknown)}")
        out = {}
        for name, p in spec.items():
            if name in params:
                out[name] = p.read(self.name, params[name])
            elif p.default is None:
                raise InvalidParamError(f"fault {self.name!r} needs {name}")
            else:
                out[name] = p.type(p.default)
        return out


def _check_ecc(p: dict, st: "FaultState") -> None:
    if p["offset"] + p["length"] > st.arena_bytes:
        raise InvalidParamError(f"ECC range [{p['offset']}, {p['offset'] + p['length']}) outside the "
                                f"{st.arena_bytes} B arena")


def _check_peer(p: dict, st: "FaultState") -> None:
    if p["peer"] == st.device_id:
        raise InvalidParamError(f"link-down: device {st.device_id} has no link to itself")


FAULT_KINDS: dict[str, FaultKind] = {k.name: k for k in (
    FaultKind("kill", "the device is lost: every later call fails with ACL_ERROR_RT_DEVICE_TASK_ABORT; a "
                      "device actor's host process dies after replying", held=False),
    FaultKind("hang", "the cores stop running blocks (queued work stays queued, heartbeats stop)", timed=True,
              condition=lambda p: HealthCondition(Condition.HANG, "Critical",
                                                  "cores hung (fault hang): no task runs")),
    FaultKind("slow", "tasks take `factor` x their time, wall and modeled",
              (Param("factor", float, 10.0, 1.0, "slow-down factor"),), timed=True,
              condition=lambda p: HealthCondition(Condition.SLOW, "Warning",
                                                  f"tasks run {p['factor']:g}x slower (fault slow)",
                                                  value=p["factor"])),
    FaultKind("ecc", "arena bytes [offset, offset+length) hold an uncorrectable ECC error: any access of the "
                     "range fails with ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR until cleared or reset",
              (Param("offset", int, 0, 0, "device-relative arena offset"), Param("length", int, 1, 1, "bytes")),
              key=lambda p: (p["offset"], p["length"]), check=_check_ecc,
              condition=lambda p: HealthCondition(Condition.ECC, "Alarm",
                                                  f"uncorrectable HBM ECC error in [0x{p['offset']:x}, "
                                                  f"0x{p['offset'] + p['length']:x})", value=p["length"])),
    FaultKind("link-down", "the link to device `peer` is down: every collective with that peer fails with "
                           "HCCL_E_NETWORK (on both ends)",
              (Param("peer", int, None, 0, "the peer device id"),), timed=True, key=lambda p: p["peer"],
              check=_check_peer,
              condition=lambda p: HealthCondition(Condition.LINK_DOWN, "Warning", f"link to device {p['peer']} down",
                                                  peer=p["peer"])),
    FaultKind("task-fail", "the next `count` tasks fail with ACL_ERROR_RT_AICORE_EXCEPTION",
              (Param("count", int, 1, 1, "tasks to fail"),),
              merge=lambda old, new: {"count": old["count"] + new["count"]},
              condition=lambda p: HealthCondition(Condition.TASK_FAILURES, "Warning",
                                                  f"the next {p['count']} tasks fail (fault task-fail)",
                                                  value=p["count"])),
    FaultKind("overheat", "the die runs `celsius` degrees hotter (the thermal model raises its alarms)",
              (Param("celsius", float, 70.0, 0.0, "extra degrees"),), timed=True),
)}

#: what ``inject_fault`` also accepts: undo every fault (``clear_fault()``)
CLEAR = "clear"


def fault_kind(name: str) -> FaultKind:
    k = FAULT_KINDS.get(name) if isinstance(name, str) else None
    if k is None:
        raise InvalidParamError(f"unknown fault kind {name!r}; known: {', '.join(FAULT_KINDS)}, {CLEAR}")
    return k


@dataclass
class _Entry:
    kind: FaultKind
    params: dict
    until: float | None                 #: expiry on the state's clock; None = until cleared


_INF = float("inf")


class FaultState:
    """The faults active on one device (``arena_bytes`` and ``device_id`` bound their parameters; ``clock``
    times their durations).  Listeners (``listen``) hear the kind of every fault applied, cleared or
    expired, called outside the lock."""

    def __init__(self, arena_bytes: int, device_id: int = 0, clock: Callable[[], float] = time.monotonic):
        self.arena_bytes = arena_bytes
        self.device_id = device_id
        self.clock = clock
        self._cv = threading.Condition()
        self._active: dict[tuple, _Entry] = {}       # (kind, key) -> entry
        self._listeners: list[Callable[[str], None]] = []
        self._closed = False
        # snapshots for hot-path readers, published under the lock
        self._next_expiry = _INF
        self._hung = False
        self._slow = 1.0
        self._overheat = 0.0
        self._links: frozenset = frozenset()
        self._task_fail = 0
        self.ecc: tuple = ()            #: poisoned arena ranges ((start, end), ...), read by the arena

    def __repr__(self) -> str:
        return f"FaultState(device={self.device_id}, active={self.active()})"

    # ---------------------------------------------------------------- edits (all under the lock)
    def listen(self, fn: Callable[[str], None]) -> None:
        self._listeners.append(fn)

    def apply(self, kind: str, params: Mapping | None = None) -> None:
        """Validate and apply one fault (host-synchronous; InvalidParamError for a bad kind or parameter)."""
        k = fault_kind(kind)
        p = k.read_params(params or {})
        if k.check is not None:
            k.check(p, self)
        duration = p.pop(DURATION.name, 0.0)
        if k.held:
            with self._cv:
                key = (k.name, k.key(p))
                old = self._active.get(key)
                if old is not None and k.merge is not None:
                    p = k.merge(old.params, p)
                self._active[key] = _Entry(k, p, self.clock() + duration / 1000.0 if duration else None)
                self._publish()
        self._tell((k.name,))

    def clear(self, kind: str | None = None) -> None:
        """Undo the faults of ``kind`` (every fault when None).  ``kill`` cannot be undone."""
        if kind is not None and not fault_kind(kind).held:
            raise InvalidParamError(f"fault {kind!r} cannot be cleared")
        with self._cv:
            gone = [key for key in self._active if kind is None or key[0] == kind]
            for key in gone:
                del self._active[key]
            self._publish()
        self._tell(sorted({key[0] for key in gone}))

    def take_task_failure(self) -> bool:
        """One task is about to run: True when it must fail (fault ``task-fail``; counts the fault down)."""
        if not self._task_fail:
            return False
        with self._cv:
            e = self._active.get(("task-fail", None))
            if e is None:
                return False
            left = e.params["count"] - 1
            if left > 0:
                e.params = {"count": left}
            else:
                del self._active[("task-fail", None)]
            self._publish()
        return True

    def close(self) -> None:
        """The device is going away: cores held by a hang are let go (for good)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def _publish(self) -> None:
        """Lock held: recompute what hot-path readers see; wake cores when a hang may have ended."""
        act = self._active
        self._hung = ("hang", None) in act
        self._slow = act[("slow", None)].params["factor"] if ("slow", None) in act else 1.0
        self._overheat = act[("overheat", None)].params["celsius"] if ("overheat", None) in act else 0.0
        self._links = frozenset(key[1] for key in act if key[0] == "link-down")
        t = act.get(("task-fail", None))
        self._task_fail = t.params["count"] if t is not None else 0
        self.ecc = tuple((o, o + n) for (kind, key) in act if kind == "ecc" for o, n in (key,))
        self._next_expiry = min((e.until for e in act.values() if e.until is not None), default=_INF)
        self._cv.notify_all()

    def _expire(self) -> None:
        now = self.clock()
        with self._cv:
            gone = [key for key, e in self._active.items() if e.until is not None and e.until <= now]
            for key in gone:
                del self._active[key]
            if gone:
                self._publish()
        if gone:
            self._tell(sorted({key[0] for key in gone}))

    def _tick(self) -> None:
        if self._next_expiry != _INF and self.clock() >= self._next_expiry:
            self._expire()

    def _tell(self, kinds: Iterable[str]) -> None:
        for kind in kinds:
            for fn in list(self._listeners):
                fn(kind)

    # ---------------------------------------------------------------- reads
    def hung(self) -> bool:
        self._tick()
        return self._hung

    def wait_running(self) -> None:
        """Block the calling core thread while a hang holds the cores (until it is cleared, expires, or
        the device closes).  Returns at once when there is none."""
        if not self._hung:
            return
        while True:
            self._tick()
            with self._cv:
                e = self._active.get(("hang", None))
                if e is None or self._closed:
                    return
                self._cv.wait(None if e.until is None else max(0.0, e.until - self.clock()))

    def slow_factor(self) -> float:
        self._tick()
        return self._slow

    def overheat_c(self) -> float:
        self._tick()
        return self._overheat

    def link_down(self, peer: int) -> bool:
        """Whether the link to device ``peer`` is down."""
        self._tick()
        return peer in self._links

    def active(self) -> dict[str, list[dict]]:
        """The active faults: kind -> the parameters of each (for reports and tests)."""
        self._tick()
        with self._cv:
            out: dict[str, list[dict]] = {}
            for (kind, _), e in self._active.items():
                out.setdefault(kind, []).append(dict(e.params))
            return out

    def conditions(self) -> list[HealthCondition]:
        """The health conditions the active faults show."""
        self._tick()
        with self._cv:
            entries = list(self._active.values())
        return [e.kind.condition(e.params) for e in entries if e.kind.condition is not None]


__all__ = ["FAULT_KINDS", "CLEAR", "FaultKind", "FaultState", "Param", "fault_kind"]
