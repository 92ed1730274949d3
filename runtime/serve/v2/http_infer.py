"""``POST /v2/models/{m}[/versions/{v}]/infer``: JSON tensors and Triton's binary tensor data
(:mod:`.http_codec`), one flow with the gRPC side (:mod:`.inference`).  A body of
:data:`~.inference.OFF_LOOP_BYTES` or more is parsed, checked and decoded on a worker thread, and outputs
that large are encoded on one; a client that goes away while its request runs cancels it (499, nobody reads
it).  Compressed request bodies (``Content-Encoding``) are refused (400)."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from ..api.handling import blocking, tenant_of
from ..api.state import ServeState, serve_state
from ..api.streaming import client_gone, disconnected
from ..engine.errors import InvalidRequest
from ..tenants import Tenant
from .http_codec import HEADER_LENGTH, encode_response, parse_request
from .inference import OFF_LOOP_BYTES, execute, prepare

router = APIRouter()


def _parse_and_prepare(st: ServeState, tenant: Tenant, model: str, version: str | None, body: bytes,
                       header_length: str | None):
    wire = parse_request(body, header_length)
    meta, req = prepare(st.service, tenant, model, version, wire)
    return meta, wire, req


async def _infer(request: Request, tenant: Tenant, st: ServeState, model: str, version: str | None) -> Response:
    enc = request.headers.get("content-encoding", "identity").strip().lower()
    if enc not in ("", "identity"):
        raise InvalidRequest(f"Content-Encoding {enc!r} is not supported: send the request uncompressed",
                             "Content-Encoding")
    body = await request.body()
    big = len(body) >= OFF_LOOP_BYTES
    args = (st, tenant, model, version, body, request.headers.get(HEADER_LENGTH))
    meta, wire, req = await blocking(_parse_and_prepare, *args) if big else _parse_and_prepare(*args)
    result = await execute(st.service, req, lambda: disconnected(request),
                           lambda: setattr(request.state, "admitted", True))
    if result is None:
        return client_gone()
    big = sum(getattr(a, "nbytes", 0) for a in result.outputs.values()) >= OFF_LOOP_BYTES
    out, head_len = (await blocking(encode_response, meta, wire, result) if big
                     else encode_response(meta, wire, result))
    if head_len is None:
        return Response(out, media_type="application/json")
    return Response(out, media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(head_len)})


@router.post("/v2/models/{model}/infer")
async def infer(model: str, request: Request, tenant: Tenant = Depends(tenant_of),
                st: ServeState = Depends(serve_state)):
    return await _infer(request, tenant, st, model, None)


@router.post("/v2/models/{model}/versions/{version}/infer")
async def infer_version(model: str, version: str, request: Request, tenant: Tenant = Depends(tenant_of),
                        st: ServeState = Depends(serve_state)):
    return await _infer(request, tenant, st, model, version)
