"""The metrics history store: samples and events round-trip, scopes, windows, retention, restart, bad input."""
from __future__ import annotations

import math
import sqlite3
import threading

import pytest

from runtime.observe.metrics_store import (METRICS, History, HistoryError, UnknownMetric, default_path,
                                     device_scope)


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def test_samples_round_trip_by_metric_scope_and_window(tmp_path):
    h = History(tmp_path / "h.sqlite")
    for i in range(10):
        h.record_samples(100.0 + i, {"qps": i, "p99_latency_ms": 10.0 * i})
        h.record_samples(100.0 + i, {"device_temperature_c": 50 + i}, scope=device_scope(3))
    assert h.samples("qps") == [(100.0 + i, float(i)) for i in range(10)]
    assert h.samples("qps", since=103, until=105) == [(103.0, 3.0), (104.0, 4.0), (105.0, 5.0)]
    assert h.samples("device_temperature_c") == []                     # not server-wide
    assert h.samples("device_temperature_c", scope="npu:3")[-1] == (109.0, 59.0)
    assert h.scopes("device_temperature_c") == ["npu:3"]
    assert h.latest() == {"qps": (109.0, 9.0), "p99_latency_ms": (109.0, 90.0)}
    assert h.span() == (100.0, 109.0)


class Waiter(threading.Thread):
    """``History.wait_newer`` on a thread of its own; ``result`` once it returned."""

    def __init__(self, h, after, scope=""):
        super().__init__(daemon=True)
        self.h, self.after, self.scope, self.result = h, after, scope, None

    def run(self):
        self.result = self.h.wait_newer(self.after, 30.0, self.scope)

    def started_waiting(self) -> "Waiter":
        """Start, and return once the thread waits in ``wait_newer`` (``History.waiters``): what is recorded
        from then on reaches it only through the store's wake-up."""
        self.start()
        assert self.h.wait_waiters(1, 30.0) and self.is_alive(), "the waiter never waited"
        return self


def test_wait_newer_returns_on_a_newer_sample_its_deadline_or_close():
    """A long poll's wait: True at once when the scope already has a newer sample, True when another thread
    records one, False when the deadline passes without one, False when the store is closed (never the
    full 30 s: the joins' deadlines are far below it).  Each record happens once the waiter waits
    (``History.waiters``), so only the store's wake-up can end the wait within the join's deadline.  Other
    scopes and older samples do not count."""
    h = History(":memory:")
    assert h.wait_newer(None, 0.01) is False                           # nothing recorded yet
    h.record_samples(10.0, {"qps": 1.0})
    assert h.wait_newer(None, 30.0) is True and h.wait_newer(9.0, 30.0) is True
    assert h.wait_newer(10.0, 0.01) is False                           # not newer
    w = Waiter(h, 10.0)
    w.started_waiting()
    h.record_samples(11.0, {"qps": 1.0}, scope=device_scope(0))         # another scope: still waiting
    h.record_samples(10.5, {"qps": 1.0}, scope="npu:9")
    h.record_samples(12.0, {"qps": 2.0})
    w.join(10.0)
    assert not w.is_alive() and w.result is True
    w = Waiter(h, 12.0, scope=device_scope(0))
    w.started_waiting()
    h.record_samples(12.5, {"device_temperature_c": 40.0}, scope=device_scope(0))
    w.join(10.0)
    assert not w.is_alive() and w.result is True
    w = Waiter(h, 12.5, scope=device_scope(0))
    w.started_waiting()
    h.record_tick(13.0, {"": {"qps": 3.0}, device_scope(0): {"device_temperature_c": 41.0}})   # one transaction
    w.join(10.0)
    assert not w.is_alive() and w.result is True
    assert h.latest()["qps"] == (13.0, 3.0) and h.latest(device_scope(0))["device_temperature_c"] == (13.0, 41.0)
    w = Waiter(h, 100.0)
    w.started_waiting()
    h.close()
    w.join(10.0)
    assert not w.is_alive() and w.result is False
    assert h.waiters() == 0


