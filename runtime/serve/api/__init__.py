"""The HTTP side of ``vnpu serve``: OpenAI protocol models (:mod:`.protocol`), error shapes and the
exception -> status table (:mod:`.errors`), routes (:mod:`.routes`)."""
from .routes import build_app

__all__ = ["build_app"]
