"""``POST /v1/completions``: one choice per prompt (a string, token ids, or a list of either)."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from ...engine.errors import InvalidRequest
from ...tenants import Tenant
from .. import protocol as P
from ..generation import generate, sampling
from ..handling import precheck, tenant_of
from ..sizes import generation_floor, prompt_floors
from ..state import ServeState, serve_state

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: P.CompletionRequest, request: Request, tenant: Tenant = Depends(tenant_of),
                      st: ServeState = Depends(serve_state)):
    eng = st.service.engine(body.model, "generate", tenant)
    prompts = body.prompt
    if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if not prompts:
        raise InvalidRequest("prompt must not be empty", "prompt")
    if body.echo:
        raise InvalidRequest("echo is not supported", "echo")
    precheck(request, tenant, generation_floor(prompt_floors(eng, prompts), body.max_tokens))   # before the work
    ids = await st.tokenizer.run(tenant.name, lambda: [eng.encode(p) for p in prompts])
    params = sampling(body, body.max_tokens, body.logprobs)
    return await generate(eng, body, request, tenant, ids, params, "prompt", chat=False)
