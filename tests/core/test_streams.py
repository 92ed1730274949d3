"""Stream, event and host-callback semantics through the public runtime API (``rt`` fixture).

The device is made to wait only by host-signalled gates (a blocking host function that waits on a
``threading.Event``); nothing sleeps and nothing asserts wall-clock durations.  Kernels are user kernels
defined here; results are read back from device memory.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from devices.device import DeviceConfig
from devices.errors import AclError, error_for_code
from devices.kernel import register_user_kernel
from runtime.api import Runtime
from runtime.backend import LocalBackend

GATE_TIMEOUT_S = 20.0       # a gate that is never released lets go by itself (a failed test cannot hang)
SYNC_MS = 20_000


# ------------------------------------------------------------------------------------------ kernels
def ts_append_seq(ctx, log, seq=0):
    """log[0] counts entries; entry i goes to log[1 + i]."""
    n = int(log[0])
    log[1 + n] = seq
    log[0] = n + 1


def ts_fill(ctx, out, base=0):
    """out[i] = (7 * i + base) % 1000003, each block writing its share."""
    r = ctx.split(out.size)
    idx = np.arange(r.start, r.stop, dtype=np.int64)
    out[r.start:r.stop] = ((7 * idx + base) % 1000003).astype(np.int32)


def ts_sum(ctx, src, out):
    out[0] = src.read().astype(np.int64).sum()


def ts_set(ctx, out, value=0):
    out[0:out.size] = value


def ts_add_into(ctx, src, dst, add=0):
    dst[0:dst.size] = src[0:src.size] + add


def ts_raise(ctx, out):
    raise ValueError("user kernel failure on purpose")


def ts_write_oob(ctx, out):
    out[out.size] = 1


def ts_mark_blocks(ctx, out):
    out[ctx.block_idx] = ctx.block_idx + 1


for _fn in (ts_append_seq, ts_fill, ts_sum, ts_set, ts_add_into, ts_raise, ts_write_oob, ts_mark_blocks):
    register_user_kernel(_fn.__name__, _fn, replace=True)


# ------------------------------------------------------------------------------------------ helpers
class Gate:
    """A blocking host function on ``stream``: later tasks of the stream wait until :meth:`open`."""

    def __init__(self, stream):
        self.entered = threading.Event()
        self.released = threading.Event()
        self.timed_out = False

        def hold():
            self.entered.set()
            if not self.released.wait(GATE_TIMEOUT_S):
                self.timed_out = True

        stream.launch_host_func(hold, blocking=True)

    def open(self):
        self.released.set()


@pytest.fixture
def gates():
    opened: list[Gate] = []

    def make(stream):
        g = Gate(stream)
        opened.append(g)
        return g

    yield make
    for g in opened:
        g.open()
    assert not any(g.timed_out for g in opened), "a gate was never opened by the test"


def code_of(excinfo) -> int:
    """The CANN code of a raised error, after checking that its class is the one every backend raises
    for that code (``error_for_code``: what the cluster backend rebuilds from the code on the wire)."""
    e = excinfo.value
    assert type(e) is type(error_for_code(e.code)), \
        f"{type(e).__name__} for code {e.code}, but error_for_code gives {type(error_for_code(e.code)).__name__}"
    return e.code


# ------------------------------------------------------------------------------------------ FIFO
def test_fifo_per_stream(rt):
    dev = rt.device(0)
    n = 200
    streams = [dev.stream() for _ in range(3)]
    logs = [dev.from_numpy(np.zeros(n + 1, np.int64)) for _ in streams]
    for i in range(n):
        for k, (s, log) in enumerate(zip(streams, logs)):
            s.launch("ts_append_seq", outputs=[log], attrs={"seq": i * 10 + k})
    for k, (s, log) in enumerate(zip(streams, logs)):
        got = log.numpy(stream=s)
        assert got[0] == n
        assert list(got[1:]) == [i * 10 + k for i in range(n)]
        log.free()


def test_fifo_mixed_task_kinds(rt):
    """Kernels, copies, memsets and stream writes on one stream run in submission order."""
    dev = rt.device(0)
    s = dev.stream()
    a = dev.from_numpy(np.zeros(64, np.int32))
    b = dev.from_numpy(np.zeros(64, np.int32))
    s.launch("ts_set", outputs=[a], attrs={"value": 5})
    s.copy(b.ptr, a.ptr, a.nbytes)                                  # b = 5
    s.memset(a.ptr, 0, a.nbytes)                                    # a = 0
    s.launch("ts_add_into", inputs=[b], outputs=[a], attrs={"add": 1})   # a = 6
    s.write(b.ptr, np.full(64, 9, np.int32).tobytes())              # b = 9
    s.launch("ts_add_into", inputs=[a], outputs=[b], attrs={"add": 10})  # b = 16
    assert np.all(a.numpy(stream=s) == 6)
    assert np.all(b.numpy(stream=s) == 16)
    a.free()
    b.free()


# ------------------------------------------------------------------------------------------ concurrency
def test_streams_progress_independently(rt, gates):
    """Two gated streams: opening the gate of one lets it finish while the other stays blocked, even
    though the blocked stream's work was submitted first."""
    dev = rt.device(0)
    g, a, b = dev.stream(), dev.stream(), dev.stream()
    ea, eb = dev.event(), dev.event()
    out_a = dev.from_numpy(np.zeros(4, np.int32))
    out_b = dev.from_numpy(np.zeros(4, np.int32))
    gate_a = gates(g)
    g.record(ea)
    gate_b = gates(g)
    g.record(eb)
    b.wait(eb)
    b.launch("ts_set", outputs=[out_b], attrs={"value": 2})
    a.wait(ea)
    a.launch("ts_set", outputs=[out_a], attrs={"value": 1})
    assert not a.query() and not b.query()
    gate_a.open()
    a.synchronize(SYNC_MS)
    assert list(out_a.numpy(stream=a)) == [1, 1, 1, 1]
    assert not b.query()
    assert not eb.query()
    gate_b.open()
    b.synchronize(SYNC_MS)
    assert list(out_b.numpy(stream=b)) == [2, 2, 2, 2]
    out_a.free()
    out_b.free()


