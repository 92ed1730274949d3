"""The OpenAI-compatible routes.  Each handler translates the wire request into engine calls and the
engine's outputs back into the wire format; the logic lives in the engines and the service.

Generation requests go to the engine with an ``on_output`` callback that hands every increment to this
event loop; a client that disconnects (stream closed, or connection dropped while waiting for a
non-streamed answer) aborts its requests, which frees their KV blocks at the engine's next step; its
handler returns (a 499 nobody reads) rather than raising, so a dropped client is never a traceback.

Tenants (:mod:`runtime.serve.tenants`): every ``/v1`` route authenticates its caller (``Authorization:
Bearer``; 401 otherwise), looks models up as that tenant may see them, runs the request at the tenant's
effective priority, and holds a quota ticket from admission until the response (or the stream) ends,
when it is settled to the tokens really used -- by the engine's own count of what it did (prompt tokens
computed, tokens generated), also for a client that went away: its slot is freed at once, its charge
settled once the engine has finished the aborted requests.  Refusals of the one error table
(:data:`.errors.ERRORS`) are answered here, never as a traceback; a refused admin action is one log line.  ``/metrics`` and ``/admin/*`` need an admin key (403);
``/health`` is open (probes); ``/v1/usage`` shows the caller its own usage only.

Observability (admin): every model request's outcome goes to the service's sampler (:func:`outcome_of`:
served, server error, client error, shed); ``GET /admin/history/samples|events|latest`` read the
server's History (``latest?after=T&wait_s=S``: a long poll for the next sample, what a dashboard or a
test waits on instead of polling), ``POST /admin/events`` records an operator command's event, ``POST /admin/reconfigure``
changes the running config; the admin commands (fallback, restore, throttle, replicas, reconfigure) are
recorded as manual interventions.

Hostile clients: in front of the routes the server's :mod:`.guard` authenticates from the headers and
bounds the body (size, deadline) before anything reads it.  A prompt or embeddings input is sized from its
text first (:mod:`.sizes`: what certainly exceeds the context or the tenant's quota is refused before any
work), then tokenized on the :class:`.tokenize_pool.TokenizePool` (tenants in turn), never on the loop.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import math
import time
import uuid
from typing import AsyncIterator

from dataclasses import asdict

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.errors import InvalidRequest, QueueFull, ServeError
from ..engine.request import RequestOutput, SamplingParams, merge_outputs
from ..tenants import Forbidden, RateLimited, Tenant
from . import protocol as P
from .errors import ERRORS, error_body, error_response, from_exception
from .longpoll import LongPolls
from .sizes import chat_floor, generation_floor, input_floors, prompt_floors
from .tokenize_pool import TokenizePool

log = logging.getLogger("vnpu.serve")

MAX_STOP = 4

#: the routes whose requests the sampler counts (qps, latency, error and shed rates)
MODEL_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/embeddings"})

#: the event kinds the History holds (``POST /admin/events`` accepts these)
EVENT_KINDS = ("fault", "trigger", "action", "recovery", "config", "alert", "manual", "lifecycle", "risk")

#: the longest a ``GET /admin/history/latest?wait_s=`` long poll may wait: under common proxies' idle
#: timeouts and well below the server's graceful-shutdown timeout
#: (:data:`runtime.serve.server.GRACEFUL_SHUTDOWN_S`, 30 s) -- a stop ends the polls in flight anyway
#: (:meth:`LongPolls.close`), this bounds one that a stop somehow missed
MAX_HISTORY_WAIT_S = 20.0

#: exception classes that mean "shed by admission control" (not a server failure)
SHED = (RateLimited, QueueFull)


def outcome_of(status: int, exc: BaseException | None, admitted: bool) -> str:
    """A model request's outcome for the sampler: ``ok``; ``shed`` (over quota, queue full, or a 503
    before admission -- the server not admitting); ``client`` (4xx); ``error`` (any other 5xx)."""
    if status < 400:
        return "ok"
    if isinstance(exc, SHED) or status == 429 or (status == 503 and not admitted):
        return "shed"
    if status < 500:
        return "client"
    return "error"


# ---------------------------------------------------------------------------------------------- helpers
def _stop_list(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > MAX_STOP:
        raise InvalidRequest(f"stop takes at most {MAX_STOP} strings, got {len(stops)}", "stop")
    if any(not s for s in stops):
        raise InvalidRequest("stop strings must not be empty", "stop")
    return tuple(stops)


def _sampling(req, max_tokens: int | None, default_max: int, logprobs: int | None) -> SamplingParams:
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


def _admin_refused(request: Request, status: int, why) -> None:
    """A refused admin action is one line in the server's log (no traceback); a call without a valid key
    (401) is not an action: nothing, so that anonymous callers cannot flood the log."""
    if request.url.path.startswith("/admin/") and status != 401:
        log.warning("admin %s %s refused (%d): %s", request.method, request.url.path, status, why)


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body is already read, so receive() only reports that)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


class _Submitted:
    """Engine requests of one HTTP request, their outputs tagged by choice index on one asyncio queue.  It
    keeps what the engine reported for each request (prompt tokens computed, completion tokens): what the
    request is charged -- :meth:`when_finished` hands the totals over once every request has finished,
    also after the client went away and the requests were aborted."""

    def __init__(self, engine, loop: asyncio.AbstractEventLoop):
        self.engine, self.loop = engine, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.handles: list = []
        self.open: set[str] = set()
        self._done: dict[str, tuple[int, int]] = {}       #: request id -> (prompt computed, completion tokens)
        self._ended: set[str] = set()                     #: request ids whose last output arrived
        self._on_finished = None

    async def add(self, index: int, prompt_ids: list[int], params: SamplingParams, prompt_param: str,
                  priority: int = 0) -> None:
        """Queue one request (an engine in another process -- a Ray Serve replica -- answers with an
        awaitable that resolves once the request is accepted or raises its refusal)."""
        def on_output(out: RequestOutput, i=index):
            with contextlib.suppress(RuntimeError):       # the loop is gone (server stopping)
                self.loop.call_soon_threadsafe(self._arrived, i, out)
        h = self.engine.add_request(prompt_ids, params, on_output=on_output, prompt_param=prompt_param,
                                    priority=priority)
        if inspect.isawaitable(h):
            h = await h
        self.handles.append(h)
        self.open.add(h.request_id)

    def _arrived(self, i: int, out: RequestOutput) -> None:
        """On the loop: one output of the engine."""
        self._done[out.request_id] = (out.prompt_computed, out.completion_tokens)
        if out.finished:
            self._ended.add(out.request_id)
        self.queue.put_nowait((i, out))
        self._check_finished()

    def when_finished(self, fn) -> None:
        """Call ``fn(prompt_tokens, completion_tokens)`` -- the work the engine did for these requests -- once
        every request added has finished (now, if they have); no request added: ``fn(0, 0)``."""
        self._on_finished = fn
        self._check_finished()

    def _check_finished(self) -> None:
        fn = self._on_finished
        if fn is not None and all(h.request_id in self._ended for h in self.handles):
            self._on_finished = None
            fn(sum(p for p, _ in self._done.values()), sum(c for _, c in self._done.values()))

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        while self.open:
            i, out = await self.queue.get()
            if out.finished:
                self.open.discard(out.request_id)
            yield i, out

    def abort(self) -> None:
        for rid in list(self.open):
            self.engine.abort(rid)


async def _collect(sub: _Submitted, n: int, request: Request) -> list[RequestOutput] | None:
    """All outputs merged per choice; None (everything aborted) if the client disconnects first."""
    async def gather():
        per: list[list[RequestOutput]] = [[] for _ in range(n)]
        async for i, out in sub.outputs():
            per[i].append(out)
        return [merge_outputs(p) for p in per]

    work = asyncio.ensure_future(gather())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            return work.result()
        sub.abort()
        work.cancel()
        return None
    finally:
        gone.cancel()


def _client_gone() -> JSONResponse:
    """What a handler returns when its client went away: nobody reads it (nginx's 499, "client closed
    request"); a handler must not raise for it -- that is logged as a failed ASGI application."""
    return error_response(499, "the client closed the request", "invalid_request_error", None, "client_closed")


class _EventStream(StreamingResponse):
    """Server-sent events whose ``on_close`` runs however the response ends: after the stream's own end, and
    when the client went away before the stream started or while a chunk was being sent -- the stream is
    closed here (its ``finally`` runs now, not whenever the generator is collected)."""

    def __init__(self, events, on_close):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()
            finally:
                self._on_close()


def _error_of(outs: list[RequestOutput]) -> JSONResponse | None:
    for o in outs:
        if o.finish_reason == "error":
            return error_response(500, f"the engine failed: {o.error}", "server_error")
    return None


# ---------------------------------------------------------------------------------------------- app
def build_app(service, tokenizer: TokenizePool | None = None) -> FastAPI:
    """The FastAPI app over ``service`` (a :class:`runtime.serve.server.Service`); prompts and inputs are
    tokenized on ``tokenizer`` (default: a pool of the app's own), never on the event loop."""
    app = FastAPI(title="vnpu serve", docs_url=None, redoc_url=None, openapi_url=None)
    tokenizer = tokenizer or TokenizePool()
    app.state.tokenizer = tokenizer
    polls = LongPolls()
    app.state.long_polls = polls            # the server closes it when it stops (ends the polls in flight)

    tm = service.tenant_metrics

    @app.middleware("http")
    async def request_id(request: Request, call_next):
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        t0 = time.monotonic()
        resp = await call_next(request)
        resp.headers["x-request-id"] = rid
        t = getattr(request.state, "tenant", None)
        if t is not None:
            tm.requests.labels(t.name, str(resp.status_code)).inc()
        if request.url.path in MODEL_ROUTES and not getattr(request.state, "streaming", False):
            service.observe(outcome_of(resp.status_code, getattr(request.state, "exc", None),
                                       getattr(request.state, "admitted", False)), time.monotonic() - t0)
        return resp

    async def tenant_of(request: Request) -> Tenant:
        """The caller's tenant (401 without a valid key)."""
        t = service.tenants.authenticate(request.headers.get("authorization"))
        request.state.tenant = t
        return t

    async def admin_of(request: Request) -> Tenant:
        t = await tenant_of(request)
        if not t.admin:
            raise Forbidden(f"tenant {t.name} has no admin key; this endpoint needs one")
        return t

    def counted(tenant: Tenant, check, tokens: int):
        try:
            return check(tenant, tokens)
        except RateLimited as e:
            tm.rate_limited.labels(tenant.name, e.limit).inc()
            raise

    def precheck(tenant: Tenant, min_tokens: int) -> None:
        """Before tokenizing: 429 now when the quotas will refuse a request of at least ``min_tokens``."""
        counted(tenant, service.quotas.precheck, min_tokens)

    def admit(tenant: Tenant, tokens: int, request: Request | None = None):
        ticket = counted(tenant, service.quotas.admit, tokens)
        if request is not None:
            request.state.admitted = True
        return ticket

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        if first.get("type") == "json_invalid":
            return error_response(400, f"the request body is not valid JSON: {first.get('msg', '')}",
                                  "invalid_request_error", None, "invalid_json")
        msg = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body')}: {e.get('msg')}" for e in errs)
        _admin_refused(request, 400, msg)
        return error_response(400, msg or "invalid request", "invalid_request_error", loc[0] if loc else None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), "invalid_request_error")

    async def refused(request: Request, exc: Exception):
        """An error of the one table (:data:`.errors.ERRORS`): its status in OpenAI's shape, handled here
        (not by the server-error middleware, which logs a traceback); a refused admin action is one line."""
        request.state.exc = exc
        resp = from_exception(exc)
        _admin_refused(request, resp.status_code, getattr(exc, "message", None) or getattr(exc, "detail", None) or exc)
        return resp

    for cls in (ServeError, *ERRORS):
        app.add_exception_handler(cls, refused)

    @app.exception_handler(Exception)
    async def other_error(request: Request, exc: Exception):
        request.state.exc = exc
        return from_exception(exc)

    # -------------------------------------------------------------- plain routes
    @app.get("/health")
    async def health():
        status, body = service.health()
        return JSONResponse(body, status_code=status, headers={"Retry-After": "1"} if status == 503 else None)

    @app.get("/metrics")
    async def metrics(tenant: Tenant = Depends(admin_of)):
        data = await asyncio.get_running_loop().run_in_executor(None, generate_latest, service.registry)
        return Response(data, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(tenant: Tenant = Depends(tenant_of)):
        return {"object": "list", "data": service.model_cards(tenant)}

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str, tenant: Tenant = Depends(tenant_of)):
        service.engine(model_id, None, tenant)               # 404 model_not_found
        return next(c for c in service.model_cards(tenant) if c["id"] == model_id)

    @app.get("/v1/usage")
    async def usage(tenant: Tenant = Depends(tenant_of)):
        return service.quotas.usage(tenant)

    # -------------------------------------------------------------- admin
    @app.get("/admin/state")
    async def admin_state(long_polls: int | None = None, wait_s: float | None = None,
                          tenant: Tenant = Depends(admin_of)):
        """The server's state; with ``long_polls=N&wait_s=S`` it answers once at least N history long polls
        are parked (or after S, at most MAX_HISTORY_WAIT_S) -- a wait, not a poll loop."""
        if (long_polls is None) != (wait_s is None):
            raise InvalidRequest("long_polls and wait_s go together", "long_polls" if wait_s is None else "wait_s")
        if long_polls is not None and wait_s is not None:
            if long_polls < 0:
                raise InvalidRequest(f"long_polls must be >= 0, got {long_polls}", "long_polls")
            if not 0 < wait_s <= MAX_HISTORY_WAIT_S:
                raise InvalidRequest(f"wait_s must be in (0, {MAX_HISTORY_WAIT_S:g}], got {wait_s:g}", "wait_s")
            await polls.parked(long_polls, wait_s)
        return {**service.state_dict(), "history_long_polls": polls.waiting()}

    async def _blocking(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def manual(tenant: Tenant, what: str, detail: dict | None = None, result: str = "ok") -> None:
        """An operator's command through the admin routes: a manual intervention in the History."""
        if service.history is not None:
            service.history.record_event("manual", source=f"admin {tenant.name}", manual=True, diagnosis=what,
                                         result=result, detail=detail or {})

    @app.post("/admin/models/{model_id}/fallback")
    async def admin_fallback(model_id: str, tenant: Tenant = Depends(admin_of)):
        res = asdict(await _blocking(service.fallback, model_id, f"admin {tenant.name}"))
        manual(tenant, f"fallback {model_id}: {res['placement']}", res)
        return res

    @app.post("/admin/models/{model_id}/restore")
    async def admin_restore(model_id: str, tenant: Tenant = Depends(admin_of)):
        res = asdict(await _blocking(service.restore, model_id))
        manual(tenant, f"restore {model_id}: {res['placement']}", res)
        return res

    @app.post("/admin/defragment")
    async def admin_defragment(tenant: Tenant = Depends(admin_of)):
        return {"devices": await _blocking(service.defragment)}

    @app.post("/admin/throttle")
    async def admin_throttle(body: P.ThrottleRequest, tenant: Tenant = Depends(admin_of)):
        res = await _blocking(service.throttle, body.factor)
        manual(tenant, f"throttle to {body.factor:g}", res)
        return res

    @app.post("/admin/replicas")
    async def admin_replicas(body: P.ScaleRequest, tenant: Tenant = Depends(admin_of)):
        scale = getattr(service, "scale_to", None)
        if scale is None:
            raise InvalidRequest("this server runs its engines in-process (start it with --replicas for Ray "
                                 "Serve replicas)", "replicas")
        res = await _blocking(scale, body.replicas)
        manual(tenant, f"scale to {body.replicas} replica(s)", {"replicas": body.replicas})
        return res

    @app.post("/admin/reconfigure")
    async def admin_reconfigure(body: P.ReconfigureRequest, tenant: Tenant = Depends(admin_of)):
        rc = service.reconfigurer
        if rc is None:
            raise InvalidRequest("this server cannot be reconfigured (it was started without a config manager)")
        return await _blocking(rc.apply, body.config, list(body.set), f"admin {tenant.name}")

    # -------------------------------------------------------------- history (vnpu monitor / diagnose / postmortem)
    def history():
        h = service.history
        if h is None:
            raise InvalidRequest("this server keeps no metrics history", None, "no_history")
        return h

    @app.get("/admin/history/samples")
    async def history_samples(metric: str, since: float | None = None, until: float | None = None, scope: str = "",
                              tenant: Tenant = Depends(admin_of)):
        try:
            pts = await _blocking(history().samples, metric, since, until, scope)
        except ValueError as e:                              # an unknown metric
            raise InvalidRequest(str(e), "metric") from None
        return {"metric": metric, "scope": scope, "points": [[t, v] for t, v in pts]}

    @app.get("/admin/history/events")
    async def history_events(since: float | None = None, until: float | None = None, kinds: str | None = None,
                             limit: int | None = None, tenant: Tenant = Depends(admin_of)):
        if limit is not None and limit < 1:
            raise InvalidRequest(f"limit must be >= 1, got {limit}", "limit")
        ks = [k for k in kinds.split(",") if k] if kinds else None
        evs = await _blocking(history().events, since, until, ks, limit)
        return {"events": [e.to_dict() for e in evs]}

    @app.get("/admin/history/latest")
    async def history_latest(after: float | None = None, wait_s: float | None = None,
                             tenant: Tenant = Depends(admin_of)):
        """The newest sample of every metric.  A long poll with ``wait_s`` (at most
        :data:`MAX_HISTORY_WAIT_S`): answers once the server has a sample newer than ``after`` (any sample
        without it) or when ``wait_s`` has passed or the server stops -- the newest samples either way.  The
        wait holds no thread (:class:`LongPolls`); ``/admin/state`` counts the polls waiting
        (``history_long_polls``)."""
        h = history()
        if wait_s is not None:
            if not 0 < wait_s <= MAX_HISTORY_WAIT_S:
                raise InvalidRequest(f"wait_s must be in (0, {MAX_HISTORY_WAIT_S:g}], got {wait_s:g}", "wait_s")
            if after is not None and not math.isfinite(after):
                raise InvalidRequest(f"after must be a finite time (seconds), got {after:g}", "after")
            await polls.wait_newer(h, after, wait_s)
        elif after is not None:
            raise InvalidRequest("after goes with wait_s (a long poll)", "after")

        def read():
            devs = sorted({s for m in ("device_health", "device_temperature_c") for s in h.scopes(m) if s})
            return {"server": {m: list(v) for m, v in h.latest("").items()},
                    "devices": {d: {m: list(v) for m, v in h.latest(d).items()} for d in devs}}
        return await _blocking(read)

    @app.post("/admin/events")
    async def post_event(body: P.EventRequest, tenant: Tenant = Depends(admin_of)):
        if body.kind not in EVENT_KINDS:
            raise InvalidRequest(f"unknown event kind {body.kind!r} (known: {', '.join(EVENT_KINDS)})", "kind")
        eid = await _blocking(lambda: history().record_event(
            body.kind, source=body.source or f"admin {tenant.name}", manual=body.manual, diagnosis=body.diagnosis,
            result=body.result, detail=body.detail))
        return {"id": eid}

    # -------------------------------------------------------------- generation
    @app.post("/v1/completions")
    async def completions(body: P.CompletionRequest, request: Request, tenant: Tenant = Depends(tenant_of)):
        eng = service.engine(body.model, "generate", tenant)
        prompts = body.prompt
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts:
            raise InvalidRequest("prompt must not be empty", "prompt")
        if body.echo:
            raise InvalidRequest("echo is not supported", "echo")
        precheck(tenant, generation_floor(prompt_floors(eng, prompts), body.max_tokens))   # before the work
        ids = await tokenizer.run(tenant.name, lambda: [eng.encode(p) for p in prompts])
        default = eng.default_max_tokens(max(len(x) for x in ids))
        params = _sampling(body, body.max_tokens, default, body.logprobs)
        return await _generate(eng, body, request, tenant, ids, params, "prompt", chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: P.ChatCompletionRequest, request: Request, tenant: Tenant = Depends(tenant_of)):
        eng = service.engine(body.model, "generate", tenant)
        if not body.messages:
            raise InvalidRequest("messages must not be empty", "messages")
        msgs = []
        for i, m in enumerate(body.messages):
            if m.role not in ("system", "user", "assistant", "developer", "tool"):
                raise InvalidRequest(f"messages[{i}].role {m.role!r} is not a chat role", "messages")
            content = m.content
            if isinstance(content, list):
                if any(p.type != "text" or p.text is None for p in content):
                    raise InvalidRequest(f"messages[{i}]: only text content parts (with text) are supported",
                                         "messages")
                content = "".join(p.text for p in content)
            msgs.append({"role": "system" if m.role == "developer" else m.role, "content": content or ""})
        mt = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        precheck(tenant, generation_floor([chat_floor(eng, msgs)], mt))                     # before the work
        ids = [await tokenizer.run(tenant.name, eng.encode_chat, msgs)]
        lp = (body.top_logprobs or 0) if body.logprobs else None
        if body.top_logprobs is not None and not body.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs=true", "top_logprobs")
        params = _sampling(body, mt, eng.default_max_tokens(len(ids[0])), lp)
        return await _generate(eng, body, request, tenant, ids, params, "messages", chat=True)

    def _settle(ticket, tenant: Tenant, model: str, ptoks: int, ctoks: int) -> None:
        ticket.settle(ptoks, ctoks)
        if ptoks:
            tm.tokens.labels(tenant.name, model, "prompt").inc(ptoks)
        if ctoks:
            tm.tokens.labels(tenant.name, model, "generation").inc(ctoks)

    async def _generate(eng, body, request: Request, tenant: Tenant, ids: list[list[int]], params: SamplingParams,
                        prompt_param: str, chat: bool):
        service.check_accepting()
        if body.stream_options is not None and not body.stream:
            raise InvalidRequest("stream_options is only allowed with stream=true", "stream_options")
        if body.priority is not None and not isinstance(body.priority, int):
            raise InvalidRequest("priority must be an integer", "priority")
        priority = tenant.effective_priority(body.priority)
        eng.check_batch(len(ids), prompt_param)          # a batch that could never be queued: 400, not 503
        for x in ids:
            eng.check(x, params, prompt_param)           # all prompts checked before any is queued
        ticket = admit(tenant, sum(len(x) + params.max_tokens for x in ids), request)
        sub = _Submitted(eng, asyncio.get_running_loop())

        def charge(ptoks: int, ctoks: int) -> None:     # what the engine did, once every request finished
            _settle(ticket, tenant, body.model, ptoks, ctoks)

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
        ptoks = sum(len(x) for x in ids)
        if body.stream:
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
                service.observe(outcome, time.monotonic() - t0)
            return _EventStream(_stream(eng, sub, rid, body.model, created, chat, include, len(ids), ended),
                                lambda: ended("client"))
        outs = None
        try:
            outs = await _collect(sub, len(ids), request)
        finally:
            if outs is None:                             # the client went away (or the server is stopping)
                abandon()
            else:
                sub.when_finished(charge)
        if outs is None:
            return _client_gone()
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

    async def _stream(eng, sub: _Submitted, rid, model, created, chat: bool, include_usage: bool, n: int, ended):
        chunk = P.chat_chunk if chat else P.completion_chunk
        ptoks = sum(h.prompt_tokens for h in sub.handles)
        ctoks = [0] * n
        offsets = [0] * n
        finished = failed = False
        try:
            if chat:
                yield _sse(chunk(rid, model, created, [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                        "logprobs": None, "finish_reason": None}]))
            async for i, o in sub.outputs():
                if o.finish_reason == "error":
                    failed = True
                    yield _sse(error_body(f"the engine failed: {o.error}", "server_error"))
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
                yield _sse(chunk(rid, model, created, [c]))
            finished = True
            if include_usage:
                yield _sse(chunk(rid, model, created, [], P.usage(ptoks, sum(ctoks))))
            yield "data: [DONE]\n\n"
        finally:                                              # the client gone: abort (frees the KV blocks)
            ended("error" if failed else "ok" if finished else "client")

    # -------------------------------------------------------------- embeddings
    @app.post("/v1/embeddings")
    async def embeddings(body: P.EmbeddingRequest, request: Request, tenant: Tenant = Depends(tenant_of)):
        eng = service.engine(body.model, "embed", tenant)
        service.check_accepting()
        texts = body.input
        if isinstance(texts, list) and texts and not all(isinstance(t, str) for t in texts):
            raise InvalidRequest(f"token-id input is not supported by {eng.model}; send strings", "input")
        if body.dimensions is not None and body.dimensions != eng.dim:
            raise InvalidRequest(f"{eng.model} has {eng.dim} dimensions; dimensions={body.dimensions} is not "
                                 f"supported", "dimensions")
        texts = [texts] if isinstance(texts, str) else texts
        precheck(tenant, sum(input_floors(eng, texts)))                                     # before the work
        counts = await tokenizer.run(tenant.name, eng.check, texts)
        ticket = admit(tenant, sum(counts), request)
        try:
            fut = eng.submit(texts, sum(counts))
        except BaseException:
            _settle(ticket, tenant, body.model, 0, 0)
            raise
        work = asyncio.wrap_future(fut) if not asyncio.isfuture(fut) else fut
        gone = asyncio.ensure_future(_disconnected(request))
        answered = False
        try:
            done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            answered = work in done
        finally:
            gone.cancel()
            if not answered:        # the client went away: a batch not started is dropped, one that ran is charged
                ticket.release()
                work.add_done_callback(_retrieved)
                fut.add_done_callback(lambda f: _settle(ticket, tenant, body.model, 0 if _failed(f) else sum(counts), 0))
                fut.cancel()
        if not answered:
            return _client_gone()
        failed = _failed(work)
        _settle(ticket, tenant, body.model, 0 if failed else sum(counts), 0)
        vecs = work.result()
        return P.embeddings(body.model, vecs, body.encoding_format or "float", sum(counts))

    return app


def _failed(fut) -> bool:
    """A done future (asyncio or concurrent) that has no result: cancelled or failed."""
    return fut.cancelled() or fut.exception() is not None


def _retrieved(fut) -> None:
    """A done callback that marks a future's exception as seen (nobody awaits it any more)."""
    _failed(fut)


def _reason(o: RequestOutput) -> str | None:
    if o.finish_reason is None:
        return None
    return {"abort": "stop", "error": "stop"}.get(o.finish_reason, o.finish_reason)
