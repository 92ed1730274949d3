"""Where the time went: the launch / alloc / copy / sync / compute / idle breakdown, on both clocks.

**Wall clock** (:func:`wall_breakdown`): the profile's span is cut at every start and end of a device
task and of a host API call made by user code (depth 0); each piece goes to the first category active in
it, in the order compute (a kernel or collective running on a device) > copy (a device copy task) > the
host call's category (launch, alloc, copy, sync, other) > idle.  Device work that overlaps host calls is
compute: a launch hidden behind running kernels costs nothing.

**Modeled clock** (:func:`modeled_timeline`): the same program replayed on the reference chip.  The host
calls are taken in the order they were made, each charged by :class:`~runtime.profiler.hostcost.HostCostSpec`
(user code between calls costs 0); ops reach the device with the submit (doorbell) that carried them;
each device task starts then, once its stream is free (event records and waits order streams), and
lasts its modeled duration from the device's cost model (:mod:`devices.chip`); a synchronize waits for
the device's work so far, then pays its own cost.  The pieces are counted the same
way as on the wall clock.  Pure computation over a :class:`~runtime.profiler.collector.RawProfile`.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable

from .collector import RawProfile
from .hostcost import REFERENCE, HostCostSpec

#: breakdown rows, in the order they are printed; PRIORITY decides overlaps (first wins)
CATEGORIES = ("launch", "alloc", "copy", "sync", "compute", "other", "idle")
PRIORITY = ("compute", "dcopy", "launch", "alloc", "copy", "sync", "other")
#: device compute share below which a program is runtime-bound (issue 16)
RUNTIME_BOUND = 0.60


@dataclass
class Breakdown:
    """Seconds per category over ``total`` seconds (``clock``: wall | modeled)."""
    clock: str
    total: float
    seconds: dict[str, float] = field(default_factory=dict)

    def share(self, cat: str) -> float:
        return self.seconds.get(cat, 0.0) / self.total if self.total > 0 else 0.0

    def shares(self) -> dict[str, float]:
        return {c: self.share(c) for c in CATEGORIES}

    @property
    def compute_share(self) -> float:
        return self.share("compute")

    def verdict(self) -> str:
        c = self.compute_share
        if c < RUNTIME_BOUND:
            return (f"runtime-bound: device compute is {c:.0%} of the {self.clock} time (< {RUNTIME_BOUND:.0%}); "
                    f"the runtime, not the kernels, is the bottleneck")
        return f"compute-bound: device compute is {c:.0%} of the {self.clock} time (>= {RUNTIME_BOUND:.0%})"

    def as_dict(self) -> dict:
        return {"clock": self.clock, "total_s": self.total, "seconds": dict(self.seconds), "shares": self.shares(),
                "verdict": self.verdict()}


def sweep(intervals: Iterable[tuple[float, float, str]], t0: float, t1: float, clock: str) -> Breakdown:
    """Cut [t0, t1] at every interval boundary and give each piece to its highest-priority active
    category (:data:`PRIORITY`); uncovered time is idle.  The seconds add up to ``t1 - t0``."""
    rank = {c: i for i, c in enumerate(PRIORITY)}
    points: list[tuple[float, int, int]] = []
    for s, e, cat in intervals:
        s, e = max(s, t0), min(e, t1)
        if e > s:
            points.append((s, 1, rank[cat]))
            points.append((e, -1, rank[cat]))
    points.sort()
    active = [0] * len(PRIORITY)
    secs = {c: 0.0 for c in CATEGORIES}
    prev = t0
    for t, delta, r in points:
        if t > prev:
            top = next((i for i, n in enumerate(active) if n > 0), None)
            cat = "idle" if top is None else PRIORITY[top]
            secs["copy" if cat == "dcopy" else cat] += t - prev
            prev = t
        active[r] += delta
    if t1 > prev:
        top = next((i for i, n in enumerate(active) if n > 0), None)
        cat = "idle" if top is None else PRIORITY[top]
        secs["copy" if cat == "dcopy" else cat] += t1 - prev
    return Breakdown(clock, t1 - t0, secs)


def _task_cat(task: dict) -> str:
    return "dcopy" if task.get("task_type") == "MEMCPY" else "compute"


def top_level(raw: RawProfile) -> list[tuple]:
    """The API calls user code made (depth 0), in time order."""
    return sorted((a for a in raw.api if a[6] == 0), key=lambda a: a[4])


def wall_breakdown(raws: list[RawProfile]) -> Breakdown:
    """The wall-clock breakdown over every process's profile span (see the module docstring)."""
    ivs: list[tuple[float, float, str]] = []
    for raw in raws:
        for a in top_level(raw):
            ivs.append((a[4], a[5], a[1]))
        for d in raw.devices:
            for t in d["tasks"]:
                ivs.append((t["start"], t["end"], _task_cat(t)))
    if not raws:
        return Breakdown("wall", 0.0, {c: 0.0 for c in CATEGORIES})
    t0 = min(r.t_start for r in raws)
    t1 = max(r.t_stop for r in raws)
    return sweep(ivs, t0, t1, "wall")


@dataclass
class ModeledTimeline:
    """The modeled replay: host calls ``(name, category, start, end)``, device tasks keyed like the
    flows ``(physical id, stream, seq) -> (start, end)`` in modeled seconds from 0, and the breakdown."""
    host: list[tuple[str, str, float, float]]
    tasks: dict[tuple[int, int, int], tuple[float, float]]
    breakdown: Breakdown


