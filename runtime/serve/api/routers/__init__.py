"""One FastAPI router per endpoint family; :func:`runtime.serve.api.app.build_app` includes
:data:`ROUTERS` in this order.  Each reads the server's shared state through
:func:`runtime.serve.api.state.serve_state` and handles its callers through :mod:`..handling`."""
from . import admin, chat, completions, embeddings, history, models

ROUTERS = (admin.router, models.router, history.router, completions.router, chat.router, embeddings.router)

__all__ = ["ROUTERS"]
