"""One inference request from a parsed wire request to its result, for both transports (one flow: the
HTTP route and the gRPC service only translate).

1. :func:`prepare` (host work only, no device): the model as the tenant may see it (404), the server
   accepting requests (503 while starting or draining), the request's tensors checked against the
   model's metadata (400: :mod:`.checks`), their data decoded (400: :mod:`.tensors`).  A caller runs it
   off the event loop for a large request (:data:`OFF_LOOP_BYTES`).
2. :func:`execute`: the tenant's quota ticket for the request's rows (429; for a tensor model one "token"
   of a quota is one sample, a batch row), the request to the repository (503 when its queue is full),
   then the result -- or, when the client goes away (``gone()`` completes, or the awaiting task is
   cancelled), the request is cancelled (dropped if its batch has not started), the concurrency slot freed
   at once and the charge settled once the engine is done with it (rows that ran are charged).
   :func:`execute_blocking` is the same for a caller on a thread of its own (the gRPC server's pool): it
   blocks that thread until the result, and the transport's "the client went away" callback (a gRPC call
   cancelled or past its deadline) walks away from the request the same way.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import CancelledError as FutureCancelled
from typing import Awaitable, Callable

from ..api.handling import admit_tenant
from ..engine.errors import Unavailable
from ..tenants import Tenant
from . import delivery
from .access import model_view
from .checks import check_request
from .repository import InferRequest, InferResult, ModelMetadata
from .request import WireRequest, decode_inputs

#: a request body at least this large is parsed and decoded off the event loop
OFF_LOOP_BYTES = 64 << 10


def prepare(service, tenant: Tenant, model: str, version: str | None,
            wire: WireRequest) -> tuple[ModelMetadata, InferRequest]:
    """The model's metadata and the checked, decoded request (raises the 4xx/503 refusals)."""
    repo = model_view(service, tenant, model)
    service.check_accepting()
    meta = repo.metadata(model, version)
    rows = check_request(meta, wire.headers, wire.output_names)
    inputs = decode_inputs(wire)
    return meta, InferRequest(model, version, inputs, tuple(wire.output_names), rows, tenant, wire.priority,
                              wire.timeout_us, wire.id)


def _settle_when_done(fut, ticket, rows: int) -> None:
    """Once the engine is done with a request nobody waits for: charge the rows if they ran."""
    def done(f):
        ok = not f.cancelled() and f.exception() is None
        ticket.settle(rows if ok else 0, 0)
    fut.add_done_callback(done)


def _walk_away(fut, ticket, rows: int) -> None:
    """Nobody waits for the request any more: free the tenant's slot now, settle the charge once the engine
    is done with it, cancel it (dropped if its batch has not started)."""
    ticket.release()
    _settle_when_done(fut, ticket, rows)
    fut.cancel()


async def _result_or_cancelled(work, fut, ticket, rows: int) -> None:
    """Wait for ``work`` (the request's future on this loop) alone -- one awaited future, no ``asyncio.wait``
    per request; its outcome is read by the caller.  This task cancelled meanwhile (a gRPC call cancelled or
    past its deadline): the request is walked away from and CancelledError goes on; ``work`` cancelled by the
    engine alone (unload, stop) or failing is an outcome like any other."""
    try:
        await work
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            _walk_away(fut, ticket, rows)
            work.cancel()
            raise
    except Exception:  # noqa: BLE001 - the request's own failure: the caller reads it from ``work``
        pass


async def execute(service, req: InferRequest, gone: Callable[[], Awaitable] | None = None,
                  on_admitted: Callable[[], None] | None = None) -> InferResult | None:
    """Run ``req`` (after :func:`prepare`); its result, or None when the client went away (``gone()``: an
    awaitable that completes then, made once the request is queued).  ``on_admitted()`` once the tenant's
    quota admitted it: a failure from then on (a 503 included: timed out in the queue, the model's engine
    failed) is the server's error for the sampler, not load shed before admission."""
    fut, ticket = _submit(service, req, on_admitted)
    work = delivery.wrap(fut)              # a batch's results reach the loop in one wake-up
    if gone is None:
        await _result_or_cancelled(work, fut, ticket, req.rows)
    else:
        watch = asyncio.ensure_future(gone())
        answered = False
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            answered = work in done
        finally:
            watch.cancel()
            if not answered:                   # gone, or this task was cancelled
                _walk_away(fut, ticket, req.rows)
                work.cancel()
        if not answered:
            return None
    ok = not work.cancelled() and work.exception() is None
    ticket.settle(req.rows if ok else 0, 0)
    if work.cancelled():
        raise _dropped(req)
    return work.result()


def _submit(service, req: InferRequest, on_admitted: Callable[[], None] | None):
    """The tenant's ticket for ``req``'s rows, then ``req`` queued: ``(its future, the ticket)``."""
    repo = model_view(service, req.tenant, req.model)
    ticket = admit_tenant(service, req.tenant, req.rows)
    if on_admitted is not None:
        on_admitted()
    try:
        return repo.submit(req), ticket
    except BaseException:
        ticket.settle(0, 0)
        raise


def _dropped(req: InferRequest) -> Unavailable:
    return Unavailable(f"model {req.model!r} dropped the request (it is unloading or the server is stopping)")


def execute_blocking(service, req: InferRequest, on_gone: Callable[[Callable[[], None]], bool],
                     on_admitted: Callable[[], None] | None = None) -> InferResult | None:
    """:func:`execute` for a caller on a thread of its own: blocks it until ``req``'s result (or the engine's
    error); None when the client went away.  ``on_gone(fn)`` registers ``fn`` to be called (from any thread)
    when the client goes away -- a gRPC call's ``context.add_callback``, which also calls it once the call
    ends normally (then it does nothing) -- and returns False when the client is already gone.  Whichever
    comes first, the result or the client going away, settles the request (the other does nothing)."""
    fut, ticket = _submit(service, req, on_admitted)
    lock, settled = threading.Lock(), [False]

    def claim() -> bool:
        with lock:
            first, settled[0] = not settled[0], True
        return first

    def gone() -> None:
        if claim():
            _walk_away(fut, ticket, req.rows)

    if not on_gone(gone):
        gone()
    try:
        result = fut.result()
    except FutureCancelled:
        result = None
    except Exception:  # noqa: BLE001 - the request's own failure: settled below, re-raised
        if claim():
            ticket.settle(0, 0)
        raise
    if not claim():                            # the client went away first
        return None
    if fut.cancelled():                        # the engine dropped it (unload, stop)
        ticket.settle(0, 0)
        raise _dropped(req)
    ticket.settle(req.rows, 0)
    return result
