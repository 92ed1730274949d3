"""``vnpu sanitize``: memcheck, racecheck across streams, initcheck and leak check for runtime programs,
in the manner of NVIDIA's compute-sanitizer.

How it sees a program: a :class:`Session` wraps every device handle of the runtime
(:class:`~runtime.sanitize.handle.SanitizedHandle`), so every call that reaches a device -- on either
backend -- passes it, in the order the host issued it, with the host call stack
(:mod:`~runtime.sanitize.sites`).  From those calls it keeps, per device, vector clocks of the host and
each stream (:mod:`~runtime.sanitize.clocks`: stream order, event record/wait, host-signalled gates,
stream/event/device synchronization and completed queries) and the access history of every allocated
byte range (:mod:`~runtime.sanitize.shadow`; the ranges each task declares, :mod:`devices.access`; a graph
replay as its captured ops).  The checks are logical, decided when the host issues work, not when the
device happens to run it: a race that timing hides on one run is reported on every run.

Turning it on: ``vnpu sanitize [--tool ...] -- <command>``, or for any runtime client the environment
(``VNPU_SANITIZE=racecheck,initcheck``, options in ``VNPU_SANITIZE_OPTIONS``, see :mod:`.options`), or
in a program ``Runtime(backend, sanitizer=Session(...))``.  Off (the default), no layer exists and the
runtime's only cost is a ``None`` check per enqueued op.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading

from .findings import Finding, summary_lines
from .options import TOOLS, SanitizeOptions, from_env, parse_options, parse_tools
from .session import Session

__all__ = ["Session", "SanitizeOptions", "Finding", "TOOLS", "current", "install", "from_environment",
           "parse_tools", "parse_options", "summary_lines"]

_current: Session | None = None
_lock = threading.Lock()


def current() -> Session | None:
    """The process's session (installed from the environment or by :func:`install`), or None."""
    return _current


def install(session: Session | None, at_exit: bool = True) -> Session | None:
    """Make ``session`` the process's session (None: none); with ``at_exit`` it finishes (leak check,
    summary, JSON report) when the process exits, and a process whose options name an
    ``error_exitcode`` then exits with it when anything was found."""
    global _current
    with _lock:
        _current = session
    if session is not None and at_exit:
        atexit.register(_finish_at_exit, session)
    return session


def from_environment() -> Session | None:
    """The process's session when ``VNPU_SANITIZE`` asks for one (made and installed on first use)."""
    global _current
    if _current is not None:
        return _current
    opts = from_env()
    if opts is None:
        return None
    with _lock:
        if _current is None:
            _current = Session(opts)
            atexit.register(_finish_at_exit, _current)
        return _current


def _finish_at_exit(session: Session) -> None:
    errors = session.finish()
    code = session.options.error_exitcode
    if errors and code and _current is session:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
