"""The server's metrics History (``vnpu monitor`` / ``diagnose`` / ``postmortem``), admin key only:
``GET /admin/history/samples|events|latest`` read it (``latest?after=T&wait_s=S``: a long poll for the
next sample, what a dashboard or a test waits on instead of polling), ``POST /admin/events`` records an
operator command's event.  The reads run off the event loop; a long poll holds no thread
(:class:`..longpoll.LongPolls`)."""
from __future__ import annotations

import math

from fastapi import APIRouter, Depends

from runtime.observe.forecast import Forecaster

from ...engine.errors import InvalidRequest
from ...tenants import Tenant
from .. import protocol as P
from ..handling import admin_of, blocking
from ..longpoll import MAX_HISTORY_WAIT_S
from ..state import ServeState, serve_state

router = APIRouter()

#: the event kinds the History holds (``POST /admin/events`` accepts these)
EVENT_KINDS = ("fault", "trigger", "action", "recovery", "config", "alert", "manual", "lifecycle", "risk")


def _history(st: ServeState):
    h = st.service.history
    if h is None:
        raise InvalidRequest("this server keeps no metrics history", None, "no_history")
    return h


@router.get("/admin/history/samples")
async def history_samples(metric: str, since: float | None = None, until: float | None = None, scope: str = "",
                          tenant: Tenant = Depends(admin_of), st: ServeState = Depends(serve_state)):
    try:
        pts = await blocking(_history(st).samples, metric, since, until, scope)
    except ValueError as e:                              # an unknown metric
        raise InvalidRequest(str(e), "metric") from None
    return {"metric": metric, "scope": scope, "points": [[t, v] for t, v in pts]}


@router.get("/admin/history/forecast")
async def history_forecast(tenant: Tenant = Depends(admin_of), st: ServeState = Depends(serve_state)):
    """The next hour's forecast request rate of the server and each model as of the newest sample
    (``vnpu monitor`` shows it)."""
    h = _history(st)
    fc = st.service.forecaster or Forecaster(h)
    fs = await blocking(fc.all)
    return {"forecasts": [f.to_dict() for f in fs]}


@router.get("/admin/history/events")
async def history_events(since: float | None = None, until: float | None = None, kinds: str | None = None,
                         limit: int | None = None, tenant: Tenant = Depends(admin_of),
                         st: ServeState = Depends(serve_state)):
    if limit is not None and limit < 1:
        raise InvalidRequest(f"limit must be >= 1, got {limit}", "limit")
    ks = [k for k in kinds.split(",") if k] if kinds else None
    evs = await blocking(_history(st).events, since, until, ks, limit)
    return {"events": [e.to_dict() for e in evs]}


@router.get("/admin/history/latest")
async def history_latest(after: float | None = None, wait_s: float | None = None,
                         tenant: Tenant = Depends(admin_of), st: ServeState = Depends(serve_state)):
    """The newest sample of every metric.  A long poll with ``wait_s`` (at most
    :data:`MAX_HISTORY_WAIT_S`): answers once the server has a sample newer than ``after`` (any sample
    without it) or when ``wait_s`` has passed or the server stops -- the newest samples either way.  The
    wait holds no thread (:class:`LongPolls`); ``/admin/state`` counts the polls waiting
    (``history_long_polls``)."""
    h = _history(st)
    if wait_s is not None:
        if not 0 < wait_s <= MAX_HISTORY_WAIT_S:
            raise InvalidRequest(f"wait_s must be in (0, {MAX_HISTORY_WAIT_S:g}], got {wait_s:g}", "wait_s")
        if after is not None and not math.isfinite(after):
            raise InvalidRequest(f"after must be a finite time (seconds), got {after:g}", "after")
        await st.long_polls.wait_newer(h, after, wait_s)
    elif after is not None:
        raise InvalidRequest("after goes with wait_s (a long poll)", "after")

    def read():
        devs = sorted({s for m in ("device_health", "device_temperature_c") for s in h.scopes(m) if s})
        return {"server": {m: list(v) for m, v in h.latest("").items()},
                "devices": {d: {m: list(v) for m, v in h.latest(d).items()} for d in devs}}
    return await blocking(read)


@router.post("/admin/events")
async def post_event(body: P.EventRequest, tenant: Tenant = Depends(admin_of), st: ServeState = Depends(serve_state)):
    if body.kind not in EVENT_KINDS:
        raise InvalidRequest(f"unknown event kind {body.kind!r} (known: {', '.join(EVENT_KINDS)})", "kind")
    eid = await blocking(lambda: _history(st).record_event(
        body.kind, source=body.source or f"admin {tenant.name}", manual=body.manual, diagnosis=body.diagnosis,
        result=body.result, detail=body.detail))
    return {"id": eid}
