"""Faults owned by the device: every kind of :data:`devices.faults.FAULT_KINDS` has its documented effect on
both backends (``rt`` fixture: in-process devices, and device actors reached over gRPC), health reports
the fault as structured conditions, and ``clear_fault`` restores normal operation.

The fault state itself is checked on an injected clock (durations, counts, merging, validation).  Nothing
sleeps and nothing asserts wall-clock durations: a slow device shows in the modeled time of its tasks (an
exact ratio) and in its health, a hang in a synchronize that times out with the CANN code, an expiring
fault in a synchronize that finishes.
"""
from __future__ import annotations

import math
import os
import queue
import random
import threading
import time

import numpy as np
import pytest

from devices.arena import ptr_offset
from devices.device import Device, DeviceConfig
from devices.errors import (ACL_ERROR_RT_AICORE_EXCEPTION, ACL_ERROR_RT_DEVICE_TASK_ABORT,
                            ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR,
                            ACL_ERROR_RT_INVALID_DEVICE_FUNCTION, ACL_ERROR_RT_LINK_ERROR,
                            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, ACL_ERROR_RT_SUSPECT_REMOTE_ERROR, HCCL_E_NETWORK,
                            HCCL_E_NOT_FOUND, HCCL_E_NOT_SUPPORT, HCCL_E_REMOTE, AclError, DeviceLostError, HcclError,
                            InvalidHandleError, InvalidParamError, KernelError, TimeoutError_)
from devices.faults import FAULT_KINDS, FaultState
from devices.health import Condition, HealthReport
from devices.kernel import TensorDesc
from devices.node import NODE_ENV
from devices.tasks import Launch, Record
from devices.tenancy import Owner
from driver import protogen, wire
from driver.client import RemoteDevice
from driver.node import this_node
from driver.service import serve
from hccl_ranks import Pool, communicators
from runtime import hccl
from runtime.api import SYNC_TIMEOUT_ENV, Runtime
from runtime.backend import LocalBackend
from runtime.cluster.chaos import CAMPAIGN_PARAMS, ChaosConfig

#: these tests kill, hang and slow the devices of ``rt``: its cluster half runs on a cluster of its own
OWN_CLUSTER = True

SYNC_MS = 20_000
N = 1024


# ------------------------------------------------------------------------------------------ helpers
class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clean(rt):
    """Every test leaves its devices without faults (a lost device stays lost: the kill test runs last)."""
    yield rt
    for d in rt.devices():
        if not d.handle.lost.is_set():
            d.handle.clear_fault()


def buf(h, values: np.ndarray) -> int:
    p = h.malloc(values.nbytes)
    h.memcpy_h2d(p, values)
    return p


def read_f32(h, ptr: int, n: int = N) -> np.ndarray:
    return h.memcpy_d2h(ptr, n * 4).view(np.float32)


def add_one(sid: int, x: int, y: int, n: int = N, blocks: int = 4) -> Launch:
    """y = x + 1 as ``blocks`` blocks (one task, whatever its block count)."""
    return Launch(sid, "add_scalar", (TensorDesc(x, (n,), "float32"),), (TensorDesc(y, (n,), "float32"),),
                  {"value": 1.0}, blocks)


def report(h) -> HealthReport:
    return h.health_report()


# ------------------------------------------------------------------------------------------ the fault state
def test_fault_table_and_wire_agree():
    for kind in FAULT_KINDS.values():
        assert set(kind.accepts) <= set(wire.FAULT_FIELDS), kind.name      # every parameter travels
    # the chaos campaign injects every kind, with parameters its table accepts
    assert set(CAMPAIGN_PARAMS) == set(FAULT_KINDS)

    class Pool:
        phys = {0: None, 1: None, 2: None}
    for name, make in CAMPAIGN_PARAMS.items():
        FAULT_KINDS[name].read_params(make(random.Random(0), ChaosConfig(), Pool, 1))


def test_fault_state_durations_expire_on_its_clock():
    clock = FakeClock()
    st = FaultState(1 << 20, device_id=3, clock=clock)
    heard = []
    st.listen(heard.append)
    st.apply("hang", {"duration_ms": 100})
    st.apply("slow", {"factor": 4, "duration_ms": 300})
    st.apply("link-down", {"peer": 1, "duration_ms": 200})
    st.apply("link-down", {"peer": 2})                         # until cleared
    st.apply("overheat", {"celsius": 30, "duration_ms": 50})
    assert st.hung() and st.slow_factor() == 4.0 and st.link_down(1) and st.link_down(2)
    assert st.overheat_c() == 30.0
    clock.t += 0.06
    assert st.overheat_c() == 0.0 and st.hung()
    clock.t += 0.05
    assert not st.hung() and st.link_down(1)
    clock.t += 0.1
    assert not st.link_down(1) and st.link_down(2) and st.slow_factor() == 4.0
    clock.t += 0.1
    assert st.slow_factor() == 1.0 and st.link_down(2)
    assert st.active() == {"link-down": [{"peer": 2}]}
    assert heard[:5] == ["hang", "slow", "link-down", "link-down", "overheat"]
    assert sorted(heard[5:]) == ["hang", "link-down", "overheat", "slow"]      # expiries are heard too
    st.clear("link-down")
    assert not st.link_down(2) and st.active() == {}


