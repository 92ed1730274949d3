"""A server: the engines of a :class:`ServeConfig` on a runtime, behind the OpenAI routes, on uvicorn.

Lifecycle (``GET /health``): ``starting`` (503) while engines load, ``ready`` (200), ``draining`` (503:
no new requests, running ones finish) after SIGTERM or :meth:`Server.drain`, then ``stopped``.  The
server binds loopback unless told otherwise -- and refuses a non-loopback address without API keys unless
``allow_unauthenticated`` -- and port 0 picks a free port (:attr:`Server.url` once bound).  What one client
may send is bounded (:mod:`.limits`: header and body deadlines and sizes, connections per address), in
uvicorn's protocol (:mod:`.api.connections`) and in front of the routes (:mod:`.api.guard`).

The service holds the HTTP tenants (:mod:`.tenants`: keys, priority classes, quotas) and the engines;
every engine (generation and embedding) gets its fallback chain (:mod:`.engine.placement`); they share one
CPU fallback device.
The admin operations the self-healing layer drives are methods here: :meth:`Service.fallback`,
:meth:`Service.restore`, :meth:`Service.defragment`, :meth:`Service.state_dict` (and, with Ray Serve replicas,
:class:`runtime.serve.replicas.ReplicaService` adds ``scale_out``/``scale_in``).

Blocking: :meth:`Server.start` returns once the socket is bound (engines may still be loading, see
:meth:`Service.wait_ready`); :meth:`Server.serve_forever` runs uvicorn in the calling (main) thread
until a drain completes; :meth:`Server.stop` drains, stops uvicorn, then frees every device resource.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from contextlib import ExitStack
from typing import Callable

from devices.errors import InvalidParamError
from runtime.observe.forecast import Forecaster

from .access_log import AccessLog
from .api import build_app
from .api.connections import ConnectionCounter, guarded_protocol
from .api.guard import RequestGuard
from .api.state import state_of
from .api.tokenize_pool import TokenizePool
from .circuit import Breakers
from .config import BatchingConfig, ModelSpec, place
from .engine import EmbedEngine, GenerateEngine
from .engine.errors import ModelNotFound, Unavailable
from .engine.placement import DeviceBinder
from .limits import HttpLimits
from .metrics import ForecastCollector, make_registry
from .result_cache import ResultCache
from .tags import TagRules
from .tenants import Quotas, Tenant, TenantRegistry, check_bind

log = logging.getLogger("vnpu.serve")

#: how long uvicorn lets requests in flight finish when the server stops (then cancels them); history long
#: polls end at once on a stop and may wait at most :data:`runtime.serve.api.longpoll.MAX_HISTORY_WAIT_S`
GRACEFUL_SHUTDOWN_S = 30


def _build_generate(rt, spec: ModelSpec, loggers, binder: DeviceBinder, on_event):
    return GenerateEngine(rt, spec.name, spec.devices, spec.engine, stat_loggers=loggers, fallback=spec.fallback,
                          binder=binder, on_event=on_event)


def _build_embed(rt, spec: ModelSpec, loggers, binder: DeviceBinder, on_event):
    b: BatchingConfig = spec.batching
    return EmbedEngine(rt, spec.name, spec.devices, b.max_batch_size, b.max_wait_ms, b.max_queued_requests,
                       stat_loggers=loggers, fallback=spec.fallback, binder=binder, on_event=on_event)


#: engine kind -> builder (a registry)
ENGINE_BUILDERS: dict[str, Callable] = {"generate": _build_generate, "embed": _build_embed}


class Frontend:
    """What every server has whatever runs its engines: tenants and quotas, the metrics registry, the
    lifecycle state (``starting`` / ``ready`` / ``draining`` / ``stopped`` / ``failed``), and engine lookup
    for the routes.  Engines are objects with the generation or embedding engine's surface, in
    :attr:`engines` by model name."""

    def __init__(self, rt, specs: tuple[ModelSpec, ...], tenants: tuple[Tenant, ...] = (),
                 clock: Callable[[], float] = time.monotonic, model_repository=None,
                 tags: tuple[tuple[str, int], ...] = ()):
        if not specs and model_repository is None:
            raise Unavailable("no model to serve (give --model or a config with models)")
        self.specs = specs
        self.engines: dict[str, object] = {}
        #: the models served over the Open Inference Protocol (a runtime.serve.v2.ModelRepositoryView: the
        #: /v2 routes and the gRPC inference service); None: none
        self.model_repository = model_repository
        self.tenants = TenantRegistry(tuple(tenants))
        self.tag_rules = TagRules(tuple(tags))   #: request tag -> priority class (runtime.serve.tags)
        self.quotas = Quotas(clock)
        self.breakers = Breakers(clock)          #: per-tenant circuit breakers (:mod:`.circuit`)
        max_len = max([m.engine.max_model_len for m in self.specs if m.kind == "generate"] or [512])
        self.registry, self.stat_logger, self.tenant_metrics = make_registry(rt, self.engines, max_len, self.quotas,
                                                                             self.tenants.tenants)
        if model_repository is not None:
            from .v2.metrics import TritonCollector
            self.registry.register(TritonCollector(model_repository))
        self.state = "starting"
        self.error: str | None = None
        self.created = int(time.time())
        self.events: list[dict] = []             #: engine re-binds and replica changes, in order
        self.stat_loggers: list = [self.stat_logger]
        self.observers: list = []                #: the sampler(s): request outcomes and events go there
        self.history = None                      #: the History the observers record into (admin routes read it)
        self.forecaster: Forecaster | None = None   #: the request-rate forecasts of that history (cached per bin)
        self.reconfigurer = None                 #: a runtime.serve.reconfigure.Reconfigurer (POST /admin/reconfigure)
        self.healing = None                      #: a runtime.serve.heal.SelfHealing (its state in /admin/state)
        self.memory = None                       #: a runtime.serve.memory_pool.MemoryManager (memory:), see manage_memory
        self.result_cache = ResultCache(clock)   #: deterministic answers per tenant (off until self-healing)
        self._cv = threading.Condition()

    def _event(self, ev: dict) -> None:
        with self._cv:
            self.events.append(ev)
        for o in list(self.observers):
            try:
                o.engine_event(ev)
            except Exception:  # noqa: BLE001 - an observer must not break the engine
                log.exception("observer failed on an event")

    # -------------------------------------------------------------- observability
    def attach_observer(self, obs) -> None:
        """``obs`` (a :class:`runtime.serve.metrics_sampler.Sampler`) hears request outcomes (``observe``), engine
        step stats (``record``, engines built from now on) and events (``engine_event``); its ``history``
        backs the ``/admin/history`` routes."""
        self.observers.append(obs)
        self.stat_loggers.append(obs)
        if self.history is None:                 # the forecasts (gauges, route) read the first observer's history
            self.forecaster = Forecaster(obs.history)
            self.registry.register(ForecastCollector(self.forecaster, obs.clock))
        self.history = obs.history

    def observe(self, outcome: str, latency_s: float | None = None, model: str | None = None) -> None:
        """The HTTP layer: one request (to ``model`` when known) ended (see
        :data:`runtime.serve.metrics_sampler.OUTCOMES`)."""
        for o in list(self.observers):
            o.observe(outcome, latency_s, model)

    def gauges(self) -> dict[str, float]:
        """Server-wide gauges now: requests waiting and running, KV-cache use (the fullest engine), the
        admission factor, serving replicas."""
        waiting = running = 0
        kv = 0.0
        for e in list(self.engines.values()):
            if getattr(e, "kind", None) == "generate" and hasattr(e, "snapshot"):
                s = e.snapshot()
                waiting += s.waiting
                running += s.running
                kv = max(kv, s.kv_usage)
        return {"queue_depth": waiting, "running": running, "kv_cache_usage": kv,
                "throttle": self.quotas.admission, "replicas": getattr(self, "replica_count", 1)}

    # -------------------------------------------------------------- lifecycle
    def load(self) -> None:
        """Build and start every engine (blocking); then the memory manager, when there is one (caps and
        pre-warms the pools, then ticks)."""
        try:
            self._load()
            if self.memory is not None and self.memory.plan.active:
                self.memory.start()
                self.memory.start_thread()
        except BaseException as e:
            with self._cv:
                self.state, self.error = "failed", f"{type(e).__name__}: {e}"
                self._cv.notify_all()
            raise
        with self._cv:
            if self.state == "starting":
                self.state = "ready"
            self._cv.notify_all()

    def _load(self) -> None:
        raise NotImplementedError

    def wait_ready(self, timeout: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: self.state != "starting", timeout) and self.state == "ready"

    def begin_drain(self) -> None:
        with self._cv:
            if self.state in ("starting", "ready"):
                self.state = "draining"
            self._cv.notify_all()
        for e in list(self.engines.values()):
            e.drain(0)                                   # stop taking requests; do not wait here

    def wait_drained(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for e in list(self.engines.values()):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not e.wait_idle(left):
                return False
        return True

    def manage_memory(self, spec, enabled: bool = True, clock: Callable[[], float] = time.monotonic):
        """Put the device pools under ``spec`` (a :class:`runtime.serve.config.MemorySpec`): a
        :class:`runtime.serve.memory_pool.MemoryManager` over :meth:`pool_devices`, degrading through
        :meth:`throttle` and defragmenting with :meth:`defragment`; started once the engines are loaded
        (caps and pre-warms the pools: blocks the host for the driver calls), then ticking once a second
        until :meth:`close`.  Returns it."""
        from .memory_pool import MemoryManager, PoolPlan
        plan = PoolPlan.from_spec(spec)
        self.memory = MemoryManager(self.pool_devices, self.throttle, self.defragment,
                                    PoolPlan(plan.strategy, plan.pool_bytes, plan.defrag_interval_s,
                                             plan.overflow_protection, enabled), clock)
        return self.memory

    def pool_devices(self) -> list:
        """The NPU devices (runtime devices with a caching pool) the in-process engines run on, once each."""
        devs: dict[int, object] = {}
        for e in self._held_engines():
            for d in getattr(e, "devices", ()):
                if getattr(d, "rt", None) is getattr(self, "rt", None):
                    devs.setdefault(id(d), d)
        return list(devs.values())

    def close(self) -> None:
        """Shut every engine down (aborting what is left) and free its device memory."""
        if self.memory is not None:
            self.memory.stop()
        with self._cv:
            self.state = "stopped"
            self._cv.notify_all()
        err = None
        for name, e in list(self.engines.items()):
            try:
                e.shutdown()
            except Exception as x:  # noqa: BLE001 - shut the others down too
                err = err or x
            self.engines.pop(name, None)
        try:
            self._closed()
        except Exception as x:  # noqa: BLE001
            err = err or x
        if err is not None:
            raise err

    def _closed(self) -> None:
        """After the engines are shut down: what else the service holds."""

    # -------------------------------------------------------------- what routes ask
    def health(self) -> tuple[int, dict]:
        failed = [n for n, e in self.engines.items() if getattr(e, "error", None)]
        if self.state == "ready" and not failed:
            return 200, {"status": "ok"}
        body = {"status": "failed" if failed or self.state == "failed" else self.state}
        if failed:
            body["failed"] = failed
        return 503, body

    def deep_health(self) -> tuple[int, dict]:
        """``GET /health?deep=true``: the health, plus a tiny kernel on every device and a request through
        every in-process model (:mod:`runtime.serve.heal.deep`; blocks for them)."""
        from .heal.deep import deep_health
        return deep_health(self, getattr(self, "rt", None))

    def check_accepting(self) -> None:
        if self.state != "ready":
            raise Unavailable(f"the server is {self.state}")

    def engine(self, name: str, kind: str | None, tenant: Tenant | None = None):
        """The engine serving ``name`` (for ``kind``), as ``tenant`` may see it (404 otherwise)."""
        e = self.engines.get(name)
        if tenant is not None and not tenant.may_use(name):
            e = None
        if e is None:
            if self.state == "starting" and any(s.name == name for s in self.specs):
                raise Unavailable(f"the model `{name}` is still loading")
            raise ModelNotFound(f"The model `{name}` does not exist or you do not have access to it.", "model",
                                "model_not_found")
        if kind is not None and e.kind != kind:
            what = "text generation" if kind == "generate" else "embeddings"
            raise ModelNotFound(f"The model `{name}` does not serve {what} (it is a "
                                f"{'generation' if e.kind == 'generate' else 'embedding'} model).", "model",
                                "model_not_found")
        return e

    def compiled_names(self) -> tuple[str, ...]:
        """The compiled models served over the Open Inference Protocol (tenants may name them)."""
        return ()

    def model_cards(self, tenant: Tenant | None = None) -> list[dict]:
        from .api.protocol import model_card
        return [model_card(n, self.created, e.config.max_model_len if e.kind == "generate" else e.max_len)
                for n, e in self.engines.items() if tenant is None or tenant.may_use(n)]

    # -------------------------------------------------------------- admin (self-healing drives these)
    def fallback(self, model: str, reason: str = "requested", timeout: float | None = None,
                 away_from: int | None = None):
        """Move ``model``'s engine (generation or embedding) one step down its fallback chain (blocks until
        re-bound); with ``away_from``, only if it still runs on that device (see
        :meth:`GenerateEngine.fallback`)."""
        return self.engine(model, None).fallback(reason, timeout, away_from)

    def restore(self, model: str, timeout: float | None = None):
        """Move ``model``'s engine back to its first placement when healthy (blocks until re-bound)."""
        return self.engine(model, None).restore(timeout)

    def restart(self, model: str, reason: str = "requested", timeout: float | None = None):
        """Restart ``model``'s engine on the placement it is on, its unfinished requests replayed there
        (blocks until rebuilt; see :meth:`runtime.serve.engine.lifecycle.EngineLifecycle.restart`)."""
        return self.engine(model, None).restart(reason, timeout)

    def throttle(self, factor: float) -> dict:
        """Admit less by ``factor`` (0 < factor <= 1; 1 restores): every generation engine's batch, step
        budget and queue bound, and every tenant's quotas.  Running requests are not dropped."""
        self.quotas.set_admission(factor)
        for e in list(self.engines.values()):
            if hasattr(e, "set_throttle"):
                e.set_throttle(factor)
        self._event({"kind": "throttle", "factor": factor, "t": time.monotonic()})
        return {"throttle": factor}

    def defragment(self, timeout: float | None = 60.0) -> list[dict]:
        """Live defragmentation of every device the engines run on (the memory pool's
        :meth:`runtime.api.Device.defragment`): every engine is held between two steps (requests keep
        queuing, running ones resume where they were), each device is compacted once -- the engines'
        weights, KV caches and activations move, captured decode graphs are re-bound in place -- then
        the engines go on.  Blocks the caller for the pause (:class:`Unavailable` when an engine does not
        reach a step boundary within ``timeout`` s; nothing moved then).  One report per device
        (``device``: ``npu:<index>``, or ``cpu:0`` for the CPU fallback, then the
        :class:`runtime.memory.DefragReport` fields)."""
        engines = self._held_engines()
        out = []
        with ExitStack() as held:
            for e in engines:
                held.enter_context(e.paused(timeout))
            devs: dict[int, object] = {}
            for e in engines:
                for d in e.devices:
                    devs.setdefault(id(d), d)
            for d in devs.values():
                rep = d.defragment()
                out.append({"device": f"{'npu' if d.rt is self.rt else 'cpu'}:{d.index}", **rep.as_dict()})
        self._event({"kind": "defragment", "devices": len(out), "bytes_moved": sum(r["bytes_moved"] for r in out),
                     "pause_s": max((r["pause_s"] for r in out), default=0.0), "t": time.monotonic()})
        return out

    def _held_engines(self) -> list:
        """The in-process engines a defragmentation holds between two steps."""
        return [e for e in list(self.engines.values()) if hasattr(e, "paused")]

    def set_tenants(self, tenants: tuple[Tenant, ...]) -> None:
        """Replace the tenants (keys, classes, quotas) for requests from now on; requests in flight keep the
        tenant they were admitted as."""
        self.tenants = TenantRegistry(tuple(tenants))

    def set_tags(self, tags: tuple[tuple[str, int], ...]) -> None:
        """Replace the tag rules for requests from now on (queued requests keep their priority)."""
        self.tag_rules = TagRules(tuple(tags))

    def live_engine(self, model: str, method: str):
        """``model``'s engine if it can take ``method`` (``set_limits``, ``set_batching``) while it runs;
        :class:`InvalidParamError` (one line) when it cannot (Ray Serve replicas, a compiled model)."""
        e = self.engines.get(model)
        if e is None or not hasattr(e, method):
            raise InvalidParamError(f"the engine of {model} here ({type(e).__name__ if e is not None else 'none'}) "
                                    f"cannot change its limits live; that needs a restart")
        return e

    def set_engine_limits(self, model: str, config) -> None:
        """``model``'s generation limits (an :class:`runtime.serve.engine.EngineConfig`; the live fields:
        batch, step budget, queue bound, policy) from its next step, nothing dropped."""
        self.live_engine(model, "set_limits").set_limits(config)

    def set_batching(self, model: str, batching) -> None:
        """``model``'s dynamic batching (a :class:`runtime.serve.config.BatchingConfig`) from its next
        batch, nothing dropped."""
        self.live_engine(model, "set_batching").set_batching(batching.max_batch_size, batching.max_wait_ms,
                                                             batching.max_queued_requests)

    def set_mode(self, model: str, mode) -> None:
        """Switch ``model``'s scheduler mode (a :class:`runtime.serve.engine.modes.ModeConfig`) from its next
        step on, without dropping anything."""
        self.engine(model, "generate").set_mode(mode)

    def pick_auto_slo(self, history, now: float | None = None) -> dict[str, float]:
        """Give every generation model in scheduler mode ``auto`` the target its history supports
        (:func:`runtime.serve.auto_slo.pick_target`; ``now``: the history's clock, default wall time).
        Models without enough history keep their target.  Returns model -> the target picked; records a
        ``config`` event per pick.  Blocks for one SQLite read per model."""
        from .auto_slo import pick_target
        now = time.time() if now is None else now
        picked: dict[str, float] = {}
        for n, e in list(self.engines.items()):
            mode = getattr(getattr(e, "config", None), "mode", None)
            if getattr(mode, "mode", None) != "auto":
                continue
            t = pick_target(history, now)
            if t is None:
                continue
            e.set_mode(dataclasses.replace(mode, target_p99_ms=t))
            picked[n] = t
            history.record_event("config", source="auto_slo", diagnosis=f"{n}: scheduler mode auto picked "
                                 f"target_p99_ms={t:g} from the history", detail={"model": n, "target_p99_ms": t})
        return picked

    def _usage(self, t: Tenant) -> dict:
        u = self.quotas.usage(t)
        if t.circuit_breaker is not None:
            u["circuit_breaker"] = self.breakers.state(t.name)
        return u

    def slo(self) -> dict:
        """The running config's ``slo`` (``target_p99_ms``, ``availability`` as a fraction; None where not
        set; what reconfigure changed included); {} when the server keeps no config."""
        rc = self.reconfigurer
        return dataclasses.asdict(rc.cfg.slo) if rc is not None else {}

    def state_dict(self) -> dict:
        """The server's state for operators: lifecycle, the ``slo`` it is held to, engines (placement,
        chain, limits), tenants' usage."""
        out = {"state": self.state, "throttle": self.quotas.admission, "slo": self.slo(), "models": {},
               "tenants": [self._usage(t) for t in self.tenants.tenants], "events": list(self.events[-50:])}
        if self.healing is not None:
            out["self_healing"] = self.healing.state()
        if self.memory is not None:
            out["memory"] = self.memory.state()
        for n, e in list(self.engines.items()):
            d = {"kind": e.kind}
            if e.kind == "generate" and hasattr(e, "chain"):
                s = e.snapshot()
                c = e.config
                d.update(placement=str(e.placement), index=s.placement, chain=[str(p) for p in e.chain],
                         rebinds=s.rebinds, running=s.running, waiting=s.waiting, mode=c.mode.mode,
                         policy=c.scheduling_policy,
                         max_num_seqs=s.limits.max_num_seqs if s.limits else c.max_num_seqs,
                         kv_blocks=s.num_blocks, block_size=c.block_size, max_model_len=c.max_model_len,
                         graphs=s.graphs, graph_buckets=list(c.decode_buckets) if c.graphs else [],
                         max_num_batched_tokens=c.max_num_batched_tokens, max_queued_requests=c.max_queued_requests)
            elif e.kind == "embed" and hasattr(e, "chain"):
                d.update(placement=str(e.placement), index=e.index, chain=[str(p) for p in e.chain],
                         rebinds=e.rebinds, waiting=e.waiting, failed_batches=e.failed_batches,
                         replayed_batches=e.replayed_batches, max_batch_size=e.max_batch_size,
                         max_wait_ms=e.max_wait_s * 1e3, max_queued_requests=e.max_queued_requests,
                         max_len=e.max_len)
            out["models"][n] = d
        return out


