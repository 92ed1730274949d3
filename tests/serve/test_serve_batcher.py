"""runtime.serve.batcher: the dynamic batching policy, checked symbolically (pure: numbers for the clock,
no threads, no devices).

The property test drives a :class:`DynamicBatcher` with random admissions, clock steps, ``next_batch``,
``expire`` and ``cancel`` calls drawn by Hypothesis, and keeps its own account of every request (its
level, deadline and state: queued, delayed, timed out, done).  After every call it checks what the
policy promises: every admitted request leaves exactly once (in a batch, from ``expire``, ``cancel`` or
the final ``drain``); a batch is a prefix of the serving order (levels highest first, arrival order, then
the delayed requests) that fits ``max_batch``, runs at the smallest gear holding its rows, and its
padding rows map to no request; no batch runs early below ``min_batch`` or off a preferred size unless
it cannot grow; a wait ends strictly in the future and no later than the oldest request's delay; every
refusal at admission is the one the configuration implies.
"""
from __future__ import annotations

import bisect
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devices.errors import InvalidParamError
from runtime.serve.batcher import Batch, DynamicBatcher, Request, RequestTimedOut, gear_for
from runtime.serve.engine.errors import InvalidRequest, QueueFull, Unavailable
from runtime.serve.modelrepo import DynamicBatching, ModelConfig, QueuePolicy

MS = 1e-3


def batching(**kw) -> DynamicBatching:
    return DynamicBatching(**kw)


# ------------------------------------------------------------------------------------------ examples
def test_preferred_size_runs_at_once_the_rest_waits_for_the_delay():
    b = DynamicBatcher(8, (1, 2, 4, 8), batching(preferred_batch_size=(2, 4), max_queue_delay_microseconds=1000))
    ids = [b.add(Request(1), 0.0).id for _ in range(3)]
    first = b.next_batch(0.0)
    assert [q.id for q in first.batch.requests] == ids[:2] and first.batch.gear == 2 and first.batch.pad == 0
    wait = b.next_batch(0.0005)
    assert wait.batch is None and wait.wake_at == pytest.approx(0.001)
    last = b.next_batch(wait.wake_at)                 # the delay expired: run what there is
    assert [q.id for q in last.batch.requests] == ids[2:] and last.batch.rows == 1
    assert b.next_batch(1.0) == type(last)() and len(b) == 0


def test_batch_pads_to_the_nearest_gear_and_padding_reaches_nobody():
    b = DynamicBatcher(8, (1, 2, 4, 8), batching())
    a, c = b.add(Request(3), 0.0), b.add(Request(2), 0.0)
    batch = b.next_batch(0.0).batch
    assert (batch.rows, batch.gear, batch.pad) == (5, 8, 3)
    assert [(s.queued.id, s.start, s.stop) for s in batch.slices] == [(a.id, 0, 3), (c.id, 3, 5)]
    xa, xc = np.arange(6.0).reshape(3, 2) + 1, np.arange(4.0).reshape(2, 2) + 100
    x = batch.stack([xa, xc])
    assert x.shape == (8, 2) and not x[5:].any()
    y = x * 10                                         # the model: rows are independent
    ya, yc = batch.split(y)
    np.testing.assert_array_equal(ya, xa * 10)
    np.testing.assert_array_equal(yc, xc * 10)
    with pytest.raises(InvalidParamError):
        batch.split(y[:5])                             # an output not at the gear's rows
    with pytest.raises(InvalidParamError):
        batch.stack([xa, xa])                          # request 2's tensor with the wrong rows


@pytest.mark.parametrize("rows,gears,want", [(1, (1, 2, 4, 8), 1), (3, (1, 2, 4, 8), 4), (8, (1, 2, 4, 8), 8),
                                             (5, (), 5), (2, (4,), 4)])
def test_gear_for(rows, gears, want):
    assert gear_for(rows, gears) == want


def test_gear_for_refuses_rows_past_the_largest_gear():
    with pytest.raises(InvalidParamError, match="largest batch gear 8"):
        gear_for(9, (1, 8))


def test_request_larger_than_max_batch_is_refused_at_admission():
    b = DynamicBatcher(8, (1, 2, 4, 8), batching())
    with pytest.raises(InvalidRequest, match="batch size 9 is larger than the model's max_batch_size 8"):
        b.add(Request(9), 0.0)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidRequest):
            b.add(Request(bad), 0.0)
    assert len(b) == 0 and b.next_batch(0.0).batch is None


