"""The HTTP side of ``vnpu serve``: OpenAI protocol models (:mod:`.protocol`), error shapes and the
exception -> status table (:mod:`.errors`), routes (:mod:`.routes`); against hostile clients, uvicorn's
protocol with header deadlines and per-address caps (:mod:`.connections`), the guard in front of the routes
(:mod:`.guard`), size floors (:mod:`.sizes`) and the tokenize pool (:mod:`.tokenize_pool`)."""
from .routes import build_app

__all__ = ["build_app"]
