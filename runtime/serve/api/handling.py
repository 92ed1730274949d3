"""How every route handles a request, whatever its endpoint: the caller's tenant (401/403), its quota
check and ticket (429, counted per tenant), the settlement of the ticket to the tokens really used, the
refusals of the one error table in OpenAI's shape (never a traceback; a refused admin action is one log
line), and the middleware that tags each response with ``x-request-id`` and reports a model request's
outcome to the sampler.  Runs on the event loop; :func:`blocking` moves a blocking call off it."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.errors import QueueFull, ServeError
from ..tenants import Forbidden, RateLimited, Tenant
from .errors import ERRORS, error_response, from_exception, shaped
from .state import ServeState, serve_state, state_of

log = logging.getLogger("vnpu.serve")

#: the routes whose requests the sampler counts (qps, latency, error and shed rates); with the Open
#: Inference Protocol's inference routes (:func:`model_route`)
MODEL_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/embeddings"})


def model_route(path: str) -> bool:
    """Whether a request to ``path`` is a model request the sampler counts: an OpenAI model route or a
    ``POST /v2/models/{m}[/versions/{v}]/infer``."""
    return path in MODEL_ROUTES or (path.startswith("/v2/models/") and path.endswith("/infer"))

#: exception classes that mean "shed by admission control" (not a server failure)
SHED = (RateLimited, QueueFull)


def outcome_of(status: int, exc: BaseException | None, admitted: bool) -> str:
    """A model request's outcome for the sampler: ``ok``; ``shed`` (over quota, queue full, or a 503
    before admission -- the server not admitting); ``client`` (4xx); ``error`` (any other 5xx)."""
    if status < 400:
        return "ok"
    if isinstance(exc, SHED) or status == 429 or (status == 503 and not admitted):
        return "shed"
    if status < 500:
        return "client"
    return "error"


class CountRequests:
    """HTTP middleware (plain ASGI): ``x-request-id`` on every response (the caller's, or a new one), the
    tenant's request counter by status, and a (non-streamed) model request's outcome and latency to the
    sampler -- all when the response starts, from what the handler left on ``request.state``.  Plain ASGI
    rather than ``@app.middleware("http")``: that one runs every request through a task group and memory
    streams of its own, a large part of the event loop's time per inference request in a profile."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.monotonic()
        rid = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id" and v), None) \
            or uuid.uuid4().hex
        state = scope.setdefault("state", {})

        async def sending(message):
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["x-request-id"] = rid
                _count(scope, state, message["status"], t0)
            await send(message)

        await self.app(scope, receive, sending)


def _count(scope, state: dict, status: int, t0: float) -> None:
    st = state_of(scope["app"])
    t = state.get("tenant")
    if t is not None:
        st.tenant_metrics.requests.labels(t.name, str(status)).inc()
    path = scope["path"]
    if model_route(path) and not state.get("streaming", False):
        outcome = outcome_of(status, state.get("exc"), state.get("admitted", False))
        st.service.observe(outcome, time.monotonic() - t0, state.get("model") or v2_model(path))
        if t is not None:
            st.service.breakers.record(t, outcome)


def v2_model(path: str) -> str | None:
    """The model of a ``/v2/models/{m}[/versions/{v}]/infer`` path (None for another path)."""
    parts = path.split("/")
    return parts[3] if len(parts) >= 5 and parts[1:3] == ["v2", "models"] and parts[-1] == "infer" else None


# ---------------------------------------------------------------------------------------------- the caller
async def tenant_of(request: Request) -> Tenant:
    """The caller's tenant (401 without a valid key)."""
    t = serve_state(request).service.tenants.authenticate(request.headers.get("authorization"))
    request.state.tenant = t
    return t


async def admin_of(request: Request) -> Tenant:
    """The caller's tenant, which must hold an admin key (403 otherwise)."""
    t = await tenant_of(request)
    if not t.admin:
        raise Forbidden(f"tenant {t.name} has no admin key; this endpoint needs one")
    return t


def note_tokens(request: Request, prompt: int, completion: int = 0) -> None:
    """The tokens a request's model computed (prompt, generated), for its access-log line."""
    request.state.tokens = (int(prompt), int(completion))


# ---------------------------------------------------------------------------------------------- quotas
def _counted(service, tenant: Tenant, check, tokens: int):
    try:
        return check(tenant, tokens)
    except RateLimited as e:
        service.tenant_metrics.rate_limited.labels(tenant.name, e.limit).inc()
        raise


def precheck(request: Request, tenant: Tenant, min_tokens: int) -> None:
    """Before tokenizing: 429 now when the quotas will refuse a request of at least ``min_tokens``."""
    st = serve_state(request)
    _counted(st.service, tenant, st.service.quotas.precheck, min_tokens)


def admit_tenant(service, tenant: Tenant, tokens: int, hbm: int = 0):
    """``tenant``'s quota ticket for ``tokens`` and ``hbm`` bytes of device memory from ``service``'s quotas
    (429 over quota, counted per tenant; 503 while the tenant's circuit breaker is open) -- for any transport
    (the gRPC side has no HTTP request)."""
    service.breakers.check(tenant)
    return _counted(service, tenant, lambda t, n: service.quotas.admit(t, n, hbm), tokens)


def admit(request: Request, tenant: Tenant, tokens: int, hbm: int = 0):
    """The tenant's quota ticket for ``tokens`` and ``hbm`` bytes (429 over quota); the request counts as
    admitted."""
    ticket = admit_tenant(serve_state(request).service, tenant, tokens, hbm)
    request.state.admitted = True
    return ticket


def settle(st: ServeState, ticket, tenant: Tenant, model: str, ptoks: int, ctoks: int) -> None:
    """Settle ``ticket`` to the tokens the engine really used, and count them per tenant and model."""
    ticket.settle(ptoks, ctoks)
    if ptoks:
        st.tenant_metrics.tokens.labels(tenant.name, model, "prompt").inc(ptoks)
    if ctoks:
        st.tenant_metrics.tokens.labels(tenant.name, model, "generation").inc(ctoks)


async def blocking(fn, *args):
    """``fn(*args)`` on the event loop's default executor (a blocking call never runs on the loop)."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


# ---------------------------------------------------------------------------------------------- refusals
def _admin_refused(request: Request, status: int, why) -> None:
    """A refused admin action is one line in the server's log (no traceback).  A call without a valid key
    (401) or with a tenant's key that is not an admin's (403) is not an admin action: nothing at the warning
    level (403 at debug), so that callers who are not the operator cannot flood the log."""
    if not request.url.path.startswith("/admin/") or status == 401:
        return
    if status == 403:
        log.debug("admin %s %s refused (403): %s", request.method, request.url.path, why)
    else:
        log.warning("admin %s %s refused (%d): %s", request.method, request.url.path, status, why)


async def _bad_request(request: Request, exc: RequestValidationError):
    errs = exc.errors()
    first = errs[0] if errs else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return error_response(400, f"the request body is not valid JSON: {first.get('msg', '')}",
                              "invalid_request_error", None, "invalid_json")
    msg = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body')}: {e.get('msg')}" for e in errs)
    _admin_refused(request, 400, msg)
    return error_response(400, msg or "invalid request", "invalid_request_error", loc[0] if loc else None)


async def _http_error(request: Request, exc: StarletteHTTPException):
    return error_response(exc.status_code, str(exc.detail), "invalid_request_error")


async def _refused(request: Request, exc: Exception):
    """An error of the one table (:data:`.errors.ERRORS`): its status in OpenAI's shape, handled here
    (not by the server-error middleware, which logs a traceback); a refused admin action is one line."""
    request.state.exc = exc
    resp = from_exception(exc)
    _admin_refused(request, resp.status_code, getattr(exc, "message", None) or getattr(exc, "detail", None) or exc)
    return resp


async def _other_error(request: Request, exc: Exception):
    request.state.exc = exc
    return from_exception(exc)


def _shaped(handler):
    """``handler``'s response in the shape of the route that failed (:func:`.errors.shaped`)."""
    async def handle(request: Request, exc: Exception):
        return shaped(request.url.path, await handler(request, exc))
    return handle


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal in OpenAI's error shape (the Open Inference Protocol's on ``/v2`` routes): bad fields
    (400), HTTP errors, the error table, anything else (500)."""
    app.add_exception_handler(RequestValidationError, _shaped(_bad_request))
    app.add_exception_handler(StarletteHTTPException, _shaped(_http_error))
    for cls in (ServeError, *ERRORS):
        app.add_exception_handler(cls, _shaped(_refused))
    app.add_exception_handler(Exception, _shaped(_other_error))