@pytest.mark.parametrize("delay_us", [0, 1000])
def test_a_request_is_never_split_and_never_overtaken(delay_us):
    b = DynamicBatcher(4, (1, 2, 4), batching(max_queue_delay_microseconds=delay_us))
    two, three, one = b.add(Request(2), 0.0), b.add(Request(3), 0.0), b.add(Request(1), 0.0)
    at = delay_us / 1e6
    assert [q.id for q in b.next_batch(at).batch.requests] == [two.id]         # 2 + 3 > 4: the 1 waits too
    assert [q.id for q in b.next_batch(at).batch.requests] == [three.id, one.id]


def test_min_batch_waits_for_the_queue_delay():
    b = DynamicBatcher(8, (1, 2, 4, 8), batching(preferred_batch_size=(2, 4), min_batch=4,
                                                 max_queue_delay_microseconds=2000))
    b.add(Request(2), 0.0)                           # a preferred size, but below min_batch: it waits
    assert b.next_batch(0.0).wake_at == pytest.approx(2 * MS)
    b.add(Request(1), 0.001)
    nxt = b.next_batch(0.0015)
    assert nxt.batch is None and nxt.wake_at == pytest.approx(2 * MS)           # the oldest's delay
    batch = b.next_batch(2 * MS).batch
    assert batch.rows == 3 and batch.gear == 4
    b.add(Request(1), 1.0)
    b.add(Request(3), 1.0)
    assert b.next_batch(1.0).batch.rows == 4                                     # min_batch and preferred: now


def test_priority_levels_serve_the_highest_first():
    b = DynamicBatcher(1, (), batching(priority_levels=3, default_priority_level=2))
    low, default, high = b.add(Request(1, priority=3), 0.0), b.add(Request(1), 0.0), b.add(Request(1, priority=1), 0.0)
    assert (low.level, default.level, high.level) == (3, 2, 1)
    got = [b.next_batch(0.0).batch.requests[0].id for _ in range(3)]
    assert got == [high.id, default.id, low.id]


@pytest.mark.parametrize("levels,priority,match", [(3, 4, "out of range: this model has priority levels 1..3"),
                                                   (0, 1, "has no priority levels"), (2, -1, "integer >= 0")])
def test_bad_priority_is_refused(levels, priority, match):
    b = DynamicBatcher(4, (), batching(priority_levels=levels, default_priority_level=1 if levels else 0))
    with pytest.raises(InvalidRequest, match=match) as e:
        b.add(Request(1, priority=priority), 0.0)
    assert e.value.param == "priority" and len(b) == 0


def test_max_queue_size_refuses_per_level():
    pol = ((1, QueuePolicy(max_queue_size=2)),)
    b = DynamicBatcher(4, (), batching(priority_levels=2, default_priority_level=2, priority_queue_policy=pol,
                                       max_queue_delay_microseconds=1000))
    b.add(Request(1, priority=1), 0.0)
    b.add(Request(1, priority=1), 0.0)
    with pytest.raises(QueueFull, match="queue of priority level 1 holds 2 requests"):
        b.add(Request(1, priority=1), 0.0)
    for _ in range(5):
        b.add(Request(1, priority=2), 0.0)                # level 2: the default policy, unbounded
    assert len(b) == 7


def test_timed_out_request_is_rejected_once_with_a_clear_error():
    b = DynamicBatcher(8, (), batching(max_queue_delay_microseconds=5000,
                                       default_queue_policy=QueuePolicy(default_timeout_microseconds=1000)))
    q = b.add(Request(1), 0.0)
    nxt = b.next_batch(0.0)
    assert nxt.batch is None and nxt.wake_at == pytest.approx(1 * MS)           # the deadline comes first
    assert b.expire(0.0009) == ()
    assert b.next_batch(1 * MS).batch is None                                    # found, held for expire()
    assert b.expire(1 * MS) == (q,) and b.expire(1.0) == () and len(b) == 0
    err = RequestTimedOut.of(q)
    assert isinstance(err, Unavailable) and "request timeout expired" in err.message


