"""The Open Inference Protocol's (KServe v2) REST routes other than inference: health, server and model
metadata, model readiness and configuration, the model repository (Triton's extension) and statistics
(Triton's extension).

- ``GET /v2/health/live|ready`` -- open (probes, like ``/health``): 200, or 400 when not (the protocol:
  "4xx means false"); ``GET /v2`` -- the server's name, version and extensions.
- ``GET /v2/models/{m}[/versions/{v}]``, ``.../ready`` (200, or 400 while not ready), ``.../config``.
- ``POST /v2/repository/index`` (the models the caller may use; body ``{"ready": true}`` for the ready
  ones), ``POST /v2/repository/models/{m}/load|unload`` and ``GET /v2/models[/{m}[/versions/{v}]]/stats``
  (an admin key: they act on, or tell about, every tenant's traffic).

Every refusal is ``{"error": "<message>"}`` with the status of the one error table.  A load or unload
blocks a worker thread, never the event loop."""
from __future__ import annotations

import json

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from ..api.handling import blocking, tenant_of
from ..api.state import ServeState, serve_state
from ..engine.errors import InvalidRequest
from ..tenants import Tenant
from . import documents as D
from .access import live, model_view, need_admin, ready, repository_of, visible_index

router = APIRouter()


def _false(message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=400)


@router.get("/v2/health/live")
async def health_live(st: ServeState = Depends(serve_state)):
    return Response(status_code=200) if live(st.service) else _false(f"the server is {st.service.state}")


@router.get("/v2/health/ready")
async def health_ready(st: ServeState = Depends(serve_state)):
    return Response(status_code=200) if ready(st.service) else _false(f"the server is {st.service.state}")


@router.get("/v2")
async def server_metadata(tenant: Tenant = Depends(tenant_of)):
    return D.server_metadata()


# ------------------------------------------------------------------------------------------- statistics
def _stats(st: ServeState, tenant: Tenant, model: str | None, version: str | None) -> dict:
    need_admin(tenant, "model statistics")
    if model is None:
        repo = repository_of(st.service)
        return D.statistics(repo.stats(None, None) if repo is not None else [])
    return D.statistics(model_view(st.service, tenant, model).stats(model, version))


@router.get("/v2/models/stats")
async def stats_all(tenant: Tenant = Depends(tenant_of), st: ServeState = Depends(serve_state)):
    return _stats(st, tenant, None, None)


@router.get("/v2/models/{model}/stats")
async def stats_model(model: str, tenant: Tenant = Depends(tenant_of), st: ServeState = Depends(serve_state)):
    return _stats(st, tenant, model, None)


@router.get("/v2/models/{model}/versions/{version}/stats")
async def stats_version(model: str, version: str, tenant: Tenant = Depends(tenant_of),
                        st: ServeState = Depends(serve_state)):
    return _stats(st, tenant, model, version)


# ------------------------------------------------------------------------------------------- metadata
@router.get("/v2/models/{model}")
async def model_metadata(model: str, tenant: Tenant = Depends(tenant_of), st: ServeState = Depends(serve_state)):
    return D.model_metadata(model_view(st.service, tenant, model).metadata(model, None))


@router.get("/v2/models/{model}/versions/{version}")
async def version_metadata(model: str, version: str, tenant: Tenant = Depends(tenant_of),
                           st: ServeState = Depends(serve_state)):
    return D.model_metadata(model_view(st.service, tenant, model).metadata(model, version))


def _ready(st: ServeState, tenant: Tenant, model: str, version: str | None):
    if model_view(st.service, tenant, model).ready(model, version):
        return Response(status_code=200)
    return _false(f"model {model!r}{f' version {version}' if version else ''} is not ready")


@router.get("/v2/models/{model}/ready")
async def model_ready(model: str, tenant: Tenant = Depends(tenant_of), st: ServeState = Depends(serve_state)):
    return _ready(st, tenant, model, None)


@router.get("/v2/models/{model}/versions/{version}/ready")
async def version_ready(model: str, version: str, tenant: Tenant = Depends(tenant_of),
                        st: ServeState = Depends(serve_state)):
    return _ready(st, tenant, model, version)


@router.get("/v2/models/{model}/config")
async def model_config(model: str, tenant: Tenant = Depends(tenant_of), st: ServeState = Depends(serve_state)):
    return D.model_config(model_view(st.service, tenant, model).config(model, None))


@router.get("/v2/models/{model}/versions/{version}/config")
async def version_config(model: str, version: str, tenant: Tenant = Depends(tenant_of),
                         st: ServeState = Depends(serve_state)):
    return D.model_config(model_view(st.service, tenant, model).config(model, version))


# ------------------------------------------------------------------------------------------- repository
async def _body(request: Request) -> dict:
    """A repository request's optional JSON object body."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"the request is not valid JSON: {e}", None, "invalid_json") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return doc


@router.post("/v2/repository/index")
async def repository_index(request: Request, tenant: Tenant = Depends(tenant_of),
                           st: ServeState = Depends(serve_state)):
    only_ready = (await _body(request)).get("ready", False)
    if not isinstance(only_ready, bool):
        raise InvalidRequest("ready must be true or false", "ready")
    return JSONResponse(D.index(visible_index(st.service, tenant, only_ready)))


def _load_parameters(doc: dict) -> None:
    """Load from the repository's files only: a config or files in the request are refused (400)."""
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidRequest("parameters must be a JSON object", "parameters")
    extra = sorted(k for k in params if k != "unload_dependents")
    if extra:
        raise InvalidRequest(f"load/unload parameters {', '.join(extra)} are not supported: models load from the "
                             f"repository's own files", "parameters")


@router.post("/v2/repository/models/{model}/load")
async def repository_load(model: str, request: Request, tenant: Tenant = Depends(tenant_of),
                          st: ServeState = Depends(serve_state)):
    need_admin(tenant, "loading a model")
    _load_parameters(await _body(request))
    await blocking(model_view(st.service, tenant, model).load, model)
    return Response(status_code=200)


@router.post("/v2/repository/models/{model}/unload")
async def repository_unload(model: str, request: Request, tenant: Tenant = Depends(tenant_of),
                            st: ServeState = Depends(serve_state)):
    need_admin(tenant, "unloading a model")
    _load_parameters(await _body(request))
    await blocking(model_view(st.service, tenant, model).unload, model)
    return Response(status_code=200)
