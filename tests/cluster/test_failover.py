"""Failover on real device actors: faults injected while a multi-device job runs are detected, the
work moves to healthy devices, and every request completes exactly once with the fault-free result.

One cluster for the module (4 + 2 spare devices, actors restartable).  Each test builds its own
DevicePool + JobRunner over the devices as they are now (a restarted actor has a new address) and
leaves every device healthy.  No sleeps: everything waits on events / conditions with deadlines.
Latencies are printed (``-s``), never asserted.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import signal
import threading
import time

import numpy as np
import pytest

from devices.errors import HCCL_E_REMOTE, HCCL_E_TIMEOUT, AclError, DeviceLostError, HcclError
from latency_noise import CPU_HOGS, healthy_stream, recorded
from runtime.cluster import ClusterSpec, LocalCluster, discover
from runtime.cluster.failover import DevicePool, FailoverOptions, flush_all
from runtime.cluster.jobrunner import JobRunner, MlpWorkload, checksum

pytestmark = pytest.mark.cluster

N_LOGICAL, N_SPARE = 4, 2
# the default straggler rule (2x the peers' median AND 2 ms over it AND 3.5 robust sigmas of the peers'
# noise, held for 2 s): this workload's requests are tens of µs of kernels behind RPCs, whose scheduling
# noise put a healthy device's median at 2x its peers' under the ratio alone; every job below asserts
# that no healthy device is taken out as slow
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


def _settle_and_close(p: DevicePool) -> None:
    """Teardown: clear every fault, wait until every device is back in service (bound or spare), close.
    A device that does not come back fails the test that left it so."""
    try:
        for pid in list(p.phys):
            h = p.phys[pid].handle
            if h is not None and not h.lost.is_set():
                h.inject_fault("clear")
        back = p.wait_for(lambda q: all(x.state in ("spare", "bound") for x in q.phys.values()), 30)
        state = p.state()
    finally:
        p.close()
    assert back, f"devices not back in service after the test: {state}"


@pytest.fixture
def pool(cluster):
    p = DevicePool(discover(), cluster.token, N_LOGICAL, OPTS)      # discover() waits for restarts
    try:
        yield p
    finally:
        _settle_and_close(p)


def _run(pool, n_before: int, n_total: int, fault, timeout: float = 60.0, until=None, slow_ok=frozenset()):
    """Submit ``n_total`` requests; after ``n_before`` completed, call ``fault(pool, runner)``; with
    ``until``, keep the queue fed (100 more requests whenever fewer than 50 wait) until ``until(pool)``
    holds or 60 s passed.  Exactly once is checked from what happened: the consumer's deliveries per request
    id (exactly 1 each) and the independent checker of the runner's history (every extra execution explained
    by a failed attempt).  No device but those in ``slow_ok`` may have been taken out as a straggler."""
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
        end = time.monotonic() + 60.0
        while until is not None and not until(pool) and time.monotonic() < end:
            if r.wait_until(lambda rr, n=n_total: len(rr.results) >= n - 50 or until(pool),
                            max(0.0, end - time.monotonic())) and not until(pool):
                for i in range(n_total, n_total + 100):
                    r.submit(i, INPUTS[i % len(INPUTS)])
                n_total += 100
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
    slow = [e for e in list(pool.events) if e["kind"] == "detected" and e["cause"] == "slow"
            and e["physical"] not in slow_ok]
    assert not slow, f"a healthy device was taken out as a straggler: {slow}"
    return r, c, t_fault, info


def _failed_on(runner, t0: float) -> set[int]:
    """Physical devices on which an attempt failed after ``t0``."""
    return {h["physical"] for h in runner.history if h["op"] == "attempt-failed" and h["t"] >= t0}


def _rebound_from(pool, pid: int, t0: float) -> list[dict]:
    """Re-bindings of a logical id away from device ``pid`` after ``t0``."""
    return [e for e in list(pool.events) if e["kind"] == "bound" and e.get("previous") == pid and e["t"] >= t0]


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


#: fault -> (parameters, the causes its detection may carry; None: not necessarily detected).  Conditions
#: without a duration (link-down, overheat) last until detected (a loaded machine may delay a health beat
#: past any fixed duration); the test then clears them so that the device can come back.
FAULTS = {
    "kill": ({}, {"stream", "call"}),
    "hang": ({"duration_ms": 2500}, {"heartbeat", "call"}),
    "slow": ({"factor": 4.0, "duration_ms": 800}, None),
    "ecc": ({"offset": 0, "length": 16 << 20}, {"ecc"}),
    "link-down": ({"peer": 5}, {"telemetry"}),
    "task-fail": ({"count": 2}, {"task-error"}),
    "overheat": ({"celsius": 120.0}, {"telemetry"}),
}


@pytest.mark.parametrize("kind", list(FAULTS))
def test_fault_during_job(pool, kind):
    params, causes = FAULTS[kind]
    # start from a settled pool: no device of an earlier case still recovering (a victim re-bound while
    # the job runs would never see the fault)
    assert pool.wait_for(lambda p: all(x.state in ("spare", "bound") for x in p.phys.values())
                         and not any(b.is_cpu for b in p.bindings.values()), 30), pool.state()
    victim = _bound_npu(pool)

    def fault(p, r):
        p.handle(victim).inject_fault(kind, **params)
        return victim
    r, c, t0, _ = _run(pool, 20, 300, fault, slow_ok={victim} if kind == "slow" else frozenset())
    _report(kind, pool, victim, t0, r)
    assert _failed_on(r, t0) <= {victim}, "a healthy device failed requests"
    if causes is not None:
        assert pool.wait_for(lambda p: _detected(p, victim, t0) is not None, 10), f"{kind} not detected"
        assert _detected(pool, victim, t0)["cause"] in causes, _detected(pool, victim, t0)
        if kind in ("link-down", "overheat"):
            pool.handle(victim).clear_fault(kind)
    if kind == "task-fail":
        assert 1 <= c["attempt_failures"] <= 2, c       # each failed task failed one attempt, replayed
    if kind in ("kill", "hang", "ecc", "link-down", "overheat"):
        # taken out of service: its logical id moved elsewhere at once ...
        assert pool.wait_for(lambda p: _rebound_from(p, victim, t0), 10), [e for e in pool.events if e["t"] >= t0]
        # ... and the device comes back (restarted actor / hang over / reset after ECC) as a spare
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
    """A real SIGKILL of one rank's device process while a long queue of all-reduces runs: every
    survivor's stream fails with HCCL_E_REMOTE (the peer is gone) or HCCL_E_TIMEOUT -- never hangs --
    and the dead rank's own stream with the device-lost error.  The communicator is then rebuilt over the
    new membership and gives the right answer."""
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
    errors: dict[int, BaseException | None] = {}

    def sync(rank, s):
        try:
            s.synchronize()
            errors[rank] = None
        except AclError as e:
            errors[rank] = e
    ts = [threading.Thread(target=sync, args=(r, s)) for r, s in enumerate(streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in ts), "a rank hangs after its peer died"
    print(f"[collective] ranks failed after {(time.monotonic() - t0) * 1000:.0f} ms: "
          f"{ {r: (type(e).__name__, e.code, getattr(e, 'hccl_code', None)) if e else None for r, e in errors.items()} }")
    assert isinstance(errors[1], DeviceLostError), errors[1]          # the killed rank: its device is lost
    for r in (0, 2):                                                   # every survivor: the peer is gone
        e = errors[r]
        assert isinstance(e, HcclError) and e.hccl_code in (HCCL_E_REMOTE, HCCL_E_TIMEOUT), \
            f"rank {r}: {type(e).__name__} {e}"
    assert pool.wait_for(lambda p: _detected(p, victim, t0) is not None, 10)
    for r, (c, b, s) in enumerate(zip(comms, bufs, streams)):
        if r == 1:                                                     # the dead rank's handles are gone
            c.destroy()                                                # (nothing left to free: no error)
            b.free()                                                   # back to the pool: no driver call
            with pytest.raises(DeviceLostError):
                s.destroy()
        else:
            c.destroy()
            b.free()
            s.destroy()
    # rebuilt over the new membership (the lost rank's logical id now lives on a spare device)
    assert pool.wait_for(lambda p: all(not p.bindings[l].is_cpu for l in lids), 30), pool.state()
    devs2 = members()
    assert victim not in [d.physical_id for d in devs2]
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


def test_no_spare_left_the_cpu_fallback_serves_correct_results(cluster):
    """A pool with no spare device: a killed device's logical id goes to the in-process CPU fallback,
    whose results are the same (exactly once, checked against numpy); when the device is back, the
    logical id moves back to it."""
    where = discover()[:N_LOGICAL]                                  # as many devices as logical ids
    p = DevicePool(where, cluster.token, N_LOGICAL, OPTS)
    try:
        victim = _bound_npu(p, 2)
        lid = next(b.logical for b in p.bindings.values() if b.physical == victim)
        r, c, t0, _ = _run(p, 20, 200, lambda pp, rr: pp.handle(victim).inject_fault("kill"))
        cpu = [e for e in _rebound_from(p, victim, t0) if e.get("cpu")]
        assert cpu and cpu[0]["logical"] == lid, [e for e in p.events if e["t"] >= t0]
        on_cpu = [h for h in r.history if h["op"] == "complete" and h["cpu"]]
        print(f"[no-spare] {len(on_cpu)} of {c['completed']} requests completed on the CPU fallback")
        assert on_cpu, "no request ran on the CPU fallback"
        assert all(h["physical"] == cpu[0]["physical"] for h in on_cpu)
        # the restarted device takes its logical id back from the CPU fallback
        assert p.wait_for(lambda q: not q.bindings[lid].is_cpu, 30), p.state()
        assert p.bindings[lid].physical == victim
    finally:
        _settle_and_close(p)


def test_slow_device_is_quarantined_as_slow(pool):
    """(a) A straggler (fault ``slow``: every task 100x its time -- this workload's kernels take tens of µs,
    so a smaller factor may hide under the RPC's own latency) is found from request latencies alone by
    the default rule -- its median over its peers', beyond the floor and their noise, for 2 s -- and
    quarantined with cause "slow"; its requests still complete (exactly once, right results), no healthy
    device is taken out, and after the quarantine and a reset it is back as a spare."""
    victim = _bound_npu(pool, 1)
    t_inj = {}

    def fault(p, rr):
        t_inj["t"] = time.monotonic()
        p.handle(victim).inject_fault("slow", factor=100.0)
    r, c, t0, _ = _run(pool, 20, 1200, fault, until=lambda p: _detected(p, victim, t_inj["t"]) is not None,
                       slow_ok={victim})
    _report("slow", pool, victim, t0, r)
    assert pool.wait_for(lambda p: _detected(p, victim, t0) is not None, 10), "the straggler was not detected"
    d = _detected(pool, victim, t0)
    assert d["cause"] == "slow" and "x its peers'" in d["reason"], d
    print(f"[slow] device {victim}: {d['reason']}")       # under CPU hogs its requests take seconds
    assert [e for e in pool.events if e["kind"] == "quarantined" and e["physical"] == victim and e["t"] >= t0]
    assert _rebound_from(pool, victim, t0)
    assert c["attempt_failures"] == 0                                 # slow is not an error: nothing replayed
    pool.handle(victim).inject_fault("clear")
    assert pool.wait_for(lambda p: p.phys[victim].state in ("spare", "bound"), 30), pool.state()


def test_report_latency_noise_and_a_straggler_on_real_devices(cluster):
    """(b) + (a) through the pool on real devices, the noise made deterministic: the recorded 2-core trace
    and a CPU-hog model are fed to ``report_latency`` of the four bound devices, on the pool's injected
    clock (the reports' own timestamps) -- nothing is taken out.  Then the device of logical id 1 turns
    100x slow: it is taken out as slow, no sooner than ``slow_persist_s`` after its first slow request, and
    its logical id moves to a spare."""
    now = [0.0]
    p = DevicePool(discover(), cluster.token, N_LOGICAL, OPTS, clock=lambda: now[0])
    try:
        bs = [p.binding(lid) for lid in range(N_LOGICAL)]
        assert not any(b.is_cpu for b in bs)
        t_end = 0.0
        for reports in (recorded(), healthy_stream(11, 3000, **CPU_HOGS)):
            for t, d, s in reports:
                now[0] = t_end + t
                p.report_latency(bs[d % N_LOGICAL], s)
            t_end = now[0] + 1.0
        slow = [e for e in p.events if e["kind"] == "detected" and e["cause"] == "slow"]
        assert not slow, slow
        victim = bs[1].physical
        t_fault = t_end
        for t, d, s in healthy_stream(12, 20000):
            now[0] = t_fault + t
            p.report_latency(bs[d], 100 * s if d == 1 else s)
            if _detected(p, victim, 0.0) is not None:
                break
        d = _detected(p, victim, 0.0)
        assert d is not None and d["cause"] == "slow", [e for e in p.events if e["kind"] == "detected"]
        print(f"[slow, fed] device {victim}: {d['reason']}")
        assert now[0] - t_fault >= OPTS.slow_persist_s
        assert p.bindings[1].physical != victim and not p.bindings[1].is_cpu
        assert not [e for e in p.events if e["kind"] == "detected" and e["cause"] == "slow"
                    and e["physical"] != victim]
    finally:
        _settle_and_close(p)


def test_breaker_quarantines_failing_device(pool):
    """A device whose tasks keep failing trips the circuit breaker: quarantined, later reset and back."""
    victim = _bound_npu(pool, 1)
    r, c, t0, _ = _run(pool, 10, 300, lambda p, r: p.handle(victim).inject_fault("task-fail", count=40))
    q = [e for e in pool.events if e["kind"] == "quarantined" and e["physical"] == victim and e["t"] >= t0]
    print(f"[breaker] device {victim}: {c['attempt_failures']} failed attempts, quarantined {len(q)}x")
    assert q, c
    assert pool.wait_for(lambda p: p.phys[victim].state in ("spare", "bound"), 30), pool.state()


def test_hbm_back_to_baseline(pool):
    """Every device of the pool -- the restarted one included -- holds no more HBM after the job than
    before it."""
    base = pool.hbm_used(every=True)
    victim = _bound_npu(pool, 0)
    _run(pool, 10, 100, lambda p, r: p.handle(victim).inject_fault("kill"))
    assert pool.wait_for(lambda p: p.phys[victim].state in ("spare", "bound"), 30)
    end = pool.hbm_used(every=True)
    assert set(end) == set(base) == set(pool.phys) and None not in end.values(), (base, end)
    assert all(end[k] <= base[k] for k in end), (base, end)