def test_fault_state_counts_merges_and_ranges():
    st = FaultState(4096, device_id=0, clock=FakeClock())
    st.apply("task-fail", {"count": 2})
    st.apply("task-fail", {"count": 3})                         # adds up
    assert [c.value for c in st.conditions()] == [5]
    assert [st.take_task_failure() for _ in range(6)] == [True] * 5 + [False]
    st.apply("ecc", {"offset": 64, "length": 16})
    st.apply("ecc", {"offset": 1024})                           # default length 1
    assert st.ecc == ((64, 80), (1024, 1025))
    conds = st.conditions()
    assert [(c.kind, c.level, c.value) for c in conds] == [(Condition.ECC, "Alarm", 16), (Condition.ECC, "Alarm", 1)]
    assert HealthReport.of(conds).level == "Alarm"
    st.clear("ecc")
    assert st.ecc == ()
    st.apply("ecc", {"offset": 4000, "length": 96})             # up to the last byte of the arena
    assert st.ecc == ((4000, 4096),)


def test_a_timed_fault_ends_exactly_at_its_deadline():
    clock = FakeClock()
    st = FaultState(4096, device_id=0, clock=clock)
    st.apply("slow", {"factor": 3, "duration_ms": 250})
    clock.t = 1000.0 + 250 / 1000.0 - 1e-9
    assert st.slow_factor() == 3.0
    clock.t = 1000.0 + 250 / 1000.0                             # the deadline itself: over
    assert st.slow_factor() == 1.0 and st.active() == {}


@pytest.mark.parametrize("kind,params,why", [
    ("meteor", {}, "unknown fault kind"),
    ("slow", {"bogus": 1}, "takes factor, duration_ms"),
    ("slow", {"factor": 0.5}, ">= 1"),
    ("slow", {"factor": math.nan}, "finite"),
    ("slow", {"factor": "3"}, "number"),
    ("slow", {"factor": [3]}, "fault 'slow': factor must be a number, got [3]"),
    ("task-fail", {"count": 0}, ">= 1"),
    ("task-fail", {"count": 1.5}, "integer"),
    ("task-fail", {"count": True}, "number"),
    ("task-fail", {"duration_ms": 10}, "takes count"),          # not a timed fault
    ("link-down", {}, "needs peer"),
    ("link-down", {"peer": 7}, "no link to itself"),
    ("ecc", {"offset": 4000, "length": 200}, "ECC range [4000, 4200) outside the 4096 B arena"),
    ("ecc", {"offset": 4000, "length": 97}, "ECC range [4000, 4097) outside"),       # one byte past the end
    ("hang", {"duration_ms": -1}, ">= 0"),
    ("kill", {"duration_ms": 5}, "no parameters"),
])
def test_fault_state_refuses_bad_faults(kind, params, why):
    st = FaultState(4096, device_id=7, clock=FakeClock())
    with pytest.raises(InvalidParamError) as ei:
        st.apply(kind, params)
    assert why in str(ei.value)
    assert st.active() == {}


def test_kill_holds_nothing_and_cannot_be_cleared():
    st = FaultState(4096)
    heard = []
    st.listen(heard.append)
    st.apply("kill")
    assert heard == ["kill"] and st.active() == {}
    with pytest.raises(InvalidParamError, match="fault 'kill' cannot be cleared"):
        st.clear("kill")


@pytest.mark.parametrize("kind", [["hang"], 7, None])
def test_a_kind_that_is_no_name_is_an_unknown_kind(kind):
    """Not a string (a list is not even hashable): the same refusal as an unknown name, listing the kinds."""
    st = FaultState(4096, device_id=0, clock=FakeClock())
    with pytest.raises(InvalidParamError) as ei:
        st.apply(kind, {})
    assert f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}, clear" in str(ei.value)


def test_faults_without_a_duration_last_until_cleared():
    """Faults that take no duration (task-fail, ecc) or were given none (link-down) never expire, however
    far the clock moves."""
    clock = FakeClock()
    st = FaultState(4096, device_id=0, clock=clock)
    st.apply("task-fail", {"count": 2})
    st.apply("ecc", {"offset": 0, "length": 8})
    st.apply("link-down", {"peer": 1})
    clock.t += 3600.0
    assert st.ecc == ((0, 8),) and st.link_down(1)
    assert [st.take_task_failure() for _ in range(3)] == [True, True, False]
    assert sorted(st.active()) == ["ecc", "link-down"]


def test_a_hung_core_waits_until_cleared():
    st = FaultState(4096)
    st.wait_running()                                           # no hang: returns at once
    st.apply("hang")
    released = threading.Event()
    t = threading.Thread(target=lambda: (st.wait_running(), released.set()))
    t.start()
    assert not released.wait(0.05)
    st.clear()
    t.join(10)
    assert released.is_set()


