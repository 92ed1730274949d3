"""Where a ``vnpu bench serve`` level's device time goes, by phase: the device processes' CPU seconds per
engine step, split into steps that computed prompt tokens (prefills, with the decode rows riding in them)
and decode-only steps at the level's full batch -- each against the same phase of the bound (its prefill
per prompt token, its decode step at that batch).

A :class:`StepCpu` is one of the server's stat loggers (:class:`runtime.serve.engine.stats.StatLogger`):
the engine thread calls :meth:`StepCpu.record` once per step it reads back, and it reads the device
processes' CPU time from ``/proc`` (a few microseconds; never blocks).  With async scheduling the step
read back at ``t`` was computed while the one before it was read, so the CPU between two records is the
device's work on one step (the steady state; the first step of a level also holds whatever ran before it).
"""
from __future__ import annotations

import threading

from .common import cpu_seconds


class StepCpu:
    """Per step: (prompt tokens, generated tokens, device CPU seconds since the record before)."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        self._lock = threading.Lock()
        self._steps: list[tuple[int, int, float]] = []
        self._last = 0.0

    def start(self) -> None:
        """Forget the steps so far; the next step's CPU counts from now."""
        with self._lock:
            self._steps = []
            self._last = cpu_seconds(self.pids)

    def record(self, model: str, stats) -> None:
        if not stats.batch_tokens or not self.pids:          # not a step (a request's own record)
            return
        now = cpu_seconds(self.pids)
        with self._lock:
            self._steps.append((stats.prompt_tokens, stats.generation_tokens, now - self._last))
            self._last = now

    def phases(self, batch: int) -> dict:
        """The level's phases: steps with prompt tokens (``prefill_*``) and decode-only steps of ``batch``
        sequences (``decode_*``); CPU seconds, steps and prompt tokens of each."""
        with self._lock:
            steps = list(self._steps)
        pre = [s for s in steps if s[0]]
        full = [s for s in steps if not s[0] and s[1] == batch]
        return {"prefill_steps": len(pre), "prefill_prompt_tokens": sum(s[0] for s in pre),
                "prefill_cpu_s": round(sum(s[2] for s in pre), 3), "decode_steps": len(full),
                "decode_cpu_s": round(sum(s[2] for s in full), 3), "steps": len(steps)}


def phase_ratios(ph: dict, bound_prefill_ms_per_token: float, bound_step_ms: float) -> dict:
    """Device CPU per prompt token in prefill steps and per full-batch decode step, and the bound's over
    each (``*_of_bound``: bound / device, as ``of_bound``; None where the level had no such step)."""
    out: dict = {"prefill_cpu_ms_per_token": None, "prefill_of_bound": None,
                 "decode_cpu_ms_per_step": None, "decode_of_bound": None}
    if ph["prefill_prompt_tokens"] and ph["prefill_cpu_s"] > 0:
        ms = 1e3 * ph["prefill_cpu_s"] / ph["prefill_prompt_tokens"]
        out.update(prefill_cpu_ms_per_token=round(ms, 3), prefill_of_bound=round(bound_prefill_ms_per_token / ms, 3))
    if ph["decode_steps"] and ph["decode_cpu_s"] > 0:
        ms = 1e3 * ph["decode_cpu_s"] / ph["decode_steps"]
        out.update(decode_cpu_ms_per_step=round(ms, 2), decode_of_bound=round(bound_step_ms / ms, 3))
    return out
