"""The server's periodic stats line (vLLM's ``LoggingStatLogger`` shape), on the logger ``vnpu.serve.stats``::

    Avg prompt throughput: 2.4 tokens/s, Avg generation throughput: 3.2 tokens/s, Running: 1 reqs,
    Waiting: 0 reqs, KV cache usage: 1.6% (10.00 s: 24 prompt + 32 generated tokens, 2 reqs finished)

Throughputs are the tokens the engines computed (prompt tokens prefilled, tokens generated: the step stats
of :class:`runtime.serve.engine.stats.StepStats`) over the window since the last line, whose length and
counts close the line; running, waiting and KV-cache use (the fullest engine) are the server's gauges at
the line's time.  :class:`StatsLog` is a stat logger of the engines (:meth:`record`) and a listener of the
metrics sampler (:meth:`on_tick`): a line once ``interval_s`` has passed on the sampler's clock since the
last one -- the period is on that injectable clock; tests tick it by hand.  An idle window (nothing
computed, nothing running or waiting) after an idle window is logged at debug level only, so that an idle
server says it is idle once.  :meth:`record` only adds under a lock; :meth:`on_tick` never blocks.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("vnpu.serve.stats")


@dataclass
class _Window:
    prompt: int = 0
    generation: int = 0
    finished: int = 0


def stats_line(prompt: int, generation: int, finished: int, seconds: float, running: int, waiting: int,
               kv_usage: float) -> str:
    """One stats line (see the module doc) for a window of ``seconds``."""
    dt = max(seconds, 1e-9)
    return (f"Avg prompt throughput: {prompt / dt:.1f} tokens/s, Avg generation throughput: {generation / dt:.1f} "
            f"tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, KV cache usage: {kv_usage * 100:.1f}% "
            f"({seconds:.2f} s: {prompt} prompt + {generation} generated tokens, {finished} reqs finished)")


class StatsLog:
    """A stats line every ``interval_s`` seconds of ``clock`` (the sampler's: its ticks carry the time)."""

    def __init__(self, interval_s: float = 10.0, clock: Callable[[], float] = time.time):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._lock = threading.Lock()
        self._win = _Window()
        self._since = clock()
        self._idle_before = False
        self.lines = 0                                    #: lines logged (at any level)

    def record(self, model: str, stats) -> None:
        """The engines' stat-logger interface (:class:`runtime.serve.engine.stats.StatLogger`)."""
        with self._lock:
            self._win.prompt += stats.prompt_tokens
            self._win.generation += stats.generation_tokens
            self._win.finished += len(stats.finished)

    def on_tick(self, ts: float, server: dict, devices: dict) -> str | None:
        """A sampler tick at ``ts`` with the server's gauges: the line, once ``interval_s`` has passed."""
        if ts - self._since < self.interval_s:
            return None
        with self._lock:
            w, self._win = self._win, _Window()
        seconds, self._since = ts - self._since, ts
        running, waiting = int(server.get("running", 0)), int(server.get("queue_depth", 0))
        line = stats_line(w.prompt, w.generation, w.finished, seconds, running, waiting,
                          float(server.get("kv_cache_usage", 0.0)))
        idle = not (w.prompt or w.generation or w.finished or running or waiting)
        log.log(logging.DEBUG if idle and self._idle_before else logging.INFO, "%s", line)
        self._idle_before = idle
        self.lines += 1
        return line
