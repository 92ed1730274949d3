"""What the routers share, on ``app.state``: one typed record (:class:`ServeState`) that
:func:`runtime.serve.api.app.build_app` puts there once, and :func:`serve_state`, the one way a route or a
dependency reads it (no route reaches into ``app.state`` by name)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request

from .longpoll import LongPolls
from .tokenize_pool import TokenizePool


@dataclass(frozen=True)
class ServeState:
    """The server's side of every route: ``service`` (a :class:`runtime.serve.server.Frontend`: engines,
    tenants and quotas, the sampler, the History, the admin actions), the ``tokenizer`` pool prompts are
    tokenized on, and the History's ``long_polls`` in flight (the server closes them when it stops).  The
    service is not typed as the server's class: the server imports this package, not the reverse."""
    service: Any
    tokenizer: TokenizePool
    long_polls: LongPolls

    @property
    def tenant_metrics(self) -> Any:
        """The per-tenant Prometheus counters (requests, tokens, rate limits)."""
        return self.service.tenant_metrics


def attach(app: FastAPI, state: ServeState) -> None:
    """Put ``state`` on ``app`` (once, when the app is built)."""
    app.state.serve = state


def state_of(app: FastAPI) -> ServeState:
    """The shared state of an app built by :func:`runtime.serve.api.app.build_app`."""
    st = app.state.serve
    if not isinstance(st, ServeState):
        raise TypeError(f"app.state.serve is {type(st).__name__}, not ServeState: the app was not built by build_app")
    return st


def serve_state(request: Request) -> ServeState:
    """The shared state of the app serving ``request`` (a FastAPI dependency)."""
    return state_of(request.app)
