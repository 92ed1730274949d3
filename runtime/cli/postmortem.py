"""``vnpu postmortem``: target vs actual (availability, p99, self-healing actions, manual interventions,
utilization) and the timeline of an incident (``--event ID``) or a window (``--since T``); see
:mod:`runtime.observe.postmortem`.

    vnpu postmortem --event 42
    vnpu postmortem --since 1h --json
"""
from __future__ import annotations

import json

from runtime.cli.reader import add_report_args, reading, report_kind, resolve_since, since
from runtime.cliargs import float_in, nonneg_int


def register(sub) -> None:
    p = sub.add_parser("postmortem", help="SLO target vs actual and the timeline of an incident",
                       example=("vnpu postmortem --event 42", "vnpu postmortem --since 1h --output pm.html"))
    g = p.add_mutually_exclusive_group()
    g.add_argument("--event", type=nonneg_int, default=None, help="the incident this event belongs to")
    g.add_argument("--since", type=since, default=None, help="a window up to now (1h, 30m, or a time; default 1h)")
    p.add_argument("--target-p99-ms", type=float_in(0.0, lo_open=True), default=None,
                   help="the p99 target (default: the server's slo.target_p99_ms)")
    p.add_argument("--availability", type=float_in(0.0, 1.0, lo_open=True), default=None,
                   help="the availability target as a fraction, e.g. 0.995 (default: the server's slo)")
    add_report_args(p, "also write the report (.html, .pdf or .md)")
    p.set_defaults(fn=_cmd)


def _cmd(a) -> int:
    from runtime.observe.postmortem import analyse, incident_window, summary_lines, targets_of
    from runtime.observe.report import postmortem_plots, write_report
    kind = report_kind(a, "vnpu postmortem")
    with reading(a, "vnpu postmortem") as src:
        if a.event is not None:
            lo, hi, _ = incident_window(src, a.event)
        else:
            hi = src.now()
            lo = resolve_since(a.since or ("ago", 3600.0), hi)
        tg = targets_of(src.events(until=hi), a.target_p99_ms, a.availability)
        pm = analyse(src, lo, hi, tg)
        plots = postmortem_plots(src, pm) if kind in ("html", "pdf") else []      # read while the source is open
    lines = summary_lines(pm)
    if kind:
        write_report(a.output, "vnpu postmortem", lines, plots)
    if a.json:
        print(json.dumps(pm, indent=1))
    else:
        print("\n".join(lines))
    return 0
