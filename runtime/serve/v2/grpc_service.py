"""The gRPC side of the Open Inference Protocol: ``inference.GRPCInferenceService`` (KServe v2's methods and
Triton's ModelConfig, ModelStatistics, RepositoryIndex, RepositoryModelLoad/Unload), answering what the REST
routes answer, through the same flow (:mod:`.inference`) and documents (:mod:`.documents`).

One gate (:func:`_rpc`) in front of every method: the caller's API key from metadata
``authorization: Bearer <key>`` (:meth:`runtime.serve.tenants.TenantRegistry.authenticate`; ServerLive and
ServerReady are open, as ``/v2/health/*`` are), and every refusal of the one error table
(:func:`runtime.serve.api.errors.status_of`) as the gRPC status of its HTTP status (:data:`GRPC_CODES`:
400 ``INVALID_ARGUMENT``, 401 ``UNAUTHENTICATED``, 403 ``PERMISSION_DENIED``, 404 ``NOT_FOUND``, 429
``RESOURCE_EXHAUSTED``, 503 ``UNAVAILABLE``, anything else ``INTERNAL``) with the same message.  A call
cancelled by its client (or past its deadline) cancels its inference request.  The servicer only adapts.

:class:`GrpcInferenceServer` serves it with ``grpc.aio`` on a thread of its own (its own event loop): it
binds loopback unless told otherwise (and, like the HTTP server, refuses a non-loopback address without
API keys), port 0 picks a free port; messages up to ``max_message_bytes`` both ways.  :meth:`start`
returns once bound; :meth:`stop` lets calls in flight finish for ``grace`` seconds, then cancels them.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time

import grpc

from driver import wire

from ..api.errors import status_of
from ..api.handling import outcome_of
from ..engine.errors import InvalidRequest, Unavailable
from ..limits import HttpLimits
from ..tenants import check_bind
from . import documents as D
from .access import live, model_view, need_admin, ready, repository_of, visible_index
from .grpc_codec import M, encode_response, message, parse_request
from .inference import OFF_LOOP_BYTES, execute, prepare

log = logging.getLogger("vnpu.serve")

_S = grpc.StatusCode
#: HTTP status of the one error table -> gRPC status
GRPC_CODES = {400: _S.INVALID_ARGUMENT, 401: _S.UNAUTHENTICATED, 403: _S.PERMISSION_DENIED, 404: _S.NOT_FOUND,
              429: _S.RESOURCE_EXHAUSTED, 499: _S.CANCELLED, 503: _S.UNAVAILABLE}


def _authorization(context) -> str | None:
    return next((v for k, v in context.invocation_metadata() or () if k == wire.AUTH_KEY), None)


def _rpc(open_: bool = False, model: bool = False):
    """The gate of one method ``fn(self, request, tenant)``: authentication, error mapping, per-tenant
    request counts; ``model``: a model request, whose outcome the server's sampler hears."""
    def wrap(fn):
        @functools.wraps(fn)
        async def call(self, request, context):
            t0, tenant, status, exc = time.monotonic(), None, 200, None
            try:
                if not open_:
                    tenant = self.service.tenants.authenticate(_authorization(context))
                return await fn(self, request, tenant)
            except asyncio.CancelledError:            # the client cancelled, or its deadline passed
                status = 499
                raise
            except Exception as e:  # noqa: BLE001 - every refusal answered as a status, never a traceback
                exc = e
                status, msg = status_of(e)
                if status >= 500 and status != 503:
                    log.exception("gRPC %s failed", fn.__name__)
            finally:
                if tenant is not None:
                    self.service.tenant_metrics.requests.labels(tenant.name, str(status)).inc()
                if model:
                    self.service.observe(outcome_of(status, exc, tenant is not None), time.monotonic() - t0)
            await context.abort(GRPC_CODES.get(status, _S.INTERNAL), msg)
        return call
    return wrap


async def _off_loop(big: bool, fn, *args):
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args) if big else fn(*args)


