"""Failover on real device actors: faults injected while a multi-device job runs are detected, the
work moves to healthy devices, and every request completes exactly once with the fault-free result.

One cluster for the module (4 + 2 spare devices, actors restartable).  Each test builds its own
DevicePool + JobRunner over the devices as they are now (a restarted actor has a new address) and
leaves every device healthy.  No sleeps: everything waits on events / conditions with deadlines.
Latencies are printed (``-s``), never asserted.
"""
from __future__ import annotations

import collections
import os
import signal
import threading
import time

import numpy as np
import pytest

from devices.errors import AclError, DeviceLostError, HcclError
from runtime.cluster import ClusterSpec, LocalCluster, discover
from runtime.cluster.failover import DevicePool, FailoverOptions, flush_all
from runtime.cluster.jobrunner import JobRunner, MlpWorkload, checksum

pytestmark = pytest.mark.cluster

N_LOGICAL, N_SPARE = 4, 2
OPTS = FailoverOptions(heartbeat_ms=50, hang_deadline_s=1.0, restart_wait_s=30.0, quarantine_s=0.5)
WL = MlpWorkload(d=64, hidden=256, batch=8)
INPUTS = WL.make_inputs(16, seed=3)
REF = [WL.reference(x) for x in INPUTS]


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster(ClusterSpec(devices=N_LOGICAL + N_SPARE, arena_bytes=32 << 20, cores=1), max_restarts=20)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def pool(cluster):
    p = DevicePool(discover(), cluster.token, N_LOGICAL, OPTS)      # discover() waits for restarts
    try:
        yield p
    finally:
        for pid in list(p.phys):
            h = p.phys[pid].handle
            if h is not None and not h.lost.is_set():
                try:
                    h.inject_fault("clear")
                except AclError:
                    pass
        p.wait_for(lambda q: all(x.state in ("spare", "bound", "dead") for x in q.phys.values()), 30)
        p.close()


def _run(pool, n_before: int, n_total: int, fault, timeout: float = 60.0):
    """Submit ``n_total`` requests; after ``n_before`` completed, call ``fault(pool, runner)``.  Exactly
    once is checked from what happened: the consumer's deliveries per request id (exactly 1 each) and the
    independent checker of the runner's history (every extra execution explained by a failed attempt)."""
    got = collections.Counter()
    holder = {}

    def consumer(rid, out):
        got[rid] += 1
        holder["r"].history.record("ack", rid, digest=checksum(out))
    r = holder["r"] = JobRunner(pool, WL, on_result=consumer)
    try:
        for i in range(n_total):
            r.submit(i, INPUTS[i % len(INPUTS)])
        assert r.wait_until(lambda rr: len(rr.results) >= n_before, 30)
        t_fault = time.monotonic()
        info = fault(pool, r)
        assert r.wait(timeout), f"not drained: {r.counts()}"
    finally:
        r.close()
    c = r.counts()
    for rid, out in r.results.items():
        np.testing.assert_allclose(out, REF[rid % len(INPUTS)], rtol=2e-4, atol=2e-5)
    assert c["submitted"] == n_total
    assert c["completed"] == n_total, c
    assert c["lost"] == 0 and c["duplicated"] == 0 and c["failed"] == 0, c
    assert c["ok"], r.check()["violations"]
    assert c["executions"] == n_total + c["attempt_failures"], c
    assert sorted(got) == list(range(n_total)) and set(got.values()) == {1}, "a result delivered twice / never"
    return r, c, t_fault, info


def _bound_npu(pool, k: int = 0) -> int:
    return sorted(b.physical for b in pool.bindings.values() if not b.is_cpu)[k]


def _detected(pool, pid: int, t0: float):
    return next((e for e in list(pool.events) if e["kind"] == "detected" and e["physical"] == pid
                 and e["t"] >= t0), None)


def _report(name, pool, pid, t0, runner=None):
    d = _detected(pool, pid, t0)
    msg = f"[{name}] device {pid}: detected after {(d['t'] - t0) * 1000:.0f} ms ({d['cause']})" if d else \
        f"[{name}] device {pid}: not detected"
    if runner is not None:
        failed = {h["id"] for h in runner.history if h["op"] == "attempt-failed" and h["t"] >= t0}
        done = [h["t"] for h in runner.history if h["op"] == "complete" and h["id"] in failed]
        if done:
            msg += f"; lost requests completed elsewhere after {(max(done) - t0) * 1000:.0f} ms"
    print(msg)
    return d


