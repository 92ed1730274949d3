"""The JobRunner's delivery, in process (a DevicePool whose logical devices are in-process CPU devices; no
Ray): waiting with and without a deadline, giving up after ``max_attempts``, a workload bug as a final
error, acknowledgement without a consumer, refused duplicate ids, the runner's own records of each
request, and what closing releases.  Workloads are small user workloads defined here (prepare / run /
release, as runtime.cluster.jobrunner's are); devices and kernels are real."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from devices.errors import ACL_ERROR_RT_AICORE_EXCEPTION, ACL_ERROR_RT_PARAM_INVALID, InvalidParamError
from runtime.cluster.failover import DevicePool, FailoverOptions
from runtime.cluster.jobrunner import History, JobRunner, checksum

WAIT = 30.0


class Doubler:
    """y = x + x on the device (one ``add`` launch); ``gate`` holds every run until it is set; ``bug``
    (an exception) is raised by every run."""
    name = "doubler"

    def __init__(self):
        self.prepared = self.released = self.runs = 0
        self.gate = threading.Event()
        self.gate.set()
        self.bug: BaseException | None = None
        self.lock = threading.Lock()

    def prepare(self, dev):
        with self.lock:
            self.prepared += 1
        return {"dev": dev, "s": dev.stream(), "x": dev.empty((8,)), "y": dev.empty((8,))}

    def run(self, st, x):
        with self.lock:
            self.runs += 1
        assert self.gate.wait(WAIT)
        if self.bug is not None:
            raise self.bug
        st["x"].copy_from(np.asarray(x, np.float32))
        st["s"].launch("add", [st["x"], st["x"]], [st["y"]])
        return st["y"].numpy(st["s"])

    def release(self, st):
        with self.lock:
            self.released += 1
        st["x"].free()
        st["y"].free()
        st["s"].destroy()
        st["dev"].empty_cache()            # the tensors went back to the caching pool: to the driver too


def inputs(i: int) -> np.ndarray:
    return np.arange(8, dtype=np.float32) + i


@pytest.fixture
def pool():
    p = DevicePool([], "unused-token", 2, FailoverOptions(cpu_fallback=True, cpu_arena_bytes=8 << 20))
    try:
        yield p
    finally:
        p.close()


def ops(runner, rid=None) -> list[str]:
    return [e["op"] for e in runner.history if rid is None or e["id"] == rid]


def test_wait_honours_its_deadline_and_pending_counts(pool):
    wl = Doubler()
    wl.gate.clear()
    r = JobRunner(pool, wl)
    try:
        for i in range(3):
            r.submit(i, inputs(i))
        assert r.pending() == 3
        assert r.wait(0.05) is False                          # held at the gate: not done in time
        assert r.wait(0) is False
        assert r.wait_until(lambda rr: len(rr.results) == 3, 0.05) is False
        done = []
        waiter = threading.Thread(target=lambda: done.append(r.wait()))      # no deadline: until done
        waiter.start()
        wl.gate.set()
        waiter.join(WAIT)
        assert done == [True]
        assert r.wait(WAIT) is True and r.wait(None) is True and r.wait(0) is True
        assert r.pending() == 0
        assert r.wait_until(lambda rr: len(rr.results) == 3, WAIT)
    finally:
        r.close()
    assert sorted(r.results) == [0, 1, 2]
    for i, out in r.results.items():
        np.testing.assert_array_equal(out, 2 * inputs(i))


def test_gives_up_after_max_attempts(pool):
    """A request whose every attempt fails (task failures on its device) is tried exactly max_attempts
    times, then finished with a final error; the runner's records say what failed where."""
    wl = Doubler()
    pool2 = DevicePool([], "unused-token", 1, FailoverOptions(cpu_fallback=True, cpu_arena_bytes=8 << 20))
    dev = pool2.bindings[0].handle
    dev.inject_fault("task-fail", count=1000)
    r = JobRunner(pool2, wl, max_attempts=3)
    default = JobRunner(pool2, wl)                        # the default: 50 attempts
    try:
        t0 = time.monotonic()
        r.submit(7, inputs(7), input=0)
        t1 = time.monotonic()
        default.submit(8, inputs(8))
        assert r.wait(WAIT) and default.wait(WAIT)
    finally:
        r.close()
        default.close()
        pool2.close()
    assert default.errors[8].startswith("gave up after 50 attempts: ") and default.requests[8].attempts == 50
    assert r.results == {} and list(r.errors) == [7]
    assert r.errors[7].startswith("gave up after 3 attempts: ")
    assert ops(r, 7) == ["submit", "attempt", "attempt-failed"] * 1 + ["attempt", "attempt-failed"] * 2 + ["failed"]
    assert next(e for e in r.history if e["op"] == "submit")["input"] == 0       # meta goes into the event
    req = r.requests[7]
    assert t0 <= req.submitted_t <= t1
    assert req.attempts == 3 and r.attempt_failures == 3 and r.pending() == 0
    assert [(phys, code) for _, phys, code in req.failures] == [(pool2.bindings[0].physical,
                                                                  ACL_ERROR_RT_AICORE_EXCEPTION)] * 3
    assert req.submitted_t <= req.failures[0][0] <= req.failures[1][0] <= req.failures[2][0]
    fails = [e for e in r.history if e["op"] == "attempt-failed"]
    assert [e["attempt"] for e in fails] == [1, 2, 3] and {e["code"] for e in fails} == {ACL_ERROR_RT_AICORE_EXCEPTION}
    assert {e["physical"] for e in fails} == {pool2.bindings[0].physical}
    assert all("injected task failure" in e["error"] for e in fails)
    c = r.counts()
    assert (c["submitted"], c["completed"], c["failed"], c["attempt_failures"]) == (1, 0, 1, 3), c
    assert c["violations"] == {"failed": 1} and not c["ok"], c          # the checker reports the given-up request