def test_delay_action_moves_a_timed_out_request_behind_its_level():
    pol = QueuePolicy(timeout_action="DELAY", allow_timeout_override=True)
    b = DynamicBatcher(1, (), batching(priority_levels=2, default_priority_level=1, default_queue_policy=pol))
    a = b.add(Request(1, timeout_us=1000), 0.0)
    c = b.add(Request(1), 0.0)
    lower = b.add(Request(1, priority=2), 0.0)
    assert b.expire(2 * MS) == ()
    order = [b.next_batch(2 * MS).batch.requests[0].id for _ in range(3)]
    assert order == [c.id, a.id, lower.id]                                       # behind its level, ahead of 2


@pytest.mark.parametrize("default,allow,asked,want", [(5000, True, 1000, 1000), (5000, True, 9000, 5000),
                                                      (5000, True, 0, 5000), (5000, False, 1000, 5000),
                                                      (0, True, 1000, 1000), (0, False, 1000, 0)])
def test_request_timeout_override_only_shortens(default, allow, asked, want):
    pol = QueuePolicy(default_timeout_microseconds=default, allow_timeout_override=allow)
    assert pol.timeout_us(asked) == want
    b = DynamicBatcher(1, (), batching(default_queue_policy=pol))
    q = b.add(Request(1, timeout_us=asked), 10.0)
    assert q.deadline == (10.0 + want / 1e6 if want else None)


def test_without_dynamic_batching_each_request_runs_alone():
    b = DynamicBatcher(8, (1, 2, 4, 8), None)
    ids = [b.add(Request(r), 0.0).id for r in (1, 2, 3)]
    batches = [b.next_batch(0.0).batch for _ in range(3)]
    assert [[q.id for q in x.requests] for x in batches] == [[i] for i in ids]
    assert [x.gear for x in batches] == [1, 2, 4]


def test_for_model_of_a_model_without_batch_axis_takes_one_row():
    b = DynamicBatcher.for_model(ModelConfig("m"))
    assert b.max_batch == 1 and b.batching is None
    with pytest.raises(InvalidRequest):
        b.add(Request(2), 0.0)
    cfg = ModelConfig("m", max_batch_size=4, dynamic_batching=batching(max_queue_delay_microseconds=100))
    b = DynamicBatcher.for_model(cfg, (1, 2, 4))
    assert (b.max_batch, b.gears, b.batching) == (4, (1, 2, 4), cfg.dynamic_batching)


def test_batcher_refuses_an_inconsistent_setup():
    with pytest.raises(InvalidParamError, match="larger than the largest batch gear 4"):
        DynamicBatcher(8, (1, 2, 4), batching())
    with pytest.raises(InvalidParamError, match="<= max_batch 4"):
        DynamicBatcher(4, (), batching(preferred_batch_size=(8,)))


def test_cancel_and_drain():
    b = DynamicBatcher(4, (), batching(max_queue_delay_microseconds=1000))
    a, c = b.add(Request(1), 0.0), b.add(Request(1), 0.0)
    assert b.cancel(a.id) is a and b.cancel(a.id) is None
    assert b.drain() == (c,) and len(b) == 0


# ------------------------------------------------------------------------------------------ the property
class Account:
    """The test's own account of every request: state queued / delayed / held (timed out, not yet handed
    back) / left, and the serving order it implies."""

    def __init__(self, b: DynamicBatcher, db: DynamicBatching | None):
        self.b, self.db = b, db or DynamicBatching()
        self.info: dict[int, dict] = {}
        self.left: dict[int, str] = {}
        self.calls = 0

    def level_count(self, level: int) -> int:
        return sum(1 for i in self.info.values() if i["level"] == level and i["state"] in ("queued", "delayed"))

    def apply_timeouts(self, now: float) -> bool:
        """What the batcher must do to timeouts at ``now``; whether anything changed."""
        self.calls += 1
        changed = False
        for qid in sorted(self.info):
            i = self.info[qid]
            if i["state"] == "queued" and i["deadline"] is not None and now >= i["deadline"]:
                delay = self.db.queue_policy(i["level"]).timeout_action == "DELAY"
                i["state"], i["delayed_at"] = ("delayed", self.calls) if delay else ("held", None)
                changed = True
        return changed

    def order(self) -> list[int]:
        live = [(i["level"], i["state"] == "delayed", i.get("delayed_at") or 0, qid)
                for qid, i in self.info.items() if i["state"] in ("queued", "delayed")]
        return [t[-1] for t in sorted(live)]

    def leave(self, qid: int, how: str) -> None:
        assert qid not in self.left, f"request {qid} left twice ({self.left[qid]}, then {how})"
        self.left[qid] = how
        self.info[qid]["state"] = "left"


