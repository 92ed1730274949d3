"""`vnpu postmortem` across a reconfiguration that changed the SLO (issue 28): each part of the window is
judged against the SLO in effect then -- the start-time SLO (`vnpu serve`'s lifecycle event) before the
change, the `config` event's SLO after it -- never one SLO for the whole window.  (That `reconfigure` records
the SLO it leaves in effect: tests/serve/test_serve_heal.py::test_admin_state_has_the_running_slo.)"""
from __future__ import annotations

import json

import pytest

from cli_checks import cli
from runtime.observe.metrics_store import History
from runtime.observe.postmortem import analyse, slo_segments
from runtime.observe.source import FileSource

T0 = 1_700_000_000.0
CHANGE = 300                                       # +300 s: reconfigure sets p99 500 ms, availability 99.9 %


def history(path, p99_after: float):
    """10 minutes at 20 req/s and 0.5 % errors; p99 600 ms before the change, ``p99_after`` after it.  The
    server started with p99 700 ms / 99 %."""
    h = History(path)
    for i in range(600):
        h.record_samples(T0 + i, {"qps": 20.0, "error_rate": 0.005,
                                  "p99_latency_ms": 600.0 if i < CHANGE else p99_after})
    h.record_event("lifecycle", ts=T0 - 5, source="serve", diagnosis="server started",
                   detail={"slo": {"target_p99_ms": 700.0, "availability": 0.99}})
    eid = h.record_event("config", ts=T0 + CHANGE, source="operator", manual=True, result="ok",
                         diagnosis="reconfigure: slo", detail={"slo": {"target_p99_ms": 500.0, "availability": 0.999}})
    h.close()
    return str(path), eid


@pytest.fixture(scope="module")
def hist(tmp_path_factory):
    path, eid = history(tmp_path_factory.mktemp("pmslo") / "h.sqlite", p99_after=450.0)
    with FileSource(path) as h:
        yield h, path, eid


def test_each_part_is_judged_against_the_slo_of_its_time(hist):
    h, _, _ = hist
    pm = analyse(h, T0, T0 + 599)
    a, b = pm["segments"]
    assert (a["since"], a["until"], b["since"], b["until"]) == (T0, T0 + CHANGE, T0 + CHANGE, T0 + 599)
    assert (a["target"]["p99_ms"], a["target"]["availability"]) == (700.0, 0.99)
    assert (b["target"]["p99_ms"], b["target"]["availability"]) == (500.0, 0.999)
    assert (a["samples"]["p99_latency_ms"], b["samples"]["p99_latency_ms"]) == (CHANGE, 600 - CHANGE)
    # 600 ms under the 700 ms of its time; judged against the 500 ms set later, every one of them would miss
    assert a["p99_met"] is True and b["p99_met"] is True and pm["actual"]["p99_met"] is True
    assert pm["actual"]["p99_share_above_target"] == 0.0 and pm["samples"]["p99_above_target"] == 0
    # 99.5 % meets 99 % before the change and misses 99.9 % after it
    assert a["availability"] == pytest.approx(0.995) and a["availability_met"] is True
    assert b["availability_met"] is False and pm["actual"]["availability_met"] is False
    assert pm["target"]["p99_ms"] == 500.0                   # the SLO at the end of the window


def test_a_window_inside_one_part_has_one_slo(hist):
    h, _, _ = hist
    pm = analyse(h, T0, T0 + CHANGE - 1)
    (only,) = pm["segments"]
    assert only["target"]["p99_ms"] == 700.0 and pm["actual"]["p99_met"] is True
    pm = analyse(h, T0 + CHANGE + 10, T0 + 599)
    assert [s["target"]["p99_ms"] for s in pm["segments"]] == [500.0]


def test_explicit_targets_override_their_field_in_every_part(hist):
    h, _, _ = hist
    segs = slo_segments(h, T0, T0 + 599, p99_ms=550.0)
    assert [(t.p99_ms, t.availability) for _, _, t in segs] == [(550.0, 0.99), (550.0, 0.999)]
    pm = analyse(h, T0, T0 + 599, p99_ms=550.0)
    assert [s["p99_met"] for s in pm["segments"]] == [False, True]
    assert len(slo_segments(h, T0, T0 + 599, p99_ms=550.0, availability=0.9)) == 1


def test_the_cli_judges_the_reconfiguration_incident_part_by_part(tmp_path, capsys):
    path, eid = history(tmp_path / "h.sqlite", p99_after=520.0)      # after the change: over its 500 ms
    rc, out, err = cli(["postmortem", "--history", path, "--event", str(eid), "--json"], capsys)
    assert rc == 0, err
    pm = json.loads(out)
    assert [(s["target"]["p99_ms"], s["p99_met"]) for s in pm["segments"]] == [(700.0, True), (500.0, False)]
    assert pm["actual"]["p99_met"] is False
    assert pm["samples"]["p99_above_target"] == 61                    # the seconds after the change, not before
    rc, out, err = cli(["postmortem", "--history", path, "--event", str(eid)], capsys)
    assert rc == 0 and "the SLO changed 1 time(s) in the window" in out, err
    assert "target p99 700 ms" in out and "target p99 500 ms" in out