def test_subscribers_are_woken_by_each_tick_and_by_close_and_count_as_waiters():
    """``History.subscribe``: what an event loop waits with instead of a thread -- called after every
    recorded tick and on close, never after it unsubscribed; a failing subscriber does not fail the writer."""
    h = History(":memory:")
    calls: list[str] = []
    stop_a = h.subscribe(lambda: calls.append("a"))
    h.subscribe(lambda: 1 / 0)                                          # a broken subscriber
    assert h.waiters() == 2 and not h.newer_than(None)
    h.record_samples(1.0, {"qps": 1.0})
    assert calls == ["a"] and h.newer_than(None) and h.newer_than(0.5) and not h.newer_than(1.0)
    assert not h.newer_than(0.5, scope=device_scope(0))                 # per scope
    stop_a()
    h.record_samples(2.0, {"qps": 1.0})
    assert calls == ["a"] and h.waiters() == 1
    stop_b = h.subscribe(lambda: calls.append("b"))
    assert not h.closed
    h.close()
    assert calls == ["a", "b"] and not h.newer_than(None) and h.closed  # closed: nothing is newer
    stop_b()


def test_non_finite_samples_are_skipped_and_unknown_names_refused(tmp_path):
    h = History(":memory:")
    h.record_samples(1.0, {"p99_latency_ms": math.nan, "qps": 2.0})
    assert h.samples("p99_latency_ms") == [] and h.samples("qps") == [(1.0, 2.0)]
    with pytest.raises(UnknownMetric):
        h.record_samples(2.0, {"qpz": 1.0})
    with pytest.raises(UnknownMetric):
        h.samples("nope")
    assert h.samples("qps") == [(1.0, 2.0)]                            # the refused batch wrote nothing


def test_events_record_update_filter_and_limit():
    clk = Clock(50.0)
    h = History(":memory:", clock=clk)
    a = h.record_event("fault", source="npu:1", diagnosis="device 1 lost", detail={"kind": "kill"})
    clk.t = 55.0
    b = h.record_event("action", trigger="dead", value=4.0, source="policy")
    c = h.record_event("manual", ts=60.0, manual=True, diagnosis="reconfigure max_num_seqs=8")
    h.update_event(b, result="ok", duration_s=3.5, detail={"device": 1})
    ev = h.event(b)
    assert (ev.ts, ev.kind, ev.trigger, ev.value, ev.result, ev.duration_s, ev.detail) == \
        (55.0, "action", "dead", 4.0, "ok", 3.5, {"device": 1})
    assert [e.id for e in h.events()] == [a, b, c]
    assert [e.id for e in h.events(since=54)] == [b, c]
    assert [e.id for e in h.events(kinds=["manual", "fault"])] == [a, c]
    assert [e.id for e in h.events(limit=2)] == [b, c]
    assert h.events(kinds=["manual"])[0].manual is True and h.event(a).manual is False
    with pytest.raises(KeyError):
        h.update_event(999, result="ok")
    with pytest.raises(ValueError):
        h.record_event("")


def test_retention_prunes_old_samples_not_events(tmp_path):
    h = History(tmp_path / "h.sqlite", retention_s=100.0)
    h.record_event("config", ts=0.0)
    h.record_samples(0.0, {"qps": 1.0})
    h.record_samples(50.0, {"qps": 2.0})
    h.record_samples(160.0, {"qps": 3.0})                              # prunes ts < 60
    assert h.samples("qps") == [(160.0, 3.0)]
    assert len(h.events()) == 1
    with pytest.raises(ValueError):
        History(":memory:", retention_s=0)


def test_history_survives_reopen_and_is_private(tmp_path):
    p = default_path(tmp_path)
    with History(p) as h:
        h.record_samples(1.0, {"error_rate": 0.25})
        eid = h.record_event("trigger", ts=1.0, trigger="errors", value=0.25)
    assert p == tmp_path / "serve" / "history.sqlite"
    assert (p.stat().st_mode & 0o077) == 0
    with History(p) as h2:
        assert h2.samples("error_rate") == [(1.0, 0.25)]
        assert h2.event(eid).trigger == "errors"
    h2.close()
    with pytest.raises(HistoryError):
        h2.samples("qps")


def test_not_a_history_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(HistoryError, match="not a vnpu history"):
        History(bad)
    other = tmp_path / "other.sqlite"
    db = sqlite3.connect(other)
    db.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT); INSERT INTO meta VALUES ('schema','9');")
    db.commit()
    db.close()
    with pytest.raises(HistoryError, match="schema 9"):
        History(other)


def test_every_metric_has_a_unit_and_help():
    assert all(unit and help_ for unit, help_ in METRICS.values())