# ------------------------------------------------------------------------------------------ both backends
def test_task_fail_fails_the_next_n_tasks_then_normal(clean):
    h = clean.devices()[0].handle
    x, y = buf(h, np.arange(N, dtype=np.float32)), buf(h, np.zeros(N, np.float32))
    s = h.create_stream()
    try:
        h.inject_fault("task-fail", count=2)
        assert report(h).has(Condition.TASK_FAILURES)
        for left in (1, 0):
            h.submit([add_one(s, x, y)])                        # one task of 4 blocks counts once
            with pytest.raises(KernelError) as ei:
                h.synchronize_stream(s, SYNC_MS)
            assert ei.value.code == ACL_ERROR_RT_AICORE_EXCEPTION
            assert [c.value for c in report(h).conditions if c.kind is Condition.TASK_FAILURES] == \
                ([left] if left else [])
        h.submit([add_one(s, x, y)])
        h.synchronize_stream(s, SYNC_MS)
        np.testing.assert_array_equal(read_f32(h, y), np.arange(N, dtype=np.float32) + 1)
        h.inject_fault("task-fail", count=5)
        h.clear_fault("task-fail")
        h.submit([add_one(s, y, y)])
        h.synchronize_stream(s, SYNC_MS)
        np.testing.assert_array_equal(read_f32(h, y), np.arange(N, dtype=np.float32) + 2)
        assert report(h).level == "OK"
    finally:
        h.destroy_stream(s)
        h.free(x)
        h.free(y)


def test_ecc_fails_access_of_the_poisoned_range_only(clean):
    h = clean.devices()[1].handle
    a, b = buf(h, np.arange(N, dtype=np.float32)), buf(h, np.ones(N, np.float32))
    s = h.create_stream()
    try:
        h.inject_fault("ecc", offset=ptr_offset(a) + 64, length=16)      # bytes 64..79 of a
        r = report(h)
        assert r.level == "Alarm" and [(c.kind, c.value) for c in r.conditions] == [(Condition.ECC, 16)]
        for call in (lambda: h.memcpy_d2h(a, N * 4), lambda: h.memcpy_d2h(a + 64, 4),
                     lambda: h.memcpy_h2d(a + 72, np.zeros(2, np.float32)),
                     lambda: h.submit([add_one(s, a, b)])):               # a launch reading it
            with pytest.raises(AclError) as ei:
                call()
            assert ei.value.code == ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR
        # the rest of the allocation, and other allocations, are fine
        np.testing.assert_array_equal(h.memcpy_d2h(a, 64).view(np.float32), np.arange(16, dtype=np.float32))
        np.testing.assert_array_equal(h.memcpy_d2h(a + 80, 16).view(np.float32), np.arange(20, 24, dtype=np.float32))
        h.submit([add_one(s, b, b)])
        h.synchronize_stream(s, SYNC_MS)
        np.testing.assert_array_equal(read_f32(h, b), np.full(N, 2, np.float32))
        h.clear_fault("ecc")
        np.testing.assert_array_equal(read_f32(h, a), np.arange(N, dtype=np.float32))
        assert report(h).level == "OK"
    finally:
        h.destroy_stream(s)
        h.free(a)
        h.free(b)


def _modeled_ms(h, s, x, y) -> float:
    """Modeled time of one launch, between two events recorded around it on stream ``s``."""
    e0, e1 = h.create_event(), h.create_event()
    try:
        h.submit([Record(s, e0), add_one(s, x, y), Record(s, e1)])
        h.synchronize_stream(s, SYNC_MS)
        return h.event_elapsed(e0, e1)[1]
    finally:
        h.destroy_event(e0)
        h.destroy_event(e1)


def test_slow_stretches_task_time_by_its_factor(clean):
    h = clean.devices()[2].handle
    x, y = buf(h, np.arange(N, dtype=np.float32)), buf(h, np.zeros(N, np.float32))
    s = h.create_stream()
    try:
        base = _modeled_ms(h, s, x, y)
        assert base > 0
        h.inject_fault("slow", factor=4.0)
        r = report(h)
        assert r.level == "Warning" and [(c.kind, c.value) for c in r.conditions] == [(Condition.SLOW, 4.0)]
        assert _modeled_ms(h, s, x, y) == pytest.approx(4.0 * base, rel=1e-9)
        np.testing.assert_array_equal(read_f32(h, y), np.arange(N, dtype=np.float32) + 1)   # still right
        h.clear_fault("slow")
        assert _modeled_ms(h, s, x, y) == pytest.approx(base, rel=1e-9)
        assert report(h).conditions == ()
    finally:
        h.destroy_stream(s)
        h.free(x)
        h.free(y)


def test_hang_holds_work_until_cleared_or_expired(clean):
    h = clean.devices()[3].handle
    x, y = buf(h, np.arange(N, dtype=np.float32)), buf(h, np.zeros(N, np.float32))
    s = h.create_stream()
    try:
        h.inject_fault("hang")
        r = report(h)
        assert r.level == "Critical" and r.has(Condition.HANG)
        h.submit([add_one(s, x, y)])
        assert not h.query_stream(s)
        with pytest.raises(AclError) as ei:
            h.synchronize_stream(s, 50)
        assert ei.value.code == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
        h.clear_fault("hang")
        h.synchronize_stream(s, SYNC_MS)
        np.testing.assert_array_equal(read_f32(h, y), np.arange(N, dtype=np.float32) + 1)
        h.inject_fault("hang", duration_ms=30)                # a timed hang ends by itself
        h.submit([add_one(s, y, y)])
        h.synchronize_stream(s, SYNC_MS)
        np.testing.assert_array_equal(read_f32(h, y), np.arange(N, dtype=np.float32) + 2)
        assert not report(h).has(Condition.HANG)
    finally:
        h.destroy_stream(s)
        h.free(x)
        h.free(y)


