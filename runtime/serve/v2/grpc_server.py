"""The gRPC server of the Open Inference Protocol: ``inference.GRPCInferenceService``
(:class:`runtime.serve.v2.grpc_service.InferenceServicer`) served with ``grpc.aio`` on a thread of its own
(its own event loop).  It binds loopback unless told otherwise -- and, like the HTTP server, refuses a
non-loopback address without API keys -- and port 0 picks a free port; messages up to
``max_message_bytes`` both ways.  :meth:`GrpcInferenceServer.start` returns once bound (blocks until then);
:meth:`GrpcInferenceServer.stop` stops taking calls and lets those in flight finish for ``grace`` seconds,
then cancels them (blocks until done)."""
from __future__ import annotations

import asyncio
import threading

import grpc

from driver import wire

from ..engine.errors import Unavailable
from ..limits import HttpLimits
from ..tenants import check_bind
from .grpc_service import InferenceServicer


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
