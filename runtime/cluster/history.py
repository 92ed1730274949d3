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
    viol: list[dict] = []
    by_kind: Counter = Counter()

    def bad(kind: str, rid, detail: str) -> None:
        by_kind[kind] += 1
        if len(viol) < max_listed:
            viol.append({"kind": kind, "id": rid, "detail": detail})

    submitted: dict = {}
    inputs: dict = {}
    attempts: Counter = Counter()
    failures: Counter = Counter()
    completes: dict = defaultdict(list)        # id -> [digest, ...]
    gave_up: set = set()
    acks: dict = defaultdict(list)             # id -> [digest, ...]
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
            if rid in submitted:
                bad("submitted-twice", rid, f"request {rid} submitted again at event {i}")
            submitted.setdefault(rid, t)
            if "input" in ev:
                inputs[rid] = str(ev["input"])
            continue
        if rid not in submitted:
            bad("unknown-request", rid, f"event {i} ({op}) for request {rid}, which was never submitted (before)")
            continue
        if op == "attempt":
            attempts[rid] += 1
        elif op == "attempt-failed":
            failures[rid] += 1
        elif op == "complete":
            completes[rid].append(ev.get("digest"))
        elif op == "failed":
            gave_up.add(rid)
        elif op == "ack":
            if not completes[rid]:
                bad("ack-without-completion", rid, f"request {rid} acknowledged at event {i} before any completion")
            acks[rid].append(ev.get("digest"))
    if not isinstance(events, list):
        bad("malformed", None, f"the history is a {type(events).__name__}, not a list of events")

    wrong = 0
    for rid in submitted:
        c = completes.get(rid, [])
        if not c:
            if rid in gave_up:
                bad("failed", rid, f"request {rid} was given up after {attempts[rid]} attempt(s)")
            else:
                bad("lost", rid, f"request {rid} never completed ({attempts[rid]} attempt(s), "
                                 f"{failures[rid]} failed)")
        elif len(c) > 1:
            bad("duplicated", rid, f"request {rid} completed {len(c)} times")
        n_att, n_fail = attempts[rid], failures[rid]
        if n_att < n_fail + len(c):
            bad("unexplained", rid, f"request {rid}: {n_fail} failure(s) and {len(c)} completion(s) but only {n_att} "
                                    f"execution(s) began")
        elif n_att > n_fail + len(c):
            bad("unfinished-attempt", rid, f"request {rid}: {n_att - n_fail - len(c)} execution(s) neither completed "
                                           f"nor failed")
        if len(c) > 1:
            bad("unexplained", rid, f"request {rid}: {len(c) - 1} execution(s) beyond the one that completed were "
                                    f"not caused by a failed attempt")
        a = acks.get(rid, [])
        if c:
            if not a:
                bad("unacknowledged", rid, f"request {rid} completed but its result never reached the consumer")
            elif len(a) > 1:
                bad("acked-twice", rid, f"the consumer received request {rid}'s result {len(a)} times")
            for d in a:
                if d not in c:
                    bad("ack-digest", rid, f"request {rid}: the consumer received {str(d)[:16]}..., the completion "
                                           f"was {str(c[0])[:16]}...")
        key = inputs.get(rid)
        if key is not None and key in ref:
            for d in set(c):
                if d != ref[key]:
                    wrong += 1
                    bad("wrong-result", rid, f"request {rid} (input {key}): result {str(d)[:16]}... differs from "
                                             f"the fault-free {str(ref[key])[:16]}...")
    completed = sum(1 for rid in submitted if completes.get(rid))
    failed = sum(1 for rid in submitted if not completes.get(rid) and rid in gave_up)
    counts = {
        "submitted": len(submitted),
        "completed": completed,
        "failed": failed,
        "lost": len(submitted) - completed - failed,
        "duplicated": sum(len(c) - 1 for rid, c in completes.items() if rid in submitted and len(c) > 1),
        "executions": sum(attempts[rid] for rid in submitted),
        "attempt_failures": sum(failures[rid] for rid in submitted),
        "acknowledged": sum(1 for rid in submitted if acks.get(rid)),
        "deliveries": sum(len(acks.get(rid, [])) for rid in submitted),
        "checked_against_reference": sum(1 for rid in submitted if inputs.get(rid) in ref and completes.get(rid)),
        "wrong_results": wrong,
    }
    ordered = sorted(viol, key=lambda v: KINDS.index(v["kind"]))
    return {"ok": not by_kind, "counts": counts, "violations": ordered, "by_kind": dict(by_kind)}


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
