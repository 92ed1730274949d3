"""The gRPC server of the Open Inference Protocol: ``inference.GRPCInferenceService``
(:class:`runtime.serve.v2.grpc_service.InferenceServicer`) served by gRPC's synchronous server on a pool of
``workers`` threads -- one per call in progress (an inference holds its thread until its batch is done, so
``workers`` is also the most requests one gRPC server can have queued for batching; calls beyond it wait
in gRPC's queue).  It binds loopback unless told otherwise -- and, like the HTTP server, refuses a
non-loopback address without API keys -- and port 0 picks a free port; messages up to
``max_message_bytes`` both ways.  :meth:`GrpcInferenceServer.start` returns once bound (blocks until then);
:meth:`GrpcInferenceServer.stop` stops taking calls and lets those in flight finish for ``grace`` seconds,
then cancels them (a cancelled call's request is dropped if its batch has not started; blocks until done).

Why not ``grpc.aio``: under load (16 closed-loop clients) its per-call handling on the one event-loop
thread cost ~0.41-0.51 ms of CPU per call against ~0.32-0.36 ms for the synchronous server on the same
machine (an echo servicer; ``docs/serving/kserve-v2.md``), and the server's throughput is bounded by its CPU
per request."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc

from driver import wire

from ..engine.errors import Unavailable
from ..limits import HttpLimits
from ..tenants import check_bind
from .grpc_service import InferenceServicer

#: worker threads (calls in progress at once) of a gRPC server unless told otherwise
DEFAULT_WORKERS = 64


class GrpcInferenceServer:
    """``inference.GRPCInferenceService`` of ``service`` on ``host:port`` (see the module docstring)."""

    def __init__(self, service, host: str = "127.0.0.1", port: int = 0,
                 max_message_bytes: int = HttpLimits().max_body_bytes, allow_unauthenticated: bool = False,
                 workers: int = DEFAULT_WORKERS):
        """Raises InvalidParamError for an open server (no API keys) on a non-loopback ``host`` unless
        ``allow_unauthenticated``."""
        check_bind(host, service.tenants, allow_unauthenticated)
        self.service, self.host, self.max_message_bytes = service, host, max_message_bytes
        self.requested_port, self.workers = port, workers
        self.port: int | None = None                 #: the bound port, once started
        self._server: grpc.Server | None = None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def url(self) -> str:
        """``host:port`` as gRPC clients (tritonclient.grpc) take it."""
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"{h}:{self.port}"

    def start(self, timeout: float = 30.0) -> "GrpcInferenceServer":
        """Bind and serve (gRPC's own threads); returns once bound (Unavailable when it cannot bind).
        ``timeout`` is accepted for the HTTP server's signature: binding does not wait."""
        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="vnpu-serve-grpc")
        server = grpc.server(pool, options=wire.server_options(self.max_message_bytes))
        try:
            wire.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(self.service), server)
            h = f"[{self.host}]" if ":" in self.host else self.host
            try:
                port = server.add_insecure_port(f"{h}:{self.requested_port}")
            except RuntimeError:                     # grpcio >= 1.50 raises where older ones returned 0
                port = 0
            if not port:
                raise Unavailable(f"the gRPC server could not bind {self.host}:{self.requested_port}")
            server.start()
        except BaseException:
            server.stop(None)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        self._server, self._pool, self.port = server, pool, port
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Stop taking calls; calls in flight get ``grace`` seconds, then are cancelled (blocks until then)."""
        server, pool, self._server, self._pool = self._server, self._pool, None, None
        if server is not None:
            server.stop(grace).wait(grace + 30)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
