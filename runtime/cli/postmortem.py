"""``vnpu postmortem``: target vs actual (availability, p99, self-healing actions, manual interventions,
utilization) and the timeline of an incident (``--event ID``) or a window (``--since T``); see
:mod:`runtime.observe.postmortem`.

    vnpu postmortem --event 42
    vnpu postmortem --since 1h --json
    vnpu postmortem --event black_friday_2024 --metrics all --output pm.pdf   (a named event: the article's)
"""
from __future__ import annotations

import json

from runtime.cli.reader import add_report_args, reading, report_kind, resolve_since, since
from runtime.cliargs import float_in, nonneg_int


def register(sub) -> None:
    p = sub.add_parser("postmortem", help="SLO target vs actual and the timeline of an incident",
                       example=("vnpu postmortem --event 42", "vnpu postmortem --since 1h --output pm.html"))
    g = p.add_mutually_exclusive_group()
    g.add_argument("--event", type=_event, default=None,
                   help="the incident this event id belongs to, or a named event (a stress-test --profile run, "
                        "a vnpu event mark NAME)")
    g.add_argument("--since", type=since, default=None, help="a window up to now (1h, 30m, or a time; default 1h)")
    p.add_argument("--target-p99-ms", type=float_in(0.0, lo_open=True), default=None,
                   help="the p99 target (default: the server's slo.target_p99_ms)")
    p.add_argument("--availability", type=float_in(0.0, 1.0, lo_open=True), default=None,
                   help="the availability target as a fraction, e.g. 0.995 (default: the server's slo)")
    p.add_argument("--metrics", type=_metrics, default=None,
                   help="also summarise these metrics over the window (comma-separated names or monitor's "
                        "aliases, or all)")
    add_report_args(p, "also write the report (.html, .pdf or .md)")
    p.set_defaults(fn=_cmd)


def _event(s: str) -> int | str:
    """An event id (a number) or an event name (letters, digits, ``_.-``)."""
    import argparse
    import re
    if s.strip().isdigit():
        return nonneg_int(s)
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,63}", s):
        raise argparse.ArgumentTypeError(f"{s!r} is neither an event id nor an event name (letters, digits, _.-)")
    return s


def _metrics(s: str) -> tuple[str, ...]:
    import argparse
    from runtime.observe.dashboard import metric_name
    from runtime.observe.metrics_store import METRICS
    if s.strip().lower() == "all":
        return tuple(METRICS)
    try:
        out = tuple(dict.fromkeys(metric_name(x) for x in s.split(",") if x.strip()))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not out:
        raise argparse.ArgumentTypeError("name at least one metric, or all")
    return out


def _cmd(a) -> int:
    from runtime.cliargs import fail
    from runtime.observe.postmortem import (analyse, incident_window, metric_lines, metric_summary, named_window,
                                            summary_lines)
    from runtime.observe.report import postmortem_plots, write_report
    kind = report_kind(a, "vnpu postmortem")
    with reading(a, "vnpu postmortem") as src:
        if isinstance(a.event, str):
            try:
                lo, hi, _ = named_window(src, a.event)
            except KeyError as e:
                fail(f"argument --event: {e.args[0]} in {src.where}", "vnpu postmortem")
        elif a.event is not None:
            lo, hi, _ = incident_window(src, a.event)
        else:
            hi = src.now()
            lo = resolve_since(a.since or ("ago", 3600.0), hi)
        pm = analyse(src, lo, hi, p99_ms=a.target_p99_ms, availability=a.availability)
        if a.metrics:
            pm["metrics"] = metric_summary(src, a.metrics, lo, hi)
        plots = postmortem_plots(src, pm) if kind in ("html", "pdf") else []      # read while the source is open
    lines = summary_lines(pm) + (metric_lines(pm["metrics"]) if a.metrics else [])
    if kind:
        write_report(a.output, "vnpu postmortem", lines, plots)
    if a.json:
        print(json.dumps(pm, indent=1))
    else:
        print("\n".join(lines))
    return 0
