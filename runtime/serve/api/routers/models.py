"""What a caller may see: ``GET /v1/models``, ``GET /v1/models/{id}`` (the models its tenant may use) and
``GET /v1/usage`` (its own usage only)."""
from __future__ import annotations

from fastapi import APIRouter, Depends

from ...tenants import Tenant
from ..handling import tenant_of
from ..state import ServeState, serve_state

router = APIRouter()


@router.get("/v1/models")
async def models(tenant: Tenant = Depends(tenant_of), st: ServeState = Depends(serve_state)):
    return {"object": "list", "data": st.service.model_cards(tenant)}


@router.get("/v1/models/{model_id}")
async def model(model_id: str, tenant: Tenant = Depends(tenant_of), st: ServeState = Depends(serve_state)):
    st.service.engine(model_id, None, tenant)               # 404 model_not_found
    return next(c for c in st.service.model_cards(tenant) if c["id"] == model_id)


@router.get("/v1/usage")
async def usage(tenant: Tenant = Depends(tenant_of), st: ServeState = Depends(serve_state)):
    return st.service.quotas.usage(tenant)