def test_overheat_raises_the_temperature_alarm(clean):
    h = clean.devices()[0].handle
    assert h.telemetry()["health"] == "OK"
    h.inject_fault("overheat", celsius=80)
    t = h.telemetry()
    assert t["temperature_c"] >= 105 and t["health"] == "Critical"
    over = [c for c in t["conditions"] if c.kind is Condition.OVERHEAT]
    assert len(over) == 1 and over[0].level == "Critical" and over[0].value >= 105
    assert report(h).level == "Critical" and h.health()[0] == "Critical"
    h.clear_fault("overheat")
    t = h.telemetry()
    assert t["temperature_c"] < 95 and t["health"] == "OK" and t["conditions"] == []
    assert h.health() == ("OK", [])


def _allreduce(comms, devs, value_of_rank=lambda r: r + 1.0):
    ts = [d.from_numpy(np.full(64, value_of_rank(r), np.float32)) for r, d in enumerate(devs)]
    for c, t in zip(comms, ts):
        c.all_reduce(t)
    return ts


def test_link_down_fails_collectives_with_that_peer_only(clean):
    d0, d1, d2, d3 = clean.devices()
    pairs = {"01": [d0, d1], "02": [d0, d2], "23": [d2, d3]}
    comms = {k: hccl.comm_init_all(v, hccl.CommOptions(exec_timeout_s=60)) for k, v in pairs.items()}
    ts = []
    try:
        d0.handle.inject_fault("link-down", peer=d1.physical_id)
        r = report(d0.handle)
        assert [(c.kind, c.peer) for c in r.conditions] == [(Condition.LINK_DOWN, d1.physical_id)]
        assert f"link to device {d1.physical_id} down" in d0.handle.health()[1]
        ts += _allreduce(comms["01"], pairs["01"])
        for d in pairs["01"]:                                   # both ends of the broken link
            with pytest.raises(HcclError) as ei:
                d.synchronize()
            assert ei.value.hccl_code == HCCL_E_NETWORK and ei.value.code == ACL_ERROR_RT_LINK_ERROR
        assert [c.async_error() for c in comms["01"]] == [HCCL_E_NETWORK, HCCL_E_NETWORK]
        for k in ("02", "23"):                                  # the link is still down: nothing else fails
            out = _allreduce(comms[k], pairs[k])
            ts += out
            for t in out:
                np.testing.assert_array_equal(t.numpy(), np.full(64, 3.0, np.float32))
        d0.handle.clear_fault("link-down")
        assert report(d0.handle).level == "OK"
        out = _allreduce(comms["01"], pairs["01"], lambda r: 10.0 * (r + 1))
        ts += out
        for t in out:
            np.testing.assert_array_equal(t.numpy(), np.full(64, 30.0, np.float32))
    finally:
        for d in d0, d1, d2, d3:
            try:
                d.synchronize()
            except AclError:
                pass
        for cs in comms.values():
            for c in cs:
                c.destroy()
        for t in ts:
            t.free()


#: a collective's exec timeout in the tests below: far longer than their host waits (SYNC_MS), so that a rank left
#: waiting for a peer shows as a host wait that times out -- the test fails instead of waiting it out
EXEC_S = 120


def _outcome(dev) -> str | int:
    """``"ok"`` or the HcclResult of what ``dev``'s work came to, waiting SYNC_MS at most; a wait that times
    out (a rank left waiting for its peers) fails the test."""
    try:
        dev.synchronize(SYNC_MS)
    except TimeoutError_:
        pytest.fail(f"device {dev.index}: still running after {SYNC_MS} ms -- a rank waits for a peer that "
                    f"will never come (it waits until its exec timeout, {EXEC_S} s)")
    except HcclError as e:
        return e.hccl_code
    return "ok"