class InferenceServicer(wire.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` over ``service`` (a :class:`runtime.serve.server.Frontend`)."""

    def __init__(self, service):
        self.service = service

    @_rpc(open_=True)
    async def ServerLive(self, request, tenant):
        return M.ServerLiveResponse(live=live(self.service))

    @_rpc(open_=True)
    async def ServerReady(self, request, tenant):
        return M.ServerReadyResponse(ready=ready(self.service))

    @_rpc()
    async def ModelReady(self, request, tenant):
        view = model_view(self.service, tenant, request.name)
        return M.ModelReadyResponse(ready=view.ready(request.name, request.version or None))

    @_rpc()
    async def ServerMetadata(self, request, tenant):
        return message(D.server_metadata(), M.ServerMetadataResponse)

    @_rpc()
    async def ModelMetadata(self, request, tenant):
        meta = model_view(self.service, tenant, request.name).metadata(request.name, request.version or None)
        return message(D.model_metadata(meta), M.ModelMetadataResponse)

    @_rpc()
    async def ModelConfig(self, request, tenant):
        cfg = model_view(self.service, tenant, request.name).config(request.name, request.version or None)
        return message({"config": D.model_config(cfg)}, M.ModelConfigResponse)

    @_rpc(model=True)
    async def ModelInfer(self, request, tenant):
        big = request.ByteSize() >= OFF_LOOP_BYTES
        wreq, (meta, req) = await _off_loop(big, self._prepare, request, tenant)
        result = await execute(self.service, req)
        big = sum(getattr(a, "nbytes", 0) for a in result.outputs.values()) >= OFF_LOOP_BYTES
        return await _off_loop(big, encode_response, meta, wreq, result)

    def _prepare(self, request, tenant):
        wreq = parse_request(request)
        return wreq, prepare(self.service, tenant, request.model_name, request.model_version or None, wreq)

    @_rpc()
    async def ModelStatistics(self, request, tenant):
        need_admin(tenant, "model statistics")
        if not request.name:
            repo = repository_of(self.service)
            stats = repo.stats(None, None) if repo is not None else []
        else:
            stats = model_view(self.service, tenant, request.name).stats(request.name, request.version or None)
        return message(D.statistics(stats), M.ModelStatisticsResponse)

    @_rpc()
    async def RepositoryIndex(self, request, tenant):
        entries = visible_index(self.service, tenant, request.ready)
        return message({"models": D.index(entries)}, M.RepositoryIndexResponse)

    @_rpc()
    async def RepositoryModelLoad(self, request, tenant):
        return await self._control(request, tenant, "load")

    @_rpc()
    async def RepositoryModelUnload(self, request, tenant):
        return await self._control(request, tenant, "unload")

    async def _control(self, request, tenant, what: str):
        need_admin(tenant, f"{what}ing a model")
        extra = sorted(k for k in request.parameters if k != "unload_dependents")
        if extra:
            raise InvalidRequest(f"{what} parameters {', '.join(extra)} are not supported: models load from the "
                                 f"repository's own files", "parameters")
        view = model_view(self.service, tenant, request.model_name)
        await _off_loop(True, getattr(view, what), request.model_name)
        return M.RepositoryModelLoadResponse() if what == "load" else M.RepositoryModelUnloadResponse()


class GrpcInferenceServer:
    """``inference.GRPCInferenceService`` of ``service`` on ``host:port`` (see the module docstring)."""

    def __init__(self, service, host: str = "127.0.0.1", port: int = 0,
                 max_message_bytes: int = HttpLimits().max_body_bytes, allow_unauthenticated: bool = False):
        """Raises InvalidParamError for an open server (no API keys) on a non-loopback ``host`` unless
        ``allow_unauthenticated``."""
        check_bind(host, service.tenants, allow_unauthenticated)
        self.service, self.host, self.max_message_bytes = service, host, max_message_bytes
        self.requested_port = port
        self.port: int | None = None                 #: the bound port, once started
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server = None
        self._bound = threading.Event()
        self._error: BaseException | None = None
        self._stopping: asyncio.Event | None = None
        self._grace = 5.0
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``host:port`` as gRPC clients (tritonclient.grpc) take it."""
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"{h}:{self.port}"

    async def _serve(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            self._stopping = asyncio.Event()
            opts = wire.server_options(self.max_message_bytes)
            self._server = grpc.aio.server(options=opts)
            wire.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(self.service), self._server)
            h = f"[{self.host}]" if ":" in self.host else self.host
            self.port = self._server.add_insecure_port(f"{h}:{self.requested_port}")
            if not self.port:
                raise Unavailable(f"the gRPC server could not bind {self.host}:{self.requested_port}")
            await self._server.start()
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
            self._bound.set()
            return
        self._bound.set()
        await self._stopping.wait()
        await self._server.stop(self._grace)

    def start(self, timeout: float = 30.0) -> "GrpcInferenceServer":
        """Serve on a thread; returns once bound (raises what prevented it)."""
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), name="vnpu-serve-grpc",
                                        daemon=True)
        self._thread.start()
        if not self._bound.wait(timeout):
            raise Unavailable(f"the gRPC server did not start on {self.host} within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Stop taking calls; calls in flight get ``grace`` seconds, then are cancelled (blocks until then)."""
        if self._thread is not None and self._loop is not None and self._error is None:
            self._grace = grace
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(grace + 30)
        self._thread = None
