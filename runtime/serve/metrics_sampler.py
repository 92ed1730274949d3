"""The server's metrics sampler: once a second, the server's and every device's gauges into the History.

The HTTP layer reports every request's outcome (:meth:`Sampler.observe`: latency, and whether it was
served, failed on the server, refused as a client error, or shed by admission control); the engines report
time to first token through the stat-logger interface (:meth:`Sampler.record`); the engines' events
(re-binds) reach :meth:`Sampler.engine_event`.  :meth:`Sampler.tick` turns what arrived since the last tick
into one sample per metric of :data:`runtime.observe.metrics_store.METRICS`:

- ``qps``: requests that ended (served or failed) per second since the last tick; also per model (scope
  ``model:<name>``, every model that had a request since the server started: 0 when none ended), the
  history the forecast (:mod:`runtime.observe.forecast`) reads;
- ``p50/p95/p99_latency_ms``: end-to-end latency (as the HTTP client sees it) of those requests; no sample
  when none ended (a percentile of nothing is not a number);
- ``ttft_p99_ms``: the engines' time to first token;
- ``error_rate``: server-side failures (5xx, engine errors, a failed stream) / requests that ended.  Client
  errors (4xx) and shed requests (429 over quota, 503 queue full or not admitting) are not errors, so one
  abusive tenant cannot make the server look broken;
- ``shed_rate``: shed / every request that arrived at a model route (no sample for either rate when no
  request ended / arrived: a rate of nothing is not 0);
- ``queue_depth``, ``running``, ``kv_cache_usage`` (the highest of the engines), ``throttle``, ``replicas``;
- per device (scope ``npu:<id>``): ``hbm_used_bytes``, ``hbm_fragmentation`` (the arena: every client),
  ``pool_fragmentation`` (the server's caching pool on it, ``memory_stats()``), ``device_temperature_c``,
  ``device_power_w``, ``aicore_util``, ``device_health`` (:data:`HEALTH_CODES`; 4 = lost).

A device whose health level gets worse (or that is lost) between two ticks is a ``fault`` event, one whose
level gets better a ``recovery`` event (``duration_s``: since the first fault of the episode).  An engine's
automatic re-bind (what was detected and where the engine went) and steps that failed since the last tick
(task exceptions: their requests failed) are ``fault`` events too.
Listeners (:meth:`Sampler.listen`, e.g. the policy engine) get every tick's samples at the tick's time.

Clock: ``clock`` gives wall-clock seconds for the History; tests drive :meth:`tick` with explicit times and
never start the thread.  Blocking: :meth:`tick` issues one telemetry and one health call per device (the
thread does it once per ``interval_s``); :meth:`observe` and :meth:`record` only append under a lock.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from runtime.observe.forecast import model_scope
from runtime.observe.metrics_store import HEALTH_CODES, History, device_scope

log = logging.getLogger("vnpu.serve")

LOST = HEALTH_CODES["Lost"]

#: request outcome -> (counts as ended, counts as a server-side error, counts as shed)
OUTCOMES: dict[str, tuple[bool, bool, bool]] = {
    "ok": (True, False, False),
    "error": (True, True, False),
    "client": (False, False, False),
    "shed": (False, False, True),
}


#: front event kind -> its lifecycle line
REPLICA_EVENTS: dict[str, str] = {"replica_added": "replica {replica} added on devices {devices}",
                                  "replica_removed": "replica {replica} removed (drained: {drained})"}


def percentile(xs: list[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``xs`` (NaN when empty)."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


@dataclass
class _Window:
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    ended: int = 0
    errors: int = 0
    shed: int = 0
    arrived: int = 0
    by_model: dict = field(default_factory=dict)     # model -> requests ended


class Sampler:
    """Samples ``service`` (a :class:`runtime.serve.server.Frontend`) into ``history`` every ``interval_s``
    once :meth:`start`\\ ed; devices come from ``rt`` (None: no device metrics, e.g. a replicas front)."""

    def __init__(self, service, history: History, rt=None, *, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.time):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.service = service
        self.history = history
        self.rt = rt
        self.interval_s = float(interval_s)
        self.clock = clock
        self._lock = threading.Lock()
        self._win = _Window()
        self._last_tick: float | None = None
        self._health: dict[int, int] = {}            # device -> last health code seen
        self._episode: dict[int, tuple] = {}         # device -> (event id, ts) of its first fault since OK
        self._failed: dict[str, int] = {}            # engine -> failed steps seen
        self._models: set[str] = set()               # models with a request since the start (per-model qps)
        self._listeners: list[Callable[[float, dict, dict], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0
        service.attach_observer(self)

    # -------------------------------------------------------------- what the server reports
    def observe(self, outcome: str, latency_s: float | None = None, model: str | None = None) -> None:
        """One request (to ``model`` when known) ended with ``outcome`` (a key of :data:`OUTCOMES`) after
        ``latency_s``."""
        ended, error, shed = OUTCOMES[outcome]
        with self._lock:
            w = self._win
            w.arrived += 1
            if ended:
                w.ended += 1
                if model:
                    w.by_model[model] = w.by_model.get(model, 0) + 1
                    self._models.add(model)
                if latency_s is not None:
                    w.latencies.append(float(latency_s))
            w.errors += error
            w.shed += shed

    def record(self, model: str, stats) -> None:
        """The stat-logger interface of the engines (:class:`runtime.serve.engine.stats.StatLogger`)."""
        if stats.time_to_first_tokens:
            with self._lock:
                self._win.ttfts.extend(stats.time_to_first_tokens)

    def engine_event(self, ev: dict) -> None:
        """An engine or front event: automatic re-binds are faults the engine detected; replica changes are
        lifecycle events (whoever asked for one records the action or manual intervention itself)."""
        kind = ev.get("kind")
        if kind in REPLICA_EVENTS:
            self.history.record_event("lifecycle", ts=self.clock(), source="replicas",
                                      diagnosis=REPLICA_EVENTS[kind].format(**ev),
                                      detail={k: v for k, v in ev.items() if k != "t"})
            return
        if kind not in ("fallback", "restore"):
            return
        reason = str(ev.get("reason", ""))
        if not reason.startswith("automatic"):
            return                                   # requested re-binds are recorded by who asked
        where = ev.get("placement") or "nowhere"
        diag = (f"{ev.get('model')}: {reason.removeprefix('automatic: ')}; moved from {ev.get('previous', '?')} "
                f"to {where}" if ev.get("ok") else f"{ev.get('model')}: {reason}; {ev.get('error', '')}")
        self.history.record_event("fault", ts=self.clock(), source="engine", diagnosis=diag,
                                  result="ok" if ev.get("ok") else f"failed: {ev.get('error', '')}",
                                  duration_s=ev.get("seconds"), detail={k: v for k, v in ev.items() if k != "t"})

    def listen(self, fn: Callable[[float, dict, dict], None]) -> None:
        """``fn(ts, server_samples, {device: samples})`` after every tick."""
        self._listeners.append(fn)

    def unlisten(self, fn: Callable[[float, dict, dict], None]) -> None:
        self._listeners.remove(fn)

    # -------------------------------------------------------------- sampling
    def tick(self, now: float | None = None) -> tuple[dict, dict]:
        """Take one sample of everything at ``now`` (default: the clock), record it, tell the listeners;
        returns (server samples, {device id: samples})."""
        now = self.clock() if now is None else float(now)
        with self._lock:
            w, self._win = self._win, _Window()
            dt = now - self._last_tick if self._last_tick is not None else self.interval_s
            self._last_tick = now
            models = sorted(self._models)
        dt = max(dt, 1e-6)
        server = {
            "qps": w.ended / dt,
            "p50_latency_ms": percentile(w.latencies, 50) * 1e3,
            "p95_latency_ms": percentile(w.latencies, 95) * 1e3,
            "p99_latency_ms": percentile(w.latencies, 99) * 1e3,
            "ttft_p99_ms": percentile(w.ttfts, 99) * 1e3,
            "error_rate": w.errors / w.ended if w.ended else math.nan,
            "shed_rate": w.shed / w.arrived if w.arrived else math.nan,
        }
        server.update(self.service.gauges())
        self._failed_steps(now)
        devices = self._devices(now)
        per_model = {model_scope(m): {"qps": w.by_model.get(m, 0) / dt} for m in models}
        self.history.record_tick(now, {"": server, **{device_scope(d): s for d, s in devices.items()}, **per_model})
        self.ticks += 1
        for fn in list(self._listeners):
            try:
                fn(now, server, devices)
            except Exception:  # noqa: BLE001 - a listener must not stop the sampling
                log.exception("sampler listener failed")
        return server, devices

    def _failed_steps(self, now: float) -> None:
        """Engine steps that failed since the last tick (task exceptions on a healthy placement): one
        ``fault`` event per engine and tick."""
        for name, e in list(self.service.engines.items()):
            n = getattr(e, "failed_steps", None)
            if n is None:
                continue
            before = self._failed.get(name, 0)
            self._failed[name] = n
            if n > before:
                self.history.record_event("fault", ts=now, source="engine",
                                          diagnosis=f"{name}: {n - before} step(s) failed on {e.placement} "
                                                    f"(their requests failed)",
                                          detail={"model": name, "failed_steps": n - before,
                                                  "placement": str(e.placement)})

    def _devices(self, now: float) -> dict[int, dict]:
        out: dict[int, dict] = {}
        if self.rt is None:
            return out
        for i in range(self.rt.device_count()):
            dev = self.rt.device(i)
            if dev.is_lost:
                out[i] = {"device_health": LOST}
                self._health_change(i, LOST, "Lost", [getattr(dev.handle, "lost_reason", "") or "lost"], now)
                continue
            try:
                t = dev.telemetry()
                level, reasons = dev.health()
            except Exception as e:  # noqa: BLE001 - an unreachable device reads as lost
                out[i] = {"device_health": LOST}
                self._health_change(i, LOST, "Lost", [str(e)], now)
                continue
            code = HEALTH_CODES.get(level, 3)
            out[i] = {"hbm_used_bytes": t["hbm_used"], "hbm_fragmentation": t["fragmentation"],
                      "device_temperature_c": t["temperature_c"], "device_power_w": t["power_w"],
                      "aicore_util": t["aicore_util_avg"], "device_health": code}
            pool = self._pool_fragmentation(dev)
            if pool is not None:
                out[i]["pool_fragmentation"] = pool
            self._health_change(i, code, level, reasons, now)
        return out

    @staticmethod
    def _pool_fragmentation(dev) -> float | None:
        """The caching pool's own fragmentation on ``dev`` (``memory_stats()["fragmentation"]``, the pool the
        engines allocate from); None when the device has no pool to report (no sample, not 0)."""
        try:
            return float(dev.memory_stats()["fragmentation"])
        except Exception:  # noqa: BLE001 - e.g. a bad VNPU_ALLOC_CONF: the pool has no stats to give
            return None

    def _health_change(self, dev: int, code: int, level: str, reasons: list[str], now: float) -> None:
        """A worse level than the last tick's is a ``fault`` event (the first of an episode is remembered);
        a better one a ``recovery`` event with the time since the episode's first fault (``duration_s``):
        a hang that clears, an overheat that cools, a restarted device.  Back at OK ends the episode."""
        before = self._health.get(dev, 0)
        self._health[dev] = code
        names = {c: n for n, c in HEALTH_CODES.items()}
        if code > before:
            why = "; ".join(str(r) for r in reasons if r) or level
            eid = self.history.record_event("fault", ts=now, source=device_scope(dev),
                                            diagnosis=f"device {dev} is {level}: {why}",
                                            detail={"device": dev, "level": level, "reasons": list(reasons)})
            self._episode.setdefault(dev, (eid, now))
        elif code < before:
            eid, t0 = self._episode.get(dev, (None, None))
            took = None if t0 is None else now - t0
            prev = names.get(before, str(before))
            rest = f" (still: {'; '.join(str(r) for r in reasons if r)})" if code and reasons else ""
            self.history.record_event("recovery", ts=now, source=device_scope(dev),
                                      diagnosis=f"device {dev} is {level} again (was {prev})"
                                                + (f" {took:.1f} s after its fault" if took is not None else "") + rest,
                                      result="ok" if code == 0 else "partial", duration_s=took,
                                      detail={"device": dev, "level": level, "previous": prev, "fault_event": eid,
                                              "reasons": list(reasons)})
            if code == 0:
                self._episode.pop(dev, None)

    # -------------------------------------------------------------- the thread
    def start(self) -> "Sampler":
        """Tick every ``interval_s`` on a thread (until :meth:`stop`)."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="vnpu-serve-sampler", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - keep sampling (a closed history ends at stop())
                log.exception("sampler tick failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