class Service(Frontend):
    """The engines of the models in this process, on runtime ``rt`` (the single-replica server):
    generation and embedding models (``models``), and compiled models (``repositories``: model
    repositories or single ``.om`` files, :class:`runtime.serve.modelrepo.Repository`) served over the Open
    Inference Protocol by :class:`runtime.serve.omserve.CompiledModels` -- placed on the devices the other
    models leave free, loaded with them, drained and shut down with them."""

    def __init__(self, rt, models: tuple[ModelSpec, ...], tenants: tuple[Tenant, ...] = (),
                 clock: Callable[[], float] = time.monotonic, tags: tuple[tuple[str, int], ...] = (),
                 repositories: tuple = ()):
        if not models and not repositories:
            raise Unavailable("no model to serve (give --model or a config with models)")
        self.rt = rt
        self.binder = DeviceBinder(rt)
        self.compiled = None                     #: the compiled models (a runtime.serve.omserve.CompiledModels)
        if repositories:
            from .omserve import CompiledModels, compiled_needs
            specs = place(models, rt.device_count(), compiled_needs(m for r in repositories for m in r.models)[0])
            self.compiled = CompiledModels(rt, repositories, specs, self.binder, [self._event])
        else:
            specs = place(models, rt.device_count())
        super().__init__(rt, specs, tenants, clock, tags=tags, model_repository=self.compiled)

    def _load(self) -> None:
        """Build and start every engine (blocking: weights upload, KV cache, graph captures), then load
        the compiled models."""
        for spec in self.specs:
            eng = ENGINE_BUILDERS[spec.kind](self.rt, spec, self.stat_loggers, self.binder, [self._event])
            self.engines[spec.name] = eng
            eng.start()
            log.debug("serving %s on devices %s", spec.name, list(spec.devices))
        if self.compiled is not None:
            self.compiled.load_all()

    def compiled_names(self) -> tuple[str, ...]:
        return self.compiled.names if self.compiled is not None else ()

    def scale_instances(self, model: str, n: int) -> list[str]:
        """``n`` more instances of compiled model ``model`` (``n`` < 0: retire as many added ones); blocks
        for the loads or the drains.  Their names."""
        if self.compiled is None or model not in self.compiled.names:
            raise Unavailable(f"{model!r} is not a compiled model of this server (instances are theirs)")
        return self.compiled.scale(model, n)

    def wait_drained(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        if not super().wait_drained(timeout):
            return False
        return self.compiled is None or self.compiled.wait_idle(None if deadline is None else
                                                                max(0.0, deadline - time.monotonic()))

    def gauges(self) -> dict[str, float]:
        g = super().gauges()
        if self.compiled is not None:
            g["queue_depth"] += self.compiled.waiting()
        return g

    def fallback(self, model: str, reason: str = "requested", timeout: float | None = None,
                 away_from: int | None = None):
        if self.compiled is not None and model in self.compiled.names:
            return self.compiled.rebind(model, "fallback", reason, timeout, away_from)
        return super().fallback(model, reason, timeout, away_from)

    def restore(self, model: str, timeout: float | None = None):
        if self.compiled is not None and model in self.compiled.names:
            return self.compiled.rebind(model, "restore", timeout=timeout)
        return super().restore(model, timeout)

    def restart(self, model: str, reason: str = "requested", timeout: float | None = None):
        if self.compiled is not None and model in self.compiled.names:
            return self.compiled.rebind(model, "restart", reason, timeout)
        return super().restart(model, reason, timeout)

    def _held_engines(self) -> list:
        return super()._held_engines() + (self.compiled.all_instances() if self.compiled is not None else [])

    def state_dict(self) -> dict:
        out = super().state_dict()
        if self.compiled is not None:
            out["compiled_models"] = self.compiled.describe()
        return out

    def _closed(self) -> None:
        try:
            if self.compiled is not None:
                self.compiled.close()
        finally:
            self.binder.close()


class _Uvicorn:
    """uvicorn.Server whose SIGTERM/SIGINT starts a drain instead of exiting (a second one exits now)."""

    @staticmethod
    def make(config, service: Frontend, on_shutdown: Callable[[], None]):
        import uvicorn

        class Server(uvicorn.Server):
            def __init__(self, cfg):
                super().__init__(cfg)
                self.bound = threading.Event()
                self.draining = False

            async def startup(self, sockets=None):
                await super().startup(sockets)
                self.bound.set()

            async def shutdown(self, sockets=None):
                on_shutdown()                            # end the long polls: the graceful wait must not wait on them
                await super().shutdown(sockets)

            def handle_exit(self, sig, frame):           # no re-raise of the signal after a clean drain
                if self.draining:
                    self.should_exit = self.force_exit = True
                    return
                self.draining = True
                threading.Thread(target=self._drain, name="vnpu-serve-drain", daemon=True).start()

            def _drain(self):
                service.begin_drain()
                service.wait_drained()
                self.should_exit = True

        return Server(config)


class Server:
    """The HTTP server of a :class:`Frontend` (a :class:`Service` or Ray Serve replicas)."""

    def __init__(self, service: Frontend, host: str = "127.0.0.1", port: int = 0,
                 allow_unauthenticated: bool = False, http: HttpLimits = HttpLimits(),
                 tokenizer: TokenizePool | None = None, grpc_port: int | None = None, access_log: bool = True):
        """Raises InvalidParamError for an open server (no API keys) on a non-loopback ``host`` unless
        ``allow_unauthenticated``.  ``http``: what one client may send (:mod:`runtime.serve.limits`: body
        size, header and body deadlines, connections per client and in all); ``tokenizer``: the pool that
        tokenizes requests -- the caller's, which the caller closes (default: the server's own of
        ``http.tokenizer_threads`` threads, closed when the server stops); ``grpc_port``: also serve the
        Open Inference Protocol over gRPC on ``host`` (0: a free port, :attr:`grpc_url` once started;
        messages up to ``http.max_body_bytes``); ``access_log``: a line per HTTP request on the logger
        ``vnpu.serve.access`` (:mod:`.access_log`; uvicorn's own access log is always off)."""
        import uvicorn
        check_bind(host, service.tenants, allow_unauthenticated)
        self.grpc = None
        if grpc_port is not None:
            from .v2.grpc_server import GrpcInferenceServer        # gRPC only for servers that serve it
            self.grpc = GrpcInferenceServer(service, host, grpc_port, http.max_body_bytes, allow_unauthenticated)
        self.service = service
        self.limits = http
        self.tokenizer = tokenizer or TokenizePool(http.tokenizer_threads)
        self._owns_tokenizer = tokenizer is None
        self.connections = ConnectionCounter(http.max_connections_per_client, http.max_connections)  #: by client
        self.app = build_app(service, self.tokenizer)
        app = RequestGuard(self.app, service, http)
        cfg = uvicorn.Config(AccessLog(app) if access_log else app, host=host, port=port, log_level="warning",
                             access_log=False, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, lifespan="off",
                             http=guarded_protocol(http, self.connections))
        self.uv = _Uvicorn.make(cfg, service, state_of(self.app).long_polls.close)
        self.host = host
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.uv.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}"

    @property
    def grpc_url(self) -> str | None:
        """``host:port`` of the gRPC inference service (None: not served)."""
        return None if self.grpc is None else self.grpc.url

    def start(self, timeout: float = 30.0) -> "Server":
        """Serve on a thread; returns once bound (raises if uvicorn could not bind)."""
        if self.grpc is not None:
            self.grpc.start(timeout)
        self._thread = threading.Thread(target=self.uv.run, name="vnpu-serve-http", daemon=True)
        self._thread.start()
        while not self.uv.bound.wait(0.05):
            if not self._thread.is_alive() or timeout <= 0:
                raise Unavailable(f"the HTTP server did not start on {self.host}")
            timeout -= 0.05
        return self

    def serve_forever(self, on_bound: Callable[["Server"], None] | None = None) -> None:
        """Run uvicorn in this (main) thread until SIGTERM/SIGINT has drained the engines."""
        if self.grpc is not None:
            self.grpc.start()
        if on_bound is not None:
            threading.Thread(target=lambda: (self.uv.bound.wait(), on_bound(self)), daemon=True).start()
        try:
            self.uv.run()
        finally:
            if self.grpc is not None:
                self.grpc.stop()
            if self._owns_tokenizer:
                self.tokenizer.close()

    def drain(self, timeout: float | None = None) -> bool:
        self.service.begin_drain()
        return self.service.wait_drained(timeout)

    def stop(self, drain_timeout: float | None = 60.0) -> None:
        """Drain, stop the HTTP server, shut the engines down.  History long polls in flight answer at once
        (they do not hold the stop for their ``wait_s``)."""
        state_of(self.app).long_polls.close()
        try:
            self.drain(drain_timeout)
        finally:
            if self.grpc is not None:
                self.grpc.stop()
            self.uv.should_exit = True
            if self._thread is not None:
                self._thread.join(GRACEFUL_SHUTDOWN_S)
                self._thread = None
            if self._owns_tokenizer:
                self.tokenizer.close()
            self.service.close()
