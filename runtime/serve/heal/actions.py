"""The actions a trigger can take (a registry, :data:`ACTIONS`), over the mechanisms the server already has.

Each action checks its parameters when the config is loaded (:meth:`Action.read_params`) and, when run,
returns an :class:`Outcome`: what it did, a health check of the result, how to undo it (rollback on a
failed check) and how to release it when the trigger's condition has cleared (hysteresis), e.g. a
throttle is lifted, a fallback restored.

- ``throttle {by: 20%, for: 5m}``: admit ``1 - by`` of the load (every engine's batch and queue, every
  tenant's quota) for at least ``for``; released: admission back to 1 -- or to the strictest throttle
  another trigger (another hot device) still holds;
- ``fallback {model}``: the model's engine (a generation or an embedding model; every generation model if
  none) one step down its chain; checked by a probe request there (one generated token, or one
  embedding); undone / released by ``restore``;
- ``restore {model}``: back to the first placement (when healthy);
- ``restart_device``: the device of the trigger's scope: engines still bound to it move down their
  chain first (only those still on it when their engine thread gets to it: an engine that re-bound
  itself stays where it went), the device is restarted (``Runtime.restart_device``: in-process devices;
  on a cluster, device actors that Ray restarts -- ``vnpu up --device-restarts N``, or the embedded
  cluster of a ``vnpu serve`` whose policy has this action), health-checked, warmed with
  ``recovery.warmup_requests`` kernel runs, and returned as a *spare* (engines go back with ``restore``);
  With ``recovery.move_back`` the engines instead go back to the device by themselves once it passed the
  deep check for ``recovery.return_after`` (hysteresis), warmed there with ``warmup_requests`` real
  requests, moved off again when that fails (``rollback_on_failure``);
- ``restart_engine {model}`` (the seed's ``restart_worker``): each engine rebuilt on the placement it is on,
  its unfinished requests replayed there; then ``warmup_requests`` real requests through it;
- ``scale_out {replicas: +1, model}`` / ``scale_in {replicas: 1}``: Ray Serve replicas (a server with
  replicas), else instances of the compiled models; a scale-out is released by removing as many;
- ``cache_results {ttl, max_entries}`` (the seed's ``cache_recent_results``): the per-tenant result cache of
  deterministic requests (:mod:`runtime.serve.result_cache`) on; released: off and emptied;
- ``defragment {timeout: 60s}``: the memory pool's live defragmentation (the server's ``defragment()``:
  every engine held between two steps, each of its devices compacted once; per replica with replicas);
  the event holds the bytes moved, the pause and each device's fragmentation before/after; checked:
  no device's fragmentation grew, the server is healthy and its generation models serve a probe;
- ``rollback``: the previous config (the reconfigure manager's).

Blocking: every action blocks its caller (the policy engine's tick) until done: re-binds upload a model,
a restart waits for the device.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .spec import SpecError, parse_duration, parse_fraction

log = logging.getLogger("vnpu.serve")


class ActionUnavailable(Exception):
    """The action cannot run on this server (no replicas, no memory pool, backend without restarts)."""


@dataclass
class Fired:
    """What fired an action: the trigger, the metric's scope (``npu:<id>`` for a device metric), its
    value, and when the condition was first detected (the tick's clock)."""
    trigger: str
    metric: str
    scope: str
    value: float
    detected_at: float
    params: dict = field(default_factory=dict)

    @property
    def device(self) -> int | None:
        return int(self.scope.split(":", 1)[1]) if self.scope.startswith("npu:") else None


@dataclass
class Outcome:
    """What an action did (``summary``, ``detail``), and its follow-ups (None where they do not apply)."""
    summary: str
    detail: dict = field(default_factory=dict)
    check: Callable[[], tuple[bool, str]] | None = None
    undo: Callable[[], str] | None = None
    release: Callable[[], str] | None = None
    hold_s: float = 0.0                          #: the release waits at least this long (throttle ``for``)


@dataclass
class Context:
    """What actions act on: the service, the runtime (devices), the recovery settings, the spares list,
    and the reconfigure manager (for ``rollback``)."""
    service: object
    rt: object = None
    warmup_requests: int = 3
    reconfigurer: object = None
    spares: set = field(default_factory=set)
    throttles: dict = field(default_factory=dict)    #: trigger@scope -> admission factor it holds
    clock: Callable[[], float] = time.time           #: the policy's clock (the sampler's: injectable)
    move_back: bool = False                          #: engines go back to a restarted device by themselves
    return_after_s: float = 30.0                     #: ... once it passed the deep check this long
    rollback_on_failure: bool = True


class Action:
    """Base: ``params`` maps a parameter to its reader (value -> checked value) and default."""
    name = ""
    params: dict[str, tuple[Callable, object]] = {}

    def read_params(self, raw: dict) -> dict:
        unknown = sorted(set(raw) - set(self.params))
        if unknown:
            raise SpecError(f"action {self.name} takes {', '.join(self.params) or 'no parameters'}; "
                            f"not {', '.join(unknown)}")
        return {k: (read(raw[k]) if k in raw else default) for k, (read, default) in self.params.items()}

    def run(self, ctx: Context, fired: Fired) -> Outcome:
        raise NotImplementedError


def _generate_models(ctx: Context, model: str | None) -> list[str]:
    if model is not None:
        return [model]
    return [n for n, e in ctx.service.engines.items() if getattr(e, "kind", None) == "generate"]


def _probe_generate(eng, timeout_s: float) -> str | None:
    """A one-token greedy generation; what went wrong, or None."""
    from ..engine.sampling import SamplingParams
    out = eng.add_request(eng.encode("health check"), SamplingParams(max_tokens=1, temperature=0.0)).result(timeout_s)
    return out.error if out.finish_reason == "error" else None


def _probe_embed(eng, timeout_s: float) -> str | None:
    """One embedding of one short text; what went wrong, or None."""
    texts = ["health check"]
    got = eng.submit(texts, sum(eng.check(texts))).result(timeout_s)
    if got.shape != (1, eng.dim) or not np.isfinite(got).all():
        return f"the probe embedding has shape {got.shape} or non-finite values"
    return None


#: engine kind -> (what an in-process engine of the kind has, its probe: a request of its kind, not over HTTP)
PROBES: dict[str, tuple[str, Callable]] = {"generate": ("add_request", _probe_generate),
                                           "embed": ("chain", _probe_embed)}


def probe(ctx, model: str, timeout_s: float = 120.0) -> tuple[bool, str]:
    """One request through ``model``'s in-process engine (a one-token greedy generation, or one
    embedding): does it serve where it is now?  ``ctx``: a :class:`Context`, or the service itself."""
    svc = getattr(ctx, "service", ctx)
    eng = svc.engines.get(model)
    has, fn = PROBES.get(getattr(eng, "kind", ""), ("", None))
    if eng is None or fn is None or not hasattr(eng, has):
        return True, "no in-process engine to probe"
    try:
        err = fn(eng, timeout_s)
    except Exception as e:  # noqa: BLE001 - the check's answer
        return False, f"{model}: probe failed: {type(e).__name__}: {e}"
    if err is not None:
        return False, f"{model}: probe failed on {eng.placement}: {err}"
    return True, f"{model} serves on {eng.placement}"


def _probe_all(ctx: Context, models: list[str]) -> Callable[[], tuple[bool, str]]:
    def check():
        for m in models:
            ok, why = probe(ctx, m)
            if not ok:
                return False, why
        return True, "; ".join(f"{m} ok" for m in models)
    return check


def _by(v) -> float:
    f = parse_fraction(v, "throttle.by")
    if not 0 < f < 1:
        raise SpecError(f"throttle.by: must be in (0%, 100%) (admit less, not nothing), got {v!r}")
    return f


class Throttle(Action):
    name = "throttle"
    params = {"by": (_by, 0.2),
              "for": (lambda v: parse_duration(v, "throttle.for"), 300.0)}

    def run(self, ctx: Context, fired: Fired) -> Outcome:
        by = fired.params.get("by", 0.2)
        svc = ctx.service
        key = f"{fired.trigger}@{fired.scope}"
        before = svc.quotas.admission

        def admit() -> float:                    # the strictest throttle in effect (several can be)
            f = min(ctx.throttles.values(), default=1.0)
            svc.throttle(f)
            return f
        ctx.throttles[key] = round(1.0 - by, 6)
        now = admit()

        def lift() -> str:
            ctx.throttles.pop(key, None)
            return f"admission back to {admit():g}"

        def check():
            st, body = svc.health()
            return st == 200, f"health {st} {body.get('status')}"
        return Outcome(f"admission {before:g} -> {now:g} for >= {fired.params.get('for', 300.0):g} s",
                       {"factor": now, "before": before}, check=check, undo=lift, release=lift,
                       hold_s=fired.params.get("for", 300.0))


class Fallback(Action):
    name = "fallback"
    params = {"model": (str, None)}

    def run(self, ctx: Context, fired: Fired) -> Outcome:
        models = _generate_models(ctx, fired.params.get("model"))
        if not models:
            raise ActionUnavailable("no generation model to move")
        moved = {}
        for m in models:
            r = ctx.service.fallback(m, f"policy {fired.trigger}")
            moved[m] = r.placement

        def back() -> str:
            out = []
            for m in models:
                r = ctx.service.restore(m)
                out.append(f"{m} -> {r.placement}")
            return "restored " + ", ".join(out)
        return Outcome("moved " + ", ".join(f"{m} -> {p}" for m, p in moved.items()), {"placements": moved},
                       check=_probe_all(ctx, models), undo=back, release=back)


class Restore(Action):
    name = "restore"
    params = {"model": (str, None)}

    def run(self, ctx: Context, fired: Fired) -> Outcome:
        models = _generate_models(ctx, fired.params.get("model"))
        done = {m: ctx.service.restore(m).placement for m in models}
        return Outcome("restored " + ", ".join(f"{m} -> {p}" for m, p in done.items()), {"placements": done},
                       check=_probe_all(ctx, models))


def warm(dev, runs: int) -> float:
    """``runs`` small kernel runs on ``dev`` checked against numpy (a restarted chip's first work:
    allocations, copies, a launch, a sync); returns the seconds it took.  Raises on a wrong result."""
    t0 = time.monotonic()
    rng = np.random.default_rng(0)
    for _ in range(max(0, runs)):
        a = rng.standard_normal(4096).astype(np.float32)
        b = rng.standard_normal(4096).astype(np.float32)
        x, y, z = dev.from_numpy(a), dev.from_numpy(b), dev.empty((4096,))
        try:
            dev.launch("add", [x, y], [z])
            got = z.numpy()
        finally:
            for t in (x, y, z):
                t.free()
        if not np.array_equal(got, a + b):
            raise RuntimeError(f"device {dev.index}: warm-up add returned wrong values")
    return time.monotonic() - t0


def device_check(dev) -> tuple[bool, str]:
    """Is device ``dev`` usable: healthy, and a tiny ``add`` returns numpy's answer?  (The deep health
    check's device part: :mod:`.deep`.)"""
    if getattr(dev, "is_lost", False):
        return False, "lost"
    level, reasons = dev.health()
    if level not in ("OK", "Warning"):
        return False, f"{level}: {'; '.join(reasons)}"
    a = np.arange(256, dtype=np.float32)
    b = np.full(256, 0.5, np.float32)
    x, y, z = dev.from_numpy(a), dev.from_numpy(b), dev.empty((256,))
    try:
        dev.launch("add", [x, y], [z])
        got = z.numpy()
    except Exception as e:  # noqa: BLE001 - the check's answer
        return False, f"a tiny add failed: {type(e).__name__}: {e}"
    finally:
        for t in (x, y, z):
            try:
                t.free()
            except Exception:  # noqa: BLE001 - a lost device frees nothing
                pass
    if not np.array_equal(got, a + b):
        return False, "a tiny add returned wrong values"
    return True, level


class NotYet(Exception):
    """A release that is not due yet (e.g. a recovered device that has not passed its checks long enough):
    the policy tries again on the next tick, quietly."""


def warm_model(ctx: Context, model: str, runs: int) -> tuple[bool, str]:
    """``runs`` real requests through ``model`` where it runs now (each a one-token greedy generation or
    one embedding: :func:`probe`); the first failure, or what ran."""
    for k in range(max(0, runs)):
        ok, why = probe(ctx, model)
        if not ok:
            return False, f"warm-up request {k + 1}/{runs}: {why}"
    return True, f"{model}: {runs} warm-up request(s) served"


class RestartDevice(Action):
    name = "restart_device"
    params = {}

    def run(self, ctx: Context, fired: Fired) -> Outcome:
        i = fired.device
        if i is None:
            raise SpecError(f"restart_device needs a device metric (trigger {fired.trigger} watches "
                            f"{fired.metric}, a server-wide metric)")
        rt = ctx.rt
        if rt is None or not hasattr(rt, "restart_device"):
            raise ActionUnavailable("this server has no runtime that can restart devices")
        moved = _move_off(ctx, i)
        from devices.errors import UnsupportedError
        try:
            dev = rt.restart_device(i)
        except UnsupportedError as e:
            raise ActionUnavailable(str(e)) from None
        level, reasons = dev.health()
        if level not in ("OK", "Warning"):
            raise RuntimeError(f"device {i} restarted but reports {level}: {'; '.join(reasons)}")
        ctx.spares.add(i)

        def check():
            if dev.is_lost:
                return False, f"device {i} is lost again"
            lv, why = dev.health()
            return lv in ("OK", "Warning"), f"device {i} {lv}{': ' + '; '.join(why) if why else ''}"
        if ctx.move_back:
            back = [m for m, p in moved.items() if not p.startswith("failed")]
            return Outcome(f"device {i} restarted; {', '.join(back) or 'nothing'} moves back after "
                           f"{ctx.return_after_s:g} s of passing the deep check",
                           {"device": i, "engines_moved": moved, "spares": sorted(ctx.spares)}, check=check,
                           release=_mover(ctx, i, back))
        secs = warm(dev, ctx.warmup_requests)
        return Outcome(f"device {i} restarted, warmed ({ctx.warmup_requests} runs, {secs:.2f} s), back as a spare",
                       {"device": i, "warmup_runs": ctx.warmup_requests, "warmup_s": secs, "engines_moved": moved,
                        "spares": sorted(ctx.spares)}, check=check)


def _move_off(ctx: Context, i: int) -> dict[str, str]:
    """Every engine still bound to device ``i`` one step down its chain: model -> where it went."""
    moved = {}
    for name, e in list(ctx.service.engines.items()):
        pl = getattr(e, "placement", None)
        if pl is not None and i in getattr(pl, "devices", ()):
            try:
                # away_from: the engine may have re-bound itself meanwhile (it saw the loss first);
                # then it stays where it went
                moved[name] = ctx.service.fallback(name, f"automatic: device {i} is lost", away_from=i).placement
            except Exception as x:  # noqa: BLE001 - recorded; the restart goes on
                moved[name] = f"failed: {x}"
    return moved


def _mover(ctx: Context, i: int, models: list[str]) -> Callable[[], str]:
    """The release of a restart with ``move_back``: once device ``i`` has passed the deep check (health and
    a tiny kernel) on every try for ``return_after_s`` (hysteresis: one failed try starts the wait again),
    the engines that left it go back to their first placement and are warmed with ``warmup_requests`` real
    requests; a failed warm-up moves them off again (``rollback_on_failure``) and the move back is tried
    later.  Raises :class:`NotYet` while the wait runs."""
    since: list[float] = []

    def release() -> str:
        ok, why = device_check(ctx.rt.device(i))
        now = ctx.clock()
        if not ok:
            since.clear()
            raise NotYet(f"device {i}: {why}")
        since[:] = since or [now]
        if now - since[0] < ctx.return_after_s:
            raise NotYet(f"device {i} healthy for {now - since[0]:g} of {ctx.return_after_s:g} s")
        out = []
        for m in models:
            out.append(f"{m} -> {ctx.service.restore(m).placement}")
            good, said = warm_model(ctx, m, ctx.warmup_requests)
            if not good:
                since.clear()
                if not ctx.rollback_on_failure:
                    raise RuntimeError(f"move back to device {i} failed: {said}")
                away = ctx.service.fallback(m, f"rollback: {said}", away_from=i).placement
                raise RuntimeError(f"move back to device {i} failed: {said}; rolled back ({m} -> {away})")
            out.append(said)
        ctx.spares.discard(i)
        return f"device {i} passed the deep check for {now - since[0]:g} s; moved back: {'; '.join(out) or 'nothing'}"
    return release


class RestartEngine(Action):
    """The seed's ``restart_worker``: each model's engine (``model``, or every one) restarted on the
    placement it is on, its requests replayed; then ``warmup_requests`` real requests through it."""
    name = "restart_engine"
    params = {"model": (str, None)}

    def run(self, ctx: Context, fired: Fired) -> Outcome:
        svc = ctx.service
        if not hasattr(svc, "restart"):
            raise ActionUnavailable("this server cannot restart its engines")
        m = fired.params.get("model")
        models = [m] if m is not None else [*svc.engines, *svc.compiled_names()]
        done, warmed = {}, []
        for name in models:
            r = svc.restart(name, f"policy {fired.trigger}")
            done[name] = {"placement": r.placement, "replayed": r.replayed}
        for name in models:
            ok, why = warm_model(ctx, name, ctx.warmup_requests)
            if not ok:
                raise RuntimeError(f"restarted, but {why}")
            warmed.append(why)
        return Outcome("restarted " + ", ".join(f"{n} on {d['placement']} ({d['replayed']} request(s) replayed)"
                                                for n, d in done.items()),
                       {"restarted": done, "warmup": warmed}, check=_probe_all(ctx, _generate_models(ctx, None)))


def _ttl(v) -> float:
    s = parse_duration(v, "cache_results.ttl")
    if s <= 0:
        raise SpecError(f"cache_results.ttl: must be > 0, got {v!r}")
    return s


def _entries(v) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise SpecError(f"cache_results.max_entries: expected an integer >= 1, got {v!r}")
    return v


class CacheResults(Action):
    """The seed's ``cache_recent_results``: answer deterministic requests again from a per-tenant cache
    for ``ttl`` (:mod:`runtime.serve.result_cache`); released: the cache off and emptied."""
    name = "cache_results"
    params = {"ttl": (_ttl, 60.0), "max_entries": (_entries, 1024)}

    def run(self, ctx: Context, fired: Fired) -> Outcome:
        cache = getattr(ctx.service, "result_cache", None)
        if cache is None:
            raise ActionUnavailable("this server has no result cache")
        from ..result_cache import CacheOptions
        opts = CacheOptions(fired.params.get("ttl", 60.0), fired.params.get("max_entries", 1024))
        cache.enable(opts, ctx.clock)

        def off() -> str:
            return f"result cache off ({cache.disable()} entries dropped)"
        return Outcome(f"result cache on: deterministic requests, per tenant, ttl {opts.ttl_s:g} s",
                       {"ttl_s": opts.ttl_s, "max_entries": opts.max_entries}, undo=off, release=off)


def _replicas(v) -> int:
    try:
        n = int(str(v).lstrip("+"))
    except ValueError:
        raise SpecError(f"replicas: expected a count like +1, got {v!r}") from None
    if n < 1:
        raise SpecError(f"replicas: must be >= 1, got {v!r}")
    return n


class ScaleOut(Action):
    """Replicas on a server with Ray Serve replicas; else instances of its compiled models (``model``, or
    every one); released by removing as many."""
    name = "scale_out"
    params = {"replicas": (_replicas, 1), "model": (str, None)}

    def run(self, ctx: Context, fired: Fired) -> Outcome:
        svc = ctx.service
        n = fired.params.get("replicas", 1)
        if hasattr(svc, "scale_out"):
            res = svc.scale_out(n)
            return Outcome(f"added {n} replica(s): {', '.join(res.get('added', []))}",
                           {"added": res.get("added", [])},
                           check=lambda: (svc.health()[0] == 200, f"health {svc.health()[0]}"),
                           release=lambda: (svc.scale_in(n), f"removed {n} replica(s)")[1])
        m = fired.params.get("model")
        models = [m] if m is not None else list(svc.compiled_names())
        if not models:
            raise ActionUnavailable("this server runs its engines in-process (no replicas to add) and serves no "
                                    "compiled model (no instances to add); start it with --replicas to scale out")
        added = [x for name in models for x in svc.scale_instances(name, n)]

        def fewer() -> str:
            gone = [x for name in models for x in svc.scale_instances(name, -n)]
            return f"removed {len(gone)} instance(s): {', '.join(gone)}"
        return Outcome(f"added {len(added)} instance(s): {', '.join(added)}", {"added": added},
                       check=lambda: (svc.health()[0] == 200, f"health {svc.health()[0]}"), undo=fewer,
                       release=fewer)


class ScaleIn(Action):
    name = "scale_in"
    params = {"replicas": (_replicas, 1)}

    def run(self, ctx: Context, fired: Fired) -> Outcome:
        svc = ctx.service
        if not hasattr(svc, "scale_in"):
            raise ActionUnavailable("this server runs its engines in-process (no replicas to remove)")
        n = fired.params.get("replicas", 1)
        res = svc.scale_in(n)
        return Outcome(f"removed {n} replica(s)", {"removed": res.get("removed", [])})


class Defragment(Action):
    name = "defragment"
    params = {"timeout": (lambda v: parse_duration(v, "defragment.timeout"), 60.0)}

    def run(self, ctx: Context, fired: Fired) -> Outcome:
        svc = ctx.service
        fn = getattr(svc, "defragment", None)
        if fn is None:
            raise ActionUnavailable("this server has no memory pool to defragment")
        reports = list(fn(fired.params.get("timeout", 60.0)))    # per device (per replica and device)
        if not reports:
            raise ActionUnavailable("no engine runs on a device with a memory pool")
        moved = sum(int(r.get("bytes_moved", 0)) for r in reports)
        pause = max(float(r.get("pause_s", 0.0)) for r in reports)

        def where(r: dict) -> str:
            return f"{r['replica']}/{r['device']}" if "replica" in r else str(r.get("device"))
        frag = {where(r): [r.get("arena_fragmentation_before"), r.get("arena_fragmentation_after")] for r in reports}
        pool = {where(r): [r.get("pool_fragmentation_before"), r.get("pool_fragmentation_after")] for r in reports}
        mine = [r for r in reports if r.get("device") == fired.scope] or reports
        worst = max(mine, key=lambda r: float(r.get("arena_fragmentation_before", 0.0)))
        summary = (f"moved {moved / 2 ** 20:.1f} MiB on {len(reports)} device(s), pause {pause * 1e3:.1f} ms; "
                   f"{where(worst)} fragmentation {worst['arena_fragmentation_before']:.3f} -> "
                   f"{worst['arena_fragmentation_after']:.3f}")

        def check():
            bad = [f"{k} {b:.3f} -> {a:.3f}" for k, (b, a) in frag.items()
                   if b is not None and a is not None and a > b + 1e-9]
            if bad:
                return False, "fragmentation grew: " + ", ".join(bad)
            st, body = svc.health()
            if st != 200:
                return False, f"health {st} {body.get('status')}"
            return _probe_all(ctx, _generate_models(ctx, None))()
        return Outcome(summary, {"bytes_moved": moved, "pause_s": pause, "fragmentation": frag,
                                 "pool_fragmentation": pool, "devices": reports}, check=check)


class Rollback(Action):
    name = "rollback"
    params = {}

    def run(self, ctx: Context, fired: Fired) -> Outcome:
        if ctx.reconfigurer is None:
            raise ActionUnavailable("this server keeps no previous config")
        return Outcome(ctx.reconfigurer.rollback(f"policy {fired.trigger}"))


#: action name -> action (a registry)
ACTIONS: dict[str, Action] = {a.name: a for a in (Throttle(), Fallback(), Restore(), RestartDevice(), RestartEngine(),
                                                   ScaleOut(), ScaleIn(), Defragment(), CacheResults(), Rollback())}
