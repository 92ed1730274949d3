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
- ``scale_out {replicas: +1}`` / ``scale_in {replicas: 1}``: Ray Serve replicas (a server with replicas);
  a scale-out is released by a scale-in of as many;
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


def probe(ctx: Context, model: str, timeout_s: float = 120.0) -> tuple[bool, str]:
    """One request through ``model``'s in-process engine (a one-token greedy generation, or one
    embedding): does it serve where it is now?"""
    eng = ctx.service.engines.get(model)
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
        moved = {}
        for name, e in list(ctx.service.engines.items()):       # nothing may stay bound to the old device
            pl = getattr(e, "placement", None)
            if pl is not None and i in getattr(pl, "devices", ()):
                try:
                    # away_from: the engine may have re-bound itself meanwhile (it saw the loss first);
                    # then it stays where it went
                    moved[name] = ctx.service.fallback(name, f"automatic: device {i} is lost",
                                                       away_from=i).placement
                except Exception as x:  # noqa: BLE001 - recorded; the restart goes on
                    moved[name] = f"failed: {x}"
        from devices.errors import UnsupportedError
        try:
            dev = rt.restart_device(i)
        except UnsupportedError as e:
            raise ActionUnavailable(str(e)) from None
        level, reasons = dev.health()
        if level not in ("OK", "Warning"):
            raise RuntimeError(f"device {i} restarted but reports {level}: {'; '.join(reasons)}")
        secs = warm(dev, ctx.warmup_requests)
        ctx.spares.add(i)

        def check():
            if dev.is_lost:
                return False, f"device {i} is lost again"
            lv, why = dev.health()
            return lv in ("OK", "Warning"), f"device {i} {lv}{': ' + '; '.join(why) if why else ''}"
        return Outcome(f"device {i} restarted, warmed ({ctx.warmup_requests} runs, {secs:.2f} s), back as a spare",
                       {"device": i, "warmup_runs": ctx.warmup_requests, "warmup_s": secs, "engines_moved": moved,
                        "spares": sorted(ctx.spares)}, check=check)


def _replicas(v) -> int:
    try:
        n = int(str(v).lstrip("+"))
    except ValueError:
        raise SpecError(f"replicas: expected a count like +1, got {v!r}") from None
    if n < 1:
        raise SpecError(f"replicas: must be >= 1, got {v!r}")
    return n


class ScaleOut(Action):
    name = "scale_out"
    params = {"replicas": (_replicas, 1)}

    def run(self, ctx: Context, fired: Fired) -> Outcome:
        svc = ctx.service
        if not hasattr(svc, "scale_out"):
            raise ActionUnavailable("this server runs its engines in-process (no replicas to add); start it "
                                    "with --replicas to scale out")
        n = fired.params.get("replicas", 1)
        res = svc.scale_out(n)
        return Outcome(f"added {n} replica(s): {', '.join(res.get('added', []))}", {"added": res.get("added", [])},
                       check=lambda: (svc.health()[0] == 200, f"health {svc.health()[0]}"),
                       release=lambda: (svc.scale_in(n), f"removed {n} replica(s)")[1])


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
ACTIONS: dict[str, Action] = {a.name: a for a in (Throttle(), Fallback(), Restore(), RestartDevice(), ScaleOut(),
                                                   ScaleIn(), Defragment(), Rollback())}
