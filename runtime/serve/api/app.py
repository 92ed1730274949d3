"""The OpenAI-compatible app: :func:`build_app` puts the server's shared state on ``app.state``
(:class:`.state.ServeState`), wires the middleware and the error handlers (:mod:`.handling`) and includes
one router per endpoint family (:mod:`.routers`: completions, chat, embeddings, models, admin, history).
Each handler translates the wire request into engine calls and the engine's outputs back into the wire
format; the logic lives in the engines and the service.

Generation (:mod:`.generation`, :mod:`.streaming`): requests go to the engine with an ``on_output``
callback that hands every increment to the event loop; a client that disconnects (stream closed, or
connection dropped while waiting for a non-streamed answer) aborts its requests, which frees their KV
blocks at the engine's next step; its handler returns (a 499 nobody reads) rather than raising, so a
dropped client is never a traceback.

Tenants (:mod:`runtime.serve.tenants`): every ``/v1`` route authenticates its caller (``Authorization:
Bearer``; 401 otherwise), looks models up as that tenant may see them, runs the request at the tenant's
effective priority, and holds a quota ticket from admission until the response (or the stream) ends,
when it is settled to the tokens really used -- by the engine's own count of what it did (prompt tokens
computed, tokens generated), also for a client that went away: its slot is freed at once, its charge
settled once the engine has finished the aborted requests.  Refusals of the one error table
(:data:`.errors.ERRORS`) are answered in OpenAI's shape, never as a traceback; a refused admin action is
one log line.  ``/metrics`` and ``/admin/*`` need an admin key (403); ``/health`` is open (probes);
``/v1/usage`` shows the caller its own usage only.

Observability (admin): every model request's outcome goes to the service's sampler
(:func:`.handling.outcome_of`: served, server error, client error, shed); ``GET
/admin/history/samples|events|latest`` read the server's History (``latest?after=T&wait_s=S``: a long
poll for the next sample, what a dashboard or a test waits on instead of polling), ``POST /admin/events``
records an operator command's event, ``POST /admin/reconfigure`` changes the running config; the admin
commands (fallback, restore, throttle, replicas, reconfigure) are recorded as manual interventions.

Hostile clients: in front of the routes the server's :mod:`.guard` authenticates from the headers and
bounds the body (size, deadline) before anything reads it.  A prompt or embeddings input is sized from its
text first (:mod:`.sizes`: what certainly exceeds the context or the tenant's quota is refused before any
work), then tokenized on the :class:`.tokenize_pool.TokenizePool` (tenants in turn), never on the loop.
"""
from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute

from .handling import CountRequests, install_error_handlers
from .longpoll import LongPolls
from .routers import ROUTERS
from .state import ServeState, attach
from .tokenize_pool import TokenizePool


def build_app(service, tokenizer: TokenizePool | None = None) -> FastAPI:
    """The FastAPI app over ``service`` (a :class:`runtime.serve.server.Frontend`); prompts and inputs are
    tokenized on ``tokenizer`` (default: a pool of the app's own), never on the event loop.  The server
    closes the app's long polls when it stops (:func:`.state.state_of`)."""
    app = FastAPI(title="vnpu serve", docs_url=None, redoc_url=None, openapi_url=None)
    attach(app, ServeState(service, tokenizer or TokenizePool(), LongPolls()))
    app.add_middleware(CountRequests)
    install_error_handlers(app)
    for router in ROUTERS:
        _include(app, router)
    return app


def _include(app: FastAPI, router: APIRouter) -> None:
    """The router's routes as the app's own routes, each as ``@app.get``/``@app.post`` would add it: the
    app's route list is flat on every FastAPI version (recent versions keep an ``include_router`` as one
    lazy entry, routed through its own dispatch), so requests take the same path and ``app.routes`` lists
    every route and its body model."""
    for r in router.routes:
        if not isinstance(r, APIRoute):
            raise TypeError(f"{r!r} is not an APIRoute: a router here holds HTTP routes only")
        app.add_api_route(r.path, r.endpoint, methods=r.methods, name=r.name)
