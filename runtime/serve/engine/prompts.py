"""The checks of a generation request, made once, by the engine, before any of its prompts is queued.

A request of n prompts is refused whole (:class:`InvalidRequest`, HTTP 400) when it could never run: more
prompts than the model can ever queue, a priority its scheduling policy does not take, a prompt beyond the
context, prompt + ``max_tokens`` beyond it, or more KV blocks than the whole cache has.  ``max_tokens``
left unset takes the engine's default here (what the context leaves after the longest prompt).
:class:`PromptChecks` is the one template of those checks for :class:`runtime.serve.engine.GenerateEngine`
and a model served by replicas (:class:`runtime.serve.replicas.RemoteGenerateEngine`).  Host-only.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from runtime.models.weights import LlamaConfig

from .config import EngineConfig
from .errors import InvalidRequest
from .sampling import SamplingParams


def encode_prompt(tok, vocab: int, prompt) -> list[int]:
    """A prompt as token ids: raw text (no template) or a list of token ids in ``[0, vocab)``."""
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("the prompt is empty", "prompt")
        return tok.encode(prompt)
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                              for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "prompt")
        return list(prompt)
    raise InvalidRequest("prompt must be a non-empty string or a non-empty list of token ids", "prompt")


def check_fits(n: int, max_tokens: int, max_model_len: int, block_size: int, num_blocks: int,
               prompt_param: str = "prompt") -> None:
    """Refuse what could never run: a prompt beyond the context, prompt + max_tokens beyond it, or more KV
    blocks than a cache of ``num_blocks`` (block 0 is the null block) has (:class:`InvalidRequest`)."""
    ml = max_model_len
    if n >= ml:
        raise InvalidRequest(f"This model's maximum context length is {ml} tokens. However, your prompt has "
                             f"{n} tokens.", prompt_param, "context_length_exceeded")
    if n + max_tokens > ml:
        raise InvalidRequest(f"This model's maximum context length is {ml} tokens. However, you requested "
                             f"{n + max_tokens} tokens ({n} in the prompt, {max_tokens} for the "
                             f"completion). Please reduce the prompt or max_tokens.", "max_tokens",
                             "context_length_exceeded")
    need, have = -(-(n + max_tokens) // block_size), num_blocks - 1
    if need > have:
        raise InvalidRequest(f"the request needs {need} KV blocks of {block_size} tokens ({n} prompt + "
                             f"{max_tokens} max_tokens) but the whole KV cache has {have}",
                             prompt_param if -(-(n + 1) // block_size) > have else "max_tokens",
                             "kv_cache_exceeded")


class PromptChecks:
    """A generation model's side of a request before it is queued: prompts to token ids (``encode``;
    ``encode_chat`` with the chat template of the model's GGUF) and the request's checks and defaults
    (:meth:`checked`).  A subclass sets ``model``, ``tok``, ``model_config`` and ``config`` (its
    :class:`EngineConfig`) and gives :attr:`kv_blocks`.  Host-only."""

    model: str
    tok: object
    model_config: LlamaConfig
    config: EngineConfig

    @property
    def kv_blocks(self) -> int:
        """Blocks of the whole KV cache (one of them is the null block)."""
        raise NotImplementedError(f"{type(self).__name__} gives no kv_blocks")

    def encode(self, prompt) -> list[int]:
        """A prompt as token ids: raw text (no template) or a list of token ids."""
        return encode_prompt(self.tok, self.model_config.vocab, prompt)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Messages rendered with the model's chat template (from its GGUF), then tokenized."""
        return self.tok.encode(self.tok.render_chat(messages))  # type: ignore[attr-defined]

    @property
    def capacity_tokens(self) -> int:
        """Tokens one request may hold at most: the context, or all usable KV blocks if fewer."""
        return min(self.config.max_model_len, (self.kv_blocks - 1) * self.config.block_size)

    @property
    def queue_capacity(self) -> int:
        """Requests the model can hold waiting at most (``max_queued_requests``, unthrottled)."""
        return self.config.max_queued_requests

    def checked(self, prompts: Sequence[list[int]], params: SamplingParams, priority: int = 0,
                prompt_param: str = "prompt", admit: Callable[[int], object] | None = None) -> SamplingParams:
        """Every check of a request of ``prompts`` (token ids), in order -- how many prompts, the priority,
        each prompt's fit -- before any of them is queued; ``params`` with the engine's defaults applied.
        ``prompt_param``: the request field the prompts came from (named in a refusal); ``admit``: called
        last with the tokens the request may use at most (prompts + ``max_tokens``) -- the caller's
        admission, e.g. a tenant's quota ticket; what it raises refuses the request."""
        self._check_count(len(prompts), prompt_param)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise InvalidRequest(f"priority must be an integer, got {priority!r}", "priority")
        if priority and not self.config.policy().uses_priority:
            raise InvalidRequest(f"priority={priority} needs the priority scheduling policy (this engine runs "
                                 f"{self.config.scheduling_policy})", "priority")
        if params.max_tokens is None:
            longest = max(len(p) for p in prompts)
            params = dataclasses.replace(params, max_tokens=max(1, self.capacity_tokens - longest))
        for ids in prompts:
            check_fits(len(ids), params.max_tokens, self.config.max_model_len, self.config.block_size,
                       self.kv_blocks, prompt_param)
        if admit is not None:
            admit(sum(len(p) + params.max_tokens for p in prompts))
        return params

    def _check_count(self, count: int, prompt_param: str) -> None:
        """Refuse a request of no prompt, or of more prompts than could ever be queued at once (no retry
        can help -- unlike a queue that is full now, :class:`QueueFull`)."""
        if count < 1:
            raise InvalidRequest("a request needs at least one prompt", prompt_param)
        cap = self.queue_capacity
        if count > cap:
            raise InvalidRequest(f"this request has {count} prompts but {self.model} queues at most {cap} requests "
                                 f"(max_queued_requests): it can never be admitted; send at most {cap} prompts "
                                 f"per request", prompt_param, "too_many_prompts")
