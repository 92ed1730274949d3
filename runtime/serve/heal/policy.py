"""The policy engine: triggers over windows of samples, guardrails, actions, recovery, events and alerts.

:meth:`PolicyEngine.on_tick` is a sampler listener: every tick it appends each trigger's metric to the
trigger's window (one window per device for a device metric), and then per trigger and scope:

- idle: when the window is covered (``window`` seconds of samples) and its aggregate meets the condition,
  the trigger *fires* -- unless a guardrail holds it: its cooldown since its last action ended, the
  server's ``max_actions_per_hour``, or flapping (``flapping.max_fires`` fires within ``flapping.window``:
  held for ``flapping.hold``, with an alert).  Firing records a ``trigger`` event, runs the action
  (:mod:`.actions`), health-checks the result (``recovery.health_check``) and undoes it when the check
  fails (``recovery.rollback_on_failure``); the ``action`` event carries the trigger's value, a one-line
  diagnosis, the result and the time from detection (the first sample of the streak that met the
  condition) to recovery.
- active (an action with a release, e.g. throttle, fallback, scale_out): once its hold time has passed
  and the window meets the *release* condition (hysteresis: not the firing threshold), the action is
  released (throttle lifted, engine restored) and a ``recovery`` event records the whole episode.

A window that reaches ``risk_ratio`` (90 %) of an upper-bound trigger's threshold without firing is a
``risk`` event ("hbm_fragmentation on npu:1 reached 0.63, 0.90 of the 0.7 threshold of frag"), once per
approach.

Every action, release, suppression and flapping hold goes to the alert sinks (:mod:`.alerts`) and is an
``alert`` event with the delivery results.  Time is the tick's (injectable: tests replay minutes in
milliseconds); an action's own run time is added to its durations.

Blocking: a tick that fires or releases an action blocks until the action (a re-bind, a restart) and its
health check end.

A forecast metric (``forecast_qps``: :mod:`runtime.observe.forecast`) is the highest forecast request rate
within the trigger's ``lead`` (of the server, or of its ``model``): a trigger ``forecast_qps > 40`` with
``lead: 30m`` scales out about half an hour before a rise the history has seen every day.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from runtime.observe.forecast import FORECAST_METRICS, Forecaster, model_scope
from runtime.observe.metrics_store import METRICS, History

from .actions import ACTIONS, ActionUnavailable, Context, Fired, NotYet, Outcome
from .alerts import Sink, make_sink
from .spec import AGGREGATES, RELATIVE, SelfHealingSpec, TriggerSpec

log = logging.getLogger("vnpu.serve")

#: metrics sampled per device (a trigger on one of these runs per device scope)
DEVICE_METRICS = frozenset(m for m, (_, doc) in METRICS.items() if doc.startswith("per device"))


@dataclass
class _State:
    """One trigger on one scope."""
    window: deque = field(default_factory=deque)        # (ts, value)
    first_ts: float | None = None
    onset: float | None = None                          # first sample of the current streak meeting the condition
    active: Outcome | None = None
    fired_at: float = 0.0
    fired_value: float = 0.0
    event_id: int = 0
    last_end: float | None = None
    fires: deque = field(default_factory=deque)
    held_until: float = -math.inf
    suppressed: bool = False
    risky: bool = False
    release_failed: str = ""


class PolicyEngine:
    """Runs ``spec``'s triggers on sampler ticks, acting through ``ctx`` and recording into ``history``."""

    def __init__(self, spec: SelfHealingSpec, ctx: Context, history: History, server: str = ""):
        self.ctx = ctx
        self.history = history
        self.server = server
        self._lock = threading.RLock()
        self._states: dict[tuple[str, str], _State] = {}
        self._actions: deque = deque()                   # times of actions run (max_actions_per_hour)
        self.forecaster = Forecaster(history)            # forecast metrics (forecast_qps), cached per bin
        self.update(spec)

    def update(self, spec: SelfHealingSpec) -> None:
        """Take a new spec (reconfigure): triggers keep their state by name; sinks are rebuilt."""
        with self._lock:
            self.spec = spec
            rec = spec.recovery
            self.ctx.warmup_requests, self.ctx.rollback_on_failure = rec.warmup_requests, rec.rollback_on_failure
            self.ctx.move_back, self.ctx.return_after_s = rec.move_back, rec.return_after_s
            self.sinks: list[Sink] = [make_sink(a) for a in spec.alerts]
            names = {t.name for t in spec.triggers}
            for key in [k for k in self._states if k[0] not in names]:
                st = self._states.pop(key)
                if st.active is not None and st.active.release is not None:
                    self._release(key, st, None, time.time(), "its trigger was removed")

    # -------------------------------------------------------------- ticks
    def on_tick(self, now: float, server: dict, devices: dict) -> None:
        """The sampler's listener: evaluate every trigger on this tick's samples."""
        if not self.spec.enabled:
            return
        with self._lock:
            for t in self.spec.triggers:
                if t.metric in FORECAST_METRICS:
                    scope = model_scope(t.model) if t.model else ""
                    self._step(t, scope, now, self.forecaster.get(now, scope, FORECAST_METRICS[t.metric])
                               .peak(t.lead_s))
                elif t.metric in DEVICE_METRICS:
                    for d, samples in sorted(devices.items()):
                        if t.metric in samples:
                            self._step(t, f"npu:{d}", now, float(samples[t.metric]))
                elif t.metric in server:
                    self._step(t, "", now, float(server[t.metric]))

    def _step(self, t: TriggerSpec, scope: str, now: float, value: float) -> None:
        if value != value:                                     # NaN: no sample (no request ended)
            return
        key = (t.name, scope)
        st = self._states.setdefault(key, _State())
        st.window.append((now, value))
        if st.first_ts is None:
            st.first_ts = now
        while st.window and st.window[0][0] < now - t.window_s:
            st.window.popleft()
        if t.aggregate in RELATIVE:                            # a change over the window, not a level
            value = AGGREGATES[t.aggregate]([v for _, v in st.window])
        if t.condition.holds(value):
            st.onset = now if st.onset is None else st.onset
        elif st.active is None:
            st.onset = None
        if t.window_s > 0 and now - st.first_ts < t.window_s:
            return                                             # the window is not covered yet
        agg = AGGREGATES[t.aggregate]([v for _, v in st.window])
        if st.active is not None:
            rel = t.release_condition(self.spec.hysteresis)
            if now - st.fired_at >= st.active.hold_s and rel.holds(agg):
                self._release(key, st, t, now, f"{t.metric}{_at(scope)} {agg:.4g} {rel}")
            return
        if not t.condition.holds(agg):
            st.suppressed = False
            self._risk(t, scope, st, now, agg)
            return
        st.risky = False
        self._fire(t, scope, st, now, agg)

    def _risk(self, t: TriggerSpec, scope: str, st: _State, now: float, agg: float) -> None:
        """An upper-bound trigger whose window reached ``risk_ratio`` of its threshold without firing: one
        ``risk`` event per approach (again after falling back below the release threshold)."""
        c = t.condition
        if c.op not in (">", ">=") or c.threshold <= 0:
            return
        ratio = agg / c.threshold
        if ratio >= self.spec.risk_ratio and not st.risky:
            st.risky = True
            self.history.record_event("risk", ts=now, source="policy", trigger=t.name, value=agg,
                                      diagnosis=f"{t.metric}{_at(scope)} reached {agg:.4g}, {ratio:.2f} of the "
                                                f"{c.threshold:g} threshold of {t.name}",
                                      detail={"scope": scope, "metric": t.metric, "threshold": c.threshold,
                                              "ratio": ratio})
        elif st.risky and t.release_condition(self.spec.hysteresis).holds(agg) and ratio < self.spec.risk_ratio:
            st.risky = False

    # -------------------------------------------------------------- guardrails and firing
    def _cooldown(self, t: TriggerSpec) -> float:
        return self.spec.recovery.cooldown_s if t.cooldown_s is None else t.cooldown_s

    def _fire(self, t: TriggerSpec, scope: str, st: _State, now: float, agg: float) -> None:
        what = f"{t.metric}{_at(scope)} = {agg:.4g} {t.condition}" + (f" over {t.window_s:g} s" if t.window_s else "")
        if st.last_end is not None and now - st.last_end < self._cooldown(t):
            return                                             # cooling down: quiet (the action just ended)
        if now < st.held_until:
            return
        fl = self.spec.flapping
        while st.fires and st.fires[0] < now - fl.window_s:
            st.fires.popleft()
        if len(st.fires) >= fl.max_fires:
            st.held_until = now + fl.hold_s
            st.fires.clear()
            self._alert("critical", t.name, t.action, agg,
                        f"{t.name} is flapping: fired {fl.max_fires} times within {fl.window_s:g} s; held for "
                        f"{fl.hold_s:g} s ({what})", "held", None, {"scope": scope, "flapping": True})
            return
        while self._actions and self._actions[0] < now - 3600.0:
            self._actions.popleft()
        if len(self._actions) >= self.spec.max_actions_per_hour:
            if not st.suppressed:
                st.suppressed = True
                self._alert("critical", t.name, t.action, agg,
                            f"{t.name} suppressed: {len(self._actions)} actions in the last hour (max "
                            f"{self.spec.max_actions_per_hour}); {what}", "suppressed", None, {"scope": scope})
            return
        st.fires.append(now)
        self._actions.append(now)
        onset = st.onset if st.onset is not None else now
        self.history.record_event("trigger", ts=now, source="policy", trigger=t.name, value=agg, diagnosis=what,
                                  detail={"scope": scope, "metric": t.metric, "condition": str(t.condition),
                                          "window_s": t.window_s, "action": t.action})
        eid = self.history.record_event("action", ts=now, source="policy", trigger=t.name, value=agg,
                                        diagnosis=f"{t.action}: {what}",
                                        detail={"action": t.action, "scope": scope, "params": t.params})
        fired = Fired(t.name, t.metric, scope, agg, onset, dict(t.params))
        t0 = time.monotonic()
        outcome, result, detail = self._run(t, fired)
        took = time.monotonic() - t0
        duration = (now - onset) + took
        self.history.update_event(eid, result=result, duration_s=duration, detail=detail)
        severity = "warning" if result == "ok" else "critical"
        self._alert(severity, t.name, t.action, agg, f"{t.action}: {what}; {detail.get('summary', '')}".strip("; "),
                    result, duration, {"scope": scope, "action_event": eid})
        if result == "ok" and outcome is not None and outcome.release is not None:
            st.active, st.fired_at, st.fired_value, st.event_id = outcome, now, agg, eid
            st.release_failed = ""
        else:
            st.last_end = now + took
            st.onset = None

    def _run(self, t: TriggerSpec, fired: Fired) -> tuple[Outcome | None, str, dict]:
        rec = self.spec.recovery
        try:
            out = ACTIONS[t.action].run(self.ctx, fired)
        except ActionUnavailable as e:
            return None, f"unavailable: {e}", {"summary": f"unavailable: {e}"}
        except Exception as e:  # noqa: BLE001 - the action failed; the server keeps running
            log.warning("self-healing %s: %s failed: %s", t.name, t.action, e)
            return None, f"failed: {type(e).__name__}: {e}", {"summary": f"failed: {e}"}
        detail = {"summary": out.summary, **out.detail}
        if rec.health_check and out.check is not None:
            ok, why = out.check()
            detail["health_check"] = why
            if not ok:
                if rec.rollback_on_failure and out.undo is not None:
                    try:
                        undone = out.undo()
                    except Exception as e:  # noqa: BLE001
                        undone = f"rollback failed: {e}"
                    detail["rollback"] = undone
                    return None, f"failed: health check: {why}; rolled back ({undone})", detail
                return None, f"failed: health check: {why}", detail
        return out, "ok", detail

    def _release(self, key, st: _State, t: TriggerSpec | None, now: float, why: str) -> None:
        assert st.active is not None and st.active.release is not None
        t0 = time.monotonic()
        try:
            msg = st.active.release()
        except NotYet:
            return                                             # not due yet (a recovering device): next tick
        except Exception as e:  # noqa: BLE001 - try again on the next tick
            err = f"{type(e).__name__}: {e}"
            if st.release_failed != err:
                st.release_failed = err
                self.history.record_event("recovery", ts=now, source="policy", trigger=key[0],
                                          diagnosis=f"{key[0]}: release failed ({why}): {err}; retrying",
                                          result=f"failed: {err}", detail={"scope": key[1]})
            return
        took = time.monotonic() - t0
        onset = st.onset if st.onset is not None else st.fired_at
        duration = (now - onset) + took
        self.history.record_event("recovery", ts=now, source="policy", trigger=key[0], value=st.window[-1][1]
                                  if st.window else None, diagnosis=f"{key[0]} released: {why}; {msg}", result="ok",
                                  duration_s=duration, detail={"scope": key[1], "action_event": st.event_id})
        self._alert("info", key[0], "release", st.window[-1][1] if st.window else None,
                    f"{key[0]} released: {why}; {msg}", "ok", duration, {"scope": key[1]})
        st.active, st.onset, st.last_end = None, None, now + took

    # -------------------------------------------------------------- alerts
    def _alert(self, severity: str, trigger: str, action: str, value, diagnosis: str, result: str,
               duration: float | None, extra: dict) -> None:
        alert = {"ts": time.time(), "severity": severity, "trigger": trigger, "action": action, "value": value,
                 "diagnosis": diagnosis, "result": result, "duration_s": duration, "server": self.server, **extra}
        delivered = {}
        for s in self.sinks:
            try:
                s.send(alert)
                delivered[str(s)] = "ok"
            except Exception as e:  # noqa: BLE001 - a sink's failure is reported, never raised
                delivered[str(s)] = f"failed: {e}"
                log.warning("alert sink %s failed: %s", s, e)
        self.history.record_event("alert", source="policy", trigger=trigger, value=value, diagnosis=diagnosis,
                                  result=result, duration_s=duration, detail={"severity": severity, "sinks": delivered,
                                                                              **extra})

    # -------------------------------------------------------------- state
    def active(self) -> dict[str, str]:
        """``trigger@scope`` -> what its active action did."""
        with self._lock:
            return {f"{k[0]}{_at(k[1])}": s.active.summary for k, s in self._states.items() if s.active is not None}


def _at(scope: str) -> str:
    return f" on {scope}" if scope else ""
