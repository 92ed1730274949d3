"""Shadow memory: the access history of every allocated byte range of one device.

The device's allocations are covered by :class:`Cell` objects (sorted, disjoint, split where accesses
begin and end, merged again where a write makes neighbours alike).  A cell holds, for its bytes:

- ``init``: every byte was written since the allocation (initcheck);
- ``w``: the last write, and ``r``: the reads since it, one per agent (racecheck, FastTrack-style: an
  agent's later read replaces its earlier one, a write clears the reads it is ordered after).

An *actor* is who accessed: ``(task, step, what)`` -- the :class:`Task` (agent, epoch, label, stream,
call site), the :class:`Step` of a graph replay that did it (or None), and the argument (``"input 0"``).
:func:`access` checks one declared access against the history and records it; a graph replay applies
its precomputed :class:`Footprint` the same way (:func:`replay`), one cell of footprint at a time.  What
the checks find goes to a collector (:class:`Hits`): hazards (two accesses, at least one a write, of
different agents, neither ordered before the other) and reads of never-written bytes.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field


class Task:
    """One device task or host call: ``agent`` and its epoch ``clock`` (see :mod:`.clocks`)."""
    __slots__ = ("agent", "clock", "label", "stream", "device", "site")

    def __init__(self, agent: int, clock: int, label: str, stream: int | None, device: int, site: int):
        self.agent, self.clock, self.label, self.stream, self.device, self.site = \
            agent, clock, label, stream, device, site


@dataclass(frozen=True, eq=False)
class Step:
    """A captured op of a graph: its position, label and capture site."""
    index: int
    label: str
    site: int


def actor_key(actor) -> tuple[int, int]:
    """The call-site identity of an actor: its task's site and (replays) its step's capture site."""
    step = actor[1]
    return actor[0].site, (step.site if step is not None else -1)


class Cell:
    __slots__ = ("lo", "hi", "alloc", "init", "w", "r")

    def __init__(self, lo: int, hi: int, alloc, init: bool = False, w=None, r=None):
        self.lo, self.hi, self.alloc, self.init, self.w, self.r = lo, hi, alloc, init, w, r

    def split(self, x: int) -> "Cell":
        """Cut at ``x``: this cell keeps ``[lo, x)``, the returned one gets ``[x, hi)``."""
        new = Cell(x, self.hi, self.alloc, self.init, self.w, dict(self.r) if self.r else None)
        self.hi = x
        return new


class Shadow:
    """The cells of one device (addresses are device pointers)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.cells: list[Cell] = []

    def __len__(self) -> int:
        return len(self.cells)

    def _cut(self, x: int) -> None:
        i = bisect.bisect_right(self.starts, x) - 1
        if i >= 0:
            c = self.cells[i]
            if c.lo < x < c.hi:
                self.cells.insert(i + 1, c.split(x))
                self.starts.insert(i + 1, x)

    def span(self, lo: int, hi: int) -> tuple[int, int]:
        """Indices ``[i, j)`` of the cells inside ``[lo, hi)`` after cutting at both ends (gaps between
        allocations have no cells)."""
        self._cut(lo)
        self._cut(hi)
        return bisect.bisect_left(self.starts, lo), bisect.bisect_left(self.starts, hi)

    def add(self, lo: int, hi: int, alloc) -> None:
        """A new allocation ``[lo, hi)``: one fresh cell (never written, no history)."""
        self.remove(lo, hi)
        i = bisect.bisect_left(self.starts, lo)
        self.starts.insert(i, lo)
        self.cells.insert(i, Cell(lo, hi, alloc))

    def remove(self, lo: int, hi: int) -> None:
        i, j = self.span(lo, hi)
        del self.starts[i:j]
        del self.cells[i:j]

    def merge(self, i: int, j: int) -> None:
        """Coalesce ``cells[i:j]`` where neighbours touch and are alike (same allocation, last write,
        init, no reads)."""
        cells = self.cells
        k = i
        while k + 1 < j:
            a, b = cells[k], cells[k + 1]
            if a.hi == b.lo and a.alloc is b.alloc and a.w is b.w and a.init == b.init and not a.r and not b.r:
                a.hi = b.hi
                del cells[k + 1]
                del self.starts[k + 1]
                j -= 1
            else:
                k += 1


class Hits:
    """What one task's accesses found: hazards by (earlier actor's site, this actor's site), each with
    the byte range it covers, and never-written bytes read, by actor."""
    __slots__ = ("hazards", "uninit")

    def __init__(self) -> None:
        self.hazards: dict = {}
        self.uninit: dict = {}

    def hazard(self, prior, actor, cell: Cell, kind: str) -> None:
        key = (actor_key(prior), actor_key(actor))
        h = self.hazards.get(key)
        if h is None:
            self.hazards[key] = [prior, actor, kind, cell.lo, cell.hi, cell.alloc]
        else:
            h[3], h[4] = min(h[3], cell.lo), max(h[4], cell.hi)

    def uninit_read(self, actor, cell: Cell) -> None:
        key = (actor_key(actor), id(cell.alloc))
        u = self.uninit.get(key)
        if u is None:
            self.uninit[key] = [actor, cell.lo, cell.hi, cell.alloc]
        else:
            u[1], u[2] = min(u[1], cell.lo), max(u[2], cell.hi)

    def __bool__(self) -> bool:
        return bool(self.hazards or self.uninit)


