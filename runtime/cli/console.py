"""The terminal output of the ``vnpu`` commands, through ``rich``: one place that makes consoles and turns a
renderable (a table, a panel, a group of them) into text.

``rich`` is a runtime dependency for its tables (``vnpu smi``, ``monitor``, ``diagnose``, ``postmortem``,
``stress-test``), live views (``vnpu monitor``: ``rich.live.Live`` redraws in place) and progress bars (``vnpu
run generate``).  Every command keeps a ``--json`` form that does not go through here.
"""
from __future__ import annotations

import io
import logging
import sys

from rich.console import Console


def stderr_console() -> Console:
    """A console on stderr (progress bars, live views); colours and cursor movement only on a terminal."""
    return Console(file=sys.stderr, highlight=False)


def stdout_console() -> Console:
    return Console(file=sys.stdout, highlight=False, soft_wrap=False)


def to_text(renderable, width: int = 110) -> str:
    """``renderable`` rendered as plain text (no colour codes), ``width`` columns wide."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False,
            legacy_windows=False).print(renderable)
    return buf.getvalue().rstrip("\n")


#: ``--log-level`` names -> logging levels
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class ConsoleLogHandler(logging.Handler):
    """Log records as ``LEVEL MM-DD HH:MM:SS PROG: message`` lines through a rich console (so that they
    print above a live progress on a terminal, and as plain text without control codes elsewhere); PROG
    is the logger's name with dots as spaces (``vnpu.serve.access`` -> ``vnpu serve access``)."""

    def __init__(self, console: Console, level: int = logging.INFO):
        super().__init__(level)
        self.console = console
        self.before: tuple = ("vnpu", logging.NOTSET, True)    #: (logger, its level, its propagation) before
        self.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(prog)s: %(message)s", "%m-%d %H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            record.prog = record.name.replace(".", " ")
            self.console.print(self.format(record), markup=False, highlight=False, emoji=False, soft_wrap=True)
        except Exception:  # noqa: BLE001 - logging must not raise (logging's own rule)
            self.handleError(record)


def log_to(console: Console, level: str, name: str = "vnpu") -> ConsoleLogHandler:
    """Send the ``name`` logger's records at ``level`` (a :data:`LOG_LEVELS` name) and above to ``console``,
    once: no other console handler on it, and no copy to the root logger's handlers (no duplicated lines).
    :func:`unlog` undoes it (a command run in-process, as tests do, leaves the logger as it was)."""
    lg = logging.getLogger(name)
    for h in list(lg.handlers):
        if isinstance(h, ConsoleLogHandler):
            unlog(h)
    h = ConsoleLogHandler(console, LOG_LEVELS[level])
    h.before = (name, lg.level, lg.propagate)
    lg.addHandler(h)
    lg.setLevel(LOG_LEVELS[level])
    lg.propagate = False
    return h


def unlog(handler: ConsoleLogHandler) -> None:
    """Take ``handler`` off its logger and give the logger back its level and propagation."""
    name, level, propagate = handler.before
    lg = logging.getLogger(name)
    if handler in lg.handlers:
        lg.removeHandler(handler)
        lg.setLevel(level)
        lg.propagate = propagate
