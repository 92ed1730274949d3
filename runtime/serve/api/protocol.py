"""OpenAI wire formats (requests as pydantic models; responses and stream chunks as plain dicts built
by one function each).  Unknown request fields are accepted and ignored, as OpenAI-compatible servers do."""
from __future__ import annotations

import base64
import time
from typing import Any, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict


class _Req(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Req):
    include_usage: bool = False


class CompletionRequest(_Req):
    model: str
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = 16
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    seed: int | None = None
    logprobs: int | None = None
    echo: bool | None = False
    user: str | None = None
    top_k: int | None = None           #: vLLM extra
    ignore_eos: bool | None = False    #: vLLM extra
    priority: int | None = None        #: vLLM extra: lower runs first; never earlier than the tenant's class


class ChatMessage(_Req):
    role: str
    content: Union[str, list[dict[str, Any]], None] = None


class ChatCompletionRequest(_Req):
    model: str
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    seed: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    user: str | None = None
    top_k: int | None = None
    ignore_eos: bool | None = False
    priority: int | None = None


class EmbeddingRequest(_Req):
    model: str
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = None
    user: str | None = None
    priority: int | None = None


class ThrottleRequest(_Req):
    """``POST /admin/throttle``: admit this fraction of the normal load (1 restores)."""
    factor: float


class ScaleRequest(_Req):
    """``POST /admin/replicas``: the number of Ray Serve replicas wanted."""
    replicas: int


class EventRequest(BaseModel):
    """``POST /admin/events``: an operator command's event (``stress-test``, the CLI) for the History."""
    model_config = ConfigDict(extra="forbid")
    kind: str = "manual"
    diagnosis: str = ""
    detail: dict = {}
    manual: bool = True
    source: str = ""
    result: str = ""


class ReconfigureRequest(BaseModel):
    """``POST /admin/reconfigure``: a whole ``serve.yaml`` (``config``) or ``key=value`` settings (``set``)."""
    model_config = ConfigDict(extra="forbid")
    config: str | None = None
    set: list[str] = []


# ---------------------------------------------------------------------------------------------- responses
def now() -> int:
    return int(time.time())


def usage(prompt: int, completion: int | None = None) -> dict:
    if completion is None:
        return {"prompt_tokens": prompt, "total_tokens": prompt}
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_logprobs(items, tok, offset0: int = 0) -> dict:
    """Completions' legacy logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, lps, tops, offs = [], [], [], []
    off = offset0
    for lp in items:
        t = tok.decode([lp.token_id], skip_special=False)
        tokens.append(t)
        lps.append(lp.logprob)
        tops.append({tok.decode([i], skip_special=False): v for i, v in lp.top})
        offs.append(off)
        off += len(t)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs}


def chat_logprobs(items, tok) -> dict:
    def entry(i, v):
        t = tok.decode([i], skip_special=False)
        return {"token": t, "logprob": v, "bytes": list(t.encode())}
    return {"content": [dict(entry(lp.token_id, lp.logprob), top_logprobs=[entry(i, v) for i, v in lp.top])
                        for lp in items]}


def completion(rid: str, model: str, created: int, choices: list[dict], use: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": use}


def chat_completion(rid: str, model: str, created: int, choices: list[dict], use: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": choices,
            "usage": use}


def completion_chunk(rid, model, created, choices, use=None) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": use}


def chat_chunk(rid, model, created, choices, use=None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices,
            "usage": use}


def embeddings(model: str, vecs: np.ndarray, fmt: str, prompt_tokens: int) -> dict:
    data = []
    for i, v in enumerate(vecs):
        emb = (base64.b64encode(np.ascontiguousarray(v, "<f4").tobytes()).decode() if fmt == "base64"
               else [float(x) for x in v])
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return {"object": "list", "data": data, "model": model, "usage": usage(prompt_tokens)}


def model_card(name: str, created: int, max_model_len: int | None) -> dict:
    card = {"id": name, "object": "model", "created": created, "owned_by": "vnpu", "root": name}
    if max_model_len is not None:
        card["max_model_len"] = max_model_len
    return card
