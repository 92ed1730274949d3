"""Exactly-once, counted from what happened: the JobRunner's history and its independent checker.

A real :class:`JobRunner` runs requests on in-process devices (a :class:`DevicePool` whose logical devices
are all CPU-fallback devices: no Ray), with failing tasks injected so that requests are replayed.  The
consumer counts the deliveries it receives and records an ``ack`` for each.  The checker
(:mod:`runtime.cluster.history_check`, which reads only the events) must pass that history, must FAIL each
doctored copy of it (a duplicated completion, a wrong digest, an acknowledgement without a completion, a
request that never completes), and must catch a runner that queues every failed request twice (each of
them runs twice) -- a mutation the old counters let through.
"""
from __future__ import annotations

import ast
import collections
import copy
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from runtime.cluster import history_check
from runtime.cluster.failover import DevicePool, FailoverOptions
from runtime.cluster.jobrunner import JobRunner, MlpWorkload, checksum

ROOT = Path(__file__).resolve().parents[2]
WL = MlpWorkload(d=32, hidden=64, batch=4)
INPUTS = WL.make_inputs(6, seed=5)
N = 24


class Consumer:
    """Receives results: counts deliveries per request id and acknowledges each in the history."""

    def __init__(self):
        self.runner = None
        self.got = collections.Counter()
        self.lock = threading.Lock()

    def __call__(self, rid, out):
        with self.lock:
            self.got[rid] += 1
        self.runner.history.record("ack", rid, digest=checksum(out))


def _run(runner_cls=JobRunner, failing_tasks: int = 6):
    pool = DevicePool([], "unused-token", 2, FailoverOptions(cpu_fallback=True, cpu_arena_bytes=16 << 20))
    consumer = Consumer()
    try:
        r = runner_cls(pool, WL, on_result=consumer)
        consumer.runner = r
        try:
            pool.bindings[0].handle.inject_fault("task-fail", count=failing_tasks)
            for i in range(N):
                r.submit(i, INPUTS[i % len(INPUTS)], input=i % len(INPUTS))
            assert r.wait(120), r.counts()
        finally:
            r.close()
        return r, consumer
    finally:
        pool.close()


@pytest.fixture(scope="module")
def run():
    r, consumer = _run()
    # the reference: each input's result, computed fault-free on its own device
    ref = {}
    for rid, out in r.results.items():
        ref.setdefault(str(rid % len(INPUTS)), checksum(out))
    return r, consumer, ref


def test_runner_history_passes_the_checker(run):
    r, consumer, ref = run
    res = r.check(ref)
    assert res["ok"], res["violations"]
    c = res["counts"]
    assert c["submitted"] == c["completed"] == N and c["lost"] == c["failed"] == c["duplicated"] == 0
    assert c["attempt_failures"] >= 1, "no failed attempt: the replay path was not exercised"
    assert c["executions"] == N + c["attempt_failures"]          # each extra run explained by a failure
    assert c["deliveries"] == c["acknowledged"] == N
    assert c["checked_against_reference"] == N and c["wrong_results"] == 0
    assert set(consumer.got) == set(range(N)) and set(consumer.got.values()) == {1}
    for rid, out in r.results.items():                          # and the results are right
        np.testing.assert_allclose(out, WL.reference(INPUTS[rid % len(INPUTS)]), rtol=2e-4, atol=2e-5)


def _ev(events, op, rid):
    return next(i for i, e in enumerate(events) if e["op"] == op and e["id"] == rid)


def _replayed_id(events):
    return next(e["id"] for e in events if e["op"] == "attempt-failed")


def doctor_duplicate_completion(events):
    rid = events[-1]["id"]
    i = _ev(events, "complete", rid)
    t = events[-1]["t"]
    return events + [dict(events[_ev(events, "attempt", rid)], t=t), dict(events[i], t=t)], "duplicated"


def doctor_wrong_digest(events):
    i = _ev(events, "complete", 3)
    events[i] = dict(events[i], digest="0" * 64)
    j = _ev(events, "ack", 3)
    events[j] = dict(events[j], digest="0" * 64)
    return events, "wrong-result"


