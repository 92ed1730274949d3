"""runtime.serve.batcher against a reference model of Triton's dynamic batcher, on generated arrival
sequences (pure: no threads, no devices; the clock is the test's).

The reference (:func:`triton_decide`) is written from Triton's scheduler
(``DynamicBatchScheduler::GetDynamicBatch``, one priority level, no timeouts): a cursor walks the queue
growing a pending batch; it marks the batch whenever the pending size is a ``preferred_batch_size``, and
-- if nothing is marked yet -- the batch before the request that would take it past the largest
preferred size; it stops at the request that would pass ``max_batch_size``.  Then: a marked batch runs at
once unless the oldest pending request has waited ``max_queue_delay``; a batch that cannot grow (stopped
at ``max_batch_size``, or at the largest preferred size) runs; so does everything once the delay passed
or without a delay; otherwise the scheduler sleeps until the oldest pending request's delay ends.

Both the reference and :class:`DynamicBatcher` drive the same simulated instance (:func:`simulate`): requests
arrive at their times, the instance asks for a batch whenever it is free, executes it for a time that
grows with its rows, and, told to wait, sleeps until the wake-up time or the next arrival.  Every decision
-- which requests run together and when, or until when to wait -- must be the same.  Times are whole ticks
of 2**-10 s and the delays 0, 2**-6, 2**-5, 2**-4 s (15625 us ...) so that every sum is exact in binary
floating point: a tie is a tie on both sides.
"""
from __future__ import annotations

import bisect

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.serve.batcher import DynamicBatcher, Request
from runtime.serve.modelrepo import DynamicBatching

TICK = 2.0 ** -10                        #: seconds per tick
US_PER_TICK = 1e6 * TICK                 #: 976.5625
DELAYS = (0, 16, 32, 64)                 #: ticks: 0, 15625, 31250, 62500 us


def triton_decide(queue: list[tuple[int, int, int]], now: int, max_batch: int, preferred: set[int],
                  delay: int) -> tuple:
    """The reference: ``queue`` of (id, rows, enqueued tick) in arrival order, at tick ``now``:
    ``("run", n)`` (the first n requests), ``("wait", until)`` or ``("idle",)``."""
    if not queue:
        return ("idle",)
    max_pref = max(preferred) if preferred else max_batch
    pending = count = 0
    mark = None
    send_now = False
    for _, rows, _ in queue:
        if pending:
            if pending + rows > max_pref and mark is None:
                mark = count
            if pending + rows > max_batch:
                send_now = True
                break
        pending += rows
        count += 1
        if pending in preferred:
            mark = count
    oldest = min(enq for _, _, enq in queue[:count])
    exceeded = delay != 0 and now - oldest >= delay
    if mark is not None and not exceeded:
        return ("run", mark)
    if send_now or pending >= max_pref or exceeded or delay == 0:
        return ("run", count)
    return ("wait", oldest + delay)


def simulate(decide, admit, arrivals: list[tuple[int, int]], exec_ticks) -> list[tuple]:
    """The instance's loop over ``arrivals`` (tick, rows), ids in arrival order: ``admit(id, rows, tick)``
    as each arrives; ``decide(now)`` -> ``("run", [ids])`` / ``("wait", tick)`` / ``("idle",)`` whenever
    free.  The log of every decision with its tick."""
    log: list[tuple] = []
    now, nxt = 0, 0
    for _ in range(10 * len(arrivals) + 10):
        while nxt < len(arrivals) and arrivals[nxt][0] <= now:
            admit(nxt, arrivals[nxt][1], arrivals[nxt][0])
            nxt += 1
        d = decide(now)
        log.append((now, *d))
        arrival = arrivals[nxt][0] if nxt < len(arrivals) else None
        if d[0] == "run":
            now += exec_ticks(sum(arrivals[i][1] for i in d[1]))
        elif d[0] == "wait":
            assert d[1] > now, f"a wait that ends at tick {d[1]}, not after now ({now})"
            now = d[1] if arrival is None else min(d[1], arrival)
        elif arrival is None:
            return log
        else:
            now = arrival
    raise AssertionError("the simulation did not finish")


def run_reference(arrivals, max_batch, preferred, delay, exec_ticks):
    queue: list[tuple[int, int, int]] = []

    def decide(now):
        d = triton_decide(queue, now, max_batch, set(preferred), delay)
        if d[0] != "run":
            return d
        ids = [q[0] for q in queue[:d[1]]]
        del queue[:d[1]]
        return ("run", ids)
    return simulate(decide, lambda i, rows, t: queue.append((i, rows, t)), arrivals, exec_ticks)


