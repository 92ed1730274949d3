"""``POST /v1/chat/completions``: the messages through the model's chat template, one choice."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from ...engine.errors import InvalidRequest
from ...tenants import Tenant
from .. import protocol as P
from ..generation import generate, sampling
from ..handling import precheck, tenant_of
from ..sizes import chat_floor, generation_floor
from ..state import ServeState, serve_state

router = APIRouter()

#: the roles a message may have (``developer`` is sent to the template as ``system``)
ROLES = ("system", "user", "assistant", "developer", "tool")


def _messages(body: P.ChatCompletionRequest) -> list[dict]:
    """The messages as the chat template takes them (400 for an unknown role or a non-text part)."""
    if not body.messages:
        raise InvalidRequest("messages must not be empty", "messages")
    msgs = []
    for i, m in enumerate(body.messages):
        if m.role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role {m.role!r} is not a chat role", "messages")
        content = m.content
        if isinstance(content, list):
            if any(p.type != "text" or p.text is None for p in content):
                raise InvalidRequest(f"messages[{i}]: only text content parts (with text) are supported",
                                     "messages")
            content = "".join(p.text for p in content)
        msgs.append({"role": "system" if m.role == "developer" else m.role, "content": content or ""})
    return msgs


@router.post("/v1/chat/completions")
async def chat(body: P.ChatCompletionRequest, request: Request, tenant: Tenant = Depends(tenant_of),
               st: ServeState = Depends(serve_state)):
    eng = st.service.engine(body.model, "generate", tenant)
    msgs = _messages(body)
    mt = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    precheck(request, tenant, generation_floor([chat_floor(eng, msgs)], mt))                     # before the work
    ids = [await st.tokenizer.run(tenant.name, eng.encode_chat, msgs)]
    lp = (body.top_logprobs or 0) if body.logprobs else None
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequest("top_logprobs needs logprobs=true", "top_logprobs")
    params = sampling(body, mt, lp)
    return await generate(eng, body, request, tenant, ids, params, "messages", chat=True)
