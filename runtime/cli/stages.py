"""The startup stages of ``vnpu up``, ``run`` and ``serve`` on the terminal (:mod:`runtime.stages` reports
them): on a terminal a live ``rich`` progress -- a spinner per stage, its steps when it counts any (graphs
captured, devices uploaded to), its elapsed time, a check mark when done; otherwise (a pipe, a file, a log
collector) one plain line per stage as it begins, ``PROG: STAGE: DETAIL``, and no control codes.

    with showing_stages("vnpu run", stderr_console()):
        ...                     # stages reported by the work show up here

Only one live display may run at a time: the progress stops when the ``with`` block ends, before a
command's own display (the token bar of ``run generate``) starts.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from runtime import stages


class StageProgress:
    """A :class:`runtime.stages.StageSink` on ``console``: live on a terminal, else ``plain(text)`` per stage
    (``STAGE: DETAIL``; default: ``PROG: STAGE: DETAIL`` on the console's file)."""

    def __init__(self, prog: str, console: Console, plain: Callable[[str], None] | None = None):
        self.prog, self.console = prog, console
        self.live = console.is_terminal
        self.plain = plain or self._print
        self._lock = threading.Lock()
        self._tasks: dict[int, tuple] = {}          # key -> (rich task id, total, text)
        self.bar = Progress(SpinnerColumn(finished_text="[green]✓"), TextColumn("{task.description}"),
                            BarColumn(bar_width=20), TextColumn("{task.fields[steps]}"), TimeElapsedColumn(),
                            console=console, transient=False) if self.live else None
        self._started = False

    def _print(self, text: str) -> None:
        f = self.console.file
        f.write(f"{self.prog}: {text}\n")
        f.flush()

    def begin(self, key: int, name: str, detail: str, total: int | None) -> None:
        text = f"{name}: {detail}" if detail else name
        if self.bar is None:
            self.plain(text)
            return
        with self._lock:
            if not self._started:
                self.bar.start()
                self._started = True
            steps = f"0/{total}" if total else ""           # a stage without steps: a pulsing bar
            self._tasks[key] = (self.bar.add_task(escape(text), total=total, steps=steps), total, escape(text))

    def advance(self, key: int, n: int) -> None:
        if self.bar is not None and key in self._tasks:
            task, total, _ = self._tasks[key]
            self.bar.advance(task, n)
            done = next(t.completed for t in self.bar.tasks if t.id == task)
            self.bar.update(task, steps=f"{done:g}/{total}")

    def end(self, key: int, seconds: float, ok: bool) -> None:
        if self.bar is None or key not in self._tasks:
            return
        task, total, text = self._tasks.pop(key)
        if ok:
            self.bar.update(task, total=total or 1, completed=total or 1)
        else:
            self.bar.update(task, description=f"[red]failed:[/] {text}")

    def close(self) -> None:
        with self._lock:
            if self.bar is not None and self._started:
                self.bar.stop()
                self._started = False


@contextlib.contextmanager
def showing_stages(prog: str, console: Console, plain: Callable[[str], None] | None = None) -> Iterator[StageProgress]:
    """Show the stages reported inside the block (see the module doc); the previous sink is back after it."""
    sink = StageProgress(prog, console, plain)
    before = stages.set_sink(sink)
    try:
        yield sink
    finally:
        stages.set_sink(before)
        sink.close()
