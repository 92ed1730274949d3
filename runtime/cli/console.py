"""The terminal output of the ``vnpu`` commands, through ``rich``: one place that makes consoles and turns a
renderable (a table, a panel, a group of them) into text.

``rich`` is a runtime dependency for its tables (``vnpu smi``, ``monitor``, ``diagnose``, ``postmortem``,
``stress-test``), live views (``vnpu monitor``: ``rich.live.Live`` redraws in place) and progress bars (``vnpu
run generate``).  Every command keeps a ``--json`` form that does not go through here.
"""
from __future__ import annotations

import io
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
