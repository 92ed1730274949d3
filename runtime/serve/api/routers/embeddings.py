"""``POST /v1/embeddings``: one vector per input string, charged the input's tokens once the batch ran."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request

from ...engine.errors import InvalidRequest
from ...tenants import Tenant
from .. import protocol as P
from ..handling import admit, note_tokens, precheck, settle, tenant_of
from ..sizes import input_floors
from ..state import ServeState, serve_state
from ..streaming import client_gone, disconnected

router = APIRouter()


def _texts(eng, body: P.EmbeddingRequest) -> list[str]:
    """The input strings (400 for token ids or dimensions the model does not have)."""
    texts = body.input
    if isinstance(texts, list) and texts and not all(isinstance(t, str) for t in texts):
        raise InvalidRequest(f"token-id input is not supported by {eng.model}; send strings", "input")
    if body.dimensions is not None and body.dimensions != eng.dim:
        raise InvalidRequest(f"{eng.model} has {eng.dim} dimensions; dimensions={body.dimensions} is not "
                             f"supported", "dimensions")
    return [texts] if isinstance(texts, str) else texts


@router.post("/v1/embeddings")
async def embeddings(body: P.EmbeddingRequest, request: Request, tenant: Tenant = Depends(tenant_of),
                     st: ServeState = Depends(serve_state)):
    eng = st.service.engine(body.model, "embed", tenant)
    request.state.model = body.model                  # the sampler's per-model request rate
    st.service.check_accepting()
    texts = _texts(eng, body)
    precheck(request, tenant, sum(input_floors(eng, texts)))                                     # before the work
    counts = await st.tokenizer.run(tenant.name, eng.check, texts)
    ticket = admit(request, tenant, sum(counts))
    try:
        fut = eng.submit(texts, sum(counts))
    except BaseException:
        settle(st, ticket, tenant, body.model, 0, 0)
        raise
    work = asyncio.wrap_future(fut) if not asyncio.isfuture(fut) else fut
    gone = asyncio.ensure_future(disconnected(request))
    answered = False
    try:
        done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        answered = work in done
    finally:
        gone.cancel()
        if not answered:        # the client went away: a batch not started is dropped, one that ran is charged
            ticket.release()
            work.add_done_callback(_retrieved)
            fut.add_done_callback(lambda f: settle(st, ticket, tenant, body.model, 0 if _failed(f) else sum(counts), 0))
            fut.cancel()
    if not answered:
        return client_gone()
    failed = _failed(work)
    settle(st, ticket, tenant, body.model, 0 if failed else sum(counts), 0)
    vecs = work.result()
    note_tokens(request, sum(counts))
    return P.embeddings(body.model, vecs, body.encoding_format or "float", sum(counts))


def _failed(fut) -> bool:
    """A done future (asyncio or concurrent) that has no result: cancelled or failed."""
    return fut.cancelled() or fut.exception() is not None


def _retrieved(fut) -> None:
    """A done callback that marks a future's exception as seen (nobody awaits it any more)."""
    _failed(fut)
