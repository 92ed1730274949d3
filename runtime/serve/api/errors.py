"""OpenAI's error shape, ``{"error": {"message", "type", "param", "code"}}``, and the one table that maps
the engines' exceptions to HTTP statuses.  The Open Inference Protocol's routes (``/v2``) answer the same
statuses in their protocol's shape, ``{"error": "<message>"}`` (:func:`shaped`)."""
from __future__ import annotations

import json

from fastapi.responses import JSONResponse

from devices.errors import InvalidParamError

from ..circuit import CircuitOpen
from ..engine.errors import EngineFailure, InvalidRequest, ModelNotFound, QueueFull, ServeError, Unavailable
from ..tenants import Forbidden, RateLimited, Unauthorized, retry_headers

RETRY_AFTER_S = 1      #: what a 503 asks the client to wait (<= 120 s, or the official client gives up)

#: exception class -> (HTTP status, error type, default code)
ERRORS: dict[type, tuple[int, str, str | None]] = {
    InvalidRequest: (400, "invalid_request_error", None),
    InvalidParamError: (400, "invalid_request_error", None),
    Unauthorized: (401, "invalid_request_error", "invalid_api_key"),
    Forbidden: (403, "invalid_request_error", "insufficient_permissions"),
    ModelNotFound: (404, "invalid_request_error", "model_not_found"),
    RateLimited: (429, "requests", "rate_limit_exceeded"),
    QueueFull: (503, "server_error", "server_overloaded"),
    CircuitOpen: (503, "server_error", "circuit_open"),
    Unavailable: (503, "server_error", "service_unavailable"),
    EngineFailure: (500, "server_error", None),
}


def error_body(message: str, etype: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


def error_response(status: int, message: str, etype: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    h = dict(headers or {})
    if status == 503:
        h.setdefault("Retry-After", str(RETRY_AFTER_S))
    return JSONResponse(error_body(message, etype, param, code), status_code=status, headers=h)


def _entry(e: Exception) -> tuple[int, str, str | None] | None:
    return next((ERRORS[cls] for cls in type(e).__mro__ if cls in ERRORS), None)


def status_of(e: Exception) -> tuple[int, str]:
    """``e``'s HTTP status and message by the one table (500 and an internal error for anything else) --
    for transports that answer in another shape (gRPC)."""
    entry = _entry(e)
    if entry is None:
        return 500, f"internal error: {type(e).__name__}: {e}"
    return entry[0], e.message if isinstance(e, ServeError) else getattr(e, "detail", str(e))


def from_exception(e: Exception) -> JSONResponse:
    entry = _entry(e)
    if entry is None:
        return error_response(500, f"internal error: {type(e).__name__}: {e}", "server_error", None, None)
    status, etype, code = entry
    if isinstance(e, RateLimited):                 # OpenAI: type "requests" or "tokens"
        return error_response(status, e.message, e.limit, None, e.code or code, retry_headers(e))
    if isinstance(e, CircuitOpen):                 # Retry-After: when the breaker lets a probe through
        return error_response(status, e.message, etype, None, e.code or code, e.headers())
    if isinstance(e, ServeError):
        return error_response(status, e.message, etype, e.param, e.code or code)
    return error_response(status, getattr(e, "detail", str(e)), etype, None, code)


def v2_path(path: str) -> bool:
    """Whether ``path`` is one of the Open Inference Protocol's routes (KServe v2: ``/v2...``)."""
    return path == "/v2" or path.startswith("/v2/")


def shaped(path: str, resp: JSONResponse) -> JSONResponse:
    """An error response in OpenAI's shape as the route at ``path`` answers it: unchanged, or -- on a
    ``/v2`` route -- ``{"error": "<message>"}`` with the same status and headers (KServe v2, Triton)."""
    if not v2_path(path):
        return resp
    try:
        err = json.loads(resp.body)["error"]
        msg = err["message"] if isinstance(err, dict) else str(err)
    except (ValueError, KeyError, TypeError):
        return resp
    headers = {k: v for k, v in resp.headers.items() if k.lower() not in ("content-length", "content-type")}
    return JSONResponse({"error": msg}, status_code=resp.status_code, headers=headers)
