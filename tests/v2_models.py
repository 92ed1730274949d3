"""A real :class:`runtime.serve.v2.ModelRepositoryView` for the protocol tests: numpy functions as models,
executed in order on one worker thread (a concurrent future per request, as an engine gives), with load and
unload, statistics, and a record of every request that reached it -- so that a test can tell that a bad
tensor never got this far.  No device: the protocol layer is what these tests are about."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable


from runtime.serve.engine.errors import ModelNotFound, Unavailable
from runtime.serve.v2 import (Duration, DynamicBatching, IndexEntry, InferRequest, InferResult, InstanceGroup,
                              ModelConfig, ModelMetadata, ModelStats, QueuePolicy, TensorSpec)

#: every datatype an echo model is made for
ECHO_TYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
              "FP64", "BYTES")


@dataclass
class FnModel:
    meta: ModelMetadata
    fn: Callable[[dict], dict]
    config: ModelConfig
    loaded: bool = True
    success: int = 0
    rows: int = 0
    calls: int = 0


@dataclass
class Gate:
    """Holds the ``gated`` model's executions until :meth:`open`; counts the ones that started."""
    opened: threading.Event = field(default_factory=threading.Event)
    started: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def wait_started(self, timeout: float = 30.0) -> bool:
        return self.started.acquire(timeout=timeout)


def _spec(name, dt, shape):
    return TensorSpec(name, dt, tuple(shape))


def _model(name, inputs, outputs, fn, mbs, batching=None, loaded=True, platform="numpy"):
    meta = ModelMetadata(name, ("1",), platform, tuple(inputs), tuple(outputs), mbs)
    cfg = ModelConfig(meta, "numpy", batching, (InstanceGroup(1, "KIND_CPU", (), f"{name}_cpu"),))
    return FnModel(meta, fn, cfg, loaded)


def models(gate: Gate) -> list[FnModel]:
    f4 = lambda n: _spec(n, "FP32", (-1, 4))                                                    # noqa: E731
    batching = DynamicBatching((2, 4), 500, 2, 1, QueuePolicy(16, 0, True))

    def gated(x):
        gate.started.release()
        gate.opened.wait(60)
        return {"OUT": x["IN"]}
    out = [_model("add_sub", [f4("INPUT0"), f4("INPUT1")], [f4("OUTPUT0"), f4("OUTPUT1")],
                  lambda x: {"OUTPUT0": x["INPUT0"] + x["INPUT1"], "OUTPUT1": x["INPUT0"] - x["INPUT1"]}, 8,
                  batching),
           _model("fixed", [_spec("IN", "INT32", (2, 3))], [_spec("OUT", "INT32", (2, 3))],
                  lambda x: {"OUT": x["IN"] * 2}, 0),
           _model("gated", [_spec("IN", "FP32", (-1, 1))], [_spec("OUT", "FP32", (-1, 1))], gated, 4),
           _model("cold", [_spec("IN", "FP32", (-1, 2))], [_spec("OUT", "FP32", (-1, 2))],
                  lambda x: {"OUT": -x["IN"]}, 4, loaded=False)]
    for dt in ECHO_TYPES:
        out.append(_model(f"echo_{dt.lower()}", [_spec("IN", dt, (-1, -1))], [_spec("OUT", dt, (-1, -1))],
                          lambda x: {"OUT": x["IN"]}, 4))
    return out


class NumpyRepository:
    """The models of :func:`models`, behind the :class:`~runtime.serve.v2.ModelRepositoryView` interface."""

    def __init__(self):
        self.gate = Gate()
        self.models = {m.meta.name: m for m in models(self.gate)}
        self.requests: list[InferRequest] = []          #: every request that reached submit, in order
        self.cancelled = 0                              #: futures cancelled before they ran
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="numpy-model")
        self._lock = threading.Condition()

    def wait_for(self, pred: Callable[["NumpyRepository"], bool], timeout: float = 30.0) -> bool:
        """Block until ``pred(self)`` holds (re-checked on every request submitted or cancelled)."""
        with self._lock:
            return self._lock.wait_for(lambda: pred(self), timeout)

    def _get(self, name: str, version: str | None) -> FnModel:
        m = self.models.get(name)
        if m is None or (version is not None and version not in m.meta.versions):
            raise ModelNotFound(f"no model {name!r}" + (f" version {version}" if version else ""))
        return m

    def index(self) -> list[IndexEntry]:
        return [IndexEntry(n, "1", "READY" if m.loaded else "UNAVAILABLE", "" if m.loaded else "unloaded")
                for n, m in self.models.items()]

    def metadata(self, name, version):
        return self._get(name, version).meta

    def config(self, name, version):
        return self._get(name, version).config

    def ready(self, name, version):
        return self._get(name, version).loaded

    def submit(self, request: InferRequest) -> Future:
        m = self._get(request.model, request.version)
        if not m.loaded:
            raise Unavailable(f"model {request.model!r} is not loaded")
        with self._lock:
            self.requests.append(request)
            self._lock.notify_all()
        fut = self._pool.submit(self._run, m, request)
        fut.add_done_callback(self._count_cancelled)
        return fut

    def _count_cancelled(self, fut: Future) -> None:
        if fut.cancelled():
            with self._lock:
                self.cancelled += 1
                self._lock.notify_all()

    def _run(self, m: FnModel, req: InferRequest) -> InferResult:
        m.calls += 1
        out = m.fn(dict(req.inputs))
        if req.outputs:
            out = {k: out[k] for k in req.outputs}
        m.success += 1
        m.rows += req.rows
        return InferResult(out, "1")

    def load(self, name):
        self._get(name, None).loaded = True

    def unload(self, name):
        self._get(name, None).loaded = False

    def stats(self, name, version):
        ms = [self._get(name, version)] if name is not None else list(self.models.values())
        now = int(time.time() * 1000)
        return [ModelStats(m.meta.name, "1", now if m.success else 0, m.rows, m.success, Duration(m.success, 1000))
                for m in ms]

    def close(self) -> None:
        self.gate.opened.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
