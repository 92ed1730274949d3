"""The independent checker of a request history (a chaos report's, a stress test's): reads ONLY the JSON.

A history is a list of events, each a dict with ``op``, ``id`` (the request id) and ``t`` (seconds), in
the order they were recorded:

===================  ======================================================================================
``submit``           the client submitted request ``id`` (optional ``input``: the key of its input, whose
                     fault-free result digest is ``reference[input]``)
``attempt``          an execution of the request began (``attempt`` = its number, ``physical`` = where)
``attempt-failed``   that execution failed (``code``, ``error``): the request may be run again
``complete``         an execution finished with a result (``digest`` = sha256 of the result bytes); one
                     is recorded for EVERY execution that finished, before any de-duplication
``failed``           the runner gave up on the request (final error)
``ack``              the consumer received the result (``digest`` of what it received); one per delivery
===================  ======================================================================================

:func:`check` recomputes everything from the events and lists every violation of exactly-once:

- each submitted request completed exactly once (``lost``: never; ``duplicated``: more than once) -- a
  request that was given up (``failed``) is reported as such;
- executions are explained: every attempt ended in a completion or a failure, and the attempts beyond the
  one that completed are exactly the failed ones (an extra run nobody asked for is ``unexplained``);
- the consumer received each completed request exactly once (``unacknowledged`` / ``acked-twice``), never a
  result that was not completed (``ack-without-completion``) and never another result than the one
  completed (``ack-digest``);
- each result equals the fault-free one (``wrong-result``: its digest differs from ``reference[input]``);
- the events are well formed (known ops, integer ids, times that never go back, nothing about a request
  before its submission).

The counts it returns (submitted, completed, failed, lost, duplicated, executions, attempt failures,
acknowledged, wrong results) are the ones a report prints.  This module imports nothing from the runner
(nothing but the standard library), so a report can be checked anywhere: ``vnpu chaos check report.json``.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict

OPS = ("submit", "attempt", "attempt-failed", "complete", "failed", "ack")
#: violation kinds, in the order they are listed
KINDS = ("malformed", "out-of-order", "unknown-request", "submitted-twice", "lost", "failed", "duplicated",
         "unexplained", "unfinished-attempt", "unacknowledged", "acked-twice", "ack-without-completion",
         "ack-digest", "wrong-result")


def check(events: list, reference: dict | None = None, max_listed: int = 50) -> dict:
    """Check a history (see the module doc).  ``reference``: input key -> fault-free result digest (keys
    compared as strings, as JSON has them).  Returns ``{"ok", "counts", "violations", "by_kind"}``, the
    violations listed up to ``max_listed`` (``by_kind`` counts them all)."""
    ref = {str(k): v for k, v in (reference or {}).items()}
    found = _Violations(max_listed)
    seen = _read(events, found.add)
    if not isinstance(events, list):
        found.add("malformed", None, f"the history is a {type(events).__name__}, not a list of events")
    wrong = 0
    for rid in seen.submitted:
        _check_completion(seen, rid, found.add)
        _check_delivery(seen, rid, found.add)
        wrong += _check_results(seen, rid, ref, found.add)
    return {"ok": not found.by_kind, "counts": _counts(seen, ref, wrong), "violations": found.ordered(),
            "by_kind": dict(found.by_kind)}


class _Violations:
    """The violations found, counted by kind, the first ``max_listed`` of them kept."""

    def __init__(self, max_listed: int):
        self.max_listed = max_listed
        self.listed: list[dict] = []
        self.by_kind: Counter = Counter()

    def add(self, kind: str, rid, detail: str) -> None:
        self.by_kind[kind] += 1
        if len(self.listed) < self.max_listed:
            self.listed.append({"kind": kind, "id": rid, "detail": detail})

    def ordered(self) -> list[dict]:
        """The listed violations in :data:`KINDS` order (in the order found within a kind)."""
        return sorted(self.listed, key=lambda v: KINDS.index(v["kind"]))


class _Seen:
    """What the events say, per request id."""

    def __init__(self):
        self.submitted: dict = {}                      # id -> time of its submission
        self.inputs: dict = {}                         # id -> input key
        self.attempts: Counter = Counter()
        self.failures: Counter = Counter()
        self.completes: dict = defaultdict(list)        # id -> [digest, ...]
        self.gave_up: set = set()
        self.acks: dict = defaultdict(list)             # id -> [digest, ...]


def _read(events, bad) -> _Seen:
    """One pass over the events: well-formedness, order, requests known, acks after a completion."""
    seen = _Seen()
    last_t = float("-inf")
    for i, ev in enumerate(events if isinstance(events, list) else []):
        if not isinstance(ev, dict) or ev.get("op") not in OPS or not _is_int(ev.get("id")) \
                or not _is_num(ev.get("t")):
            bad("malformed", ev.get("id") if isinstance(ev, dict) else None, f"event {i}: {str(ev)[:120]}")
            continue
        op, rid, t = ev["op"], ev["id"], float(ev["t"])
        if t < last_t:
            bad("out-of-order", rid, f"event {i} ({op}) at t={t:.6f} after an event at t={last_t:.6f}")
        last_t = max(last_t, t)
        if op == "submit":
            if rid in seen.submitted:
                bad("submitted-twice", rid, f"request {rid} submitted again at event {i}")
            seen.submitted.setdefault(rid, t)
            if "input" in ev:
                seen.inputs[rid] = str(ev["input"])
            continue
        if rid not in seen.submitted:
            bad("unknown-request", rid, f"event {i} ({op}) for request {rid}, which was never submitted (before)")
            continue
        if op == "attempt":
            seen.attempts[rid] += 1
        elif op == "attempt-failed":
            seen.failures[rid] += 1
        elif op == "complete":
            seen.completes[rid].append(ev.get("digest"))
        elif op == "failed":
            seen.gave_up.add(rid)
        elif op == "ack":
            if not seen.completes[rid]:
                bad("ack-without-completion", rid, f"request {rid} acknowledged at event {i} before any completion")
            seen.acks[rid].append(ev.get("digest"))
    return seen


def _check_completion(seen: _Seen, rid, bad) -> None:
    """Request ``rid`` completed exactly once (or was given up), and its executions are explained."""
    c = seen.completes.get(rid, [])
    n_att, n_fail = seen.attempts[rid], seen.failures[rid]
    if not c:
        if rid in seen.gave_up:
            bad("failed", rid, f"request {rid} was given up after {n_att} attempt(s)")
        else:
            bad("lost", rid, f"request {rid} never completed ({n_att} attempt(s), {n_fail} failed)")
    elif len(c) > 1:
        bad("duplicated", rid, f"request {rid} completed {len(c)} times")
    if n_att < n_fail + len(c):
        bad("unexplained", rid, f"request {rid}: {n_fail} failure(s) and {len(c)} completion(s) but only {n_att} "
                                f"execution(s) began")
    elif n_att > n_fail + len(c):
        bad("unfinished-attempt", rid, f"request {rid}: {n_att - n_fail - len(c)} execution(s) neither completed "
                                       f"nor failed")
    if len(c) > 1:
        bad("unexplained", rid, f"request {rid}: {len(c) - 1} execution(s) beyond the one that completed were "
                                f"not caused by a failed attempt")


def _check_delivery(seen: _Seen, rid, bad) -> None:
    """A completed request ``rid`` reached the consumer exactly once, with the completed result."""
    c = seen.completes.get(rid, [])
    a = seen.acks.get(rid, [])
    if not c:
        return
    if not a:
        bad("unacknowledged", rid, f"request {rid} completed but its result never reached the consumer")
    elif len(a) > 1:
        bad("acked-twice", rid, f"the consumer received request {rid}'s result {len(a)} times")
    for d in a:
        if d not in c:
            bad("ack-digest", rid, f"request {rid}: the consumer received {str(d)[:16]}..., the completion "
                                   f"was {str(c[0])[:16]}...")


def _check_results(seen: _Seen, rid, ref: dict, bad) -> int:
    """How many of request ``rid``'s distinct results differ from its input's fault-free one."""
    key = seen.inputs.get(rid)
    if key is None or key not in ref:
        return 0
    wrong = 0
    for d in set(seen.completes.get(rid, [])):
        if d != ref[key]:
            wrong += 1
            bad("wrong-result", rid, f"request {rid} (input {key}): result {str(d)[:16]}... differs from "
                                     f"the fault-free {str(ref[key])[:16]}...")
    return wrong


def _counts(seen: _Seen, ref: dict, wrong: int) -> dict:
    """The figures a report prints (see the module doc)."""
    submitted, completes, acks = seen.submitted, seen.completes, seen.acks
    completed = sum(1 for rid in submitted if completes.get(rid))
    failed = sum(1 for rid in submitted if not completes.get(rid) and rid in seen.gave_up)
    return {
        "submitted": len(submitted),
        "completed": completed,
        "failed": failed,
        "lost": len(submitted) - completed - failed,
        "duplicated": sum(len(c) - 1 for rid, c in completes.items() if rid in submitted and len(c) > 1),
        "executions": sum(seen.attempts[rid] for rid in submitted),
        "attempt_failures": sum(seen.failures[rid] for rid in submitted),
        "acknowledged": sum(1 for rid in submitted if acks.get(rid)),
        "deliveries": sum(len(acks.get(rid, [])) for rid in submitted),
        "checked_against_reference": sum(1 for rid in submitted if seen.inputs.get(rid) in ref and completes.get(rid)),
        "wrong_results": wrong,
    }


def check_report(report: dict, max_listed: int = 50) -> dict:
    """:func:`check` of a chaos report's ``history`` against its ``reference`` digests."""
    return check(report.get("history", []), report.get("reference"), max_listed)


def check_file(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return check_report(json.load(f))


def verdict_lines(res: dict) -> list[str]:
    c = res["counts"]
    lines = [f"history: {c['submitted']} submitted, {c['completed']} completed, {c['failed']} failed, {c['lost']} lost, "
             f"{c['duplicated']} duplicated; {c['executions']} executions ({c['attempt_failures']} failed attempts); "
             f"{c['deliveries']} deliveries to the consumer; {c['checked_against_reference']} results checked "
             f"against the fault-free run, {c['wrong_results']} wrong"]
    if res["ok"]:
        lines.append("check: OK (every request completed exactly once, delivered once, with the fault-free result)")
    else:
        lines.append("check: FAILED " + ", ".join(f"{k} {n}" for k, n in sorted(res["by_kind"].items(),
                                                                            key=lambda kv: KINDS.index(kv[0]))))
        lines += [f"  {v['kind']}: {v['detail']}" for v in res["violations"][:20]]
    return lines


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


__all__ = ["OPS", "KINDS", "check", "check_report", "check_file", "verdict_lines"]