def doctor_ack_without_completion(events):
    rid = _replayed_id(events)
    i = _ev(events, "attempt-failed", rid)
    events.insert(i + 1, dict(events[i], op="ack", digest="f" * 64))
    return events, "ack-without-completion"


def doctor_never_completes(events):
    return [e for e in events if not (e["id"] == 7 and e["op"] in ("complete", "ack"))], "lost"


def doctor_unacknowledged(events):
    return [e for e in events if not (e["id"] == 2 and e["op"] == "ack")], "unacknowledged"


def doctor_delivered_twice(events):
    i = _ev(events, "ack", 5)
    return events + [dict(events[i], t=events[-1]["t"])], "acked-twice"


def doctor_execution_without_outcome(events):
    rid = 4
    i = _ev(events, "attempt", rid)
    return events[:i + 1] + [dict(events[i])] + events[i + 1:], "unfinished-attempt"


def doctor_time_goes_back(events):
    events[5] = dict(events[5], t=events[5]["t"] - 1000.0)
    return events, "out-of-order"


DOCTORS = [doctor_duplicate_completion, doctor_wrong_digest, doctor_ack_without_completion, doctor_never_completes,
           doctor_unacknowledged, doctor_delivered_twice, doctor_execution_without_outcome, doctor_time_goes_back]


@pytest.mark.parametrize("doctor", DOCTORS, ids=[d.__name__[7:] for d in DOCTORS])
def test_doctored_history_fails_the_check(run, doctor):
    r, _, ref = run
    events, kind = doctor(copy.deepcopy(r.history.events()))
    res = history_check.check(events, ref)
    assert not res["ok"]
    assert kind in res["by_kind"], res["by_kind"]


def test_a_runner_that_queues_failed_requests_twice_is_caught():
    """The mutation of issue 19.1: every failed request goes back into the queue twice, so it runs twice.
    The runner still delivers each result once, but the history shows the extra executions."""
    class DoubleQueue(JobRunner):
        def _requeue(self, req, b, e, attempt):
            super()._requeue(req, b, e, attempt)
            if attempt is not None and req.id not in self.errors:
                with self._cv:
                    self._q.appendleft(req)
    r, consumer = _run(DoubleQueue)
    res = r.check()
    assert set(consumer.got.values()) == {1}                  # the consumer alone would not notice
    assert not res["ok"]
    assert res["by_kind"].get("duplicated", 0) >= 1 and res["counts"]["duplicated"] >= 1, res["by_kind"]
    completes = collections.Counter(e["id"] for e in r.history if e["op"] == "complete")
    assert r.duplicates_suppressed == sum(n - 1 for n in completes.values()) >= 1   # each extra one hidden
    assert r.counts()["replays_suppressed"] == r.duplicates_suppressed


def test_checker_reads_only_json():
    """The checker imports nothing but the standard library (a stress test reuses it on any JSON)."""
    tree = ast.parse((ROOT / "runtime" / "cluster" / "history_check.py").read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert mods <= {"__future__", "json", "collections"}, mods


def test_vnpu_chaos_check_cli(run, tmp_path):
    r, _, ref = run
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"history": r.history.events(), "reference": ref}))
    bad_events, _ = doctor_duplicate_completion(copy.deepcopy(r.history.events()))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"history": bad_events, "reference": ref}))
    junk = tmp_path / "junk.json"
    junk.write_bytes(b"\x00\x01not json")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")

    def check(path):
        return subprocess.run([sys.executable, "-m", "runtime.cli", "chaos", "check", str(path)], capture_output=True,
                              text=True, timeout=120, env=env, cwd=ROOT)
    p = check(good)
    assert p.returncode == 0 and "check: OK" in p.stdout, p.stdout + p.stderr
    p = check(bad)
    assert p.returncode == 1 and "duplicated" in p.stdout, p.stdout + p.stderr
    p = check(junk)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    p = check(tmp_path / "missing.json")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