@pytest.mark.parametrize("n", [2, 4])
def test_after_a_cleared_link_down_the_next_collective_ends_and_the_one_after_works(clean, n):
    """Link-down fails an AllReduce on every rank; only rank 0's host looks at the error (the other ranks'
    streams keep theirs: a failed stream skips its work until its host synchronizes).  After ``clear``, the
    next AllReduce on the same communicators must end on every rank at once -- rank 0 is told that its peers
    did not run it (HCCL_E_REMOTE), the others report the error they kept -- never leave rank 0 waiting for
    peers that skipped it (issue 25: blocked until the exec timeout, and the ranks' operator counts apart
    for good).  The AllReduce after that works on every rank, with the right sum."""
    devs = clean.devices()[:n]
    d0, d1 = devs[0], devs[1]
    with Pool() as pool, communicators(devs, timeout_s=EXEC_S) as comms:
        def allreduce(scale):
            ts = [pool.put(d, np.full(64, scale * (r + 1), np.float32)) for r, d in enumerate(devs)]
            for c, t in zip(comms, ts):
                c.all_reduce(t)
            return ts
        d0.handle.inject_fault("link-down", peer=d1.physical_id)
        allreduce(1.0)
        assert _outcome(d0) == HCCL_E_NETWORK             # rank 0's host sees it; the others' hosts do not look
        d0.handle.clear_fault("link-down")
        allreduce(10.0)
        got = [_outcome(d) for d in devs]
        assert got == [HCCL_E_REMOTE] + [HCCL_E_NETWORK] * (n - 1), got
        assert comms[0].async_error() == HCCL_E_REMOTE
        ts = allreduce(100.0)
        want = np.full(64, 100.0 * n * (n + 1) / 2, np.float32)
        for t in ts:
            np.testing.assert_array_equal(t.numpy(), want)


def test_a_collective_a_rank_does_not_run_fails_its_peers_at_once(clean):
    """A task failure takes the place of rank 1's AllReduce (fault ``task-fail``): rank 1 reports it, and
    rank 0 is told at once that its peer did not run the operator (HCCL_E_REMOTE, ACL code 507057) instead
    of waiting for it until the exec timeout.  The next AllReduce pairs up again and works."""
    devs = clean.devices()[:2]
    with Pool() as pool, communicators(devs, timeout_s=EXEC_S) as comms:
        def allreduce():
            ts = [pool.put(d, np.full(64, r + 1.0, np.float32)) for r, d in enumerate(devs)]
            for c, t in zip(comms, ts):
                c.all_reduce(t)
            return ts
        devs[1].handle.inject_fault("task-fail", count=1)
        allreduce()
        with pytest.raises(HcclError) as ei:
            try:
                devs[0].synchronize(SYNC_MS)
            except TimeoutError_:
                pytest.fail("rank 0 waits for the AllReduce that rank 1 did not run")
        assert ei.value.hccl_code == HCCL_E_REMOTE and ei.value.code == ACL_ERROR_RT_SUSPECT_REMOTE_ERROR
        assert "rank 1" in str(ei.value) and "did not run its allreduce" in str(ei.value)
        with pytest.raises(KernelError):
            devs[1].synchronize(SYNC_MS)
        for t in allreduce():
            np.testing.assert_array_equal(t.numpy(), np.full(64, 3.0, np.float32))


def test_a_replay_its_stream_skips_gives_up_its_collectives(clean):
    """A captured graph holding an AllReduce, replayed on both ranks: rank 1's stream failed before the replay
    (an earlier task, its error not yet seen by the host), so the replay is skipped -- and its AllReduce
    tells rank 0 so at once, as the operator issued eagerly would.  The next replays work."""
    devs = clean.devices()[:2]
    with Pool() as pool, communicators(devs, timeout_s=EXEC_S) as comms:
        ts = [pool.put(d, np.full(64, r + 1.0, np.float32)) for r, d in enumerate(devs)]
        streams = [d.stream() for d in devs]
        graphs = []
        try:
            for c, t, s in zip(comms, ts, streams):
                s.begin_capture()
                c.all_reduce(t, stream=s)
                graphs.append(s.end_capture())
            devs[1].handle.inject_fault("task-fail", count=1)
            streams[1].launch("add_scalar", [ts[1]], [ts[1]], {"value": 1.0})     # fails: rank 1's stream fails
            for g, s in zip(graphs, streams):
                g.execute_async(s)
            with pytest.raises(HcclError) as ei:
                try:
                    streams[0].synchronize(SYNC_MS)
                except TimeoutError_:
                    pytest.fail("rank 0 waits for the AllReduce of a replay that rank 1 skipped")
            assert ei.value.hccl_code == HCCL_E_REMOTE
            with pytest.raises(KernelError):
                streams[1].synchronize(SYNC_MS)
            for t, r in zip(ts, (0, 1)):
                t.copy_from(np.full(64, r + 1.0, np.float32))
            for g, s in zip(graphs, streams):
                g.execute_async(s)
            for t, s in zip(ts, streams):
                np.testing.assert_array_equal(t.numpy(stream=s), np.full(64, 3.0, np.float32))
        finally:
            for g in graphs:
                g.destroy()
            for s in streams:
                s.destroy()