def test_consumer_waiting_on_event_sees_complete_data(rt):
    dev = rt.device(1)
    n = 1 << 19
    src = dev.empty((n,), "int32")
    dst = dev.empty((n,), "int32")
    total = dev.from_numpy(np.zeros(1, np.int64))
    prod, cons = dev.stream(), dev.stream()
    ready = dev.event()
    idx = np.arange(n, dtype=np.int64)
    for it in range(20):
        prod.launch("ts_fill", outputs=[src], attrs={"base": it * 1000}, block_dim=8)
        prod.record(ready)
        cons.wait(ready)
        cons.copy(dst.ptr, src.ptr, src.nbytes)
        cons.launch("ts_sum", inputs=[dst], outputs=[total])
        expect = ((7 * idx + it * 1000) % 1000003).astype(np.int32)
        got = dst.numpy(stream=cons)
        assert np.array_equal(got, expect), f"iteration {it}: consumer saw incomplete data"
        assert int(total.numpy(stream=cons)[0]) == int(expect.astype(np.int64).sum())
    prod.synchronize(SYNC_MS)
    for t in (src, dst, total):
        t.free()


# ------------------------------------------------------------------------------------------ events
def test_event_query_states(rt, gates):
    dev = rt.device(0)
    s = dev.stream()
    ev = dev.event()
    assert ev.query() is True                       # never recorded: complete
    g = gates(s)
    s.record(ev)
    assert ev.query() is False                      # recorded behind the gate
    assert ev.query() is False
    g.open()
    ev.synchronize(SYNC_MS)
    assert ev.query() is True
    s.synchronize(SYNC_MS)


def _elapsed(dev, s, launches, out):
    e0, e1 = dev.event(), dev.event()
    s.record(e0)
    for _ in range(launches):
        s.launch("ts_set", outputs=[out], attrs={"value": 3})
    s.record(e1)
    e1.synchronize(SYNC_MS)
    return e0.elapsed(e1)


def test_event_elapsed(rt):
    """Modeled time is additive: n launches of one kernel between two records cost exactly n times one;
    nothing between them costs nothing.  Wall time between records with work between them is positive."""
    dev = rt.device(0)
    s = dev.stream()
    out = dev.from_numpy(np.zeros(256, np.float32))
    one, fifty, none = (_elapsed(dev, s, n, out) for n in (1, 50, 0))
    assert one.modeled_ms > 0.0                      # a launch costs modeled time
    assert fifty.modeled_ms == pytest.approx(50 * one.modeled_ms, rel=1e-9)
    assert none.modeled_ms == 0.0
    assert one.wall_ms > 0.0 and fifty.wall_ms > 0.0
    out.free()


