"""Per-tenant circuit breakers: a tenant whose requests keep failing is refused for a while, so that its
failures stop costing the devices and the other tenants, then let back in by one probe.

A tenant with ``circuit_breaker: {error_rate: 50%, window: 30s, open_for: 60s, min_requests: 5}`` in
serve.yaml is judged on the outcomes of its own model requests over the last ``window`` (the clock is
injectable): server-side failures (5xx other than a shed) against successes; refusals (401-429, shed) are
no verdict.  States:

- **closed**: requests pass; once the window holds ``min_requests`` verdicts and the share of failures is
  ``error_rate`` or more, the breaker **opens**;
- **open**: every request of the tenant is refused before any work -- 503, code ``circuit_open``, with
  ``Retry-After`` (and ``retry-after-ms``) the time left -- for ``open_for``;
- **half-open** (after ``open_for``): ONE request is admitted as a probe, the others are refused (503,
  ``Retry-After`` 1 s); the probe's success closes the breaker (its window starts empty), its failure opens
  it again for ``open_for``.  A probe with no verdict (the client went away) is replaced by the next
  request after ``open_for``.

Other tenants are not affected: each tenant has its own breaker.  Pure host-side logic under one short
lock; nothing here blocks.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from devices.errors import InvalidParamError

from .engine.errors import ServeError

RETRY_AFTER_MAX_S = 120.0     #: the official client gives up on a larger Retry-After


class CircuitOpen(ServeError):
    """The tenant's circuit breaker is open (HTTP 503, ``circuit_open``); ``retry_after_s``: when it
    lets a probe through."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message, None, "circuit_open")
        self.retry_after_s = retry_after_s

    def __reduce__(self):
        return (type(self), (self.message, self.retry_after_s))

    def headers(self) -> dict:
        s = min(RETRY_AFTER_MAX_S, max(1e-3, self.retry_after_s))
        return {"Retry-After": str(max(1, math.ceil(s))), "retry-after-ms": str(max(1, math.ceil(s * 1000)))}


@dataclass(frozen=True)
class BreakerSpec:
    """``error_rate``: the share of failed requests (0-1] that opens the breaker; ``window_s``: over how
    long; ``open_for_s``: how long it stays open before a probe; ``min_requests``: verdicts the window must
    hold before it may open."""
    error_rate: float = 0.5
    window_s: float = 30.0
    open_for_s: float = 60.0
    min_requests: int = 5

    def __post_init__(self):
        r = self.error_rate
        if not isinstance(r, (int, float)) or isinstance(r, bool) or not 0 < r <= 1:
            raise InvalidParamError(f"error_rate must be in (0, 100%], got {r!r}")
        for k in ("window_s", "open_for_s"):
            v = getattr(self, k)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf:
                raise InvalidParamError(f"{k} must be a positive duration, got {v!r}")
        m = self.min_requests
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise InvalidParamError(f"min_requests must be a positive integer, got {m!r}")


@dataclass
class _Breaker:
    state: str = "closed"
    outcomes: deque = field(default_factory=deque)        #: (t, failed), oldest first
    until: float = 0.0                                    #: open: when the probe may go
    probe_at: float | None = None                         #: half-open: when the probe was admitted
    opened: int = 0                                       #: times it opened


class Breakers:
    """Every tenant's breaker on ``clock`` (seconds).  Routes call :meth:`check` before admitting a request
    and :meth:`record` with its outcome."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._by_name: dict[str, _Breaker] = {}

    def check(self, tenant) -> None:
        """Raise :class:`CircuitOpen` if ``tenant``'s breaker refuses a request now (a tenant without a
        ``circuit_breaker`` always passes)."""
        spec = getattr(tenant, "circuit_breaker", None)
        if spec is None:
            return
        now = self.clock()
        with self._lock:
            b = self._by_name.setdefault(tenant.name, _Breaker())
            if b.state == "open":
                if now < b.until:
                    raise CircuitOpen(f"the circuit breaker of tenant {tenant.name} is open: its requests failed "
                                      f"too often; a probe is let through in {b.until - now:.3g}s", b.until - now)
                b.state, b.probe_at = "half_open", None
            if b.state == "half_open":
                if b.probe_at is not None and now - b.probe_at < spec.open_for_s:
                    raise CircuitOpen(f"the circuit breaker of tenant {tenant.name} is half-open: a probe "
                                      f"request is in flight", 1.0)
                b.probe_at = now

    def record(self, tenant, outcome: str) -> None:
        """One of ``tenant``'s model requests ended: ``ok`` or ``error`` is a verdict; ``client`` / ``shed``
        are none."""
        spec = getattr(tenant, "circuit_breaker", None)
        if spec is None or outcome not in ("ok", "error"):
            return
        failed = outcome == "error"
        now = self.clock()
        with self._lock:
            b = self._by_name.setdefault(tenant.name, _Breaker())
            if b.state == "half_open" and b.probe_at is not None:
                if failed:
                    self._open(b, now, spec)
                else:
                    b.state, b.probe_at = "closed", None
                    b.outcomes.clear()
                return
            if b.state != "closed":
                return                                    # a request admitted before it opened: no verdict
            b.outcomes.append((now, failed))
            while b.outcomes and now - b.outcomes[0][0] >= spec.window_s:
                b.outcomes.popleft()
            n = len(b.outcomes)
            if n >= spec.min_requests and sum(f for _, f in b.outcomes) / n >= spec.error_rate:
                self._open(b, now, spec)

    @staticmethod
    def _open(b: _Breaker, now: float, spec: BreakerSpec) -> None:
        b.state, b.until, b.probe_at = "open", now + spec.open_for_s, None
        b.outcomes.clear()
        b.opened += 1

    def state(self, name: str) -> dict:
        """``{"state", "opened", "retry_after_s"}`` of tenant ``name``'s breaker (``closed`` if none)."""
        now = self.clock()
        with self._lock:
            b = self._by_name.get(name) or _Breaker()
            state = "half_open" if b.state == "open" and now >= b.until else b.state
            return {"state": state, "opened": b.opened,
                    "retry_after_s": max(0.0, b.until - now) if state == "open" else None}