def test_host_waits_of_the_runtime_end_at_its_sync_timeout(clean):
    """No host call of runtime.api waits without a deadline: with the cores hung (fault ``hang``), a
    ``Tensor.numpy()``, a device, stream or event synchronize "until done" raises the CANN timeout code
    (507046; 507047 for an event) once the runtime's ``sync_timeout_s`` has passed, and the work is still
    there to finish once the hang is cleared.  The waits run in a thread the test joins with a deadline: a
    wait without one fails the test instead of hanging it."""
    dev = clean.devices()[2]
    before = clean.sync_timeout_s
    x = dev.from_numpy(np.arange(N, dtype=np.float32))
    s, ev = dev.stream(), dev.event()
    got: queue.Queue = queue.Queue()

    def waits():
        for name, call in (("numpy", x.numpy), ("device", dev.synchronize), ("stream", s.synchronize),
                           ("event", ev.synchronize)):
            try:
                call()
                got.put((name, "returned"))
            except AclError as e:
                got.put((name, type(e).__name__, e.code))
    try:
        clean.sync_timeout_s = 0.2
        dev.handle.inject_fault("hang")
        dev.launch("add_scalar", [x], [x], {"value": 1.0})
        s.launch("add_scalar", [x], [x], {"value": 1.0})
        ev.record(s)
        t = threading.Thread(target=waits, daemon=True)
        t.start()
        t.join(SYNC_MS / 1000)
        assert not t.is_alive(), "a host wait of runtime.api has no deadline"
        assert [got.get_nowait() for _ in range(4)] == [
            ("numpy", "TimeoutError_", ACL_ERROR_RT_STREAM_SYNC_TIMEOUT),
            ("device", "TimeoutError_", ACL_ERROR_RT_STREAM_SYNC_TIMEOUT),
            ("stream", "TimeoutError_", ACL_ERROR_RT_STREAM_SYNC_TIMEOUT),
            ("event", "TimeoutError_", ACL_ERROR_RT_EVENT_SYNC_TIMEOUT)]
    finally:
        dev.handle.clear_fault("hang")
        clean.sync_timeout_s = before
    np.testing.assert_array_equal(x.numpy(), np.arange(N, dtype=np.float32) + 2)
    ev.destroy()
    s.destroy()
    x.free()


def test_a_host_func_behind_hung_work_is_abandoned_at_the_sync_timeout(clean):
    """The runtime thread that runs ``launch_host_func`` callbacks waits for their stream's work no longer than
    the runtime's ``sync_timeout_s``: behind hung cores the callback is abandoned -- it does not run, the
    thread logs ACL_ERROR_RT_STREAM_SYNC_TIMEOUT (logger ``vnpu``) and releases the blocking stream -- and
    later callbacks still run once the hang is cleared."""
    import logging
    dev = clean.devices()[2]
    before = clean.sync_timeout_s
    x = dev.from_numpy(np.arange(N, dtype=np.float32))
    s = dev.stream()
    logged: queue.Queue = queue.Queue()

    class Catch(logging.Handler):
        def emit(self, record):
            logged.put(record)
    catch = Catch(level=logging.ERROR)
    log = logging.getLogger("vnpu")
    log.addHandler(catch)
    ran = []
    later = threading.Event()
    try:
        clean.sync_timeout_s = 0.2
        dev.handle.inject_fault("hang")
        s.launch("add_scalar", [x], [x], {"value": 1.0})
        s.launch_host_func(lambda: ran.append("behind the hang"), blocking=True)
        rec = logged.get(timeout=SYNC_MS / 1000)          # a wait without a deadline fails the test here
        assert rec.exc_info is not None, rec.getMessage()
        err = rec.exc_info[1]
        assert isinstance(err, AclError) and err.code == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, err
        assert "abandoned" in str(err)
        assert ran == []
    finally:
        dev.handle.clear_fault("hang")
        clean.sync_timeout_s = before
        log.removeHandler(catch)
    s.launch("add_scalar", [x], [x], {"value": 1.0})
    s.launch_host_func(later.set, blocking=True)
    assert later.wait(SYNC_MS / 1000), "a later host func did not run"
    s.synchronize()                                       # the abandoned one's gate was released
    assert ran == []
    np.testing.assert_array_equal(x.numpy(), np.arange(N, dtype=np.float32) + 2)
    s.destroy()
    x.free()


@pytest.mark.parametrize("value, env", [(0, None), (-1.0, None), (float("nan"), None), ("5", None), (True, None),
                                        (None, "soon"), (None, "0"), (None, "inf")])
def test_a_sync_timeout_is_a_positive_number_of_seconds(value, env, monkeypatch):
    """``Runtime(sync_timeout_s=...)`` and ``VNPU_SYNC_TIMEOUT_S`` take a positive finite number of seconds;
    anything else is refused with the parameter code before any device is touched."""
    if env is None:
        monkeypatch.delenv(SYNC_TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(SYNC_TIMEOUT_ENV, env)
    with pytest.raises(InvalidParamError):
        Runtime(None, sync_timeout_s=value)                     # type: ignore[arg-type]
    monkeypatch.setenv(SYNC_TIMEOUT_ENV, "7.5")
    r = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 20, shm=False)))
    try:
        assert r.sync_timeout_s == 7.5
        assert (r.wait_ms(-1), r.wait_ms(0), r.wait_ms(30)) == (7500.0, 0, 30)     # only "until done" changes
    finally:
        r.close()


def test_unknown_faults_and_parameters_are_refused_alike(clean):
    h = clean.devices()[1].handle
    for kind, params in (("meteor", {}), ("slow", {"bogus": 1}), ("link-down", {}), ("task-fail", {"count": 0}),
                         ("ecc", {"offset": 1 << 40}), ("clear", {"count": 1})):
        with pytest.raises(InvalidParamError):
            h.inject_fault(kind, **params)
    with pytest.raises(InvalidParamError):
        h.clear_fault("kill")
    assert report(h).conditions == ()
    h.inject_fault("slow", factor=2)
    h.inject_fault("clear")                                     # the alias of clear_fault()
    assert report(h).conditions == ()


