"""driver.lease.Leases on its own (no gRPC): lease watches counted per client, a release only after the
LAST watch of a client ended and nothing renewed it within the grace period, never for a client that
still holds one, and never after the device closed.  Grace periods are short (20 ms) and every wait is
on a condition with a deadline; a wait that must time out (nothing released) waits 5 grace periods.

The real protocol (WatchHealth streams over gRPC) is in tests/driver/test_rpc.py."""
from __future__ import annotations

import logging
import threading

import pytest

from driver.lease import Leases

GRACE = 0.02
NOTHING = 5 * GRACE              #: how long "nothing happens" is waited for
WAIT = 10.0                      #: deadline for what must happen
#: a grace no test outlives: where a step must come within the grace (a renewal, a close), the test
#: holds the grace this long so a preempted thread cannot lose the race; it checks what is armed
LONG = 600.0


class Recorder:
    def __init__(self, fail: bool = False):
        self.released: list[str] = []
        self.fail = fail
        self.calls = threading.Event()

    def __call__(self, owner: str) -> None:
        self.released.append(owner)
        self.calls.set()
        if self.fail:
            raise RuntimeError("release failed")


@pytest.fixture
def rec():
    return Recorder()


@pytest.fixture
def leases(rec):
    le = Leases(rec, grace_s=GRACE)
    yield le
    le.close()


def test_one_watch_released_after_the_grace(leases, rec):
    leases.opened("a")
    assert leases.holds("a") and leases.count("a") == 1
    leases.closed("a")
    assert not leases.holds("a") and leases.count("a") == 0
    assert leases.wait_released("a", WAIT)
    assert rec.released == ["a"] and leases.released == ["a"]


def test_two_overlapping_watches_closing_one_releases_nothing(leases, rec):
    leases.opened("a")
    leases.opened("a")
    assert leases.count("a") == 2
    leases.closed("a")
    assert leases.holds("a") and leases.count("a") == 1
    assert not leases.wait_released("a", NOTHING)
    assert rec.released == [] and leases.released == []
    leases.closed("a")
    assert leases.wait_released("a", WAIT) and rec.released == ["a"]


def test_other_clients_are_independent(leases, rec):
    leases.opened("a")
    leases.opened("b")
    leases.closed("b")
    assert leases.wait_released("b", WAIT)
    assert leases.holds("a") and rec.released == ["b"]
    assert not leases.wait_released("a", NOTHING)


def test_a_renewed_lease_is_not_released(rec):
    le = Leases(rec, grace_s=LONG)
    try:
        le.opened("a")
        le.closed("a")
        assert le.armed("a")
        le.opened("a")                                  # renewed within the grace period: disarmed
        assert not le.armed("a") and le.holds("a")
        assert not le.wait_released("a", NOTHING) and rec.released == []
        le.grace_s = GRACE
        le.closed("a")
        assert le.wait_released("a", WAIT) and rec.released == ["a"] and not le.armed("a")
    finally:
        le.close()


def test_released_once_per_ending(leases, rec):
    """Closing again re-arms the release (each end of the last watch releases once): two ends, two
    releases; and a second close of an already closed client does not release twice at once."""
    leases.opened("a")
    leases.closed("a")
    leases.closed("a")                                  # (spurious) second end: re-armed, not doubled
    assert leases.wait_released("a", WAIT)
    assert not leases.wait_count("a", 1, NOTHING)
    assert rec.released == ["a"]


def test_close_cancels_pending_releases_and_stops_arming(rec):
    le = Leases(rec, grace_s=LONG)
    le.opened("a")
    le.closed("a")
    assert le.armed("a")                                # armed ...
    le.close()                                          # ... and cancelled: the device is going away
    assert not le.armed("a")
    le.grace_s = GRACE
    le.opened("b")
    le.closed("b")                                      # after close: nothing is armed
    assert not le.armed("b")
    assert not le.wait_released("a", NOTHING) and not le.wait_released("b", NOTHING)
    assert rec.released == []


def test_a_failing_release_is_logged_not_recorded_and_the_table_keeps_working(caplog):
    rec = Recorder(fail=True)
    le = Leases(rec, grace_s=GRACE)
    try:
        with caplog.at_level(logging.ERROR, logger="vnpu.lease"):
            le.opened("a")
            le.closed("a")
            assert rec.calls.wait(WAIT)
            assert not le.wait_released("a", NOTHING)   # the release raised: not counted as done
        (rec_log,) = [r for r in caplog.records if r.name == "vnpu.lease"]
        assert rec_log.getMessage() == "releasing client a failed" and rec_log.exc_info[0] is RuntimeError
        rec.fail = False
        le.opened("b")
        le.closed("b")
        assert le.wait_released("b", WAIT) and le.released == ["b"]
    finally:
        le.close()


def test_a_pending_release_does_not_keep_the_process_alive(rec):
    """The grace timer is a daemon thread: a device process that exits with a release pending exits at
    once instead of waiting out the grace period."""
    before = set(threading.enumerate())
    le = Leases(rec, grace_s=60.0)
    try:
        le.opened("a")
        le.closed("a")
        timers = [t for t in set(threading.enumerate()) - before if isinstance(t, threading.Timer)]
        assert len(timers) == 1 and timers[0].daemon is True
    finally:
        le.close()


def test_wait_count(leases):
    done = threading.Event()

    def later():
        leases.opened("a")
        leases.opened("a")
        done.set()
    t = threading.Thread(target=later)
    t.start()
    assert leases.wait_count("a", 2, WAIT)
    t.join(WAIT)
    assert done.is_set()
    assert not leases.wait_count("a", 3, NOTHING)
    leases.closed("a")
    leases.closed("a")
    assert leases.wait_count("a", 0, WAIT) and leases.count("a") == 0
    assert leases.count("nobody") == 0 and not leases.holds("nobody")
