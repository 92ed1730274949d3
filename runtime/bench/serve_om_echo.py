"""The transport floor of ``vnpu bench serve-om``: a gRPC server of ``inference.GRPCInferenceService`` that
answers each ``ModelInfer`` with the response it precomputed for the request's input bytes -- the correct
output rows of the bench's samples (so the clients still verify every answer) -- and does nothing else:
no model, no batching, no checks, no tenants.  Served like vnpu's own gRPC endpoint (gRPC's synchronous
server on a thread pool, the same options, in the bench's process) to the same clients: the requests/s it
sustains is the most the clients, gRPC and this machine allow at that concurrency, whatever the server
behind them does.  A request whose inputs are not a known sample is answered ``NOT_FOUND``.

Blocking: :meth:`EchoServer.start` returns once bound; :meth:`EchoServer.stop` blocks until stopped.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from driver import wire

M = wire.inference


class _Echo(wire.GRPCInferenceServiceServicer):
    def __init__(self, answers: dict[tuple[bytes, ...], object]):
        self.answers = answers

    def ModelInfer(self, request, context):
        resp = self.answers.get(tuple(request.raw_input_contents))
        if resp is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "not one of the bench's samples")
        return resp


def _answers(samples: list[dict[str, np.ndarray]], refs: list[list[np.ndarray]], names: list[str],
             outputs: list[tuple[str, str]]) -> dict[tuple[bytes, ...], object]:
    """Input bytes (in ``names`` order) -> the response with ``refs`` (``outputs``: (name, datatype))."""
    out = {}
    for s, ys in zip(samples, refs):
        r = M.ModelInferResponse(model_name="echo", model_version="1")
        for (name, dt), y in zip(outputs, ys):
            r.outputs.add(name=name, datatype=dt, shape=list(y.shape))
            r.raw_output_contents.append(np.ascontiguousarray(y).tobytes())
        out[tuple(np.ascontiguousarray(s[n]).tobytes() for n in names)] = r
    return out


class EchoServer:
    """The floor server on loopback (a free port); :attr:`url` once started."""

    def __init__(self, samples, refs, names: list[str], outputs: list[tuple[str, str]], workers: int = 64):
        self._answers = _answers(samples, refs, names, outputs)
        self._workers = workers
        self._server: grpc.Server | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.url = ""

    def start(self) -> "EchoServer":
        pool = ThreadPoolExecutor(self._workers, thread_name_prefix="bench-echo")
        server = grpc.server(pool, options=wire.server_options())
        wire.add_GRPCInferenceServiceServicer_to_server(_Echo(self._answers), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server, self._pool, self.url = server, pool, f"127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(None).wait(30)
            self._server = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


__all__ = ["EchoServer"]