def test_elapsed_with_unrecorded_event(rt):
    dev = rt.device(0)
    s = dev.stream()
    rec, unrec = dev.event(), dev.event()
    s.record(rec)
    rec.synchronize(SYNC_MS)
    with pytest.raises(AclError) as ei:
        rec.elapsed(unrec)
    assert code_of(ei) == 107006
    with pytest.raises(AclError) as ei:
        unrec.elapsed(rec)
    assert code_of(ei) == 107006


def test_wait_ignores_records_issued_after_it(rt, gates):
    """A wait issued before a re-record waits for the earlier record only."""
    dev = rt.device(0)
    p1, p2, c = dev.stream(), dev.stream(), dev.stream()
    ev = dev.event()
    flag = dev.from_numpy(np.zeros(1, np.int32))
    p1.record(ev)
    p1.synchronize(SYNC_MS)                          # record 1 complete
    gc = gates(c)                                    # c reaches its wait only later ...
    c.wait(ev)
    c.launch("ts_set", outputs=[flag], attrs={"value": 1})
    gp = gates(p2)
    p2.record(ev)                                    # ... after record 2, which stays pending
    gc.open()
    c.synchronize(SYNC_MS)                           # record 1 suffices
    assert flag.numpy(stream=c)[0] == 1
    assert not ev.query()
    gp.open()
    ev.synchronize(SYNC_MS)
    flag.free()


def test_wait_uses_latest_record(rt, gates):
    """A wait issued after a re-record waits for the new record, not the completed old one."""
    dev = rt.device(0)
    p1, p2, c = dev.stream(), dev.stream(), dev.stream()
    ev = dev.event()
    flag = dev.from_numpy(np.zeros(1, np.int32))
    p1.record(ev)
    p1.synchronize(SYNC_MS)                          # record 1 complete
    gp = gates(p2)
    p2.record(ev)                                    # record 2 pending
    c.wait(ev)
    c.launch("ts_set", outputs=[flag], attrs={"value": 1})
    assert not c.query()
    with pytest.raises(AclError) as ei:
        c.synchronize(timeout_ms=50)
    assert code_of(ei) == 507046
    gp.open()
    c.synchronize(SYNC_MS)
    assert flag.numpy(stream=c)[0] == 1
    flag.free()


def test_wait_is_not_released_by_a_later_record_completing_first(rt, gates):
    """Record 1 is gated, a stream waits on it, then record 2 (on an idle stream) completes at once:
    the wait captured record 1's work and must keep waiting for it."""
    dev = rt.device(0)
    p1, p2, c = dev.stream(), dev.stream(), dev.stream()
    ev = dev.event()
    flag = dev.from_numpy(np.zeros(1, np.int32))
    gp = gates(p1)
    p1.record(ev)                                    # record 1, pending behind the gate
    c.wait(ev)                                       # waits for record 1
    c.launch("ts_set", outputs=[flag], attrs={"value": 1})
    p2.record(ev)                                    # record 2 completes immediately
    p2.synchronize(SYNC_MS)
    try:
        assert not c.query(), "the wait was released by a later record, before the work it captured ran"
        with pytest.raises(AclError) as ei:          # still blocked a while later
            c.synchronize(timeout_ms=200)
        assert code_of(ei) == 507046, "the wait was released by a later record"
        assert flag.numpy(stream=p2)[0] == 0
    finally:
        gp.open()
    c.synchronize(SYNC_MS)
    assert flag.numpy(stream=c)[0] == 1
    p1.synchronize(SYNC_MS)
    flag.free()


def test_late_older_record_keeps_latest_timestamps(rt, gates):
    """The event's state is its latest record: an older record completing afterwards changes nothing."""
    dev = rt.device(0)
    p1, p2 = dev.stream(), dev.stream()
    start, ev = dev.event(), dev.event()
    out = dev.from_numpy(np.zeros(4, np.int32))
    gp = gates(p1)
    p1.record(ev)                                    # record 1, pending
    p2.record(start)
    p2.launch("ts_set", outputs=[out], attrs={"value": 1})
    p2.record(ev)                                    # record 2, the latest
    p2.synchronize(SYNC_MS)
    assert ev.query() is True                        # the latest record's work is done
    before = start.elapsed(ev)
    gp.open()
    p1.synchronize(SYNC_MS)
    after = start.elapsed(ev)
    assert after == before
    out.free()


def test_event_synchronize_timeout(rt, gates):
    dev = rt.device(0)
    s = dev.stream()
    ev = dev.event()
    g = gates(s)
    s.record(ev)
    with pytest.raises(AclError) as ei:
        ev.synchronize(timeout_ms=50)
    assert code_of(ei) == 507047
    g.open()
    ev.synchronize(SYNC_MS)