def check_batch(acc: Account, batch: Batch, now: float, order: list[int]) -> None:
    b, db = acc.b, acc.db
    ids = [q.id for q in batch.requests]
    assert ids == order[:len(ids)], "a batch is a prefix of the serving order"
    assert 1 <= batch.rows <= b.max_batch and batch.rows == sum(acc.info[i]["rows"] for i in ids)
    assert batch.gear == (b.gears[bisect.bisect_left(b.gears, batch.rows)] if b.gears else batch.rows)
    at = 0
    for s in batch.slices:
        assert (s.start, s.stop) == (at, at + s.queued.rows)
        at = s.stop
    owned = {r for s in batch.slices for r in range(s.start, s.stop)}
    assert owned.isdisjoint(range(batch.rows, batch.gear)) and len(owned) == batch.rows
    if b.batching is None:
        assert len(ids) == 1
        return
    nxt = acc.info[order[len(ids)]]["rows"] if len(order) > len(ids) else None
    full = nxt is not None and batch.rows + nxt > b.max_batch
    delay = db.max_queue_delay_microseconds / 1e6
    waited = delay == 0 or now >= min(acc.info[i]["enqueued"] for i in ids) + delay
    if batch.rows < db.min_batch:
        assert full or waited, "ran below min_batch before the delay"
    pref = db.preferred_batch_size
    if pref and not waited:
        assert batch.rows in pref or batch.rows >= pref[-1] or (nxt is not None and batch.rows + nxt > pref[-1]), \
            "ran early off a preferred size"


def do_next(acc: Account, now: float, waking: bool) -> None:
    changed = acc.apply_timeouts(now)
    order = acc.order()
    nxt = acc.b.next_batch(now)
    if nxt.batch is not None:
        check_batch(acc, nxt.batch, now, order)
        for q in nxt.batch.requests:
            acc.leave(q.id, "batch")
        return
    if not order:
        assert nxt.wake_at is None
        return
    check_wait(acc, now, order, nxt.wake_at)
    assert not waking or changed, "woke at wake_at and nothing happened"
    acc.wake_at = nxt.wake_at


def check_wait(acc: Account, now: float, order: list[int], wake_at: float) -> None:
    """The batcher waits only when Triton's rules say wait: everything queued fits one batch below the
    largest preferred size, no prefix of it is a preferred size of min_batch rows or more, and the oldest
    has not waited the delay; it wakes by the delay's end and by the first deadline."""
    b, db = acc.b, acc.db
    assert b.batching is not None and db.max_queue_delay_microseconds > 0, "waited without a queue delay"
    rows = [acc.info[i]["rows"] for i in order]
    sums = list(itertools.accumulate(rows))
    max_pref = db.preferred_batch_size[-1] if db.preferred_batch_size else b.max_batch
    assert sums[-1] <= b.max_batch, "waited with more queued than one batch holds"
    assert sums[-1] < max_pref, "waited with the largest preferred size (or max_batch) at hand"
    assert not any(s in db.preferred_batch_size and s >= db.min_batch for s in sums), \
        "waited with a preferred size at hand"
    due = min(acc.info[i]["enqueued"] for i in order) + db.max_queue_delay_microseconds / 1e6
    deadlines = [i["deadline"] for i in acc.info.values() if i["state"] == "queued" and i["deadline"] is not None]
    assert now < wake_at <= min(deadlines + [due]), "wakes too late for the delay or a deadline"


def do_add(acc: Account, now: float, rows: int, prio: int, timeout: int) -> None:
    b, db = acc.b, acc.db
    levels = db.levels
    level = db.default_priority_level if prio == 0 else prio
    ok_prio = prio == 0 or (db.priority_levels and prio <= db.priority_levels)
    cap = db.queue_policy(level).max_queue_size if ok_prio else 0
    try:
        q = b.add(Request(rows, prio, timeout), now)
    except InvalidRequest:
        assert rows > b.max_batch or not ok_prio
        return
    except QueueFull:
        assert cap and acc.level_count(level) >= cap
        return
    assert rows <= b.max_batch and ok_prio and level in levels and not (cap and acc.level_count(level) >= cap)
    t = db.queue_policy(level).timeout_us(timeout)
    assert q.level == level and q.deadline == (now + t / 1e6 if t else None) and q.id not in acc.info
    acc.info[q.id] = {"rows": rows, "level": level, "deadline": q.deadline, "enqueued": now, "state": "queued"}


