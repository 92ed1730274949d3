"""What the completions and chat routers share: a request's OpenAI fields as the engine's sampling
parameters (which check themselves: 400 for a bad field), and one generation -- checked and queued by the
engine all at once (:meth:`runtime.serve.engine.GenerateEngine.add_requests`), admitted in between under
the tenant's quota ticket, answered whole or streamed as server-sent events -- whose ticket is settled to
the tokens the engine really used (prompt tokens computed, tokens generated), also for a client that went
away: its slot is freed at once, its charge settled once the engine has finished the aborted requests."""
from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import Request

from ..engine.errors import InvalidRequest
from ..engine.request import RequestOutput
from ..engine.sampling import SamplingParams
from ..result_cache import cache_key, deterministic
from ..tags import PRIORITY_HEADER, TAG_HEADER, request_tag
from ..tenants import Tenant
from . import protocol as P
from .errors import error_body, error_response
from .handling import admit, note_tokens, settle
from .state import serve_state
from .streaming import EventStream, Submitted, client_gone, collect, sse

#: the header that marks an answer served from the result cache
CACHE_HEADER = "x-vnpu-cache"


def sampling(req, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    """The sampling parameters of a completion or chat request (OpenAI's defaults for fields not given;
    ``max_tokens`` None: the engine's default).  400 for ``n`` > 1, or for a field the parameters refuse."""
    if req.n not in (None, 1):
        raise InvalidRequest(f"n={req.n} is not supported: this server returns one choice per prompt (n=1)", "n")
    stop = () if req.stop is None else (req.stop,) if isinstance(req.stop, str) else tuple(req.stop)
    return SamplingParams(max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
                          top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k or 0, seed=req.seed,
                          stop=stop, logprobs=logprobs, ignore_eos=bool(req.ignore_eos))


def _error_of(outs: list[RequestOutput]):
    for o in outs:
        if o.finish_reason == "error":
            return error_response(500, f"the engine failed: {o.error}", "server_error")
    return None


def _hbm(eng, tokens: int) -> int:
    """The HBM a request of ``tokens`` (prompts + max_tokens) may hold on ``eng`` (0 for an engine that
    does not say: replicas in other processes)."""
    fn = getattr(eng, "kv_bytes", None)
    return int(fn(tokens)) if fn is not None else 0


def _reason(o: RequestOutput) -> str | None:
    if o.finish_reason is None:
        return None
    return {"abort": "stop", "error": "stop"}.get(o.finish_reason, o.finish_reason)


async def generate(eng, body, request: Request, tenant: Tenant, ids: list[list[int]], params: SamplingParams,
                   prompt_param: str, chat: bool):
    """Generate for the prompts ``ids`` under the tenant's ticket: the completion or chat answer, or its
    event stream with ``body.stream``.  The engine checks them all before any is queued (400), the ticket is
    taken in between (429), then they are queued all together (503 when they do not fit now)."""
    st = serve_state(request)
    request.state.model = body.model                  # the sampler's per-model request rate
    st.service.check_accepting()
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest("stream_options is only allowed with stream=true", "stream_options")
    tag = request_tag(request.headers.get(TAG_HEADER), body.vnpu_tag)
    priority = tenant.effective_priority(body.priority, st.service.tag_rules.class_of(tag))
    cache, key = _cached(st, body, tenant, ids, params, chat)
    hit = cache.get(tenant.name, key) if cache is not None and key is not None else None
    if hit is not None:                             # the engine is not asked, no quota ticket is taken
        return _with_priority(_hit(hit), priority)
    sub = Submitted(eng, asyncio.get_running_loop())
    tickets: list = []                              # the ticket, once the engine's checks passed

    def charge(ptoks: int, ctoks: int) -> None:     # what the engine did, once every request finished
        settle(st, tickets[0], tenant, body.model, ptoks, ctoks)

    def abandon() -> None:                          # nobody waits for these any more: abort, charge the work
        sub.abort()
        tickets[0].release()
        sub.when_finished(charge)
    try:
        await sub.add(ids, params, prompt_param, priority,
                      lambda tokens: tickets.append(admit(request, tenant, tokens, _hbm(eng, tokens))),
                      tenant.cache_salt)
    except BaseException:
        if tickets:
            abandon()
        raise
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = P.now()
    if body.stream:
        return _with_priority(_streamed(eng, body, request, sub, rid, created, chat, len(ids), charge, abandon),
                              priority)
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
    note_tokens(request, sum(len(x) for x in ids), sum(o.completion_tokens for o in outs))
    answer = _answer(eng, body, outs, rid, created, chat, sum(len(x) for x in ids), params)
    if cache is not None and key is not None and isinstance(answer, dict):
        cache.put(tenant.name, key, answer)
    return _with_priority(answer, priority)


def _cached(st, body, tenant: Tenant, ids, params: SamplingParams, chat: bool):
    """The result cache and this request's key there, when the cache is on and the request is a
    deterministic, non-streamed one (:mod:`runtime.serve.result_cache`); else (cache, None)."""
    cache = getattr(st.service, "result_cache", None)
    if cache is None or not cache.enabled or body.stream or not deterministic(params):
        return cache, None
    return cache, cache_key(body.model, "chat" if chat else "completion", ids, params)


def _hit(answer: dict):
    """A cached answer, said to be one (header ``x-vnpu-cache: hit``)."""
    from fastapi.responses import JSONResponse
    r = JSONResponse(answer)
    r.headers[CACHE_HEADER] = "hit"
    return r


def _with_priority(answer, priority: int):
    """The answer (a response, or the body of a 200) with the priority it was queued at in a header."""
    from fastapi.responses import JSONResponse
    if not hasattr(answer, "headers"):
        answer = JSONResponse(answer)
    answer.headers[PRIORITY_HEADER] = str(priority)
    return answer


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
        st.service.observe(outcome, time.monotonic() - t0, body.model)
        if getattr(request.state, "tenant", None) is not None:
            st.service.breakers.record(request.state.tenant, outcome)
    return EventStream(_stream(eng, sub, rid, body.model, created, chat, include, n, ended,
                               lambda p, c: note_tokens(request, p, c)), lambda: ended("client"))


async def _stream(eng, sub: Submitted, rid, model, created, chat: bool, include_usage: bool, n: int, ended,
                  tokens=lambda p, c: None):
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
        tokens(ptoks, sum(ctoks))
        ended("error" if failed else "ok" if finished else "client")

