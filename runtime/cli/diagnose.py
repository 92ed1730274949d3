"""``vnpu diagnose``: anomalies in a server's history lined up with its events, ranked root-cause
candidates with evidence, confidence and advice (:mod:`runtime.observe.diagnose`) -- a finding crosses a
limit from the chip's specs or the SLO (``--target-p99-ms`` / ``--availability`` override the server's) in
enough samples, else the verdict is "no significant anomaly"; ``--output`` writes an HTML report with plots
(inline SVG), a PDF (a page of text, then the plots) or Markdown, by its suffix.

    vnpu diagnose --since 1h --focus latency --output report.html
    vnpu diagnose --time-range last_1h --focus latency_spike --output runtime_health.pdf   (the article's)
"""
from __future__ import annotations

import json

from runtime.cli.reader import add_report_args, reading, report_kind, resolve_since, since
from runtime.cliargs import float_in


def register(sub) -> None:
    from runtime.observe.diagnose import FOCUS
    d = sub.add_parser("diagnose", help="find anomalies in the server's history and rank their root causes",
                       example=("vnpu diagnose --since 1h --focus latency --output report.html",
                                "vnpu diagnose --history history.sqlite --since 2026-12-01T03:00:00 --json"))
    d.add_argument("--since", "--time-range", dest="since", type=since, default=("ago", 3600.0),
                   help="how far back (1h, 30m, last_1h, last_24h, or a time)")
    d.add_argument("--until", type=since, default=None, help="end of the window (default: now)")
    d.add_argument("--focus", type=_focus, default=None,
                   help=f"rank only the causes of this symptom: {', '.join(FOCUS)} (or an article name: "
                        f"latency_spike, memory_leak, error_spike, overheat, ...)")
    d.add_argument("--target-p99-ms", type=float_in(0.0, lo_open=True), default=None,
                   help="the p99 target a latency finding must cross (default: the server's slo.target_p99_ms)")
    d.add_argument("--availability", type=float_in(0.0, 1.0, lo_open=True), default=None,
                   help="the availability target whose error budget an error finding must cross, e.g. 0.995 "
                        "(default: the server's slo)")
    add_report_args(d, "report.html, report.pdf or report.md")
    d.set_defaults(fn=_cmd)


def _focus(s: str) -> str:
    import argparse
    from runtime.observe.diagnose import focus_name
    try:
        return focus_name(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _cmd(a) -> int:
    kind = report_kind(a, "vnpu diagnose")
    from runtime.observe.diagnose import Options, diagnose, summary_lines
    from runtime.observe.postmortem import targets_of
    with reading(a, "vnpu diagnose") as src:
        now = src.now()
        until = resolve_since(a.until, now) if a.until else now
        tg = targets_of(src.events(until=until), a.target_p99_ms, a.availability)
        d = diagnose(src, Options(since=resolve_since(a.since, until), until=until, focus=a.focus, targets=tg))
    if kind:
        from runtime.observe import report
        report.write_diagnosis(a.output, d)
    if a.json:
        print(json.dumps(d.to_dict(), indent=1))
    else:
        for ln in summary_lines(d):
            print(ln)
        if a.output:
            print(f"report: {a.output}")
    return 0
