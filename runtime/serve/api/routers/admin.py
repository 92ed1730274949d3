"""The server's operational endpoints: ``GET /health`` (open: probes), ``GET /metrics`` and ``/admin/*``
(an admin key): the state, and the operator's commands -- fallback, restore, defragment, throttle,
replicas, reconfigure -- each recorded in the History as a manual intervention (reconfigure records its
own ``config`` event).  A blocking action runs off the event loop (:func:`..handling.blocking`)."""
from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ...engine.errors import InvalidRequest
from ...tenants import Tenant
from .. import protocol as P
from ..handling import admin_of, blocking
from ..longpoll import MAX_HISTORY_WAIT_S
from ..state import ServeState, serve_state

router = APIRouter()


def _manual(st: ServeState, tenant: Tenant, what: str, detail: dict | None = None, result: str = "ok") -> None:
    """An operator's command through the admin routes: a manual intervention in the History."""
    if st.service.history is not None:
        st.service.history.record_event("manual", source=f"admin {tenant.name}", manual=True, diagnosis=what,
                                        result=result, detail=detail or {})


@router.get("/health")
async def health(deep: bool = False, st: ServeState = Depends(serve_state)):
    """The server's state; ``?deep=true``: also a tiny kernel on every device and a one-token request through
    every model (503 when one fails; see :mod:`runtime.serve.heal.deep`)."""
    status, body = await blocking(st.service.deep_health) if deep else st.service.health()
    return JSONResponse(body, status_code=status, headers={"Retry-After": "1"} if status == 503 else None)


@router.get("/metrics")
async def metrics(tenant: Tenant = Depends(admin_of), st: ServeState = Depends(serve_state)):
    data = await blocking(generate_latest, st.service.registry)
    return Response(data, media_type=CONTENT_TYPE_LATEST)


@router.get("/admin/state")
async def admin_state(long_polls: int | None = None, wait_s: float | None = None,
                      tenant: Tenant = Depends(admin_of), st: ServeState = Depends(serve_state)):
    """The server's state; with ``long_polls=N&wait_s=S`` it answers once at least N history long polls
    are parked (or after S, at most MAX_HISTORY_WAIT_S) -- a wait, not a poll loop."""
    if (long_polls is None) != (wait_s is None):
        raise InvalidRequest("long_polls and wait_s go together", "long_polls" if wait_s is None else "wait_s")
    if long_polls is not None and wait_s is not None:
        if long_polls < 0:
            raise InvalidRequest(f"long_polls must be >= 0, got {long_polls}", "long_polls")
        if not 0 < wait_s <= MAX_HISTORY_WAIT_S:
            raise InvalidRequest(f"wait_s must be in (0, {MAX_HISTORY_WAIT_S:g}], got {wait_s:g}", "wait_s")
        await st.long_polls.parked(long_polls, wait_s)
    return {**st.service.state_dict(), "history_long_polls": st.long_polls.waiting()}


@router.post("/admin/models/{model_id}/fallback")
async def admin_fallback(model_id: str, tenant: Tenant = Depends(admin_of), st: ServeState = Depends(serve_state)):
    res = asdict(await blocking(st.service.fallback, model_id, f"admin {tenant.name}"))
    _manual(st, tenant, f"fallback {model_id}: {res['placement']}", res)
    return res


@router.post("/admin/models/{model_id}/restore")
async def admin_restore(model_id: str, tenant: Tenant = Depends(admin_of), st: ServeState = Depends(serve_state)):
    res = asdict(await blocking(st.service.restore, model_id))
    _manual(st, tenant, f"restore {model_id}: {res['placement']}", res)
    return res


@router.post("/admin/defragment")
async def admin_defragment(tenant: Tenant = Depends(admin_of), st: ServeState = Depends(serve_state)):
    return {"devices": await blocking(st.service.defragment)}


@router.post("/admin/throttle")
async def admin_throttle(body: P.ThrottleRequest, tenant: Tenant = Depends(admin_of),
                         st: ServeState = Depends(serve_state)):
    res = await blocking(st.service.throttle, body.factor)
    _manual(st, tenant, f"throttle to {body.factor:g}", res)
    return res


@router.post("/admin/replicas")
async def admin_replicas(body: P.ScaleRequest, tenant: Tenant = Depends(admin_of),
                         st: ServeState = Depends(serve_state)):
    scale = getattr(st.service, "scale_to", None)
    if scale is None:
        raise InvalidRequest("this server runs its engines in-process (start it with --replicas for Ray "
                             "Serve replicas)", "replicas")
    res = await blocking(scale, body.replicas)
    _manual(st, tenant, f"scale to {body.replicas} replica(s)", {"replicas": body.replicas})
    return res


@router.post("/admin/reconfigure")
async def admin_reconfigure(body: P.ReconfigureRequest, tenant: Tenant = Depends(admin_of),
                            st: ServeState = Depends(serve_state)):
    rc = st.service.reconfigurer
    if rc is None:
        raise InvalidRequest("this server cannot be reconfigured (it was started without a config manager)")
    return await blocking(rc.apply, body.config, list(body.set), f"admin {tenant.name}")
