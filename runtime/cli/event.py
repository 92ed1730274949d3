"""``vnpu event mark NAME``: record a named event in the server's history (or a history file) -- the start
(or, with ``--end``, the end) of something to look back on, e.g. a sale; ``vnpu postmortem --event NAME``
then reports on the window from its start to its end (a ``lifecycle`` event, ``detail: {event: NAME,
phase: start|end}``, as ``vnpu stress-test`` records its runs; not a manual intervention).

    vnpu event mark black_friday_2024
    vnpu event mark black_friday_2024 --end --note "doors closed"
"""
from __future__ import annotations

from runtime.cli.reader import add_source_args, reading


def register(sub) -> None:
    e = sub.add_parser("event", help="record named events in the server's history",
                       example=("vnpu event mark black_friday_2024",))
    ops = e.add_subparsers(dest="op", required=True, metavar="{mark}")
    m = ops.add_parser("mark", help="record the start (or --end) of a named event",
                       example=("vnpu event mark black_friday_2024",
                                "vnpu event mark black_friday_2024 --end --note 'doors closed'"))
    m.add_argument("name", type=_name, help="the event's name (letters, digits, _.-; not a number)")
    m.add_argument("--end", action="store_true", help="its end (default: its start)")
    m.add_argument("--note", default="", help="one line to keep with it")
    add_source_args(m)
    m.set_defaults(fn=_mark)


def _name(s: str) -> str:
    import argparse
    import re
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,63}", s):
        raise argparse.ArgumentTypeError(f"{s!r} is not an event name (a letter, then letters, digits, _.-)")
    return s


def _mark(a) -> int:
    phase = "end" if a.end else "start"
    with reading(a, "vnpu event mark") as src:
        eid = src.record_event("lifecycle", source="operator",
                               diagnosis=f"{a.name} {'ended' if a.end else 'started'}" + (f": {a.note}" if a.note else ""),
                               detail={"event": a.name, "phase": phase})
    print(f"vnpu event mark: {a.name} {phase} recorded (event {eid})")
    return 0
