"""Startup stages: what a long start is doing now (starting devices, loading weights, uploading to HBM,
capturing graphs), told to whoever shows it.

The code that does the work wraps it in :func:`stage` (a name, a detail, optionally a count of steps it
advances through); a command that shows progress installs a :class:`StageSink` with :func:`set_sink` (the
command line's: a live ``rich`` progress on a terminal, one plain line per stage otherwise).  Without a
sink a stage costs a function call.  The sink is process-wide, like a log handler: engines load on other
threads than the command's.  Stages only report; they never block or change what the work does.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator, Protocol

#: the stages a start goes through, in order (names a sink may rely on)
STARTING_DEVICES = "starting devices"
LOADING_WEIGHTS = "loading weights"
UPLOADING = "uploading to HBM"
CAPTURING = "capturing graphs"


class StageSink(Protocol):
    def begin(self, key: int, name: str, detail: str, total: int | None) -> None: ...
    def advance(self, key: int, n: int) -> None: ...
    def end(self, key: int, seconds: float, ok: bool) -> None: ...


_lock = threading.Lock()
_sink: StageSink | None = None
_next = [0]


def set_sink(sink: StageSink | None) -> StageSink | None:
    """Install ``sink`` (None: none) for every stage from now on; returns the one it replaces."""
    global _sink
    with _lock:
        old, _sink = _sink, sink
    return old


@contextlib.contextmanager
def stage(name: str, detail: str = "", total: int | None = None) -> Iterator[Callable[[int], None]]:
    """Report the work in the ``with`` block as stage ``name`` (``detail``: what it works on, e.g. the
    model); yields ``advance(n=1)`` for a stage of ``total`` steps."""
    sink = _sink
    if sink is None:
        yield lambda n=1: None
        return
    with _lock:
        key = _next[0] = _next[0] + 1
    t0 = time.monotonic()
    sink.begin(key, name, detail, total)
    ok = False
    try:
        yield lambda n=1: sink.advance(key, n)
        ok = True
    finally:
        sink.end(key, time.monotonic() - t0, ok)
