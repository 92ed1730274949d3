"""What one device's client did, replayed as happens-before edges and memory accesses.

A :class:`DeviceTracker` follows every call its :class:`~runtime.sanitize.handle.SanitizedHandle`
forwarded: allocations (shadow cells, allocation histories), streams and events (agents, record
snapshots), the stream ops in the order the host issued them (each task's declared accesses,
:mod:`devices.access`; a graph replay as its captured footprint), host accesses (host-synchronous copies,
memsets, frees) and host synchronizations.  What the checks find goes to the session's collector.

Host-signalled gates: a stream that waits on an event record the host has not signalled yet (a blocking
host callback's gate) does not run what follows until the host signals it, and what the host does before
the signal happens before those tasks.  So the tasks queued behind such a wait are held back here too
(with what the host knew when it issued them) and checked when the gate opens -- otherwise a callback's
host access would look concurrent with the tasks it orders.

Everything is called with the session lock held.
"""
from __future__ import annotations

from collections import deque

from devices.graph import PointerMap, remap_ops
from devices.access import op_accesses, op_label
from devices.tasks import Collective, ExecGraph, Record, Wait

from .clocks import HOST, Clocks
from .memory import AllocTable
from .shadow import Footprint, Hits, Shadow, Step, Task, access, build_footprint, replay

#: event record snapshots kept per event (a wait for an older record uses the oldest kept)
EVENT_HISTORY = 64


class StreamState:
    __slots__ = ("sid", "agent", "site", "gate", "backlog", "internal")

    def __init__(self, sid: int, agent: int, site: int, internal: bool = False):
        self.sid, self.agent, self.site, self.internal = sid, agent, site, internal
        self.gate: tuple | None = None      # (EventState, gen) this stream's next task waits for
        self.backlog: deque = deque()       # (item, host clock at issue) held behind the gate


class EventState:
    __slots__ = ("eid", "site", "recorded", "vcs", "pending", "waiting")

    def __init__(self, eid: int, site: int):
        self.eid, self.site = eid, site
        self.recorded = 0                   # record numbers handed out (the device's recorded_gen)
        self.vcs: dict[int, dict] = {}      # record number -> the recording stream's clock
        self.pending: set[int] = set()      # record numbers issued on a stream held behind a gate
        self.waiting: dict[int, list] = {}  # record number -> streams gated on it

    def clock_of(self, gen: int) -> dict | None:
        """The clock of record ``gen`` once known (a later known record stands for one that was
        forgotten, or for every number a host signal completed at once); None while it is to come."""
        vc = self.vcs.get(gen)
        if vc is not None or gen in self.pending:
            return vc
        later = [k for k in self.vcs if k >= gen]
        return self.vcs[min(later)] if later else None


class GraphState:
    __slots__ = ("gid", "site", "footprint", "steps", "ops")

    def __init__(self, gid: int, site: int, footprint: Footprint, steps: int, ops: list | None = None):
        self.gid, self.site, self.footprint, self.steps = gid, site, footprint, steps
        self.ops = ops or []            #: (op, capture site) in capture order (re-bound after a defragmentation)