@pytest.mark.parametrize("kind,params,expect_detect", [
    ("kill", {}, True),
    ("hang", {"duration_ms": 2500}, True),
    ("slow", {"factor": 4.0, "duration_ms": 800}, False),
    ("ecc", {"offset": 0, "length": 16 << 20}, True),
    ("link-down", {"peer": 5}, True),
    ("task-fail", {"count": 2}, False),
    ("overheat", {"celsius": 120.0}, True),
])
def test_fault_during_job(pool, kind, params, expect_detect):
    # start from a settled pool: no device of an earlier case still recovering (a victim re-bound while
    # the job runs would never see the fault)
    assert pool.wait_for(lambda p: all(x.state in ("spare", "bound") for x in p.phys.values())
                         and not any(b.is_cpu for b in p.bindings.values()), 30), pool.state()
    victim = _bound_npu(pool)

    def fault(p, r):
        p.handle(victim).inject_fault(kind, **params)
        return victim
    r, c, t0, _ = _run(pool, 20, 300, fault)
    d = _report(kind, pool, victim, t0, r)
    if expect_detect:
        # conditions without a duration last until detected (a loaded machine may delay a health beat past
        # any fixed duration); then they are cleared so that the device can come back
        assert pool.wait_for(lambda p: _detected(p, victim, t0) is not None, 10), f"{kind} not detected"
        if kind in ("link-down", "overheat"):
            pool.handle(victim).clear_fault(kind)
    if kind == "task-fail":
        assert c["attempt_failures"] >= 1                   # the failed tasks were replayed
    if kind in ("kill", "hang", "ecc"):
        assert d is not None and c["attempt_failures"] + len(pool.events) > 0
        # the lost device comes back (restarted actor / hang over / reset after ECC) as a spare
        assert pool.wait_for(lambda p: p.phys[victim].state in ("spare", "bound"), 30), pool.state()


def test_sigkill_actor_process_mid_request(pool):
    victim = _bound_npu(pool, 1)
    pid = pool.phys[victim].where["pid"]

    def fault(p, r):
        os.kill(pid, signal.SIGKILL)                          # for real: the actor's process dies
    r, c, t0, _ = _run(pool, 30, 300, fault)
    d = _report("sigkill", pool, victim, t0, r)
    assert d is not None and d["cause"] in ("stream", "call")
    assert pool.wait_for(lambda p: p.phys[victim].state in ("spare", "bound"), 30), pool.state()
    assert pool.phys[victim].where["pid"] != pid               # a restarted actor: a new process


def test_kill_two_of_four(pool):
    v = [_bound_npu(pool, 0), _bound_npu(pool, 2)]

    def fault(p, r):
        for x in v:
            p.handle(x).inject_fault("kill")
    r, c, t0, _ = _run(pool, 20, 400, fault)
    for x in v:
        _report("kill-2-of-4", pool, x, t0, r)
        assert pool.wait_for(lambda p, x=x: _detected(p, x, t0) is not None, 10)


def test_hang_one(pool):
    victim = _bound_npu(pool, 3)
    r, c, t0, _ = _run(pool, 20, 300, lambda p, r: p.handle(victim).inject_fault("hang", duration_ms=3000))
    _report("hang", pool, victim, t0, r)

    def heartbeat_detection(p):       # other records (e.g. a failed request) may come first under load
        return next((e for e in list(p.events) if e["kind"] == "detected" and e["physical"] == victim
                     and e["t"] >= t0 and e["cause"] == "heartbeat"), None)
    assert pool.wait_for(lambda p: heartbeat_detection(p) is not None, 30), \
        [e for e in list(pool.events) if e["t"] >= t0]
    assert heartbeat_detection(pool)["code"] == 507010


def test_device_dies_during_recovery(pool):
    """The device a lost one's work moved to dies too, while the first is still being restarted."""
    first = _bound_npu(pool, 0)
    lid = next(b.logical for b in pool.bindings.values() if b.physical == first)
    second = {}

    def fault(p, r):
        g0 = p.bindings[lid].gen
        p.handle(first).inject_fault("kill")
        b = p.binding(lid, timeout=10, newer_than=g0)          # re-bound to a spare
        assert b is not None and b.physical != first
        second["pid"] = b.physical
        if not b.is_cpu:
            p.handle(b.physical).inject_fault("kill")
    r, c, t0, _ = _run(pool, 20, 400, fault)
    _report("dies-during-recovery(first)", pool, first, t0, r)
    if "pid" in second:
        _report("dies-during-recovery(second)", pool, second["pid"], t0, r)
    for x in (first, second.get("pid", first)):
        if x in pool.phys:
            assert pool.wait_for(lambda p, x=x: p.phys[x].state in ("spare", "bound"), 30), pool.state()


