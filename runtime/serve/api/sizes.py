"""What a request costs at least, known before it is tokenized.

Tokenizing costs time in proportion to the text; a request that can never fit the model's context, or
the tenant's quota, must be refused before that work, not after it.  These are lower bounds on token
counts from the text alone (:meth:`runtime.models.tokenizer.GgufBpeTokenizer.min_tokens`: characters over
the longest token; :meth:`runtime.models.tokenizer.BertTokenizer.min_tokens`: pieces between whitespace,
read up to the model's length): a request refused here would be refused after tokenizing too, and
nothing that fits is.  The exact checks still run after tokenization.

Host-only, on the event loop, so bounded whatever the body: a request carries at most :data:`MAX_ITEMS`
prompts or inputs (OpenAI's limit for an embeddings array; 400 beyond), a prompt's floor is O(1), and the
embeddings scan reads at most :data:`SCAN_CHARS` characters of a request in all (inputs past that count
their [CLS] and [SEP] only).
"""
from __future__ import annotations

from ..engine.embed_engine import input_too_long
from ..engine.errors import InvalidRequest

#: prompts (completions) or inputs (embeddings) one request may carry
MAX_ITEMS = 2048
#: characters of one embeddings request the floor scan reads at most (and of one input, 8 per token of the
#: model's length): a few milliseconds of the event loop
SCAN_CHARS = 16384


def _items(items: list, param: str) -> None:
    if len(items) > MAX_ITEMS:
        raise InvalidRequest(f"{param} takes at most {MAX_ITEMS} items, got {len(items)}", param)


def prompt_floors(eng, prompts: list, param: str = "prompt") -> list[int]:
    """Per prompt of a generation engine ``eng`` (a text or token ids), at least how many tokens it has;
    :class:`InvalidRequest` (``context_length_exceeded``) for one that certainly does not fit the context."""
    _items(prompts, param)
    ml = eng.config.max_model_len
    out = []
    for p in prompts:
        n = eng.tok.min_tokens(p) if isinstance(p, str) else len(p) if isinstance(p, (list, tuple)) else 0
        if n >= ml:
            what = f" ({len(p)} characters)" if isinstance(p, str) else ""
            raise InvalidRequest(f"This model's maximum context length is {ml} tokens. However, your {param} has "
                                 f"at least {n} tokens{what}.", param, "context_length_exceeded")
        out.append(n)
    return out


def chat_floor(eng, messages: list[dict]) -> int:
    """At least how many tokens ``messages`` take with ``eng``'s chat template (see :func:`prompt_floors`)."""
    return prompt_floors(eng, [eng.tok.render_chat(messages)], "messages")[0]


def generation_floor(floors: list[int], max_tokens) -> int:
    """The least a generation request with these prompt floors is charged at admission: each prompt plus
    its ``max_tokens`` (at least 1 when not given or not valid; the request's own check refuses it then)."""
    mt = max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0 else 1
    return sum(n + mt for n in floors)


def input_floors(eng, texts) -> list[int]:
    """Per embeddings input of ``eng`` (an embedding engine), at least how many tokens it has;
    :class:`InvalidRequest` (``context_length_exceeded``) for one that certainly is too long.  Inputs that
    are not strings count 0 (the engine's own check refuses them)."""
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list):
        return []
    _items(texts, "input")
    out = []
    left = SCAN_CHARS
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            out.append(0)
            continue
        look = min(len(t), 8 * eng.max_len, left)
        left -= look
        n = eng.tok.min_tokens(t, eng.max_len, look)
        if n >= eng.max_len:
            raise input_too_long(i, n, eng.max_len, eng.model)
        out.append(n)
    return out
