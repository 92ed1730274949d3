"""What the completions and chat routers share: the sampling parameters of a request (400 for a bad
field), and one generation -- admitted under the tenant's quota ticket, queued on the engine, answered
whole or streamed as server-sent events -- whose ticket is settled to the tokens the engine really used
(prompt tokens computed, tokens generated), also for a client that went away: its slot is freed at once,
its charge settled once the engine has finished the aborted requests."""
from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import Request

from ..engine.errors import InvalidRequest
from ..engine.request import RequestOutput, SamplingParams
from ..tenants import Tenant
from . import protocol as P
from .errors import error_body, error_response
from .handling import admit, settle
from .state import serve_state
from .streaming import EventStream, Submitted, client_gone, collect, sse

MAX_STOP = 4


def _stop_list(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > MAX_STOP:
        raise InvalidRequest(f"stop takes at most {MAX_STOP} strings, got {len(stops)}", "stop")
    if any(not s for s in stops):
        raise InvalidRequest("stop strings must not be empty", "stop")
    return tuple(stops)


def sampling(req, max_tokens: int | None, default_max: int, logprobs: int | None) -> SamplingParams:
    """The sampling parameters of a completion or chat request (400 for a field out of range)."""
    if req.n not in (None, 1):
        raise InvalidRequest(f"n={req.n} is not supported: this server returns one choice per prompt (n=1)", "n")
    if max_tokens is not None and max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    t = 1.0 if req.temperature is None else req.temperature
    if not 0 <= t <= 2:
        raise InvalidRequest(f"temperature must be in [0, 2], got {t}", "temperature")
    tp = 1.0 if req.top_p is None else req.top_p
    if not 0 < tp <= 1:
        raise InvalidRequest(f"top_p must be in (0, 1], got {tp}", "top_p")
    if req.top_k is not None and req.top_k < -1:
        raise InvalidRequest(f"top_k must be -1 or 0 (all tokens) or at least 1, got {req.top_k}", "top_k")
    if logprobs is not None and not 0 <= logprobs <= 20:
        raise InvalidRequest(f"logprobs must be in [0, 20], got {logprobs}", "logprobs")
    return SamplingParams(max_tokens=default_max if max_tokens is None else max_tokens, temperature=float(t),
                          top_p=float(tp), top_k=max(0, req.top_k or 0), seed=req.seed, stop=_stop_list(req.stop),
                          logprobs=logprobs, ignore_eos=bool(req.ignore_eos))


def _error_of(outs: list[RequestOutput]):
    for o in outs:
        if o.finish_reason == "error":
            return error_response(500, f"the engine failed: {o.error}", "server_error")
    return None


def _reason(o: RequestOutput) -> str | None:
    if o.finish_reason is None:
        return None
    return {"abort": "stop", "error": "stop"}.get(o.finish_reason, o.finish_reason)


async def generate(eng, body, request: Request, tenant: Tenant, ids: list[list[int]], params: SamplingParams,
                   prompt_param: str, chat: bool):
    """Generate for the prompts ``ids`` (all checked before any is queued) under the tenant's ticket: the
    completion or chat answer, or its event stream with ``body.stream``."""
    st = serve_state(request)
    st.service.check_accepting()
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest("stream_options is only allowed with stream=true", "stream_options")
    if body.priority is not None and not isinstance(body.priority, int):
        raise InvalidRequest("priority must be an integer", "priority")
    priority = tenant.effective_priority(body.priority)
    eng.check_batch(len(ids), prompt_param)          # a batch that could never be queued: 400, not 503
    for x in ids:
        eng.check(x, params, prompt_param)           # all prompts checked before any is queued
    ticket = admit(request, tenant, sum(len(x) + params.max_tokens for x in ids))
    sub = Submitted(eng, asyncio.get_running_loop())

    def charge(ptoks: int, ctoks: int) -> None:     # what the engine did, once every request finished
        settle(st, ticket, tenant, body.model, ptoks, ctoks)

    def abandon() -> None:                          # nobody waits for these any more: abort, charge the work
        sub.abort()
        ticket.release()
        sub.when_finished(charge)
    try:
        for i, x in enumerate(ids):
            await sub.add(i, x, params, prompt_param, priority)
    except BaseException:
        abandon()
        raise
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = P.now()
    if body.stream:
        return _streamed(eng, body, request, sub, rid, created, chat, len(ids), charge, abandon)
    outs = None
    try:
        outs = await collect(sub, len(ids), request)
    finally:
        if outs is None:                             # the client went away (or the server is stopping)
            abandon()
        else:
            sub.when_finished(charge)
    if outs is None:
        return client_gone()
    return _answer(eng, body, outs, rid, created, chat, sum(len(x) for x in ids), params)


def _answer(eng, body, outs: list[RequestOutput], rid: str, created: int, chat: bool, ptoks: int,
            params: SamplingParams):
    """The whole answer of a non-streamed generation (a 500 if the engine failed a request)."""
    err = _error_of(outs)
    if err is not None:
        return err
    ctoks = sum(o.completion_tokens for o in outs)
    if chat:
        o = outs[0]
        choice = {"index": 0, "message": {"role": "assistant", "content": o.text},
                  "logprobs": P.chat_logprobs(o.logprobs, eng.tok) if params.logprobs is not None else None,
                  "finish_reason": _reason(o)}
        return P.chat_completion(rid, body.model, created, [choice], P.usage(ptoks, ctoks))
    choices = [{"index": i, "text": o.text,
                "logprobs": P.completion_logprobs(o.logprobs, eng.tok) if params.logprobs is not None else None,
                "finish_reason": _reason(o)} for i, o in enumerate(outs)]
    return P.completion(rid, body.model, created, choices, P.usage(ptoks, ctoks))


def _streamed(eng, body, request: Request, sub: Submitted, rid: str, created: int, chat: bool, n: int,
              charge, abandon) -> EventStream:
    """The event stream of a streamed generation; its end (or the client's going away) is reported once: to
    the sampler, and to the ticket (a client gone: its requests aborted, their work charged)."""
    st = serve_state(request)
    include = bool(body.stream_options and body.stream_options.include_usage)
    request.state.streaming = True
    t0 = time.monotonic()
    reported: list[str] = []

    def ended(outcome: str) -> None:             # once: by the stream's end, or by the response's
        if reported:
            return
        reported.append(outcome)
        if outcome == "client":
            abandon()
        else:
            sub.when_finished(charge)
        st.service.observe(outcome, time.monotonic() - t0)
    return EventStream(_stream(eng, sub, rid, body.model, created, chat, include, n, ended), lambda: ended("client"))


async def _stream(eng, sub: Submitted, rid, model, created, chat: bool, include_usage: bool, n: int, ended):
    chunk = P.chat_chunk if chat else P.completion_chunk
    ptoks = sum(h.prompt_tokens for h in sub.handles)
    ctoks = [0] * n
    offsets = [0] * n
    finished = failed = False
    try:
        if chat:
            yield sse(chunk(rid, model, created, [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                   "logprobs": None, "finish_reason": None}]))
        async for i, o in sub.outputs():
            if o.finish_reason == "error":
                failed = True
                yield sse(error_body(f"the engine failed: {o.error}", "server_error"))
                continue
            ctoks[i] = o.completion_tokens
            lp = None
            if o.logprobs:
                lp = (P.chat_logprobs(o.logprobs, eng.tok) if chat
                      else P.completion_logprobs(o.logprobs, eng.tok, offsets[i]))
            offsets[i] += len(o.text)
            if not o.text and not o.finished and lp is None:
                continue                                  # nothing to show yet (held back)
            if chat:
                delta = {"content": o.text} if o.text else {}
                c = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": _reason(o)}
            else:
                c = {"index": i, "text": o.text, "logprobs": lp, "finish_reason": _reason(o)}
            yield sse(chunk(rid, model, created, [c]))
        finished = True
        if include_usage:
            yield sse(chunk(rid, model, created, [], P.usage(ptoks, sum(ctoks))))
        yield "data: [DONE]\n\n"
    finally:                                              # the client gone: abort (frees the KV blocks)
        ended("error" if failed else "ok" if finished else "client")