class DeviceTracker:
    """The sanitizer's view of one device (physical id ``device``) of this client."""

    def __init__(self, device: int, clocks: Clocks, options):
        self.device = device
        self.clocks = clocks
        self.races = options.on("racecheck")
        self.init = options.on("initcheck")
        self.shadow = Shadow()
        self.memory = AllocTable()
        self.streams: dict[int, StreamState] = {}
        self.events: dict[int, EventState] = {}
        self.graphs: dict[int, GraphState] = {}
        self.comms: dict[str, tuple[int, int]] = {}
        self.closed = False
        #: what was checked: device tasks (graph replays among them) and host accesses
        self.counts = {"tasks": 0, "replays": 0, "host_accesses": 0}

    # ------------------------------------------------------------------ memory
    def malloc(self, ptr: int, size: int, site: int) -> None:
        a = self.memory.add(ptr, size, site)
        self.shadow.add(ptr, ptr + size, a)

    def free(self, ptr: int, site: int, hits: Hits) -> None:
        """The host frees an allocation: a write of all of it by the host (a task still using it races),
        then its history goes."""
        a = self.memory.live.get(ptr)
        if a is None:
            return
        self.host_access(ptr, a.size, True, "free", site, hits, init=False)
        self.memory.remove(ptr, site)
        self.shadow.remove(ptr, ptr + a.size)

    def host_access(self, ptr: int, nbytes: int, write: bool, label: str, site: int, hits: Hits,
                    init: bool = True) -> None:
        """A host-synchronous access (it runs now, ordered only by what the host knows)."""
        c = self.clocks
        self.counts["host_accesses"] += 1
        task = Task(HOST, c.host[HOST], label, None, self.device, site)
        what = "allocation" if label == "free" else "dst" if write else "src"
        access(self.shadow, ptr, ptr + nbytes, (task, None, what), c.host, write, False, hits,
               self.races, self.init and init)

    # ------------------------------------------------------------------ handles
    def stream_created(self, sid: int, site: int, internal: bool = False) -> None:
        self.streams[sid] = StreamState(sid, self.clocks.new_agent(), site, internal)

    def mark_internal(self, sid: int) -> None:
        """A stream the runtime made for itself (a device's default stream): not the program's leak."""
        st = self.streams.get(sid)
        if st is not None:
            st.internal = True

    def stream_destroyed(self, sid: int, hits: Hits) -> None:
        """Destroying waits for the stream's work: the host learns its clock."""
        st = self.streams.pop(sid, None)
        if st is not None:
            self._settle(st, hits)
            self.clocks.acquire(HOST, self.clocks.vc[st.agent])

    def event_created(self, eid: int, site: int) -> None:
        self.events[eid] = EventState(eid, site)

    def event_destroyed(self, eid: int) -> None:
        self.events.pop(eid, None)

    def graph_created(self, gid: int, ops: list, site: int) -> None:
        """``ops``: ``(op, capture site)`` in capture order."""
        steps = [(Step(i, op_label(op), s), self.accesses(op)) for i, (op, s) in enumerate(ops)]
        self.graphs[gid] = GraphState(gid, site, build_footprint(steps), len(ops), list(ops))

    def graph_rebound(self, gid: int, moves) -> None:
        """The pool's defragmentation moved memory the graph uses: its footprint follows the remapped ops."""
        g = self.graphs.get(gid)
        if g is None:
            return
        pm = PointerMap(moves)
        self.graph_created(gid, [(remap_ops((op,), pm)[0][0], site) for op, site in g.ops], g.site)

    def graph_destroyed(self, gid: int) -> None:
        self.graphs.pop(gid, None)

    def comm(self, comm_id: str, rank: int, size: int) -> None:
        self.comms[comm_id] = (rank, size)

    def accesses(self, op):
        """The device memory ``op`` reads and writes (:func:`devices.access.op_accesses`; a collective's as
        its communicator's rank and size, registered by :meth:`comm`, say).  Host-only."""
        return op_accesses(op, self.comms.get(op.comm) if isinstance(op, Collective) else None)

    def _stream(self, sid: int) -> StreamState:
        st = self.streams.get(sid)
        if st is None:                                  # a stream this client did not create here
            st = self.streams[sid] = StreamState(sid, self.clocks.new_agent(), -1, internal=True)
        return st

    # ------------------------------------------------------------------ stream ops
    def issue(self, op, site: int, hits: Hits) -> None:
        """The host issued ``op`` (in program order)."""
        st = self._stream(op.stream)
        gen = 0
        if isinstance(op, Record):
            ev = self.events.get(op.event)
            if ev is None:
                return
            ev.recorded += 1
            gen = ev.recorded
            ev.pending.add(gen)
        elif isinstance(op, Wait):
            ev = self.events.get(op.event)
            if ev is None:
                return
            gen = op.gen or ev.recorded
        item = (op, site, gen)
        if st.gate is not None or st.backlog:
            st.backlog.append((item, self.clocks.host_snapshot()))
        else:
            self._run(st, item, None, hits)

    def _run(self, st: StreamState, item, host_vc, hits: Hits) -> None:
        op, site, gen = item
        c = self.clocks
        clock = c.issue(st.agent, host_vc)
        if isinstance(op, Record):
            ev = self.events.get(op.event)
            if ev is not None:
                self._recorded(ev, gen, c.snapshot(st.agent), hits)
            return
        if isinstance(op, Wait):
            ev = self.events.get(op.event)
            if ev is None or gen == 0:
                return                                  # never recorded: orders nothing
            vc = ev.clock_of(gen)
            if vc is None:                              # a record (or host signal) still to come
                st.gate = (ev, gen)
                ev.waiting.setdefault(gen, []).append(st)
            else:
                c.acquire(st.agent, vc)
            return
        task = Task(st.agent, clock, op_label(op), st.sid, self.device, site)
        vc = c.vc[st.agent]
        self.counts["tasks"] += 1
        if isinstance(op, ExecGraph):
            g = self.graphs.get(op.graph)
            if g is not None:
                self.counts["replays"] += 1
                replay(self.shadow, g.footprint, task, vc, hits, self.races, self.init)
            return
        for a in self.accesses(op):
            access(self.shadow, a.ptr, a.ptr + a.nbytes, (task, None, a.what), vc, a.write, a.partial, hits,
                   self.races, self.init)

    def _recorded(self, ev: EventState, gen: int, vc: dict, hits: Hits) -> None:
        ev.vcs[gen] = vc
        ev.pending.discard(gen)
        if len(ev.vcs) > EVENT_HISTORY:
            for g in sorted(ev.vcs)[:len(ev.vcs) - EVENT_HISTORY]:
                if g not in ev.waiting:
                    del ev.vcs[g]
        for g in [g for g in ev.waiting if g <= gen and ev.clock_of(g) is not None]:
            for st in ev.waiting.pop(g):
                if st.gate is not None and st.gate[0] is ev and st.gate[1] == g:
                    st.gate = None
                    self.clocks.acquire(st.agent, ev.clock_of(g) or vc)
                    self._drain(st, hits)

    def _drain(self, st: StreamState, hits: Hits) -> None:
        while st.gate is None and st.backlog:
            item, host_vc = st.backlog.popleft()
            self._run(st, item, host_vc, hits)

    def _settle(self, st: StreamState, hits: Hits) -> None:
        """The host saw the stream finish: whatever held its tasks back has happened, even if the edge
        that released it went around this tracker -- run them (without that edge)."""
        while st.gate is not None or st.backlog:
            if st.gate is not None:
                ev, g = st.gate
                held = ev.waiting.get(g, [])
                if st in held:
                    held.remove(st)
                st.gate = None
            self._drain(st, hits)

    def signal(self, eid: int, gen: int, hits: Hits) -> None:
        """The host completed the event up to record ``gen``: a release by the host."""
        ev = self.events.get(eid)
        if ev is None:
            return
        ev.recorded = max(ev.recorded, gen)
        self._recorded(ev, gen, self.clocks.host_snapshot(), hits)

    # ------------------------------------------------------------------ host synchronization
    def synced_stream(self, sid: int, hits: Hits) -> None:
        st = self.streams.get(sid)
        if st is not None:
            self._settle(st, hits)
            self.clocks.acquire(HOST, self.clocks.vc[st.agent])

    def synced_event(self, eid: int, hits: Hits) -> None:
        ev = self.events.get(eid)
        if ev is None or ev.recorded == 0:
            return
        vc = ev.clock_of(ev.recorded)
        if vc is None:                       # its record is held behind a gate the host saw open
            for st in list(self.streams.values()):
                self._settle(st, hits)
            vc = ev.clock_of(ev.recorded)
        if vc is not None:
            self.clocks.acquire(HOST, vc)

    def synced_device(self, hits: Hits) -> None:
        for st in list(self.streams.values()):
            self._settle(st, hits)
            self.clocks.acquire(HOST, self.clocks.vc[st.agent])

    # ------------------------------------------------------------------ leaks
    def alive(self) -> dict[str, list]:
        """What the client still holds here: allocations, streams (not the runtime's own), events, graphs."""
        return {"allocation": list(self.memory.live.values()),
                "stream": [s for s in self.streams.values() if not s.internal],
                "event": list(self.events.values()),
                "graph": list(self.graphs.values())}

    def reset(self) -> None:
        """The device dropped everything (reset): forget it all."""
        self.memory.clear()
        self.shadow = Shadow()
        self.streams.clear()
        self.events.clear()
        self.graphs.clear()
        self.comms.clear()
