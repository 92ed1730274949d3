"""One FastAPI router per endpoint family; :func:`runtime.serve.api.app.build_app` includes
:data:`ROUTERS` in this order.  Each reads the server's shared state through
:func:`runtime.serve.api.state.serve_state` and handles its callers through :mod:`..handling`."""
from ...v2 import http_infer, http_routes
from . import admin, chat, completions, embeddings, history, models

#: the OpenAI routers, then the Open Inference Protocol's (KServe v2, :mod:`runtime.serve.v2`)
ROUTERS = (admin.router, models.router, history.router, completions.router, chat.router, embeddings.router,
           http_routes.router, http_infer.router)

__all__ = ["ROUTERS"]
