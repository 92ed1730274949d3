"""The gRPC side of the Open Inference Protocol: ``inference.GRPCInferenceService`` (KServe v2's methods and
Triton's ModelConfig, ModelStatistics, RepositoryIndex, RepositoryModelLoad/Unload), answering what the REST
routes answer, through the same flow (:mod:`.inference`) and documents (:mod:`.documents`).

One gate (:func:`_rpc`) in front of every method: the caller's API key from metadata
``authorization: Bearer <key>`` (:meth:`runtime.serve.tenants.TenantRegistry.authenticate`; ServerLive and
ServerReady are open, as ``/v2/health/*`` are), and every refusal of the one error table
(:func:`runtime.serve.api.errors.status_of`) as the gRPC status of its HTTP status (:data:`GRPC_CODES`:
400 ``INVALID_ARGUMENT``, 401 ``UNAUTHENTICATED``, 403 ``PERMISSION_DENIED``, 404 ``NOT_FOUND``, 429
``RESOURCE_EXHAUSTED``, 503 ``UNAVAILABLE``, anything else ``INTERNAL``) with the same message.  A call
cancelled by its client (or past its deadline) cancels its inference request (the call's termination
callback, :func:`.inference.execute_blocking`).  The servicer only adapts; its methods are synchronous and
run on the worker threads of :class:`runtime.serve.v2.grpc_server.GrpcInferenceServer` (one thread per call
in progress: an inference blocks its thread until its batch is done, a model load until it is loaded).
"""
from __future__ import annotations

import functools
import logging
import time

import grpc

from driver import wire

from ..api.errors import status_of
from ..api.handling import outcome_of
from ..engine.errors import InvalidRequest, ServeError
from . import documents as D
from .access import live, model_view, need_admin, ready, repository_of, visible_index
from .grpc_codec import M, encode_response, message, parse_request
from .inference import execute_blocking, prepare

log = logging.getLogger("vnpu.serve")

_S = grpc.StatusCode
#: HTTP status of the one error table -> gRPC status
GRPC_CODES = {400: _S.INVALID_ARGUMENT, 401: _S.UNAUTHENTICATED, 403: _S.PERMISSION_DENIED, 404: _S.NOT_FOUND,
              429: _S.RESOURCE_EXHAUSTED, 499: _S.CANCELLED, 503: _S.UNAVAILABLE}


def _authorization(context) -> str | None:
    return next((v for k, v in context.invocation_metadata() or () if k == wire.AUTH_KEY), None)


def _rpc(open_: bool = False, model: bool = False):
    """The gate of one method ``fn(self, request, tenant)``: authentication, error mapping, per-tenant
    request counts; ``model``: a model request (``fn(self, request, tenant, admitted, context)``: ``admitted``
    a list the method appends to once the request is admitted; :class:`ClientGone` when its client went
    away, counted as 499), whose outcome the server's sampler hears."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(self, request, context):
            t0, tenant, status, exc, admitted = time.monotonic(), None, 200, None, []
            try:
                if not open_:
                    tenant = self.service.tenants.authenticate(_authorization(context))
                return (fn(self, request, tenant, admitted, context) if model else fn(self, request, tenant))
            except ClientGone as e:                   # the client cancelled, or its deadline passed
                status, msg = 499, str(e)
            except Exception as e:  # noqa: BLE001 - every refusal answered as a status, never a traceback
                exc = e
                status, msg = status_of(e)
                if status == 500 and not isinstance(e, ServeError):     # not in the table: a bug, logged
                    log.exception("gRPC %s failed", fn.__name__)
            finally:
                if tenant is not None:
                    self.service.tenant_metrics.requests.labels(tenant.name, str(status)).inc()
                if model:                             # a 503 before admission is shed, as on REST
                    self.service.observe(outcome_of(status, exc, bool(admitted)), time.monotonic() - t0,
                                         getattr(request, "model_name", None) or None)
            context.abort(GRPC_CODES.get(status, _S.INTERNAL), msg)
        return call
    return wrap


class ClientGone(Exception):
    """The call was cancelled by its client, or its deadline passed, before its answer (nobody reads it)."""


class InferenceServicer(wire.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` over ``service`` (a :class:`runtime.serve.server.Frontend`)."""

    def __init__(self, service):
        self.service = service

    @_rpc(open_=True)
    def ServerLive(self, request, tenant):
        return M.ServerLiveResponse(live=live(self.service))

    @_rpc(open_=True)
    def ServerReady(self, request, tenant):
        return M.ServerReadyResponse(ready=ready(self.service))

    @_rpc()
    def ModelReady(self, request, tenant):
        view = model_view(self.service, tenant, request.name)
        return M.ModelReadyResponse(ready=view.ready(request.name, request.version or None))

    @_rpc()
    def ServerMetadata(self, request, tenant):
        return message(D.server_metadata(), M.ServerMetadataResponse)

    @_rpc()
    def ModelMetadata(self, request, tenant):
        meta = model_view(self.service, tenant, request.name).metadata(request.name, request.version or None)
        return message(D.model_metadata(meta), M.ModelMetadataResponse)

    @_rpc()
    def ModelConfig(self, request, tenant):
        cfg = model_view(self.service, tenant, request.name).config(request.name, request.version or None)
        return message({"config": D.model_config(cfg)}, M.ModelConfigResponse)

    @_rpc(model=True)
    def ModelInfer(self, request, tenant, admitted, context):
        wreq = parse_request(request)
        meta, req = prepare(self.service, tenant, request.model_name, request.model_version or None, wreq)
        result = execute_blocking(self.service, req, context.add_callback, lambda: admitted.append(True))
        if result is None:
            raise ClientGone("the client cancelled the call, or its deadline passed")
        return encode_response(meta, wreq, result)

    @_rpc()
    def ModelStatistics(self, request, tenant):
        need_admin(tenant, "model statistics")
        if not request.name:
            repo = repository_of(self.service)
            stats = repo.stats(None, None) if repo is not None else []
        else:
            stats = model_view(self.service, tenant, request.name).stats(request.name, request.version or None)
        return message(D.statistics(stats), M.ModelStatisticsResponse)

    @_rpc()
    def RepositoryIndex(self, request, tenant):
        entries = visible_index(self.service, tenant, request.ready)
        return message({"models": D.index(entries)}, M.RepositoryIndexResponse)

    @_rpc()
    def RepositoryModelLoad(self, request, tenant):
        return self._control(request, tenant, "load")

    @_rpc()
    def RepositoryModelUnload(self, request, tenant):
        return self._control(request, tenant, "unload")

    def _control(self, request, tenant, what: str):
        need_admin(tenant, f"{what}ing a model")
        extra = sorted(k for k in request.parameters if k != "unload_dependents")
        if extra:
            raise InvalidRequest(f"{what} parameters {', '.join(extra)} are not supported: models load from the "
                                 f"repository's own files", "parameters")
        view = model_view(self.service, tenant, request.model_name)
        getattr(view, what)(request.model_name)
        return M.RepositoryModelLoadResponse() if what == "load" else M.RepositoryModelUnloadResponse()