def access(sh: Shadow, lo: int, hi: int, actor, vc: dict, write: bool, partial: bool, hits: Hits,
           races: bool = True, init: bool = True) -> None:
    """Check and record one access of ``[lo, hi)`` by ``actor`` whose agent's clock is ``vc``
    (``races``/``init``: run racecheck / initcheck)."""
    if hi <= lo:
        return
    i, j = sh.span(lo, hi)
    if i == j:
        return
    cells = sh.cells
    task = actor[0]
    a = task.agent
    get = vc.get
    for k in range(i, j):
        c = cells[k]
        if races:
            w = c.w
            if w is not None:
                wt = w[0]
                if wt.agent != a and wt.clock > get(wt.agent, 0):
                    hits.hazard(w, actor, c, "WAW" if write else "RAW")
            if write and c.r:
                for ra in c.r.values():
                    rt = ra[0]
                    if rt.agent != a and rt.clock > get(rt.agent, 0):
                        hits.hazard(ra, actor, c, "WAR")
        if write:
            c.w = actor
            c.r = None
            if not partial:
                c.init = True
        else:
            if init and not partial and not c.init:
                hits.uninit_read(actor, c)
            if c.r is None:
                c.r = {a: actor}
            else:
                c.r[a] = actor
    if write and j - i > 1:
        sh.merge(i, j)


# ------------------------------------------------------------------------------------- graph footprints
@dataclass
class FootCell:
    """What one graph replay does to a byte range, as the ordered accesses of its steps sum up (steps are
    ``(step, what)`` templates; a replay makes them actors of its task)."""
    first: tuple                       #: the first access ...
    first_write: bool                  #: ... and whether it writes
    wfirst: tuple | None = None        #: the first write (a WAR is this one)
    wlast: tuple | None = None         #: the last write (what later accesses see)
    winit: bool = False                #: some write covers every byte (not a scatter)
    rfirst: tuple | None = None        #: the first read
    uninit: tuple | None = None        #: the first full read before any full write (initcheck)

    def key(self) -> tuple:
        return (id(self.first[0]), self.first[1], self.first_write, _tid(self.wfirst), _tid(self.wlast), self.winit,
                _tid(self.rfirst), _tid(self.uninit))


def _tid(t):
    return None if t is None else (id(t[0]), t[1])


@dataclass
class Footprint:
    """A graph's accesses folded into disjoint ranges ``(lo, hi, FootCell)``, in address order."""
    cells: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.cells)


def build_footprint(steps: list[tuple[Step, tuple]]) -> Footprint:
    """Fold the steps' declared accesses (``(step, accesses)`` in graph order; each access has ``ptr``,
    ``nbytes``, ``write``, ``what``, ``partial``) into a :class:`Footprint`."""
    accs = [(step, a) for step, accesses in steps for a in accesses if a.nbytes > 0]
    bounds = sorted({x for _, a in accs for x in (a.ptr, a.ptr + a.nbytes)})
    segs: list[FootCell | None] = [None] * max(0, len(bounds) - 1)
    for step, a in accs:
        t = (step, a.what)
        i = bisect.bisect_left(bounds, a.ptr)
        j = bisect.bisect_left(bounds, a.ptr + a.nbytes)
        for k in range(i, j):
            fc = segs[k]
            if fc is None:
                fc = segs[k] = FootCell(t, a.write)
            if a.write:
                if fc.wfirst is None:
                    fc.wfirst = t
                fc.wlast = t
                fc.winit = fc.winit or not a.partial
            else:
                if fc.rfirst is None:
                    fc.rfirst = t
                if not a.partial and not fc.winit and fc.uninit is None:
                    fc.uninit = t
    fp = Footprint()
    for k, fc in enumerate(segs):
        if fc is None:
            continue
        lo, hi = bounds[k], bounds[k + 1]
        if fp.cells and fp.cells[-1][1] == lo and fp.cells[-1][2].key() == fc.key():
            fp.cells[-1] = (fp.cells[-1][0], hi, fp.cells[-1][2])
        else:
            fp.cells.append((lo, hi, fc))
    return fp


def replay(sh: Shadow, fp: Footprint, task: Task, vc: dict, hits: Hits, races: bool = True,
           init: bool = True) -> None:
    """Check and record one replay of a graph (its footprint) by ``task``."""
    a = task.agent
    get = vc.get
    made: dict = {}

    def actor(t):
        x = made.get(id(t))
        if x is None:
            x = made[id(t)] = (task, t[0], t[1])
        return x

    cells = sh.cells
    for lo, hi, fc in fp.cells:
        i, j = sh.span(lo, hi)
        for k in range(i, j):
            c = cells[k]
            if races:
                w = c.w
                if w is not None:
                    wt = w[0]
                    if wt.agent != a and wt.clock > get(wt.agent, 0):
                        hits.hazard(w, actor(fc.first), c, "WAW" if fc.first_write else "RAW")
                if fc.wfirst is not None and c.r:
                    for ra in c.r.values():
                        rt = ra[0]
                        if rt.agent != a and rt.clock > get(rt.agent, 0):
                            hits.hazard(ra, actor(fc.wfirst), c, "WAR")
            if init and fc.uninit is not None and not c.init:
                hits.uninit_read(actor(fc.uninit), c)
            if fc.wlast is not None:
                c.w = actor(fc.wlast)
                c.r = None
                if fc.winit:
                    c.init = True
            else:
                if c.r is None:
                    c.r = {a: actor(fc.rfirst)}
                else:
                    c.r[a] = actor(fc.rfirst)