def test_kill_during_collective(pool):
    """A collective in flight when a rank's device dies fails on every rank (never hangs); the
    communicator is then rebuilt over the new membership and gives the right answer."""
    from runtime import hccl
    lids = pool.logical_ids()[:3]
    opts = hccl.CommOptions(exec_timeout_s=5.0)

    def members():
        return [pool.binding(l, timeout=10).device for l in lids]
    devs = members()
    comms = hccl.comm_init_all(devs, opts)
    n = 1 << 20
    bufs = [d.from_numpy(np.full(n, i + 1, np.float32)) for i, d in enumerate(devs)]
    streams = [d.stream() for d in devs]
    victim = pool.bindings[lids[1]].physical
    for c, b, s in zip(comms, bufs, streams):
        for _ in range(200):                                    # a long queue of all-reduces
            c.all_reduce(b, b, stream=s)
    flush_all(devs)
    vpid = pool.phys[victim].where["pid"]
    t0 = time.monotonic()
    os.kill(vpid, signal.SIGKILL)
    errors = []

    def sync(s):
        try:
            s.synchronize()
        except (HcclError, DeviceLostError, AclError) as e:
            errors.append(e)
    ts = [threading.Thread(target=sync, args=(s,)) for s in streams]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in ts), "a rank hangs after its peer died"
    print(f"[collective] {len(errors)} ranks failed after {(time.monotonic() - t0) * 1000:.0f} ms: "
          f"{sorted({type(e).__name__ + ' ' + str(e.code) for e in errors})}")
    assert len(errors) >= 1
    assert pool.wait_for(lambda p: _detected(p, victim, t0) is not None, 10)
    for c in comms:
        try:
            c.destroy()
        except AclError:
            pass
    for b in bufs:
        try:
            b.free()
        except AclError:
            pass
    # rebuilt over the new membership (the lost rank's logical id now lives elsewhere)
    devs2 = members()
    assert victim not in [d.physical_id for d in devs2]
    if any(pool.bindings[l].is_cpu for l in lids):
        pytest.skip("a rank fell back to the CPU device: no HCCL there")
    comms2 = hccl.comm_init_all(devs2, opts)
    bufs2 = [d.from_numpy(np.full(1024, i + 1, np.float32)) for i, d in enumerate(devs2)]
    for c, b in zip(comms2, bufs2):
        c.all_reduce(b, b, stream=b.device.default_stream)
    flush_all(devs2)
    outs = [b.numpy() for b in bufs2]
    for o in outs:
        assert np.all(o == 6.0)
    for c in comms2:
        c.destroy()
    for b in bufs2:
        b.free()
    for d, s in zip(devs, streams):
        try:
            s.destroy()
        except AclError:
            pass


def test_breaker_quarantines_failing_device(pool):
    """A device whose tasks keep failing trips the circuit breaker: quarantined, later reset and back."""
    victim = _bound_npu(pool, 1)
    r, c, t0, _ = _run(pool, 10, 300, lambda p, r: p.handle(victim).inject_fault("task-fail", count=40))
    q = [e for e in pool.events if e["kind"] == "quarantined" and e["physical"] == victim and e["t"] >= t0]
    print(f"[breaker] device {victim}: {c['attempt_failures']} failed attempts, quarantined {len(q)}x")
    assert q, c
    assert pool.wait_for(lambda p: p.phys[victim].state in ("spare", "bound"), 30), pool.state()


def test_hbm_back_to_baseline(pool):
    base = pool.hbm_used()
    victim = _bound_npu(pool, 0)
    _run(pool, 10, 100, lambda p, r: p.handle(victim).inject_fault("kill"))
    assert pool.wait_for(lambda p: p.phys[victim].state in ("spare", "bound"), 30)
    end = pool.hbm_used()
    assert all(end.get(k, 0) <= base.get(k, 0) for k in end), (base, end)