def do_expire(acc: Account, now: float) -> None:
    acc.apply_timeouts(now)
    want = {qid for qid, i in acc.info.items() if i["state"] == "held"}
    got = [q.id for q in acc.b.expire(now)]
    assert len(got) == len(set(got)) and set(got) == want
    for qid in got:
        acc.leave(qid, "expired")


@st.composite
def setups(draw):
    max_batch = draw(st.integers(1, 12))
    gears = draw(st.sets(st.integers(1, 16), max_size=4))
    gears = tuple(sorted(gears | {draw(st.integers(max_batch, 16))})) if gears or draw(st.booleans()) else ()
    if draw(st.integers(0, 5)) == 0:
        return DynamicBatcher(max_batch, gears, None), None
    levels = draw(st.integers(0, 3))
    pol = st.builds(QueuePolicy, st.sampled_from(("REJECT", "DELAY")), st.sampled_from((0, 500, 2000, 8000)),
                    st.booleans(), st.sampled_from((0, 0, 1, 3, 6)))
    pref = tuple(draw(st.sets(st.integers(1, max_batch), max_size=3)))
    delay = draw(st.sampled_from((0, 1000, 4000)))
    top = max(pref) if pref else max_batch
    min_batch = draw(st.integers(1, top)) if delay else 1
    per_level = tuple((lv, draw(pol)) for lv in range(1, levels + 1) if draw(st.booleans()))
    db = DynamicBatching(pref, delay, min_batch, levels, draw(st.integers(1, levels)) if levels else 0, draw(pol),
                         per_level)
    return DynamicBatcher(max_batch, gears, db), db


def ops(max_batch: int, levels: int):
    """One step: admissions mostly valid (a row count past max_batch and a priority past the levels now
    and then), clock steps of 0-5 ms, and the calls."""
    rows = st.one_of(st.integers(1, max_batch), st.integers(1, max_batch), st.integers(1, max_batch),
                     st.just(max_batch + 1))
    prio = st.one_of(st.just(0), st.integers(0, levels), st.just(levels + 1)) if levels else \
        st.one_of(st.just(0), st.just(0), st.just(0), st.just(1))
    adds = [st.tuples(st.just("add"), rows, prio, st.sampled_from((0, 300, 3000))),
            st.tuples(st.just("add"), rows, prio, st.just(0))] * 2
    return st.one_of(*adds,
                     st.tuples(st.just("tick"), st.sampled_from((0, 100, 700, 1500, 5000))),
                     st.tuples(st.just("next")), st.tuples(st.just("wake")), st.tuples(st.just("expire")),
                     st.tuples(st.just("cancel"), st.integers(0, 40)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(setups(), st.data())
def test_policy_properties(setup, data):
    b, db = setup
    acc = Account(b, db)
    acc.wake_at = None
    now = 0.0
    steps = data.draw(st.lists(ops(b.max_batch, db.priority_levels if db else 0), min_size=20, max_size=80))
    for op in steps:
        if op[0] not in ("tick", "wake"):
            acc.wake_at = None               # a wait's promise holds only while nothing else happens
        if op[0] == "add":
            do_add(acc, now, *op[1:])
        elif op[0] == "tick":
            now += op[1] * 1e-6
        elif op[0] == "next":
            do_next(acc, now, False)
        elif op[0] == "wake" and acc.wake_at is not None and acc.wake_at >= now:
            now, acc.wake_at = acc.wake_at, None
            do_next(acc, now, True)
        elif op[0] == "expire":
            do_expire(acc, now)
        elif op[0] == "cancel" and acc.info:
            qid = sorted(acc.info)[op[1] % len(acc.info)]
            got = b.cancel(qid)
            assert (got is not None) == (acc.info[qid]["state"] in ("queued", "delayed"))
            if got is not None:
                acc.leave(qid, "cancel")
    for q in b.drain():
        acc.leave(q.id, "drain")
    assert set(acc.left) == set(acc.info) and len(b) == 0, "every admitted request leaves exactly once"
