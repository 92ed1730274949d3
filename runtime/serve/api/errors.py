"""OpenAI's error shape, ``{"error": {"message", "type", "param", "code"}}``, and the one table that maps
the engines' exceptions to HTTP statuses."""
from __future__ import annotations

from fastapi.responses import JSONResponse

from devices.errors import InvalidParamError

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


def from_exception(e: Exception) -> JSONResponse:
    for cls in type(e).__mro__:
        if cls in ERRORS:
            status, etype, code = ERRORS[cls]
            if isinstance(e, RateLimited):                 # OpenAI: type "requests" or "tokens"
                return error_response(status, e.message, e.limit, None, e.code or code, retry_headers(e))
            if isinstance(e, ServeError):
                return error_response(status, e.message, etype, e.param, e.code or code)
            return error_response(status, getattr(e, "detail", str(e)), etype, None, code)
    return error_response(500, f"internal error: {type(e).__name__}: {e}", "server_error", None, None)
