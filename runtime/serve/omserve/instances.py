"""The instances of one served model version (Triton's model instances) and the router in front of them:
each request goes to the least loaded instance (fewest requests queued or running), and to the next one
when that instance refuses it (its queue full, or it failed); only when every instance refuses is the
request refused (:class:`QueueFull` if any queue was full -- the server is busy --, else
:class:`Unavailable`).  A priority the model does not have is refused by the first instance asked.

Each instance batches its own queue (:class:`runtime.serve.engine.om_engine.OmEngine`); a priority level's
``max_queue_size`` bounds the model's queue, as in Triton: the requests waiting at that level on all the
instances together (admissions are serialised, so the count cannot be overshot); the next one is refused
with :class:`QueueFull` (503 / ``UNAVAILABLE``) whichever instance it would have gone to.

Blocking: building loads the model on every instance's first placement; :meth:`InstanceSet.drain` waits
for the requests in flight; :meth:`InstanceSet.shutdown` frees the devices; the rest is host-only.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Callable, Sequence

from ..engine.errors import QueueFull, Unavailable
from ..engine.om_engine import OmEngine
from ..engine.placement import DeviceBinder, RebindResult
from ..modelrepo import ModelConfig, ModelVersion
from ..v2.repository import InferRequest
from .placement import InstancePlacement
from .stats import VersionStats


class InstanceSet:
    """Every instance of ``version`` of model ``config.name``, one per entry of ``placements``.  Raises
    (after freeing the instances already built) when an instance cannot load."""

    def __init__(self, rt, config: ModelConfig, version: ModelVersion, placements: Sequence[InstancePlacement],
                 stats: VersionStats, binder: DeviceBinder, on_event: Sequence[Callable[[dict], None]] = (),
                 clock: Callable[[], float] = time.monotonic):
        self.name, self.version = config.name, str(version.version)
        self._batching = config.dynamic_batching
        self._admit = threading.Lock()                 #: one admission at a time: the model's queue bound holds
        self.placements = tuple(placements)
        self._make = lambda i, p: OmEngine(rt, config.name, self.version, version.path, config, version.gears, stats,
                                           p.first, p.fallback, binder, clock, on_event, i)
        self.engines: list[OmEngine] = []
        try:
            for i, p in enumerate(placements):
                self.engines.append(self._make(i, p))
        except BaseException:
            self.shutdown()
            raise

    def start(self) -> None:
        for e in self.engines:
            e.start()

    def grow(self, n: int) -> list[str]:
        """``n`` more instances, started, placed as the configured ones in turn (the seed's ``scale_workers``
        on a compiled model: more instances to batch on; instances on one device share its cores).  Blocks
        for their model loads; raises (the ones built freed) when one cannot load.  Their names."""
        new: list[OmEngine] = []
        try:
            for k in range(n):
                i = len(self.engines) + k
                new.append(self._make(i, self.placements[i % len(self.placements)]))
        except BaseException:
            for e in new:
                e.shutdown()
            raise
        for e in new:
            e.start()
        self.engines = self.engines + new               # routing reads the list whole: no lock needed
        return [f"{self.name}/{self.version}#{e.instance}" for e in new]

    def shrink(self, n: int, timeout: float | None = 120.0) -> list[str]:
        """Retire the ``n`` newest instances beyond the configured ones (never fewer than configured):
        they stop taking requests at once, finish those they hold (up to ``timeout``), then shut down.
        Their names."""
        n = max(0, min(n, len(self.engines) - len(self.placements)))
        if n == 0:
            return []
        gone = self.engines[-n:]
        self.engines = self.engines[:-n]
        for e in gone:
            e.drain(timeout)
            e.shutdown()
        return [f"{self.name}/{self.version}#{e.instance}" for e in gone]

    def submit(self, request: InferRequest) -> Future:
        """``request`` to the least loaded instance that takes it (see the module)."""
        with self._admit:
            self._check_model_queue(request)
            return self._route(request)

    def _check_model_queue(self, request: InferRequest) -> None:
        """QueueFull when the level ``request`` queues at holds the model's ``max_queue_size`` requests on
        all the instances together (InvalidRequest for a priority the model does not have)."""
        if self._batching is None or not self.engines:
            return
        level = self.engines[0].batcher.level_of(request.priority or 0)
        cap = self._batching.queue_policy(level).max_queue_size
        if cap and sum(e.waiting_at(level) for e in self.engines) >= cap:
            which = f"priority level {level} of model {self.name!r}" if self._batching.priority_levels else \
                f"model {self.name!r}"
            raise QueueFull(f"exceeds the maximum queue size: the queue of {which} holds {cap} requests "
                            "(max_queue_size, over all its instances); retry later")

    def _route(self, request: InferRequest) -> Future:
        if len(self.engines) == 1:                   # nothing to choose (and no engine lock to take for it)
            return self.engines[0].submit(request)
        refusal: BaseException | None = None
        for e in sorted(self.engines, key=lambda x: x.load):
            try:
                return e.submit(request)
            except (QueueFull, Unavailable) as x:
                refusal = x if not isinstance(refusal, QueueFull) else refusal
        raise refusal or Unavailable(f"model {self.name!r} version {self.version} has no instance")

    @property
    def ready(self) -> bool:
        return any(e.accepting for e in self.engines)

    @property
    def waiting(self) -> int:
        return sum(e.waiting for e in self.engines)

    def wait_idle(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        return all(e.wait_idle(None if deadline is None else max(0.0, deadline - time.monotonic()))
                   for e in self.engines)

    def drain(self, timeout: float | None = None) -> bool:
        """Stop taking requests; wait (up to ``timeout`` s) for those in flight."""
        for e in self.engines:
            e.drain(0)
        return self.wait_idle(timeout)

    def shutdown(self) -> None:
        """Shut every instance down (what is left is refused), freeing its device memory; the first failure
        is raised once all were tried."""
        err = None
        for e in self.engines:
            try:
                e.shutdown()
            except Exception as x:  # noqa: BLE001 - shut the others down too
                err = err or x
        if err is not None:
            raise err

    def rebind(self, kind: str, reason: str = "requested", timeout: float | None = None,
               away_from: int | None = None) -> list[RebindResult]:
        """``fallback`` / ``restore`` / ``restart`` every instance (blocks until each is re-bound)."""
        if kind == "fallback":
            return [e.fallback(reason, timeout, away_from) for e in self.engines]
        if kind == "restart":
            return [e.restart(reason, timeout) for e in self.engines]
        return [e.restore(timeout) for e in self.engines]

    def describe(self) -> list[dict]:
        """Each instance's placement and chain, for operators."""
        return [{"instance": e.instance, "placement": str(e.placement), "index": e.index,
                 "chain": [str(p) for p in e.chain], "rebinds": e.rebinds, "waiting": e.waiting,
                 "failed_batches": e.failed_batches, "replayed_batches": e.replayed_batches,
                 "error": e.error} for e in self.engines]


__all__ = ["InstanceSet"]
