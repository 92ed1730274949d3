"""How an operator command (``monitor``, ``diagnose``, ``postmortem``, ``stress-test``) finds the history
it reads: ``--history FILE`` | ``--url U`` (+ ``--api-key`` / ``$VNPU_API_KEY``) | the running server's
file in the state directory (see :func:`runtime.observe.source.open_source`); the time arguments
(``--since 1h``, an ISO time, or epoch seconds); and what a reporting command (``diagnose``,
``postmortem``) writes: ``--output FILE`` (.html, .pdf or .md; ``--report`` is the same flag) and ``--json``."""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import re

from runtime.cliargs import add_output_arg, fail

_AGO = re.compile(r"\s*(?:last[_ ]?)?([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d)\s*")
_UNIT = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def add_source_args(p) -> None:
    g = p.add_argument_group("where the history is")
    g.add_argument("--history", metavar="FILE", help="a history file (default: the running server's, see --url)")
    g.add_argument("--url", help="a running server (default: the one in $VNPU_HOME/serve/server.json)")
    g.add_argument("--api-key", help="the server's admin key (default: $VNPU_API_KEY)")


def open_from_args(a, prog: str):
    from runtime.cluster.discovery import state_dir
    from runtime.observe.source import SourceError, open_source
    try:
        return open_source(state_dir(), history=a.history, url=a.url, api_key=a.api_key)
    except SourceError as e:
        fail(str(e), prog)


@contextlib.contextmanager
def reading(a, prog: str):
    """The history the arguments name, open for the block (closed after it); a
    :class:`~runtime.observe.source.SourceError` raised in the block is a usage error of ``prog`` (exit 2,
    one line)."""
    from runtime.observe.source import SourceError
    with open_from_args(a, prog) as src:
        try:
            yield src
        except SourceError as e:
            fail(str(e), prog)


def add_report_args(p, output_help: str) -> None:
    """``--output FILE`` (a report: .html, .pdf or .md), ``--json`` and where the history is
    (:func:`add_source_args`): the arguments every reporting command takes."""
    add_output_arg(p, output_help)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_source_args(p)


def report_kind(a, prog: str) -> str | None:
    """``"html"``, ``"md"`` or ``"pdf"`` by ``--output``'s suffix (:data:`runtime.observe.report.KINDS`), None
    without ``--output``; any other suffix is a usage error of ``prog``."""
    if not a.output:
        return None
    from runtime.observe.report import KINDS, kind_of
    kind = kind_of(a.output)
    if kind is None:
        fail(f"argument --output: {a.output} is not a report file (use {', '.join(KINDS)})", prog)
    return kind


def since(s: str):
    """``type=``: how far back: ``90s`` / ``30m`` / ``1h`` / ``2d``, also as the CANN article writes it,
    ``last_1h`` / ``last_30m`` / ``last_24h`` (relative: a negative number of seconds is
    returned as ``("ago", s)``), an ISO time (``2026-12-01T03:00:00``, UTC unless it says otherwise), or
    epoch seconds."""
    m = _AGO.fullmatch(s)
    if m:
        v = float(m.group(1)) * _UNIT[m.group(2)]
        if not v > 0:
            raise argparse.ArgumentTypeError(f"must be longer than 0, got {s!r}")
        return ("ago", v)
    try:
        return ("at", float(s))
    except ValueError:
        pass
    try:
        t = _dt.datetime.fromisoformat(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a duration (1h, 30m) or a time (ISO 8601 or epoch "
                                         f"seconds)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return ("at", t.timestamp())


def resolve_since(value, now: float) -> float | None:
    if value is None:
        return None
    kind, v = value
    return now - v if kind == "ago" else v
