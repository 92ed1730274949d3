"""The models of the Open Inference Protocol as one caller may see them, for both transports: the server's
:class:`~runtime.serve.v2.repository.ModelRepositoryView` (``service.model_repository``; a server without
one serves no model here), a tenant limited to some models gets 404 for the others (as for the OpenAI
routes), repository control and statistics need an admin key (they act on, or tell about, every tenant's
traffic), and the server's liveness and readiness.  Nothing here blocks (the view answers these at once)."""
from __future__ import annotations

from ..engine.errors import ModelNotFound
from ..tenants import Forbidden, Tenant
from .repository import IndexEntry, ModelRepositoryView

#: server states in which it is live (answers); ready: only "ready"
LIVE_STATES = ("starting", "ready", "draining")


def not_found(name: str) -> ModelNotFound:
    return ModelNotFound(f"model {name!r} is not served here (or you do not have access to it)", "model",
                         "model_not_found")


def repository_of(service) -> ModelRepositoryView | None:
    """The server's model repository view (None: it serves no model over this protocol)."""
    return getattr(service, "model_repository", None)


def model_view(service, tenant: Tenant, name: str) -> ModelRepositoryView:
    """The view serving ``name`` as ``tenant`` may see it (404 for a model it may not use, or on a server
    without a repository)."""
    repo = repository_of(service)
    if repo is None or not tenant.may_use(name):
        raise not_found(name)
    return repo


def visible_index(service, tenant: Tenant, ready_only: bool = False) -> list[IndexEntry]:
    repo = repository_of(service)
    entries = repo.index() if repo is not None else []
    return [e for e in entries if tenant.may_use(e.name) and (not ready_only or e.state == "READY")]


def need_admin(tenant: Tenant, what: str) -> None:
    if not tenant.admin:
        raise Forbidden(f"tenant {tenant.name} has no admin key; {what} needs one")


def live(service) -> bool:
    return service.state in LIVE_STATES


def ready(service) -> bool:
    return service.health()[0] == 200