def test_a_workload_bug_is_a_final_error_at_once(pool):
    """An exception that is not a device error is the workload's bug: the request fails at once (no
    replay), with the error's type and text, and the other requests still complete."""
    wl = Doubler()
    got = []
    hist = History()
    r = JobRunner(pool, wl, on_result=lambda rid, out: got.append(rid), history=hist)
    try:
        wl.bug = ValueError("boom")
        r.submit(1, inputs(1))
        assert r.wait(WAIT)
        assert r.pending() == 0
        wl.bug = ValueError("x" * 300)                     # a long message: the event keeps 200 characters
        r.submit(9, inputs(9))
        assert r.wait(WAIT)
        wl.bug = None
        r.submit(2, inputs(2))
        assert r.wait(WAIT)
    finally:
        r.close()
    assert r.history is hist and len(hist) > 0           # the history given is the one written
    assert r.errors.pop(9) == "ValueError: " + "x" * 300
    assert len(next(e for e in hist if e["op"] == "failed" and e["id"] == 9)["error"]) == 200
    assert next(e for e in hist if e["op"] == "attempt-failed" and e["id"] == 9)["error"] == \
        ("ValueError: " + "x" * 300)[:160]                 # the attempt's event keeps 160
    assert r.errors == {1: "ValueError: boom"} and sorted(r.results) == [2] and got == [2]
    assert ops(r, 1) == ["submit", "attempt", "attempt-failed", "failed"]
    failed = next(e for e in r.history if e["op"] == "attempt-failed")
    assert failed["code"] == 0 and failed["error"] == "ValueError: boom" and failed["attempt"] == 1
    assert r.attempt_failures == 0                         # not a device failure: nothing to replay
    assert next(e for e in r.history if e["op"] == "failed")["error"] == "ValueError: boom"


def test_a_device_error_is_logged_per_attempt_in_160_characters(pool):
    """A device error with a long message: each failed attempt's event keeps its first 160 characters (the
    history stays small however long device messages are); the final error keeps all of it."""
    wl = Doubler()
    err = InvalidParamError("y" * 300)
    wl.bug = err
    r = JobRunner(pool, wl, max_attempts=2)
    try:
        r.submit(4, inputs(4))
        assert r.wait(WAIT)
    finally:
        r.close()
    fails = [e for e in r.history if e["op"] == "attempt-failed" and e["id"] == 4]
    assert [e["error"] for e in fails] == [str(err)[:160]] * 2 and len(str(err)) > 160
    assert [e["code"] for e in fails] == [ACL_ERROR_RT_PARAM_INVALID] * 2
    assert r.errors[4] == f"gave up after 2 attempts: {err}"