@pytest.fixture
def doomed(rt):
    """Devices a test may lose: in-process, a runtime of its own (the module's devices stay intact whatever
    order the tests run in); device actors cost a cluster start each, so there the module's runtime is
    used and this test runs last in the module (it loses device 3)."""
    if rt.backend.name != "local":
        yield rt
        return
    from conftest import make_local_runtime
    own = make_local_runtime(4, arena=8 << 20)
    try:
        yield own
    finally:
        own.close()


def test_kill_loses_the_device_and_nothing_else(doomed):
    """In-process, the device is marked lost and the process lives; on a device actor, the host process
    dies.  Either way a thread blocked in a synchronize wakes with the device-lost code, and every later
    call fails with it; the other devices keep working."""
    devs = doomed.devices()
    h = devs[3].handle
    x, y = buf(h, np.arange(N, dtype=np.float32)), buf(h, np.zeros(N, np.float32))
    s = h.create_stream()
    h.inject_fault("hang")
    h.submit([add_one(s, x, y)])
    woke: queue.Queue = queue.Queue()

    def blocked():
        try:
            h.synchronize_stream(s, -1)
            woke.put(None)
        except AclError as e:
            woke.put(e)
    t = threading.Thread(target=blocked, daemon=True)
    t.start()
    h.inject_fault("kill")
    assert h.lost.wait(30), "the device was not marked lost"
    err = woke.get(timeout=30)
    assert isinstance(err, DeviceLostError) and err.code == ACL_ERROR_RT_DEVICE_TASK_ABORT
    for call in (lambda: h.malloc(64), h.mem_info, h.health, h.telemetry, lambda: h.synchronize_stream(s, 10),
                 lambda: h.inject_fault("slow"), lambda: h.clear_fault()):
        with pytest.raises(DeviceLostError) as ei:
            call()
        assert ei.value.code == ACL_ERROR_RT_DEVICE_TASK_ABORT
    with pytest.raises(DeviceLostError):
        devs[3].synchronize()
    other = devs[0].handle
    p = buf(other, np.arange(N, dtype=np.float32))
    np.testing.assert_array_equal(read_f32(other, p), np.arange(N, dtype=np.float32))
    other.free(p)
    t.join(10)


# ------------------------------------------------------------------------------------------ in-process only
def test_transport_choice_follows_the_node_identity():
    """HCCL picks a transport per peer by node identity: peers on another node need the cross-node
    transport, which only device actors install (in-process: HCCL_E_NOT_SUPPORT at communicator init)."""
    a = Device(DeviceConfig(device_id=0, arena_bytes=1 << 20, cores=1, node="node-a"))
    b = Device(DeviceConfig(device_id=1, arena_bytes=1 << 20, cores=1, node="node-b"))
    c = Device(DeviceConfig(device_id=2, arena_bytes=1 << 20, cores=1, node="node-a"))
    try:
        assert (a.info().node, b.hccl_info()["node"]) == ("node-a", "node-b")
        with pytest.raises(HcclError) as ei:
            a.hccl_comm_init("x" * 32, 0, [a.hccl_info(), b.hccl_info()])
        assert ei.value.hccl_code == HCCL_E_NOT_SUPPORT
        a.hccl_comm_init("y" * 32, 0, [a.hccl_info(), c.hccl_info()])     # same node: shared memory
        a.hccl_comm_destroy("y" * 32)
    finally:
        for d in (a, b, c):
            d.close()


# ------------------------------------------------------------------------------------------ over the wire
@pytest.fixture
def served():
    """An in-process device served on loopback (no Ray); its clients are closed at the end."""
    made = []

    def make(device_id: int = 40, on_kill=lambda: None, **config):
        dev = Device(DeviceConfig(device_id=device_id, arena_bytes=8 << 20, cores=2, **config))
        srv = serve(dev, host="127.0.0.1", token="t" * 24, port=0, on_kill=on_kill)
        made.append((dev, srv, []))
        return dev, srv

    def client(srv, **kw):
        c = RemoteDevice(srv.address, "t" * 24, srv.device.id, timeout_s=10.0, **kw)
        for dev, s, clients in made:
            if s is srv:
                clients.append(c)
        c.open_lease()                  # as every runtime client does: creating anything needs it
        return c
    make.client = client
    yield make
    for dev, srv, clients in made:
        for c in clients:
            c.close()
        srv.stop(grace=None)
        dev.close()