# ------------------------------------------------------------------------------------------ priorities
PRIO_LOG: list[str] = []
PRIO_GATES: dict[str, threading.Event] = {}


def ts_prio_log(ctx, tag=""):
    PRIO_LOG.append(tag)


def ts_prio_hold(ctx, tag=""):
    PRIO_LOG.append(f"{tag}{ctx.block_idx}s")
    if ctx.block_idx == 0:
        PRIO_GATES["started"].set()
        PRIO_GATES["proceed"].wait(GATE_TIMEOUT_S)
    PRIO_LOG.append(f"{tag}{ctx.block_idx}e")


register_user_kernel("ts_prio_log", ts_prio_log, replace=True)
register_user_kernel("ts_prio_hold", ts_prio_hold, replace=True)


@pytest.fixture(scope="module")
def one_core_rt():
    r = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=16 << 20, cores=1)))
    yield r
    r.close()


def test_priority_orders_ready_tasks(one_core_rt, gates):
    dev = one_core_rt.device(0)
    g = dev.stream()
    go = dev.event()
    gate = gates(g)
    g.record(go)
    low, high = dev.stream(7), dev.stream(0)
    PRIO_LOG.clear()
    low.wait(go)                                     # low is queued first everywhere
    high.wait(go)
    for i in range(3):
        low.launch("ts_prio_log", attrs={"tag": f"L{i}"})
    for i in range(3):
        high.launch("ts_prio_log", attrs={"tag": f"H{i}"})
    assert PRIO_LOG == []
    gate.open()
    low.synchronize(SYNC_MS)
    high.synchronize(SYNC_MS)
    assert PRIO_LOG == ["H0", "H1", "H2", "L0", "L1", "L2"]


def test_no_preemption_of_running_block(one_core_rt):
    dev = one_core_rt.device(0)
    low, high = dev.stream(7), dev.stream(0)
    PRIO_LOG.clear()
    PRIO_GATES["started"] = threading.Event()
    PRIO_GATES["proceed"] = threading.Event()
    try:
        low.launch("ts_prio_hold", attrs={"tag": "L"}, block_dim=3)
        assert PRIO_GATES["started"].wait(GATE_TIMEOUT_S)
        high.launch("ts_prio_log", attrs={"tag": "H"})
    finally:
        PRIO_GATES["proceed"].set()
    high.synchronize(SYNC_MS)
    low.synchronize(SYNC_MS)
    # the running low-priority block finishes first; the high-priority task then goes before the
    # low task's remaining blocks
    assert PRIO_LOG[:3] == ["L0s", "L0e", "H"]
    assert PRIO_LOG[3:] == ["L1s", "L1e", "L2s", "L2e"]


# ------------------------------------------------------------------------------------------ host callbacks
def test_host_func_runs_after_prior_work_and_blocks_later_tasks(rt):
    dev = rt.device(2)
    s = dev.stream()
    a = dev.from_numpy(np.zeros(16, np.int32))
    b = dev.from_numpy(np.zeros(16, np.int32))
    before, after = dev.event(), dev.event()
    seen: list = []
    release, queued = threading.Event(), threading.Event()

    def cb():
        # the stream can reach the callback before this thread has sent the work after it; an event not yet
        # recorded queries as complete (as aclrtQueryEvent's), so look only once that work is on the device
        queued.wait(GATE_TIMEOUT_S)
        seen.append(before.query())                  # the work queued before the callback is done
        seen.append(after.query())                   # the work queued after it has not started
        release.wait(GATE_TIMEOUT_S)

    s.launch("ts_set", outputs=[a], attrs={"value": 4})
    s.record(before)
    s.launch_host_func(cb, blocking=True)
    s.launch("ts_add_into", inputs=[a], outputs=[b], attrs={"add": 1})
    s.record(after)
    # sent now, not carried by the wait below: ops another thread took to carry with its wait are not yet
    # on the device when that thread's RPC starts, and the callback's query would overtake them
    dev.flush()
    queued.set()
    try:
        before.synchronize(SYNC_MS)
        assert not after.query()
        assert not s.query()
        with pytest.raises(AclError) as ei:
            s.synchronize(timeout_ms=50)
        assert code_of(ei) == 507046
    finally:
        release.set()
    s.synchronize(SYNC_MS)
    assert seen == [True, False]
    assert np.all(b.numpy(stream=s) == 5)
    a.free()
    b.free()