def test_without_a_consumer_the_runner_acknowledges(pool):
    r = JobRunner(pool, Doubler())
    try:
        for i in range(4):
            r.submit(i, inputs(i))
        assert r.wait(WAIT)
    finally:
        r.close()
    acks = {e["id"]: e["digest"] for e in r.history if e["op"] == "ack"}
    assert acks == {i: checksum(2 * inputs(i)) for i in range(4)}
    done = {e["id"]: e for e in r.history if e["op"] == "complete"}
    assert {i: e["digest"] for i, e in done.items()} == acks
    assert all(e["cpu"] is True and e["attempt"] == 1 for e in done.values())
    assert {e["physical"] for e in done.values()} <= {b.physical for b in pool.bindings.values()}
    res = r.check()
    assert res["ok"] and res["counts"]["deliveries"] == res["counts"]["acknowledged"] == 4, res
    c = r.counts()
    assert c["replays_suppressed"] == 0 and r.duplicates_suppressed == 0 and c["ok"] is True
    assert c["violations"] == {}


def test_a_consumer_sees_each_result_before_wait_returns(pool):
    seen = {}

    def consumer(rid, out):
        seen[rid] = out.copy()
    r = JobRunner(pool, Doubler(), on_result=consumer)
    try:
        for i in range(5):
            r.submit(i, inputs(i))
        assert r.wait(WAIT)
        assert sorted(seen) == list(range(5))          # wait() returned: every result was handed over
    finally:
        r.close()
    assert not [e for e in r.history if e["op"] == "ack"]      # the consumer records its own acks
    for i in range(5):
        np.testing.assert_array_equal(seen[i], r.results[i])


def test_a_request_id_is_submitted_once(pool):
    r = JobRunner(pool, Doubler())
    try:
        r.submit(3, inputs(3))
        with pytest.raises(ValueError, match="request id 3 submitted twice"):
            r.submit(3, inputs(4))
        assert r.wait(WAIT)
    finally:
        r.close()
    assert ops(r, 3).count("submit") == 1
    np.testing.assert_array_equal(r.results[3], 2 * inputs(3))


def test_close_releases_every_prepared_state_and_stops_the_workers(pool):
    wl = Doubler()
    free0 = {lid: b.handle.mem_info()[0] for lid, b in pool.bindings.items()}
    r = JobRunner(pool, wl)
    for i in range(6):
        r.submit(i, inputs(i))
    assert r.wait(WAIT)
    assert 1 <= wl.prepared <= 2 and wl.released == 0      # one state per logical device that ran something
    names = {t.name for t in threading.enumerate() if t.is_alive()}
    assert {"vnpu-job-0", "vnpu-job-1"} <= names          # a worker per logical device
    # daemon workers: a runner its user forgot to close does not keep the process from exiting
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("vnpu-job-"))
    r.close()
    assert wl.released == wl.prepared
    assert {lid: b.handle.mem_info()[0] for lid, b in pool.bindings.items()} == free0
    assert not any(t.is_alive() for t in threading.enumerate() if t.name.startswith("vnpu-job-"))
    assert wl.runs == 6


def test_history_records_in_order_on_its_clock():
    t = iter(range(100, 200))
    h = History(clock=lambda: float(next(t)))
    a = h.record("submit", 1, input=4)
    b = h.record("ack", 1, digest="d")
    assert a == {"op": "submit", "id": 1, "t": 100.0, "input": 4} and b["t"] == 101.0
    assert len(h) == 2 and h.events() == [a, b] and list(h) == [a, b]
    ev = h.events()
    ev.clear()                                           # a copy: the history keeps its events
    assert len(h) == 2
