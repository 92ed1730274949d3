"""Ray Serve replicas: R copies of a server's engines on the cluster, behind the same OpenAI routes.

``vnpu serve --replicas R`` keeps the HTTP front (routes, tenants, quotas, metrics) in its own process and
runs the engines as R Ray Serve applications, one replica each (:class:`ReplicaDeployment`).  A replica
asks Ray for ``{"NPU": k}`` (k: the devices one copy of the models needs), so Ray places it on a node with k
free NPUs and tells it which through ``ASCEND_RT_VISIBLE_DEVICES``; the replica opens the device actors of
*its own* node (matched by Ray node id) and sees exactly those k devices as visible ids ``0..k-1``, so the
models' placements and fallback chains in the config are relative to each replica's group.  Replicas
therefore spread over the nodes of a multi-node cluster with no configuration.  The single-replica
default (:class:`runtime.serve.server.Service`) stays in-process: no Ray Serve hop.

Why one application per replica (and not one deployment with ``num_replicas=R``): Ray Serve restarts every
replica of a deployment redeployed from Python (its code version is random), and its in-place scaling API
is only reachable through the dashboard.  With one application per replica the front adds one
(:meth:`ReplicaService.scale_out`) without touching the others, and removes a chosen one
(:meth:`ReplicaService.scale_in`) after *draining* it: no new requests go there, the front waits until its
in-flight requests have finished, then deletes the application (Ray Serve's own graceful shutdown waits
again, and the replica frees its device memory).  The front routes each request to the ready replica
with the fewest requests in flight.

Streaming: a generation request is one streaming call (``handle.options(stream=True)``); the replica's
generator first yields an empty "accepted" item (so a refusal -- queue full, bad request -- is an HTTP
error before the first byte), then *batches* of outputs: whatever the engine produced since the last
item, gathering for up to ``stream_interval_ms`` after the first token -- tokens never pay one Serve
message each, and the first token is never held.

Health: Ray Serve calls :meth:`ReplicaBody.check_health` (``health_check_period_s``); it raises when an
engine failed (no fallback left) and Serve replaces the replica.  The front stops routing to a replica
whose calls fail and probes it again after a second.

Blocking: :meth:`ReplicaService.load`, :meth:`~ReplicaService.scale_out`, :meth:`~ReplicaService.scale_in`
block (replica start: model upload and graph captures; drain); the proxies' calls are coroutines on the
HTTP server's event loop.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from devices.errors import InvalidParamError

from runtime.cluster import rayenv

from .config import ModelSpec, devices_needed, place
from .credentials import replica_env
from .engine.embed_engine import check_texts
from .engine.errors import ServeError, Unavailable
from .engine.prompts import PromptChecks
from .engine.request import RequestHandle, RequestOutput
from .engine.sampling import SamplingParams
from .server import Frontend, Service
from .tenants import Tenant

log = logging.getLogger("vnpu.serve")


@dataclass(frozen=True)
class ReplicaOptions:
    """Ray Serve knobs of every replica (same names as ``@serve.deployment``), and how long a replica
    gathers streamed tokens into one item after the first (``stream_interval_ms``)."""
    max_ongoing_requests: int = 64
    health_check_period_s: float = 5.0
    health_check_timeout_s: float = 30.0
    graceful_shutdown_timeout_s: float = 60.0
    stream_interval_ms: float = 20.0
    num_cpus: float = 0.0
    start_timeout_s: float = 600.0

    def __post_init__(self):
        if not isinstance(self.max_ongoing_requests, int) or self.max_ongoing_requests < 1:
            raise InvalidParamError(f"max_ongoing_requests must be >= 1, got {self.max_ongoing_requests!r}")
        if not 0 <= self.stream_interval_ms <= 1000:
            raise InvalidParamError(f"stream_interval_ms must be in [0, 1000], got {self.stream_interval_ms!r}")


# ---------------------------------------------------------------------------------------------- replica side
def node_runtime():
    """The runtime of a replica: the device actors on this Ray node (matched by node id), of which
    ``ASCEND_RT_VISIBLE_DEVICES`` (set by Ray for the ``NPU`` resource) names the visible ones."""
    rayenv.prepare()
    import ray

    from runtime.api import Runtime
    from runtime.cluster.discovery import attach_ray, discover
    from runtime.cluster.remote import RemoteBackend

    from .credentials import device_credential
    attach_ray()
    node = ray.get_runtime_context().get_node_id()
    where = [w for w in discover() if w.get("ray_node", node) == node]
    return Runtime(RemoteBackend(where, device_credential()))


class ReplicaBody:
    """What one replica runs: a :class:`Service` over its devices, and the calls the front makes.  A plain
    class (the Ray Serve deployment wraps it), so that it also runs in-process."""

    def __init__(self, specs: tuple[ModelSpec, ...], stream_interval_ms: float = 20.0,
                 runtime_factory: Callable = node_runtime):
        self.rt = runtime_factory()
        self.stream_interval_s = stream_interval_ms / 1e3
        self.svc = Service(self.rt, specs)
        try:
            self.svc.load()
        except BaseException:
            self.close()
            raise

    def info(self) -> dict:
        import os
        models = {}
        for name, e in self.svc.engines.items():
            if e.kind == "generate":
                models[name] = {"kind": "generate", "config": e.config, "num_blocks": e.blocks.pool.num_blocks}
            else:
                models[name] = {"kind": "embed", "max_len": e.max_len, "dim": e.dim}
        node = ""
        rayenv.prepare()
        import ray
        if ray.is_initialized():                        # (never start or join a Ray cluster from here)
            node = ray.get_runtime_context().get_node_id()
        return {"pid": os.getpid(), "node": node, "devices": [d.physical_id for d in self.rt.devices()],
                "visible_devices": os.environ.get("ASCEND_RT_VISIBLE_DEVICES", ""), "models": models}

    async def generate(self, model: str, prompt_ids: list[int], params: SamplingParams, priority: int,
                       request_id: str, cache_salt: str = ""):
        """Yields ``[]`` once accepted, then lists of :class:`RequestOutput` until the last one."""
        eng = self.svc.engine(model, "generate")
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        h = eng.add_request(prompt_ids, params, request_id,
                            on_output=lambda o: loop.call_soon_threadsafe(q.put_nowait, o), priority=priority,
                            cache_salt=cache_salt)
        done = sent = False
        try:
            yield []
            while not done:
                batch = [await q.get()]
                deadline = loop.time() + (self.stream_interval_s if sent else 0.0)
                while not batch[-1].finished:
                    if not q.empty():
                        batch.append(q.get_nowait())
                        continue
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    try:
                        batch.append(await asyncio.wait_for(q.get(), left))
                    except asyncio.TimeoutError:
                        break
                done, sent = batch[-1].finished, True
                yield batch
        finally:
            if not done:
                eng.abort(h.request_id)

    async def embed(self, model: str, texts: list[str], tokens: int):
        eng = self.svc.engine(model, "embed")
        return await asyncio.wrap_future(eng.submit(texts, tokens))

    def ping(self) -> int:
        """A no-op (what a Serve round trip costs by itself)."""
        return 0

    def check_health(self) -> None:
        failed = {n: e.error for n, e in self.svc.engines.items() if getattr(e, "error", None)}
        if failed or self.svc.state != "ready":
            raise Unavailable(f"replica unhealthy: {failed or self.svc.state}")

    def state(self) -> dict:
        return self.svc.state_dict()

    def set_mode(self, model: str, mode) -> None:
        self.svc.set_mode(model, mode)

    def throttle(self, factor: float) -> dict:
        return self.svc.throttle(factor)

    def fallback(self, model: str):
        return self.svc.fallback(model, "requested through the front")

    def defragment(self, timeout: float | None = 60.0) -> list[dict]:
        return self.svc.defragment(timeout)

    def restore(self, model: str):
        return self.svc.restore(model)

    def restart(self, model: str):
        return self.svc.restart(model, "requested through the front")

    def drain(self, timeout: float | None = None) -> bool:
        self.svc.begin_drain()
        return self.svc.wait_drained(timeout)

    def close(self) -> None:
        try:
            self.svc.close()
        finally:
            self.rt.close()


class ReplicaDeployment(ReplicaBody):
    """The Ray Serve deployment class: Serve calls ``check_health`` and, after its graceful shutdown,
    ``__del__`` (which drains what is left and frees the devices)."""

    def __del__(self):
        try:
            self.drain(30)
            self.close()
        except Exception:  # noqa: BLE001 - shutting down anyway
            pass


def _unwrap(e: BaseException, replica: str) -> BaseException:
    """The replica's own :class:`ServeError` from a Ray error; anything else as 503 Unavailable."""
    for x in (e, getattr(e, "cause", None), e.__cause__):
        if isinstance(x, ServeError):
            return x
    return Unavailable(f"replica {replica} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


# ---------------------------------------------------------------------------------------------- front side
@dataclass
class Replica:
    """The front's view of one replica (one Ray Serve application)."""
    name: str
    handle: object
    info: dict
    state: str = "ready"                #: ready | draining | failed
    in_flight: int = 0
    requests: int = 0
    failed_at: float = 0.0

    def view(self) -> dict:
        return {"name": self.name, "state": self.state, "in_flight": self.in_flight, "requests": self.requests,
                "node": self.info.get("node", ""), "devices": self.info.get("devices", []),
                "visible_devices": self.info.get("visible_devices", ""), "pid": self.info.get("pid")}


class RemoteGenerateEngine(PromptChecks):
    """A generation model served by the replicas, with the in-process engine's surface for the routes."""

    kind = "generate"

    def __init__(self, svc: "ReplicaService", name: str, info: dict):
        from runtime.models.llama import DECODER_MODELS
        from runtime.models.tokenizer import GgufBpeTokenizer
        from runtime.models.weights import LlamaConfig, read_gguf_meta
        self.svc, self.model = svc, name
        meta = read_gguf_meta(str(DECODER_MODELS[name]()))[1]         # metadata only: no weights here
        self.tok = GgufBpeTokenizer(meta)
        self.model_config = LlamaConfig.from_gguf_meta(meta)
        self.config = info["config"]
        self.num_blocks = info["num_blocks"]
        self._streams: dict[str, object] = {}

    @property
    def kv_blocks(self) -> int:
        return self.num_blocks

    @property
    def queue_capacity(self) -> int:
        """Every serving replica's queue (the prompts of one request are spread over the replicas)."""
        return self.config.max_queued_requests * max(1, self.svc.replica_count)

    async def add_requests(self, prompts: list[list[int]], params: SamplingParams, priority: int = 0,
                           prompt_param: str = "prompt", on_output: Callable[[int, RequestOutput], None] | None = None,
                           admit: Callable[[int], object] | None = None, cache_salt: str = "") -> list[RequestHandle]:
        """The in-process engine's :meth:`~runtime.serve.engine.GenerateEngine.add_requests` over the
        replicas: checked here, all together (the same checks and defaults), ``admit(tokens)`` called, then
        each prompt sent to the least busy ready replica; returns once every one is accepted.  A refusal
        part-way aborts those already accepted (all or none) and is raised."""
        params = self.checked(prompts, params, priority, prompt_param, admit)
        hs: list[RequestHandle] = []
        try:
            for i, ids in enumerate(prompts):
                cb = None if on_output is None else (lambda o, i=i: on_output(i, o))
                hs.append(await self._add(ids, params, priority, cb, cache_salt))
        except BaseException:
            for h in hs:
                self.abort(h.request_id)
            raise
        return hs

    async def _add(self, prompt_ids: list[int], params: SamplingParams, priority: int,
                   on_output: Callable[[RequestOutput], None] | None, cache_salt: str = "") -> RequestHandle:
        """Send one checked request to the least busy ready replica; returns once it is accepted there."""
        rep = self.svc.pick()
        rid = f"req-{uuid.uuid4().hex[:16]}"
        resp = rep.handle.options(stream=True).generate.remote(self.model, list(prompt_ids), params, priority, rid,
                                                                 cache_salt)
        self.svc.started(rep)
        try:
            await resp.__anext__()                                # [] = accepted, or the replica's refusal
        except BaseException as e:
            self.svc.ended(rep, e)
            raise _unwrap(e, rep.name) from None
        self._streams[rid] = resp
        asyncio.get_running_loop().create_task(self._pump(rep, rid, resp, on_output, len(prompt_ids)))
        return RequestHandle(rid, len(prompt_ids))

    async def _pump(self, rep: Replica, rid: str, resp, on_output, n_prompt: int) -> None:
        finished, err, k, pc = False, None, 0, 0
        try:
            async for chunk in resp:
                for o in chunk:
                    k, pc = o.completion_tokens, o.prompt_computed
                    finished = finished or o.finished
                    if on_output is not None:
                        on_output(o)
        except BaseException as e:  # noqa: BLE001 - cancelled (client gone) or the replica failed
            err = e
        finally:
            self._streams.pop(rid, None)
            self.svc.ended(rep, err if not isinstance(err, asyncio.CancelledError) else None)
            if not finished and on_output is not None:
                reason = "abort" if err is None or _cancelled(err) else "error"
                msg = None if reason == "abort" else str(_unwrap(err, rep.name))
                on_output(RequestOutput(rid, "", [], [], reason, n_prompt, k, msg, pc))

    def abort(self, request_id: str) -> None:
        resp = self._streams.get(request_id)
        if resp is not None:
            resp.cancel()

    def shutdown(self) -> None:
        """Nothing to free here (the replicas own the devices); streams still open are cancelled."""
        for resp in list(self._streams.values()):
            resp.cancel()


def _cancelled(e: BaseException) -> bool:
    return isinstance(e, asyncio.CancelledError) or type(e).__name__ in ("RequestCancelledError",
                                                                           "TaskCancelledError")


class RemoteEmbedEngine:
    """An embedding model served by the replicas."""

    kind = "embed"

    def __init__(self, svc: "ReplicaService", name: str, info: dict):
        from runtime.models.tokenizer import bert_tokenizer
        self.svc, self.model = svc, name
        self.max_len, self.dim = info["max_len"], info["dim"]
        self.tok = bert_tokenizer(self.max_len)

    def check(self, texts) -> list[int]:
        return check_texts(self.tok, texts, self.max_len, self.model)

    def submit(self, texts: list[str], tokens: int):
        """An asyncio future of the ``[len(texts), dim]`` embeddings (on the running loop)."""
        return asyncio.ensure_future(self._embed(list(texts), tokens))

    def shutdown(self) -> None:
        pass

    async def _embed(self, texts, tokens):
        rep = self.svc.pick()
        self.svc.started(rep)
        err = None
        try:
            return await rep.handle.embed.remote(self.model, texts, tokens)
        except BaseException as e:
            err = e
            raise _unwrap(e, rep.name) from None
        finally:
            self.svc.ended(rep, err)


#: engine kind -> front-side proxy over the replicas (a registry, as the in-process builders)
PROXIES: dict[str, Callable] = {"generate": RemoteGenerateEngine, "embed": RemoteEmbedEngine}


class ReplicaService(Frontend):
    """The HTTP front of engines that run as Ray Serve replicas (this process must be attached to the
    cluster's Ray).  ``models``' devices are relative to one replica's device group."""

    def __init__(self, models: tuple[ModelSpec, ...], replicas: int = 2, tenants: tuple[Tenant, ...] = (),
                 clock: Callable[[], float] = time.monotonic, options: ReplicaOptions = ReplicaOptions()):
        if not isinstance(replicas, int) or replicas < 1:
            raise InvalidParamError(f"replicas must be >= 1, got {replicas!r}")
        k = devices_needed(models)
        specs = place(models, k)
        super().__init__(None, specs, tenants, clock)
        self.k, self.target, self.options = k, replicas, options
        self.prefix = f"vnpu-{uuid.uuid4().hex[:6]}"
        self.replicas: dict[str, Replica] = {}
        self._seq = 0
        self._started_serve = False
        self._reg_collector()

    def _reg_collector(self) -> None:
        from prometheus_client.core import GaugeMetricFamily
        svc = self

        class _Replicas:
            def collect(self):
                g = GaugeMetricFamily("vnpu:serve_replicas", "Ray Serve replicas of the engines by state.",
                                      labels=("state",))
                f = GaugeMetricFamily("vnpu:replica_requests_in_flight", "Requests in flight per replica.",
                                      labels=("replica",))
                reps = svc.replica_views()
                for st in ("ready", "draining", "failed"):
                    g.add_metric([st], sum(1 for r in reps if r["state"] == st))
                for r in reps:
                    f.add_metric([r["name"]], r["in_flight"])
                yield g
                yield f
        self.registry.register(_Replicas())

    @property
    def replica_count(self) -> int:
        with self._cv:
            return sum(1 for r in self.replicas.values() if r.state != "draining")

    # -------------------------------------------------------------- lifecycle
    def _deployment(self):
        rayenv.prepare()
        from ray import serve

        from driver.host import BLAS_ENV
        return serve.deployment(
            ReplicaDeployment, name="engine", num_replicas=1,
            ray_actor_options={"resources": {"NPU": self.k}, "num_cpus": self.options.num_cpus,
                               "runtime_env": {"env_vars": {**BLAS_ENV, **replica_env()}}},
            max_ongoing_requests=self.options.max_ongoing_requests,
            health_check_period_s=self.options.health_check_period_s,
            health_check_timeout_s=self.options.health_check_timeout_s,
            graceful_shutdown_timeout_s=self.options.graceful_shutdown_timeout_s,
        ).bind(self.specs, self.options.stream_interval_ms)

    def _check_capacity(self, n: int) -> None:
        rayenv.prepare()
        import ray
        free = ray.available_resources().get("NPU", 0)
        if free < n * self.k:
            raise Unavailable(f"{n} more replica(s) need {n * self.k} free NPU ({self.k} each); the cluster has "
                              f"{free:g} free of {ray.cluster_resources().get('NPU', 0):g}")

    def _load(self) -> None:
        rayenv.prepare()
        from ray import serve
        logging.getLogger("ray.serve").setLevel(logging.WARNING)       # no per-call INFO lines on our stderr
        if not serve.status().applications:
            self._started_serve = True
        serve.start(proxy_location="Disabled", logging_config={"log_level": "WARNING"})
        self._add(self.target)
        first = next(iter(self.replicas.values()))
        for spec in self.specs:
            self.engines[spec.name] = PROXIES[spec.kind](self, spec.name, first.info["models"][spec.name])

    def _add(self, n: int) -> list[str]:
        """Start ``n`` replicas (blocking until each runs; Unavailable if one cannot start in time)."""
        rayenv.prepare()
        from ray import serve
        self._check_capacity(n)
        names = []
        for _ in range(n):
            self._seq += 1
            names.append(f"{self.prefix}-r{self._seq}")
        targets = [serve.RunTarget(self._deployment(), name=nm, route_prefix=None) for nm in names]
        handles = serve.run_many(targets, wait_for_applications_running=False)
        self._wait_running(names)
        for nm, h in zip(names, handles):
            info = h.info.remote().result(timeout_s=120)
            with self._cv:
                self.replicas[nm] = Replica(nm, h, info)
                self._cv.notify_all()
            self._event({"kind": "replica_added", "replica": nm, "node": info["node"], "devices": info["devices"],
                         "t": time.monotonic()})
            log.info("replica %s up on node %s, devices %s", nm, info["node"][:8], info["devices"])
        return names

    def _wait_running(self, names: list[str]) -> None:
        rayenv.prepare()
        from ray import serve
        deadline = time.monotonic() + self.options.start_timeout_s
        wake = threading.Event()
        while True:
            apps = serve.status().applications
            st = {n: (apps[n].status if n in apps else "NOT_STARTED") for n in names}
            bad = {n: s for n, s in st.items() if s in ("DEPLOY_FAILED", "UNHEALTHY")}
            if bad:
                msg = "; ".join(f"{n}: {apps[n].message[:200]} " + " ".join(
                    f"[{d}: {ds.message[-1500:]}]" for d, ds in apps[n].deployments.items() if ds.message) for n in bad)
                for n in names:
                    serve.delete(n)
                raise Unavailable(f"replica(s) failed to start: {msg}")
            if all(s == "RUNNING" for s in st.values()):
                return
            if time.monotonic() > deadline:
                for n in names:
                    serve.delete(n)
                raise Unavailable(f"replica(s) did not start within {self.options.start_timeout_s:g} s: {st}")
            wake.wait(0.2)                       # Serve's control plane has no push API here: poll its status

    def _closed(self) -> None:
        rayenv.prepare()
        from ray import serve
        for nm in list(self.replicas):
            try:
                serve.delete(nm)
            except Exception as e:  # noqa: BLE001 - delete the others too
                log.warning("deleting replica %s: %s", nm, e)
            self.replicas.pop(nm, None)
        if self._started_serve and not serve.status().applications:
            serve.shutdown()

    # -------------------------------------------------------------- routing
    def pick(self) -> Replica:
        """The ready replica with the fewest requests in flight (a failed one is probed again after 1 s)."""
        now = time.monotonic()
        with self._cv:
            for r in self.replicas.values():
                if r.state == "failed" and now - r.failed_at > 1.0:
                    r.state = "ready"
            ready = [r for r in self.replicas.values() if r.state == "ready"]
            if not ready:
                raise Unavailable("no replica is ready")
            return min(ready, key=lambda r: (r.in_flight, r.requests))

    def started(self, rep: Replica) -> None:
        with self._cv:
            rep.in_flight += 1
            rep.requests += 1

    def ended(self, rep: Replica, err: BaseException | None) -> None:
        with self._cv:
            rep.in_flight -= 1
            if err is not None and not _cancelled(err) and isinstance(_unwrap(err, rep.name), Unavailable) \
                    and rep.state == "ready":
                rep.state, rep.failed_at = "failed", time.monotonic()
            self._cv.notify_all()

    def replica_views(self) -> list[dict]:
        with self._cv:
            return [r.view() for r in self.replicas.values()]

    def ping(self, n: int = 20) -> float:
        """Median seconds of a no-op call on a replica's handle (the bare Ray Serve round trip)."""
        import statistics
        rep = self.pick()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            rep.handle.ping.remote().result(timeout_s=60)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def wait_replicas(self, pred: Callable[[list[dict]], bool], timeout: float | None = None) -> bool:
        """Block until ``pred(replica_views())`` holds (re-checked on every replica change and request end)."""
        with self._cv:
            return self._cv.wait_for(lambda: pred([r.view() for r in self.replicas.values()]), timeout)

    # -------------------------------------------------------------- scaling (the self-healing layer drives these)
    def scale_out(self, n: int = 1) -> dict:
        """Add ``n`` replicas (blocks until they serve)."""
        added = self._add(n)
        return {"added": added, "replicas": self.replica_views()}

    def scale_in(self, n: int = 1, timeout: float | None = 120.0) -> dict:
        """Remove ``n`` replicas, the least busy first: drain each (no new requests; the front waits for its
        in-flight ones), then delete it.  At least one replica stays."""
        rayenv.prepare()
        from ray import serve
        with self._cv:
            live = [r for r in self.replicas.values() if r.state != "draining"]
            if n < 1 or n >= len(live):
                raise InvalidParamError(f"cannot remove {n} of {len(live)} replica(s): at least one must stay")
            gone = sorted(live, key=lambda r: (r.in_flight, -int(r.name.rsplit("r", 1)[1])))[:n]
            busy = {r.name: r.in_flight for r in gone}
            for r in gone:
                r.state = "draining"
            self._cv.notify_all()
        t0 = time.monotonic()
        drained = []
        for r in gone:
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - t0))
            with self._cv:
                ok = self._cv.wait_for(lambda r=r: r.in_flight == 0, left)
                waited = r.in_flight
            serve.delete(r.name)
            with self._cv:
                self.replicas.pop(r.name, None)
                self._cv.notify_all()
            drained.append({"replica": r.name, "drained": ok, "in_flight_at_start": busy[r.name], "abandoned": waited,
                            "requests": r.requests})
            self._event({"kind": "replica_removed", "replica": r.name, "drained": ok, "t": time.monotonic()})
        return {"removed": drained, "seconds": time.monotonic() - t0, "replicas": self.replica_views()}

    def scale_to(self, n: int) -> dict:
        """Scale to ``n`` replicas (``POST /admin/replicas``)."""
        if not isinstance(n, int) or n < 1:
            raise InvalidParamError(f"replicas must be >= 1, got {n!r}")
        have = self.replica_count
        if n > have:
            return self.scale_out(n - have)
        if n < have:
            return self.scale_in(have - n)
        return {"replicas": self.replica_views()}

    # -------------------------------------------------------------- what routes and operators ask
    def health(self) -> tuple[int, dict]:
        status, body = super().health()
        if status == 200 and not any(r["state"] == "ready" for r in self.replica_views()):
            return 503, {"status": "no replica ready"}
        return status, body

    def state_dict(self) -> dict:
        out = super().state_dict()
        out["replicas"] = self.replica_views()
        for name, e in self.engines.items():
            out["models"][name] = {"kind": e.kind, "replicas": len(out["replicas"])}
        return out

    def set_mode(self, model: str, mode) -> None:
        """Switch ``model``'s scheduler mode on every replica."""
        self.engine(model, "generate")
        with self._cv:
            reps = list(self.replicas.values())
        for r in reps:
            r.handle.set_mode.remote(model, mode).result(timeout_s=60)

    def throttle(self, factor: float) -> dict:
        """Admit less on every replica and at the front (tenants' quotas)."""
        out = super().throttle(factor)
        with self._cv:
            reps = list(self.replicas.values())
        for r in reps:
            r.handle.throttle.remote(factor).result(timeout_s=60)
        return out

    def defragment(self, timeout: float | None = 60.0) -> list[dict]:
        """Live defragmentation in every replica that is not failed (each holds its engines between steps
        and compacts its own devices: :meth:`runtime.serve.server.Service.defragment`), one replica after
        the other; one report per replica device, with the replica's name (blocks the caller)."""
        with self._cv:
            reps = [r for r in self.replicas.values() if r.state != "failed"]
        out = []
        for r in reps:
            for d in r.handle.defragment.remote(timeout).result(timeout_s=600):
                out.append({"replica": r.name, **d})
        return out

    def fallback(self, model: str, reason: str = "requested", timeout: float | None = None,
                 away_from: int | None = None):
        raise InvalidParamError("with replicas, fall back per replica (each has its own chain)")

    def restore(self, model: str, timeout: float | None = None):
        raise InvalidParamError("with replicas, restore per replica (each has its own chain)")

    def restart(self, model: str, reason: str = "requested", timeout: float | None = None):
        """Restart ``model``'s engine in every replica that is not failed, one after the other, each on its
        own placement with its requests replayed there (blocks the caller); one result for them all."""
        from .engine.placement import RebindResult
        with self._cv:
            reps = [r for r in self.replicas.values() if r.state != "failed"]
        res = [r.handle.restart.remote(model).result(timeout_s=timeout or 600) for r in reps]
        if not res:
            raise Unavailable("no replica to restart")
        return RebindResult(False, 0, 0, "; ".join(f"{r.name}: {x.placement}" for r, x in zip(reps, res)), reason,
                            sum(x.replayed for x in res), max(x.seconds for x in res))

    def begin_drain(self) -> None:
        with self._cv:
            if self.state in ("starting", "ready"):
                self.state = "draining"
            self._cv.notify_all()

    def wait_drained(self, timeout: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: all(r.in_flight == 0 for r in self.replicas.values()), timeout)
