"""The test tiers' time budgets, and how a tier's time is counted.

A budget is seconds of wall-clock time on the 2-core CI box, set-up and teardown of the tier's fixtures
included (a module's cluster counts in its first test's set-up).  A tier's time is the wall-clock time during
which at least one of its tests was running: the union of its tests' set-up, call and teardown intervals.
Run one test at a time (``pytest -m serve``) that is the sum of their durations; run beside each other (the
full suite: two pytest-xdist workers plus a Ray tiers' session, ``scripts/test.sh``) it is the time the tier
held the run -- a sum of durations would count the seconds two workers spent side by side twice.  Every run
prints each tier's time against its budget; with ``VNPU_TIER_BUDGETS=enforce`` a tier over budget fails the
run.  Tests themselves never assert wall-clock times.

A test that carries two tier markers (tests/serve/test_serve_replicas.py: serve + multinode) counts in both
tiers -- a budget is what ``pytest -m TIER`` costs, and both selections run it -- so the budgets overlap and
their sum is not the suite's time.  multinode: ~45 s for its own modules plus ~35 s for the Serve replicas on
its cluster.

``scripts/test.sh`` runs the suite as pytest sessions, two at a time; each appends its tests' intervals to the
file named by ``VNPU_TIER_SPANS`` (one JSON line per test phase), and the run's verdict is the union over
every session, printed (and enforced) by ``python tests/tier_budgets.py FILE`` once all are done.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable

TIER_BUDGETS_S = {"multinode": 130.0, "serve": 240.0, "security": 60.0, "smoke": 180.0}

#: the environment variable that makes a run enforce the budgets, and its value
ENFORCE_ENV, ENFORCE = "VNPU_TIER_BUDGETS", "enforce"
#: the environment variable naming the file the sessions of one run append their tier intervals to
SPANS_ENV = "VNPU_TIER_SPANS"


def union_seconds(spans: Iterable[tuple[float, float]]) -> float:
    """The length of the union of the intervals ``spans`` (start, stop), in their unit."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def tier_seconds(spans: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """Each tier's time (:func:`union_seconds` of its intervals)."""
    return {tier: union_seconds(s) for tier, s in spans.items()}


def over_budget(seconds: dict[str, float]) -> list[str]:
    return sorted(t for t, s in seconds.items() if s > TIER_BUDGETS_S[t])


def enforced() -> bool:
    return os.environ.get(ENFORCE_ENV) == ENFORCE


def summary(seconds: dict[str, float], enforce: bool, label: str = "") -> list[str]:
    """One line per tier: its time against its budget and the verdict."""
    lines = []
    for tier, s in sorted(seconds.items()):
        over = s > TIER_BUDGETS_S[tier]
        verdict = ("OVER BUDGET" + (" (enforced: the run fails)" if enforce else "")) if over else "within budget"
        lines.append(f"tier {tier}{label}: {s:.1f} s of a {TIER_BUDGETS_S[tier]:.0f} s budget: {verdict}")
    return lines


def append_spans(path: str, tier_spans: dict[str, list[tuple[float, float]]]) -> None:
    """Append ``tier_spans`` to the run's span file (one JSON line per interval; one write per session)."""
    lines = "".join(json.dumps({"tier": t, "start": a, "stop": b}) + "\n"
                    for t, spans in tier_spans.items() for a, b in spans)
    if lines:
        with open(path, "a", encoding="utf-8") as f:
            f.write(lines)


def read_spans(path: str) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                out.setdefault(d["tier"], []).append((float(d["start"]), float(d["stop"])))
    return out


def main(argv: list[str]) -> int:
    """``python tests/tier_budgets.py FILE``: the run's tier times over every session that wrote ``FILE``;
    exit 1 when enforced and a tier is over its budget."""
    if len(argv) != 1:
        print("usage: python tests/tier_budgets.py SPANS_FILE", file=sys.stderr)
        return 2
    seconds = tier_seconds(read_spans(argv[0])) if os.path.exists(argv[0]) else {}
    enforce = enforced()
    for line in summary(seconds, enforce, label=" (the whole run)"):
        print(line)
    return 1 if enforce and over_budget(seconds) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
