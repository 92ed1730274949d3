"""The open-loop generator: requests leave at their arrival times whatever the server does (a slow server
does not slow the arrivals down, as a closed loop would), and everything is written to a request history
in :mod:`runtime.cluster.history_check`'s format.

One request = ``submit``, then per try an ``attempt`` and either ``complete`` (a response with a result:
``digest`` of its body's result) + ``ack``, or ``attempt-failed`` (5xx other than an admission refusal,
connection errors, timeouts: retried up to ``max_attempts`` as the OpenAI client does), or ``failed``
(given up: retries exhausted, a client error, or *shed*: refused by admission control -- 429, or 503
``server_overloaded`` -- which is not retried and is reported apart from failures).

Timing: ``clock`` (monotonic seconds) and ``wait_until(deadline)`` are injectable; the dispatcher wakes at
each arrival and hands the request to a worker pool (``workers`` threads).  The *intended* rate is the
profile's; the *achieved* rate counts dispatches by when they really left (``sent``), so a generator that
could not keep up shows it.  Blocking: :meth:`OpenLoop.run` blocks for the whole run plus the drain.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Outcome:
    """One try of a request: ``kind`` is ``ok`` / ``shed`` / ``retry`` (a server-side failure worth another
    try) / ``client-error``; ``status`` the HTTP status (0: no response)."""

    kind: str
    status: int = 200
    digest: str = ""
    value: object = None
    error: str = ""
    server_failure: bool = False          #: counted in the error rate (5xx, timeouts, connection errors)


@dataclass
class Record:
    rid: int
    intended: float                       #: arrival time (s from the start)
    key: str = ""                         #: the input's key (for the reference result)
    dispatched: float | None = None       #: when the dispatcher handed it to a worker
    sent: float | None = None             #: when a worker really sent it (later if every worker was busy)
    done: float | None = None
    latency_s: float | None = None        #: first try's send to the final response
    attempts: int = 0
    outcome: str = ""                     #: ok / shed / failed / client-error ("" while running)
    status: int = 0
    value: object = None
    errors: list[str] = field(default_factory=list)


class OpenLoop:
    """Drive ``send(rid, key) -> Outcome`` at ``arrivals`` (seconds from the start)."""

    def __init__(self, arrivals: list[float], send: Callable[[int, str], Outcome], keys: Callable[[int], str],
                 clock: Callable[[], float] = time.monotonic,
                 wait_until: Callable[[float], None] | None = None, workers: int = 64, max_attempts: int = 3):
        self.arrivals = list(arrivals)
        self.send, self.keys = send, keys
        self.clock = clock
        self.wait_until = wait_until or self._sleep_until
        self.workers, self.max_attempts = workers, max_attempts
        self.records: list[Record] = []
        self.history: list[dict] = []
        self._lock = threading.Lock()
        self.t0 = 0.0
        self.stopped = threading.Event()

    def _sleep_until(self, deadline: float) -> None:
        while not self.stopped.is_set():
            left = deadline - self.clock()
            if left <= 0:
                return
            self.stopped.wait(min(left, 0.5))

    def _log(self, op: str, rid: int, **kw) -> None:
        with self._lock:
            self.history.append({"op": op, "id": rid, "t": round(self.clock() - self.t0, 6), **kw})

    def _one(self, rec: Record) -> None:
        rec.sent = self.clock() - self.t0
        start = time.perf_counter()                    # latency in real seconds, whatever the clock
        for attempt in range(1, self.max_attempts + 1):
            rec.attempts = attempt
            self._log("attempt", rec.rid, attempt=attempt, physical=-1)
            try:
                out = self.send(rec.rid, rec.key)
            except Exception as e:  # noqa: BLE001 - a sender that breaks is a failed try, not a crash
                out = Outcome("retry", 0, error=f"{type(e).__name__}: {e}", server_failure=True)
            rec.status = out.status
            if out.kind == "ok":
                self._log("complete", rec.rid, attempt=attempt, digest=out.digest)
                self._log("ack", rec.rid, digest=out.digest)
                rec.outcome, rec.value = "ok", out.value
                break
            rec.errors.append(out.error or f"HTTP {out.status}")
            if out.kind == "retry" and attempt < self.max_attempts:
                self._log("attempt-failed", rec.rid, attempt=attempt, code=out.status, error=out.error[:200])
                continue
            if out.kind == "retry":
                self._log("attempt-failed", rec.rid, attempt=attempt, code=out.status, error=out.error[:200])
            self._log("failed", rec.rid, code=out.status, error=(out.error or out.kind)[:200])
            rec.outcome = {"shed": "shed", "client-error": "client-error"}.get(out.kind, "failed")
            break
        rec.done = self.clock() - self.t0
        rec.latency_s = time.perf_counter() - start

    def run(self, drain_s: float = 120.0, on_arrival: Callable[[float], None] | None = None) -> None:
        """Dispatch every arrival at its time, then wait up to ``drain_s`` for the requests in flight (those
        still running after it are left out of the history's completions: *lost*)."""
        self.t0 = self.clock()
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="vnpu-stress")
        futs = []
        try:
            for rid, t in enumerate(self.arrivals):
                self.wait_until(self.t0 + t)
                if self.stopped.is_set():
                    break
                if on_arrival is not None:
                    on_arrival(t)
                rec = Record(rid, t, self.keys(rid), dispatched=self.clock() - self.t0)
                self.records.append(rec)
                self._log("submit", rid, input=rec.key)
                futs.append(pool.submit(self._one, rec))
            deadline = time.monotonic() + drain_s
            for f in futs:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    f.result(timeout=left)
                except Exception:  # noqa: BLE001 - timeouts: the request stays unfinished (lost)
                    pass
        finally:
            self.stopped.set()
            pool.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------------------------------------- figures
    def rates(self) -> dict:
        """Intended vs achieved arrivals: counts and requests/s over the span of the intended arrivals."""
        a = self.arrivals
        sent = sorted(r.sent for r in self.records if r.sent is not None)
        lag = [r.sent - r.intended for r in self.records if r.sent is not None]
        return {"intended": len(a), "dispatched": len(self.records), "sent": len(sent),
                "intended_rate": ((len(a) - 1) / max(a[-1] - a[0], 1e-9)) if len(a) > 1 else 0.0,
                "achieved_rate": ((len(sent) - 1) / max(sent[-1] - sent[0], 1e-9)) if len(sent) > 1 else 0.0,
                "send_lag_p99_s": _pct(lag, 99), "send_lag_max_s": max(lag) if lag else None}


class ScaledClock:
    """A clock that runs ``factor`` times faster than the monotonic one (tests: a 5 min profile in 5 s at
    60x); :meth:`wait_until` sleeps the real time to a deadline on this clock."""

    def __init__(self, factor: float):
        if not factor > 0:
            raise ValueError(f"factor must be > 0, got {factor!r}")
        self.factor = float(factor)
        self.r0 = time.monotonic()

    def __call__(self) -> float:
        return (time.monotonic() - self.r0) * self.factor

    def wait_until(self, deadline: float) -> None:
        left = (deadline - self()) / self.factor
        if left > 0:
            time.sleep(left)                             # the schedule itself: arrivals are due at these times


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100.0 * (len(s) - 1))))]