def run_batcher(arrivals, max_batch, preferred, delay, exec_ticks, gears=()):
    b = DynamicBatcher(max_batch, gears, DynamicBatching(tuple(sorted(preferred)), round(delay * US_PER_TICK)))
    ids: dict[int, int] = {}

    def admit(i, rows, t):
        ids[b.add(Request(rows, payload=i), t * TICK).id] = i

    def decide(now):
        nxt = b.next_batch(now * TICK)
        if nxt.batch is not None:
            batch = nxt.batch
            want = gears[bisect.bisect_left(gears, batch.rows)] if gears else batch.rows
            assert batch.gear == want and batch.pad == want - batch.rows
            return ("run", [ids[q.id] for q in batch.requests])
        if nxt.wake_at is not None:
            ticks = nxt.wake_at / TICK
            assert ticks == int(ticks), f"woke off the tick grid: {nxt.wake_at!r}"
            return ("wait", int(ticks))
        return ("idle",)
    log = simulate(decide, admit, arrivals, exec_ticks)
    assert len(b) == 0
    return log


def _exec(base: int, per_row: int):
    return lambda rows: base + per_row * rows


# ------------------------------------------------------------------------------------------ examples
def test_reference_example_preferred_sizes_and_delay():
    """max_batch 8, preferred [4, 6], delay 16 ticks; execution 3 + rows/2 ticks."""
    arrivals = [(0, 1), (1, 1), (1, 2), (5, 1), (30, 3), (31, 1), (31, 2), (31, 4), (60, 1)]
    ex = lambda rows: 3 + rows // 2                                            # noqa: E731
    ref = run_reference(arrivals, 8, (4, 6), 16, ex)
    assert run_batcher(arrivals, 8, (4, 6), 16, ex, (1, 2, 4, 8)) == ref
    runs = [(t, ids) for t, kind, *rest in ref if kind == "run" for ids in rest]
    # 1 + 1 + 2 = 4 rows (preferred) at tick 1; the lone request of tick 5 waits out the delay (5 + 16);
    # 3 + 1 + 2 = 6 rows (preferred) at 31, the 4-row request of 31 after them; the last waits the delay
    assert runs == [(1, [0, 1, 2]), (21, [3]), (31, [4, 5, 6]), (37, [7]), (76, [8])]


def test_reference_example_no_delay_runs_what_is_queued():
    arrivals = [(0, 1)] * 5 + [(2, 3), (2, 3), (2, 3)]
    ex = _exec(4, 0)
    ref = run_reference(arrivals, 6, (), 0, ex)
    assert run_batcher(arrivals, 6, (), 0, ex) == ref
    assert [ids for _, kind, *rest in ref if kind == "run" for ids in rest] == [[0, 1, 2, 3, 4], [5, 6], [7]]


# ------------------------------------------------------------------------------------------ the property
@st.composite
def cases(draw):
    max_batch = draw(st.integers(1, 16))
    preferred = draw(st.sets(st.integers(1, max_batch), max_size=3))
    delay = draw(st.sampled_from(DELAYS))
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(st.integers(0, 24), min_size=n, max_size=n))
    rows = draw(st.lists(st.integers(1, max_batch), min_size=n, max_size=n))
    ticks = [sum(gaps[:i + 1]) for i in range(n)]
    base, per_row = draw(st.integers(1, 12)), draw(st.integers(0, 3))
    gears = tuple(sorted(draw(st.sets(st.integers(1, 32), max_size=4)) | {draw(st.integers(max_batch, 32))}))
    return list(zip(ticks, rows)), max_batch, tuple(sorted(preferred)), delay, (base, per_row), gears


@settings(max_examples=150, deadline=None)
@given(cases())
def test_batch_formation_matches_the_reference(case):
    arrivals, max_batch, preferred, delay, (base, per_row), gears = case
    ex = _exec(base, per_row)
    ref = run_reference(arrivals, max_batch, preferred, delay, ex)
    got = run_batcher(arrivals, max_batch, preferred, delay, ex, gears)
    assert got == ref
    ran = [i for _, kind, *rest in ref if kind == "run" for ids in rest for i in ids]
    assert sorted(ran) == list(range(len(arrivals))), "every request runs exactly once"
