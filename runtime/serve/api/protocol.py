"""OpenAI wire formats (requests as pydantic models; responses and stream chunks as plain dicts built
by one function each).  Unknown request fields are accepted and ignored, as OpenAI-compatible servers do.

Every request field is checked as JSON, not coerced: a value of another type is refused (``"5"`` for an
integer, ``true`` for a number), integers are signed 64-bit (OpenAI's and vLLM's ``seed`` range: any
int64 is a seed), numbers are finite (no ``NaN``/``Infinity``), and no string -- nested ones included --
holds a lone UTF-16 surrogate (``"\\ud800"``: not Unicode text; a tokenizer cannot take it), and nothing
nests deeper than :data:`MAX_DEPTH`.  The route answers 400 in OpenAI's error shape with the field as
``param``."""
from __future__ import annotations

import base64
import math
import time
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1

#: a JSON integer of a request: signed 64-bit
Int = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
#: a JSON number of a request: finite
Float = Annotated[float, Field(allow_inf_nan=False)]


#: how deep a request's JSON may nest (a chat message's content parts are 4 deep)
MAX_DEPTH = 32


def check_json_text(value, where: str = "") -> None:
    """Refuse (ValueError) a lone surrogate in any string, a non-finite number anywhere in ``value``
    (strings, numbers, lists and dicts, keys included) and nesting deeper than :data:`MAX_DEPTH`."""
    todo = [(value, 0)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")                    # (C speed; only a surrogate cannot be encoded)
                except UnicodeEncodeError:
                    raise ValueError(f"{where or 'a string'} holds a lone surrogate (not valid Unicode text)") from None
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError(f"{where or 'a number'} is not finite ({v})")
        elif isinstance(v, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                raise ValueError(f"{where or 'a value'} nests deeper than {MAX_DEPTH} levels")
            items = [*v.keys(), *v.values()] if isinstance(v, dict) else v
            todo.extend((x, depth + 1) for x in items)


class _Checked(BaseModel):
    """A request body: strict JSON types, every field's strings and numbers checked (:func:`check_json_text`)."""
    model_config = ConfigDict(strict=True, extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _text(cls, v, info):
        if not isinstance(v, BaseModel):
            check_json_text(v, info.field_name)
        return v


class _Req(_Checked):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Req):
    include_usage: bool = False


class CompletionRequest(_Req):
    model: str
    prompt: Union[str, list[str], list[Int], list[list[Int]]]
    max_tokens: Int | None = 16
    temperature: Float | None = None
    top_p: Float | None = None
    n: Int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    seed: Int | None = None
    logprobs: Int | None = None
    echo: bool | None = False
    user: str | None = None
    top_k: Int | None = None           #: vLLM extra (-1 or 0: all tokens)
    ignore_eos: bool | None = False    #: vLLM extra
    priority: Int | None = None        #: vLLM extra: lower runs first; never earlier than the tenant's class
    vnpu_tag: str | None = None        #: vnpu extra: the request's tag (runtime.serve.tags; or x-vnpu-tag)


class ContentPart(_Req):
    """A part of a chat message's content (only ``text`` parts are served)."""
    type: str
    text: str | None = None


class ChatMessage(_Req):
    role: str
    content: Union[str, list[ContentPart], None] = None


class ChatCompletionRequest(_Req):
    model: str
    messages: list[ChatMessage]
    max_tokens: Int | None = None
    max_completion_tokens: Int | None = None
    temperature: Float | None = None
    top_p: Float | None = None
    n: Int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    seed: Int | None = None
    logprobs: bool | None = False
    top_logprobs: Int | None = None
    user: str | None = None
    top_k: Int | None = None
    ignore_eos: bool | None = False
    priority: Int | None = None
    vnpu_tag: str | None = None


class EmbeddingRequest(_Req):
    model: str
    input: Union[str, list[str], list[Int], list[list[Int]]]
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: Int | None = None
    user: str | None = None
    priority: Int | None = None


class ThrottleRequest(_Req):
    """``POST /admin/throttle``: admit this fraction of the normal load (1 restores)."""
    factor: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]


class ScaleRequest(_Req):
    """``POST /admin/replicas``: the number of Ray Serve replicas wanted."""
    replicas: Int


class EventRequest(_Checked):
    """``POST /admin/events``: an operator command's event (``stress-test``, the CLI) for the History."""
    kind: str = "manual"
    diagnosis: str = ""
    detail: dict = {}
    manual: bool = True
    source: str = ""
    result: str = ""


class ReconfigureRequest(_Checked):
    """``POST /admin/reconfigure``: a whole ``serve.yaml`` (``config``) or ``key=value`` settings (``set``)."""
    config: str | None = None
    set: list[str] = []

    @model_validator(mode="after")
    def _something(self):
        if self.config is not None and not self.config.strip():
            raise ValueError("config is empty (a whole serve.yaml; to change settings, use set)")
        if self.config is None and not self.set:
            raise ValueError("give config (a whole serve.yaml) or set (key=value settings)")
        return self


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
