"""The sanitizer's engine as pure data (unit tier, no devices): vector clocks, the shadow memory's cells,
the race and init rules, graph footprints, and the happens-before edges a tracker builds from stream ops
(records, waits, host-signalled gates, synchronizations).  Checked symbolically, like the HCCL schedules:
small hand-made histories with the answer known, and random histories against a byte-by-byte reference.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.access import Access, collective_accesses, kernel_accesses, op_accesses
from devices.kernel import TensorDesc
from devices.tasks import Collective, CopyD2D, ExecGraph, Launch, Memset, Record, Wait, WriteH2D
from runtime.sanitize.clocks import HOST, Clocks, happens_before, join
from runtime.sanitize.options import SanitizeOptions
from runtime.sanitize.shadow import Hits, Shadow, Step, Task, access, build_footprint, replay
from runtime.sanitize.tracker import DeviceTracker

BASE = 0xAC << 56


def task(agent, clock, label="t", stream=1, site=0):
    return Task(agent, clock, label, stream, 0, site)


def actor(agent, clock, site=0, what="x"):
    return (task(agent, clock, site=site), None, what)


# ---------------------------------------------------------------------------------------------- clocks
def test_join_and_happens_before():
    a = {1: 3, 2: 1}
    join(a, {2: 4, 5: 1})
    assert a == {1: 3, 2: 4, 5: 1}
    assert happens_before(1, 3, a) and not happens_before(1, 4, a) and not happens_before(7, 1, a)


def test_issue_orders_host_before_task_but_not_after():
    c = Clocks()
    s = c.new_agent()
    h0 = c.host[HOST]                     # a host access before the issue ...
    n = c.issue(s)
    c.host_released()
    assert happens_before(HOST, h0, c.vc[s])             # ... happens before the task
    assert not happens_before(s, n, c.host)              # the task is not known to the host
    assert not happens_before(HOST, c.host[HOST], c.vc[s])   # later host accesses are not before it
    c.acquire(HOST, c.vc[s])                             # a synchronize
    assert happens_before(s, n, c.host)


# ---------------------------------------------------------------------------------------------- shadow
def test_span_cuts_and_merge_coalesces():
    sh = Shadow()
    sh.add(BASE, BASE + 100, "a")
    sh.add(BASE + 200, BASE + 300, "b")
    i, j = sh.span(BASE + 10, BASE + 250)                # cuts at 10 and 250, the gap has no cells
    assert [(c.lo - BASE, c.hi - BASE) for c in sh.cells[i:j]] == [(10, 100), (200, 250)]
    assert [(c.lo - BASE, c.hi - BASE) for c in sh.cells] == [(0, 10), (10, 100), (200, 250), (250, 300)]
    hits = Hits()
    w = actor(1, 1)
    access(sh, BASE, BASE + 100, w, {1: 1}, True, False, hits)   # one write over the first allocation
    assert [(c.lo - BASE, c.hi - BASE) for c in sh.cells][:1] == [(0, 100)]   # merged back
    sh.remove(BASE + 200, BASE + 300)
    assert len(sh) == 1


def _one(sh_range=(0, 64)):
    sh = Shadow()
    sh.add(BASE + sh_range[0], BASE + sh_range[1], "alloc")
    return sh


@pytest.mark.parametrize("first,second,kind", [(True, False, "RAW"), (True, True, "WAW"), (False, True, "WAR")])
def test_unordered_conflicts_are_hazards(first, second, kind):
    sh, hits = _one(), Hits()
    access(sh, BASE, BASE + 64, actor(1, 1, site=10), {1: 1}, first, False, Hits())
    access(sh, BASE + 32, BASE + 48, actor(2, 1, site=20), {2: 1}, second, False, hits)
    [(key, h)] = hits.hazards.items()
    assert key == ((10, -1), (20, -1)) and h[2] == kind and (h[3] - BASE, h[4] - BASE) == (32, 48)


@pytest.mark.parametrize("first,second", [(True, False), (True, True), (False, True)])
def test_ordered_or_same_agent_or_both_reads_are_not(first, second):
    sh = _one()
    access(sh, BASE, BASE + 64, actor(1, 1), {1: 1}, first, False, Hits())
    ordered, same, reads = Hits(), Hits(), Hits()
    access(sh, BASE, BASE + 64, actor(2, 1), {2: 1, 1: 1}, second, False, ordered)   # knows agent 1's clock 1
    assert not ordered.hazards
    sh2 = _one()
    access(sh2, BASE, BASE + 64, actor(1, 1), {1: 1}, first, False, Hits())
    access(sh2, BASE, BASE + 64, actor(1, 2), {1: 2}, second, False, same)           # program order
    assert not same.hazards
    sh3 = _one()
    access(sh3, BASE, BASE + 64, actor(1, 1), {1: 1}, False, False, Hits())
    access(sh3, BASE, BASE + 64, actor(2, 1), {2: 1}, False, False, reads)
    assert not reads.hazards


def test_disjoint_ranges_do_not_conflict():
    sh, hits = _one(), Hits()
    access(sh, BASE, BASE + 32, actor(1, 1), {1: 1}, True, False, Hits())
    access(sh, BASE + 32, BASE + 64, actor(2, 1), {2: 1}, True, False, hits)
    assert not hits.hazards


def test_initcheck_sees_unwritten_bytes_only_and_skips_partial_accesses():
    sh, hits = _one(), Hits()
    access(sh, BASE + 16, BASE + 32, actor(1, 1), {1: 1}, True, False, Hits())       # bytes 16..32 written
    access(sh, BASE, BASE + 64, actor(1, 2, site=5), {1: 2}, False, False, hits)
    [(actor_, lo, hi, _)] = hits.uninit.values()
    assert (lo - BASE, hi - BASE) == (0, 64)          # one report, spanning the unwritten parts
    sh2, h2 = _one(), Hits()
    access(sh2, BASE, BASE + 64, actor(1, 1), {1: 1}, True, True, Hits())        # a scatter: writes, no init
    access(sh2, BASE, BASE + 64, actor(1, 2), {1: 2}, False, True, h2)           # a gather: no initcheck
    assert not h2
    access(sh2, BASE, BASE + 64, actor(1, 3), {1: 3}, False, False, h2)
    assert h2.uninit


# ---------------------------------------------------------------------------------------------- footprints
def _bytes_reference(steps, shadow_w):
    """Per byte: (first access kind, whether written, whether a full read precedes any full write)."""
    ref = {}
    for step, accs in steps:
        for a in accs:
            for b in range(a.ptr, a.ptr + a.nbytes):
                st_ = ref.setdefault(b, {"first": a.write, "w": False, "init": False, "uninit": False})
                if a.write:
                    st_["w"] = True
                    st_["init"] = st_["init"] or not a.partial
                elif not a.partial and not st_["init"]:
                    st_["uninit"] = True
    return ref


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 56), st.integers(1, 16), st.booleans(), st.booleans()), min_size=1,
                max_size=12))
def test_footprint_replay_matches_byte_by_byte_reference(ops):
    steps = [(Step(i, f"op{i}", 100 + i), (Access(BASE + o, n, w, "x", p),)) for i, (o, n, w, p) in enumerate(ops)]
    ref = _bytes_reference(steps, None)
    fp = build_footprint(steps)
    # replay by agent 2 over a history where agent 1 wrote bytes 0..32 unordered
    sh = _one((0, 80))
    access(sh, BASE, BASE + 32, actor(1, 1, site=1), {1: 1}, True, False, Hits())
    hits = Hits()
    replay(sh, fp, task(2, 1, site=50), {2: 1}, hits)
    # a report covers the envelope of what one step did over its cells: compare envelopes
    touched_racy = sorted(b - BASE for b in ref if b - BASE < 32)
    spans = [(lo - BASE, hi - BASE) for (_, _, _, lo, hi, _) in hits.hazards.values()]
    if touched_racy:
        assert min(lo for lo, _ in spans) == touched_racy[0] and max(hi for _, hi in spans) == touched_racy[-1] + 1
    else:
        assert not spans
    want_uninit = sorted(b - BASE for b, r in ref.items() if r["uninit"] and b - BASE >= 32)
    spans = [(lo - BASE, hi - BASE) for (_, lo, hi, _) in hits.uninit.values()]
    if want_uninit:
        assert min(lo for lo, _ in spans) == want_uninit[0] and max(hi for _, hi in spans) == want_uninit[-1] + 1
    else:
        assert not spans
    # what later accesses see: written bytes carry the replay's write, init follows full writes
    for c in sh.cells:
        for b in range(c.lo - BASE, c.hi - BASE):
            r = ref.get(BASE + b)
            if r is None:
                continue
            if r["w"]:
                assert c.w is not None and c.w[0].agent == 2
            if r["init"] or b < 32:
                assert c.init


# ---------------------------------------------------------------------------------------------- declarations
def test_declared_accesses_of_each_op():
    a, b = TensorDesc(BASE, (4,), "float32"), TensorDesc(BASE + 64, (4,), "float32")
    assert op_accesses(Launch(1, "relu", (a,), (b,))) == (Access(BASE, 16, False, "input 0"),
                                                          Access(BASE + 64, 16, True, "output 0"))
    assert op_accesses(CopyD2D(1, BASE + 64, BASE, 8)) == (Access(BASE, 8, False, "src"), Access(BASE + 64, 8, True, "dst"))
    assert op_accesses(Memset(1, BASE, 0, 8)) == (Access(BASE, 8, True, "dst"),)
    assert op_accesses(WriteH2D(1, BASE, b"abc")) == (Access(BASE, 3, True, "dst"),)
    assert op_accesses(Record(1, 2)) == op_accesses(Wait(1, 2)) == op_accesses(ExecGraph(1, 3)) == ()
    emb = kernel_accesses(Launch(1, "embedding", (TensorDesc(BASE, (8, 4)), TensorDesc(BASE + 256, (2,), "int32")),
                                 (TensorDesc(BASE + 512, (2, 4)),)))
    assert [x.partial for x in emb] == [True, False, False]          # the table is gathered
    sc = kernel_accesses(Launch(1, "scatter_update", (TensorDesc(BASE, (1, 4)), TensorDesc(BASE + 64, (1,), "int32")),
                                (TensorDesc(BASE + 128, (8, 4)),)))
    assert sc[-1].write and sc[-1].partial                           # the var is scattered into


@pytest.mark.parametrize("op,rank,want", [
    ("allreduce", 1, [(0, 40, False), (4096, 40, True)]),
    ("allgather", 1, [(0, 40, False), (4096, 120, True)]),
    ("reducescatter", 1, [(0, 120, False), (4096, 40, True)]),
    ("broadcast", 0, [(0, 40, False)]),
    ("broadcast", 2, [(0, 40, True)]),
    ("reduce", 0, [(0, 40, False), (4096, 40, True)]),
    ("reduce", 1, [(0, 40, False)]),
    ("send", 1, [(0, 40, False)]),
    ("recv", 1, [(4096, 40, True)]),
    ("barrier", 1, []),
])
def test_collective_buffers_per_rank(op, rank, want):
    send = BASE
    recv = BASE + 4096 if op != "broadcast" else BASE
    c = Collective(1, "c", op, send, recv, 10, "float32", root=0, peer=0 if op in ("send", "recv") else -1)
    got = [(a.ptr - BASE, a.nbytes, a.write) for a in collective_accesses(c, rank, 3)]
    assert got == want


# ---------------------------------------------------------------------------------------------- tracker edges
def _tracker():
    return DeviceTracker(0, Clocks(), SanitizeOptions())


def _k(stream, ins=(), outs=()):
    return Launch(stream, "relu", tuple(TensorDesc(BASE + o, (16,)) for o in ins),
                  tuple(TensorDesc(BASE + o, (16,)) for o in outs))


def _issue(t, ops):
    hits = Hits()
    for i, op in enumerate(ops):
        t.issue(op, i, hits)
    t.clocks.host_released()
    return hits


def test_tracker_record_wait_orders_and_an_early_record_does_not():
    t = _tracker()
    t.malloc(BASE, 256, -1)
    for s in (1, 2):
        t.stream_created(s, -1)
    t.event_created(7, -1)
    ok = _issue(t, [_k(1, outs=(0,)), Record(1, 7), Wait(2, 7), _k(2, ins=(0,), outs=(64,))])
    assert not ok.hazards
    t.event_created(8, -1)
    bad = _issue(t, [Record(1, 8), _k(1, outs=(128,)), Wait(2, 8), _k(2, ins=(128,), outs=(192,))])
    [(prior, act, kind, *_)] = bad.hazards.values()
    assert kind == "RAW" and prior[0].stream == 1 and act[0].stream == 2


def test_tracker_host_gate_orders_the_tasks_behind_it():
    """A stream waits on an event the host signals later (a blocking host callback): its later tasks are
    checked only once the gate opens, after what the host did meanwhile."""
    t = _tracker()
    t.malloc(BASE, 256, -1)
    t.stream_created(1, -1)
    t.event_created(5, -1)                        # done
    t.event_created(6, -1)                        # gate
    hits = _issue(t, [_k(1, outs=(0,)), Record(1, 5), Wait(1, 6, 1), _k(1, outs=(0,))])
    assert t.streams[1].gate is not None and len(t.streams[1].backlog) == 1
    t.synced_event(5, hits)                       # the callback thread waits for "done" ...
    t.host_access(BASE, 64, False, "memcpy_d2h", 9, hits)   # ... reads the buffer ...
    t.signal(6, 1, hits)                          # ... and opens the gate
    assert t.streams[1].gate is None and not t.streams[1].backlog
    assert not hits.hazards                       # the later write is ordered after the host read


def test_tracker_sync_stream_and_device_order_the_host():
    t = _tracker()
    t.malloc(BASE, 256, -1)
    t.stream_created(1, -1)
    t.stream_created(2, -1)
    hits = _issue(t, [_k(1, outs=(0,)), _k(2, outs=(64,))])
    t.synced_stream(1, hits)
    t.host_access(BASE, 64, False, "memcpy_d2h", 9, hits)
    assert not hits.hazards
    t.host_access(BASE + 64, 64, False, "memcpy_d2h", 10, hits)
    assert len(hits.hazards) == 1                 # stream 2 was not synchronized
    hits = Hits()
    t.synced_device(hits)
    t.host_access(BASE + 64, 64, False, "memcpy_d2h", 11, hits)
    assert not hits.hazards


def test_tracker_free_while_in_use_is_a_hazard():
    t = _tracker()
    t.malloc(BASE, 64, -1)
    t.stream_created(1, -1)
    hits = _issue(t, [_k(1, ins=(0,), outs=(0,))])
    t.free(BASE, 3, hits)
    [(_, act, kind, *_)] = hits.hazards.values()
    assert act[0].label == "free" and kind in ("WAW", "WAR") and not t.memory.live


def test_tracker_graph_replay_is_its_captured_ops():
    t = _tracker()
    t.malloc(BASE, 256, -1)
    for s in (1, 2):
        t.stream_created(s, -1)
    t.graph_created(3, [(_k(1, ins=(0,), outs=(64,)), 40), (_k(1, ins=(64,), outs=(128,)), 41)], 39)
    hits = _issue(t, [_k(1, outs=(0,))])
    hits = _issue(t, [ExecGraph(1, 3)])           # same stream: ordered
    assert not hits
    hits = _issue(t, [ExecGraph(2, 3)])           # another stream, no event: the replay's write races
    kinds = sorted(h[2] for h in hits.hazards.values())
    assert kinds and all(h[1][1] is not None for h in hits.hazards.values())     # attributed to a step
    assert {h[1][1].site for h in hits.hazards.values()} <= {40, 41}


def test_random_histories_against_a_naive_happens_before_reference():
    """Random stream programs (launches, records, waits, host syncs) on 3 streams: every hazard the tracker
    reports is a pair that a transitive-closure reference also finds unordered, and vice versa."""
    rng = random.Random(7)
    for trial in range(40):
        t = _tracker()
        t.malloc(BASE, 4 * 64, -1)
        for s in (1, 2, 3):
            t.stream_created(s, -1)
        for e in (1, 2, 3):
            t.event_created(10 + e, -1)
        # reference: nodes = tasks in issue order, edges = stream order, record->wait, issue, host sync
        nodes, edges = [], set()
        last = {1: None, 2: None, 3: None}
        rec: dict[int, int | None] = {11: None, 12: None, 13: None}
        host_known: set[int] = set()
        hits = Hits()
        site = 0
        for step in range(14):
            r = rng.random()
            s = rng.choice((1, 2, 3))
            if r < 0.55:
                buf = rng.randrange(4) * 64
                w = rng.random() < 0.6
                op = _k(s, ins=() if w else (buf,), outs=(buf,) if w else ())
                node = len(nodes)
                nodes.append((s, buf, w, site))
                if last[s] is not None:
                    edges.add((last[s], node))
                for h in host_known:
                    edges.add((h, node))
                last[s] = node
                t.issue(op, site, hits)
            elif r < 0.75:
                e = rng.choice((11, 12, 13))
                t.issue(Record(s, e), site, hits)
                rec[e] = last[s]
            elif r < 0.9:
                e = rng.choice((11, 12, 13))
                t.issue(Wait(s, e), site, hits)
                if rec[e] is not None:
                    # later tasks of s come after the recorded task: model as a pseudo edge via 'last'
                    nodes.append((s, None, None, None))
                    node = len(nodes) - 1
                    edges.add((rec[e], node))
                    if last[s] is not None:
                        edges.add((last[s], node))
                    last[s] = node
            else:
                t.synced_stream(s, hits)
                if last[s] is not None:
                    host_known |= _ancestors(last[s], edges) | {last[s]}
            t.clocks.host_released()
            site += 1
        want = set()
        for j, (sj, bj, wj, sitej) in enumerate(nodes):
            if bj is None:
                continue
            anc = _ancestors(j, edges)
            for i in range(j):
                si, bi, wi, sitei = nodes[i]
                if bi is None or bi != bj or si == sj or not (wi or wj) or i in anc:
                    continue
                want.add((sitei, sitej))
        got = {(k[0][0], k[1][0]) for k in hits.hazards}
        # the tracker keeps the last write and one read per agent (FastTrack): it may report a subset of
        # the pairs, but never a pair the reference finds ordered, and never misses a racy location
        assert got <= want, (trial, got - want)
        assert bool(got) == bool(want), trial


def _ancestors(n, edges):
    out, todo = set(), [n]
    while todo:
        x = todo.pop()
        for a, b in edges:
            if b == x and a not in out:
                out.add(a)
                todo.append(a)
    return out