def modeled_timeline(raw: RawProfile, spec: HostCostSpec = REFERENCE) -> ModeledTimeline:
    """Replay one process's profile on the modeled clock (see the module docstring).  Ops reach a device
    with the submit (doorbell) that carried them; event records and waits order the streams."""
    tasks: dict[tuple[int, int, int], dict] = {}
    for d in raw.devices:
        for t in d["tasks"]:
            tasks[(d["device"], t["stream"], t["seq"])] = t
    r = _Replay(tasks)
    for _, _, kind, p in _host_items(raw):
        if kind == "call":
            cost = _call_cost(spec, p)
            if cost is not None:                 # a sync is charged at its end, after what rode on it
                r.host(p[0], p[1], cost)
        elif kind == "op":
            r.pending.setdefault(p[1], []).append(p)
        elif kind == "submit":
            r.submit(p, spec.submit())
        else:                                    # sync_end: wait for the device, then the call's own cost
            r.h = max(r.h, r.dev_done)
            r.host(p[0], "sync", spec.sync())
    total = max(r.h, r.dev_done)
    ivs = [(s, e, c) for s, e, c in r.dev_iv] + [(s, e, cat) for _, cat, s, e in r.host_iv]
    return ModeledTimeline(r.host_iv, r.placed, sweep(ivs, 0.0, total, "modeled"))


def _host_items(raw: RawProfile) -> list[tuple[float, int, str, tuple]]:
    """The profile's items in host order: (time, order, kind, payload); a sync's wait happens at its end."""
    items: list[tuple[float, int, str, tuple]] = []
    for a in raw.api:
        if a[0] == "rtSubmit":
            items.append((a[4], 2, "submit", a))
        elif a[6] == 0:
            items.append((a[4], 1, "call", a))
            if a[1] == "sync":
                items.append((a[5], 0, "sync_end", a))
    for f in raw.flows:
        items.append((f[5], 3, "op", f))
    items.sort(key=lambda x: (x[0], x[1]))
    return items


def _call_cost(spec: HostCostSpec, p: tuple) -> float | None:
    """The modeled host cost of one top-level API call; None for a sync (charged at its end)."""
    name, cat = p[0], p[1]
    info = p[7] or {}
    if cat == "launch":
        return spec.launch()
    if cat == "alloc":
        return spec.alloc(name)
    if cat == "copy":
        return spec.copy(int(info.get("bytes", 0)), bool(info.get("pinned")), bool(info.get("async")))
    if cat == "sync":
        return None
    return spec.call()


class _Replay:
    """The modeled replay's state: the host clock ``h``, the ops waiting for their submit (per device),
    when each stream is free and each event was recorded, when the device is done, and what was placed."""

    def __init__(self, tasks: dict[tuple[int, int, int], dict]):
        self.tasks = tasks
        self.h = 0.0
        self.pending: dict[int, list[tuple]] = {}
        self.stream_free: dict[tuple[int, int], float] = {}
        self.event_at: dict[tuple[int, int], float] = {}
        self.dev_done = 0.0
        self.host_iv: list[tuple[str, str, float, float]] = []
        self.dev_iv: list[tuple[float, float, str]] = []
        self.placed: dict[tuple[int, int, int], tuple[float, float]] = {}

    def host(self, name: str, cat: str, cost: float) -> None:
        """Charge ``cost`` to the host clock as one interval."""
        self.host_iv.append((name, cat, self.h, self.h + cost))
        self.h += cost

    def submit(self, p: tuple, cost: float) -> None:
        """One submit (doorbell): its host cost, then the ops it carried, in order, on their streams."""
        self.host("rtSubmit", "launch", cost)
        info = p[7] or {}
        phys = info.get("device")
        queue = self.pending.get(phys, [])
        n = int(info.get("ops", 0))
        batch, self.pending[phys] = queue[:n], queue[n:]
        for f in batch:
            self._place(f)

    def _place(self, f: tuple) -> None:
        skey = (f[1], f[2])
        if f[3] < 0:                     # an event record or wait
            ev = (f[1], f[7] if len(f) > 7 else -1)
            if f[6] == "Record":
                self.event_at[ev] = max(self.h, self.stream_free.get(skey, 0.0))
            elif f[6] == "Wait":
                self.stream_free[skey] = max(self.stream_free.get(skey, 0.0), self.event_at.get(ev, 0.0))
            return
        key = (f[1], f[2], f[3])
        t = self.tasks.get(key)
        if t is None:
            return
        dur = max(0.0, t["model_end"] - t["model_start"])
        start = max(self.h, self.stream_free.get(skey, 0.0))
        end = start + dur
        self.stream_free[skey] = end
        self.dev_done = max(self.dev_done, end)
        self.placed[key] = (start, end)
        self.dev_iv.append((start, end, _task_cat(t)))


def modeled_breakdown(raws: list[RawProfile], spec: HostCostSpec = REFERENCE) -> Breakdown:
    """The modeled breakdown summed over processes (each replayed on its own host)."""
    secs = {c: 0.0 for c in CATEGORIES}
    total = 0.0
    for raw in raws:
        b = modeled_timeline(raw, spec).breakdown
        total += b.total
        for c, v in b.seconds.items():
            secs[c] += v
    return Breakdown("modeled", total, secs)


def top_ops(raws: list[RawProfile], n: int = 10) -> list[tuple[str, int, float, float]]:
    """(op type, count, total wall s, total modeled s) of the device tasks, largest wall total first."""
    acc: dict[str, list] = {}
    for raw in raws:
        for d in raw.devices:
            for t in d["tasks"]:
                a = acc.setdefault(t["op_type"], [0, 0.0, 0.0])
                a[0] += 1
                a[1] += t["end"] - t["start"]
                a[2] += t["model_end"] - t["model_start"]
    rows = [(k, v[0], v[1], v[2]) for k, v in acc.items()]
    return heapq.nlargest(n, rows, key=lambda r: r[2])