def test_health_conditions_travel_in_get_health_watch_and_telemetry(served):
    dev, srv = served()
    c = served.client(srv)
    beats: queue.Queue = queue.Queue()
    watch = c.watch_health(20, beats.put)
    try:
        c.inject_fault("link-down", peer=3)
        c.inject_fault("slow", factor=3)
        want = {(Condition.LINK_DOWN, 3, 0.0), (Condition.SLOW, -1, 3.0)}
        assert {(x.kind, x.peer, x.value) for x in c.health_report().conditions} == want
        assert c.health_report() == dev.health_report()
        assert {(x.kind, x.peer, x.value) for x in c.telemetry()["conditions"]} == want
        end = time.monotonic() + 30                              # a beat after the faults carries them
        seen = []
        while True:
            left = end - time.monotonic()
            if left <= 0:
                pytest.fail(f"no health beat carried {want} within 30 s; beats seen: {seen[-5:]}")
            try:
                ev = beats.get(timeout=left)
            except queue.Empty:
                continue                                         # (the deadline check above ends it)
            seen.append({(x.kind, x.peer, x.value) for x in ev.conditions})
            if seen[-1] == want:
                break
        assert ev.health == "Warning" and "link to device 3 down" in ev.reasons
        c.clear_fault()
        assert c.health_report() == HealthReport("OK", ())
    finally:
        watch.stop()


def test_hccl_results_travel_as_a_field(served):
    dev, srv = served()
    c = served.client(srv)
    with pytest.raises(HcclError) as ei:                         # an HcclError raised by the device
        c.hccl_async_error("no-such-communicator-0123")
    assert ei.value.hccl_code == HCCL_E_NOT_FOUND
    assert ei.value.detail == "HCCL_E_NOT_FOUND: unknown communicator 'no-such-communicator-0123'"
    # the code is a field of the detail, whatever the text says
    md = wire.error_trailers(ACL_ERROR_RT_LINK_ERROR, "HcclError", HCCL_E_NETWORK)
    assert wire.error_from_trailers(md) == (ACL_ERROR_RT_LINK_ERROR, "HcclError", HCCL_E_NETWORK)
    assert wire.error_from_trailers(wire.error_trailers(ACL_ERROR_RT_LINK_ERROR)) == (ACL_ERROR_RT_LINK_ERROR, None,
                                                                                    None)


def test_unknown_launch_template_is_a_code_and_the_client_resends(served):
    dev, srv = served()
    c = served.client(srv)
    x, y = buf(c, np.arange(N, dtype=np.float32)), buf(c, np.zeros(N, np.float32))
    s = c.create_stream()
    c.submit([add_one(s, x, y)])                                # sent in full, remembered as a template
    c.synchronize_stream(s, SYNC_MS)
    templates = wire.LaunchTemplates()
    assert wire.submit_request([add_one(s, x, y)], templates).ops[0].WhichOneof("op") == "launch"
    ref = wire.submit_request([add_one(s, x, y)], templates)
    assert ref.ops[0].WhichOneof("op") == "launch_ref"
    with pytest.raises(InvalidHandleError) as ei:
        wire.TemplateTable().decode(ref.ops, "someone")         # a table that never saw it
    assert ei.value.code == ACL_ERROR_RT_INVALID_DEVICE_FUNCTION
    srv.rms.drop_client(Owner("admin", c.client_id, limited=False))                  # the device forgets the client's templates
    c.memcpy_h2d(y, np.zeros(N, np.float32))
    before = c.rpc_count
    c.submit([add_one(s, x, y)])                                 # by reference: refused by code, resent in full
    assert c.rpc_count == before + 2
    c.synchronize_stream(s, SYNC_MS)
    np.testing.assert_array_equal(read_f32(c, y), np.arange(N, dtype=np.float32) + 1)


def test_same_node_is_the_node_identity(served, monkeypatch):
    monkeypatch.setenv(NODE_ENV, "sim-node-a")
    assert this_node() == "sim-node-a"
    here, srv_here = served(41)
    there, srv_there = served(42, node="sim-node-b")
    assert (here.node, there.node) == ("sim-node-a", "sim-node-b")
    assert served.client(srv_here).fast_path is True            # mapped: same node
    assert served.client(srv_there).fast_path is False          # the arena is on this machine, but not this node
    assert served.client(srv_there, same_node=True).fast_path is True     # forced
    assert served.client(srv_here, same_node=False).fast_path is False


def test_kill_of_a_served_device_is_its_hosts_business(served):
    killed = threading.Event()
    dev, srv = served(43, on_kill=killed.set)                   # a device host passes one that ends it
    c = served.client(srv)
    c.inject_fault("kill")
    assert killed.wait(10)
    assert not dev.lost.is_set() and c.mem_info()[1] == 8 << 20


def test_generated_code_is_made_at_setup_only(tmp_path, monkeypatch):
    monkeypatch.setattr(protogen, "OUT_DIR", tmp_path / "_gen")
    with pytest.raises(protogen.GeneratedCodeError) as ei:
        protogen.check()
    assert "scripts/setup.sh" in str(ei.value)
    stale = tmp_path / "_gen" / "vnpu" / "v1"
    stale.mkdir(parents=True)
    for p in protogen.PROTO_DIR.glob("**/*.proto"):
        f = stale / (p.stem + "_pb2.py")
        f.write_text("")
        os.utime(f, (0, 0))                                      # older than every .proto
    with pytest.raises(protogen.GeneratedCodeError) as ei:
        protogen.check()
    assert "older" in str(ei.value)
