"""The HTTP side of ``vnpu serve``: OpenAI protocol models (:mod:`.protocol`), error shapes and the
exception -> status table (:mod:`.errors`), the app (:mod:`.app`) with one router per endpoint family
(:mod:`.routers`) over the shared state (:mod:`.state`), request handling (:mod:`.handling`), generation
(:mod:`.generation`, :mod:`.streaming`); against hostile clients, uvicorn's protocol with header deadlines
and per-address caps (:mod:`.connections`), the guard in front of the routes (:mod:`.guard`), size floors
(:mod:`.sizes`) and the tokenize pool (:mod:`.tokenize_pool`)."""
from .app import build_app

__all__ = ["build_app"]