def test_non_blocking_host_func_does_not_hold_the_stream(rt):
    dev = rt.device(2)
    s = dev.stream()
    out = dev.from_numpy(np.zeros(4, np.int32))
    done = dev.event()
    release = threading.Event()
    finished = threading.Event()

    def cb():
        release.wait(GATE_TIMEOUT_S)
        finished.set()

    s.launch_host_func(cb, blocking=False)
    s.launch("ts_set", outputs=[out], attrs={"value": 8})
    s.record(done)
    try:
        done.synchronize(SYNC_MS)                    # later work ran while the callback is still blocked
        assert not finished.is_set()
        assert np.all(out.numpy(stream=s) == 8)
    finally:
        release.set()
    assert finished.wait(GATE_TIMEOUT_S)
    out.free()


# ------------------------------------------------------------------------------------------ failures
@pytest.mark.parametrize("kernel,code", [("ts_raise", 507015), ("ts_write_oob", 507043)])
def test_failed_task_fails_its_stream_only(rt, kernel, code):
    dev, other_dev = rt.device(3), rt.device(1)
    s, other = dev.stream(), dev.stream()
    out = dev.from_numpy(np.zeros(8, np.int32))
    marker = dev.from_numpy(np.zeros(8, np.int32))
    s.launch("ts_set", outputs=[out], attrs={"value": 1})         # runs
    s.launch(kernel, outputs=[out])                                # fails
    s.launch("ts_set", outputs=[marker], attrs={"value": 7})       # skipped
    # other streams and devices keep working meanwhile
    o = dev.from_numpy(np.zeros(8, np.int32))
    other.launch("ts_set", outputs=[o], attrs={"value": 3})
    other.synchronize(SYNC_MS)
    assert np.all(o.numpy(stream=other) == 3)
    od = other_dev.from_numpy(np.zeros(8, np.int32))
    ods = other_dev.stream()
    ods.launch("ts_set", outputs=[od], attrs={"value": 4})
    assert np.all(od.numpy(stream=ods) == 4)
    with pytest.raises(AclError) as ei:
        s.synchronize(SYNC_MS)
    assert code_of(ei) == code
    assert str(code) in str(ei.value)
    s.synchronize(SYNC_MS)                                         # the error was reported once
    assert np.all(out.numpy(stream=s) == 1)
    assert np.all(marker.numpy(stream=s) == 0), "a task after the failed one ran"
    # the stream works again afterwards
    s.launch("ts_set", outputs=[marker], attrs={"value": 9})
    assert np.all(marker.numpy(stream=s) == 9)
    for t in (out, marker, o, od):
        t.free()


def test_failed_task_reaches_device_synchronize(rt):
    dev = rt.device(3)
    s = dev.stream()
    out = dev.from_numpy(np.zeros(4, np.int32))
    s.launch("ts_raise", outputs=[out])
    s.launch("ts_set", outputs=[out], attrs={"value": 5})          # skipped
    with pytest.raises(AclError) as ei:
        dev.synchronize(SYNC_MS)
    assert code_of(ei) == 507015
    dev.synchronize(SYNC_MS)
    assert np.all(out.numpy() == 0)
    out.free()


def test_failed_multi_block_task(rt):
    """One failing block fails the task; the stream reports it once and recovers."""
    dev = rt.device(3)
    s = dev.stream()
    out = dev.from_numpy(np.zeros(4, np.int32))
    s.launch("ts_mark_blocks", outputs=[out], block_dim=6)          # blocks 4 and 5 write out of bounds
    with pytest.raises(AclError) as ei:
        s.synchronize(SYNC_MS)
    assert code_of(ei) == 507043
    s.synchronize(SYNC_MS)
    s.launch("ts_mark_blocks", outputs=[out], block_dim=4)
    assert list(out.numpy(stream=s)) == [1, 2, 3, 4]
    out.free()


def test_synchronize_timeout(rt, gates):
    dev = rt.device(0)
    s = dev.stream()
    out = dev.from_numpy(np.zeros(4, np.int32))
    g = gates(s)
    s.launch("ts_set", outputs=[out], attrs={"value": 6})
    with pytest.raises(AclError) as ei:
        s.synchronize(timeout_ms=50)
    assert code_of(ei) == 507046
    assert not s.query()
    g.open()
    s.synchronize(SYNC_MS)
    assert np.all(out.numpy(stream=s) == 6)
    out.free()
