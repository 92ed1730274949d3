"""The tier budgets' accounting (tests/tier_budgets.py): a tier's time is the union of its tests' intervals,
over every session of a run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tier_budgets import TIER_BUDGETS_S, append_spans, over_budget, read_spans, tier_seconds, union_seconds

SCRIPT = Path(__file__).resolve().parents[1] / "tier_budgets.py"


def brute_union(spans, step=0.5):
    """The union's length counted on a grid of ``step`` (every interval's ends are multiples of it)."""
    cells = set()
    for a, b in spans:
        cells.update(range(round(a / step), round(b / step)))
    return len(cells) * step


@pytest.mark.parametrize("spans", [
    [],
    [(0.0, 3.0)],
    [(0.0, 3.0), (5.0, 6.5)],                       # one test after another: the sum
    [(0.0, 4.0), (1.0, 2.0)],                       # nested: the outer one
    [(0.0, 4.0), (3.0, 7.0), (6.5, 8.0)],           # a chain of overlaps
    [(2.0, 3.0), (0.0, 1.0), (0.5, 2.5), (10.0, 10.0)],   # unsorted, touching, empty
])
def test_union_is_the_wall_time_covered(spans):
    assert union_seconds(spans) == pytest.approx(brute_union(spans))


def test_serial_tests_count_their_sum_and_side_by_side_tests_count_once():
    serial = [(float(i), i + 0.75) for i in range(10)]
    assert union_seconds(serial) == pytest.approx(sum(b - a for a, b in serial))
    two_workers = serial + [(a + 0.1, b + 0.1) for a, b in serial]     # a second worker at the same time
    assert union_seconds(two_workers) == pytest.approx(10 * 0.85)      # not the 15 s a sum would give


def test_the_run_verdict_covers_every_session_and_fails_only_when_enforced(tmp_path):
    f = tmp_path / "spans.jsonl"
    budget = TIER_BUDGETS_S["security"]
    append_spans(str(f), {"security": [(0.0, budget * 0.6)]})               # one session
    append_spans(str(f), {"security": [(budget * 0.5, budget * 1.1)], "smoke": [(0.0, 1.0)]})   # the other
    seconds = tier_seconds(read_spans(str(f)))
    assert seconds == pytest.approx({"security": budget * 1.1, "smoke": 1.0})
    assert over_budget(seconds) == ["security"]
    lines = [json.loads(x) for x in f.read_text().splitlines()]
    assert len(lines) == 3 and {x["tier"] for x in lines} == {"security", "smoke"}

    def run(env_value):
        env = {"PATH": "/usr/bin:/bin"} | ({"VNPU_TIER_BUDGETS": env_value} if env_value else {})
        return subprocess.run([sys.executable, str(SCRIPT), str(f)], capture_output=True, text=True, env=env)
    shown = run(None)
    assert shown.returncode == 0 and "tier security (the whole run)" in shown.stdout and "OVER BUDGET" in shown.stdout
    assert "tier smoke (the whole run): 1.0 s" in shown.stdout and "within budget" in shown.stdout
    enforced = run("enforce")
    assert enforced.returncode == 1 and "enforced: the run fails" in enforced.stdout
    within = tmp_path / "within.jsonl"
    append_spans(str(within), {"security": [(0.0, budget * 0.9)]})
    assert subprocess.run([sys.executable, str(SCRIPT), str(within)], env={"VNPU_TIER_BUDGETS": "enforce"},
                          capture_output=True).returncode == 0
