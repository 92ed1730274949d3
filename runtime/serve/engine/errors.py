"""What an engine refuses, as typed exceptions (the API maps each to an HTTP status in one table)."""
from __future__ import annotations


class ServeError(Exception):
    """Base of the serving errors; ``param`` names the request field at fault (or None)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code

    def __reduce__(self):                 # crosses process boundaries (Ray Serve replicas) intact
        return (type(self), (self.message, self.param, self.code))


class InvalidRequest(ServeError):
    """Bad parameters or a prompt that cannot fit (HTTP 400)."""


class ModelNotFound(ServeError):
    """No such model served here (HTTP 404, ``model_not_found``)."""


class QueueFull(ServeError):
    """Admission control: the engine's waiting queue is full (HTTP 503 + Retry-After)."""


class Unavailable(ServeError):
    """The engine is starting, draining or failed (HTTP 503)."""


class EngineFailure(ServeError):
    """A batch failed on the device (a task exception on a healthy placement): its requests fail (HTTP
    500, ``server_error``); the engine goes on."""
