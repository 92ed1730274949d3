"""``vnpu diagnose``: anomalies in a server's history lined up with its events, ranked root-cause
candidates with evidence and advice (:mod:`runtime.observe.diagnose`); ``--output`` writes an HTML report
with plots (inline SVG) or Markdown.

    vnpu diagnose --since 1h --focus latency --output report.html
"""
from __future__ import annotations

import json

from runtime.cli.reader import add_source_args, open_from_args, resolve_since, since
from runtime.cliargs import writable_file


def register(sub) -> None:
    from runtime.observe.diagnose import FOCUS
    d = sub.add_parser("diagnose", help="find anomalies in the server's history and rank their root causes")
    d.add_argument("--since", type=since, default=("ago", 3600.0), help="how far back (1h, 30m, or a time)")
    d.add_argument("--until", type=since, default=None, help="end of the window (default: now)")
    d.add_argument("--focus", choices=tuple(FOCUS), default=None)
    d.add_argument("--output", type=writable_file, default=None, help="report.html or report.md")
    d.add_argument("--json", action="store_true")
    add_source_args(d)
    d.set_defaults(fn=_cmd)


def _cmd(a) -> int:
    from runtime.cliargs import fail
    if a.output and not a.output.endswith((".html", ".htm", ".md")):
        fail(f"argument --output: {a.output} is neither .html nor .md", "vnpu diagnose")
    from runtime.observe.diagnose import Options, diagnose, summary_lines
    from runtime.observe.source import SourceError
    with open_from_args(a, "vnpu diagnose") as src:
        try:
            now = src.now()
            until = resolve_since(a.until, now) if a.until else now
            d = diagnose(src, Options(since=resolve_since(a.since, until), until=until, focus=a.focus))
        except SourceError as e:
            fail(str(e), "vnpu diagnose")
    if a.output:
        from runtime.observe import report
        text = report.diagnosis_html(d) if a.output.endswith((".html", ".htm")) else report.diagnosis_markdown(d)
        report.write(a.output, text)
    if a.json:
        print(json.dumps(d.to_dict(), indent=1))
    else:
        for ln in summary_lines(d):
            print(ln)
        if a.output:
            print(f"report: {a.output}")
    return 0
