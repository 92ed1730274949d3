"""The ``auto`` scheduler mode's latency target, picked from the server's history (the SQLite metrics store,
:mod:`runtime.observe.metrics_store`).

Rule: the target is the ``quantile`` (default 0.9) of the ``p99_latency_ms`` samples recorded over the last
``lookback_s`` (default one day) -- the per-second p99 the server met in 90 % of the seconds it served
requests.  Adaptive scheduling then sizes its batches to keep that level: it never plans for a latency
the server has not shown it can deliver, and a day of higher load does not loosen the target below what
the last day achieved.  Fewer than ``min_samples`` samples (default 30: half a minute of traffic) is not a
history: no target is picked and the mode keeps its configured one (``slo.target_p99_ms``), or runs as
``manual`` without one (:mod:`runtime.serve.engine.modes`).

Pure reads of the store (blocks the caller for one SQLite query); the clock is the caller's ``now``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from devices.errors import InvalidParamError


@dataclass(frozen=True)
class AutoSlo:
    """How ``auto`` picks its target (see the module docstring)."""
    lookback_s: float = 86400.0
    quantile: float = 0.9
    min_samples: int = 30

    def __post_init__(self):
        if not self.lookback_s > 0:
            raise InvalidParamError(f"lookback_s must be > 0, got {self.lookback_s!r}")
        if not 0 < self.quantile <= 1:
            raise InvalidParamError(f"quantile must be in (0, 1], got {self.quantile!r}")
        if not isinstance(self.min_samples, int) or self.min_samples < 1:
            raise InvalidParamError(f"min_samples must be a positive integer, got {self.min_samples!r}")


def pick_target(history, now: float, rule: AutoSlo = AutoSlo()) -> float | None:
    """The target p99 (ms) the history supports at ``now``, or None when it holds too few samples."""
    rows = history.samples("p99_latency_ms", since=now - rule.lookback_s, until=now)
    values = sorted(float(r[1]) for r in rows if float(r[1]) > 0)
    if len(values) < rule.min_samples:
        return None
    k = max(0, math.ceil(rule.quantile * len(values) - 1e-9) - 1)       # nearest rank
    return round(values[k], 3)


__all__ = ["AutoSlo", "pick_target"]
