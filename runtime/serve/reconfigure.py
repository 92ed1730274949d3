"""Reconfiguring a running server: a new ``serve.yaml`` (or ``key=value`` settings over the current one),
validated first, applied without a restart and without dropping a request, health-checked, rolled back
when the check fails, and recorded as a manual intervention (``config`` event, ``manual=True``, with the SLO it leaves in effect:
``vnpu postmortem`` judges each part of a window against the SLO of its time).

What applies live: every model's scheduler mode (``models[].scheduler``: from the engine's next step on),
the engine limits a running engine takes between two steps (``max_num_seqs`` and ``max_num_batched_tokens``
up to what it was built with, ``max_queued_requests``, ``scheduling_policy``, ``priority_aging_s``:
:data:`runtime.serve.engine.config.LIVE_FIELDS`) and an embedding model's dynamic batching (from its next
batch; ``max_batch_size`` up to the built one),
the tenants (keys, priority classes, quotas, admin), the ``slo``, ``memory`` (the pools grow or shrink
without touching a live block -- a size below what the engines hold is refused --, the defragmentation
interval, overflow protection: :mod:`runtime.serve.memory_pool`), and the ``self_healing`` section (the
policy engine keeps the state of triggers that keep their name).  What needs a restart -- ``server``,
the models served, their devices, fallback chains, the other engine fields (block size, model length, KV
blocks, graphs), a batch above the built one -- is refused by name, before anything changes.

``key=value`` paths are dotted; a list element is named by its index or its name (a model's name without
``@devices``, a tenant's or trigger's ``name``): ``models.smollm2.scheduler.mode=latency``,
``self_healing.triggers.thermal.condition='> 90'``, ``slo.target_p99_ms=500``.  Values are YAML.

Blocking: :meth:`Reconfigurer.apply` blocks for the mode switches and the health check (one probe
generation per model).
"""
from __future__ import annotations

import dataclasses
import threading
import time

import yaml

from .config import ConfigError, ServeConfig, parse_config
from .engine.config import LIVE_FIELDS
from .heal.actions import PROBES, Context, probe


class Reconfigurer:
    """The running config of ``service`` (``text``: its YAML) and how to change it; ``healing``: the
    server's :class:`runtime.serve.heal.SelfHealing` (None: none runs); ``history``: where changes are
    recorded; ``health_check``: probe every generation model after a change."""

    def __init__(self, service, cfg: ServeConfig, text: str = "", healing=None, history=None,
                 health_check: bool = True):
        self.service = service
        self.cfg = cfg
        self.text = text
        self.healing = healing
        self.history = history
        self.health_check = health_check
        self.previous: list[tuple[ServeConfig, str]] = []
        self._lock = threading.Lock()
        service.reconfigurer = self
        if healing is not None:
            healing.ctx.reconfigurer = self

    # -------------------------------------------------------------- the new config
    def propose(self, config_text: str | None = None, sets: list[str] | tuple[str, ...] = ()) -> tuple[ServeConfig, str]:
        """The validated config of ``config_text`` (or the current one) with ``sets`` applied
        (ConfigError otherwise), and its YAML."""
        try:
            doc = yaml.safe_load(config_text if config_text is not None else self.text or "") or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"reconfigure: not valid YAML: {getattr(e, 'problem', e)}") from None
        if not isinstance(doc, dict):
            raise ConfigError("reconfigure: the config must be a mapping")
        mem = {k: v for k, v in dataclasses.asdict(self.cfg.memory).items() if v is not None}
        if "memory" not in doc and mem and config_text is None:
            doc["memory"] = mem                          # what the command line set (--pool-size ...) stays
        for s in sets:
            key, eq, raw = str(s).partition("=")
            if not eq or not key.strip():
                raise ConfigError(f"--set {s!r}: expected key=value (e.g. slo.target_p99_ms=500)")
            try:
                value = yaml.safe_load(raw)
            except yaml.YAMLError:
                raise ConfigError(f"--set {s!r}: the value is not valid YAML") from None
            if key.strip() in ("memory.pool_size", "memory.pool_bytes") and isinstance(doc.get("memory"), dict):
                doc["memory"].pop("pool_size", None)     # the seed's name and vnpu's: the new one replaces both
                doc["memory"].pop("pool_bytes", None)
            _set_path(doc, key.strip().split("."), value, key.strip())
        text = yaml.safe_dump(doc, sort_keys=False)
        new = parse_config(text, "reconfigure", self.service.compiled_names())
        old = self.cfg
        if "models" not in doc:                          # what the command line chose stays as it is
            models = tuple(dataclasses.replace(m, engine=dataclasses.replace(
                m.engine, mode=dataclasses.replace(m.engine.mode, target_p99_ms=new.slo.target_p99_ms)))
                if m.kind == "generate" else m for m in old.models)           # (the SLO the modes plan for)
            new = dataclasses.replace(new, models=models)
        if "server" not in doc:
            new = dataclasses.replace(new, host=old.host, port=old.port, replicas=old.replicas,
                                      allow_unauthenticated=old.allow_unauthenticated)
        if "http" not in doc:
            new = dataclasses.replace(new, http=old.http)
        self._check_live(new)
        return new, text

    def _check_live(self, new: ServeConfig) -> None:
        old = self.cfg
        for f in ("host", "port", "allow_unauthenticated", "replicas"):
            if getattr(new, f) != getattr(old, f):
                raise ConfigError(f"reconfigure: server.{f} cannot change without a restart")
        if new.http != old.http:
            raise ConfigError("reconfigure: the http limits cannot change without a restart")
        if [m.name for m in new.models] != [m.name for m in old.models]:
            raise ConfigError(f"reconfigure: the models served cannot change without a restart "
                              f"({', '.join(m.name for m in old.models)})")
        running = {s.name: s for s in self.service.specs}
        for m in new.models:
            o = running[m.name]
            if m.devices is not None and m.devices != o.devices:
                raise ConfigError(f"reconfigure: models.{m.name}: the devices cannot change without a restart")
            if m.fallback != o.fallback:
                raise ConfigError(f"reconfigure: models.{m.name}.fallback cannot change without a restart")
            if m.kind == "generate":
                live, restart = o.engine.live_diff(m.engine)
                if restart:
                    raise ConfigError(f"reconfigure: models.{m.name}.engine.{restart[0]} cannot change without a "
                                      f"restart (live: engine.{', engine.'.join(LIVE_FIELDS)}, scheduler, tenants, "
                                      f"slo, memory, self_healing)")
                if live:
                    self._check_engine(m, "set_limits")
            elif m.batching != o.batching:
                self._check_engine(m, "set_batching")
        if new.memory != old.memory:
            self._check_memory(new)

    def _check_engine(self, m, method: str) -> None:
        """Refuse (ConfigError, nothing changed) live limits ``m``'s running engine cannot take."""
        from devices.errors import InvalidParamError
        try:
            eng = self.service.live_engine(m.name, method)
            cap = getattr(eng, "capacity", None) if method == "set_limits" else None
            if cap is not None:
                for k in ("max_num_seqs", "max_num_batched_tokens"):
                    if getattr(m.engine, k) > getattr(cap, k):
                        raise InvalidParamError(f"engine.{k} {getattr(m.engine, k)} is above the {getattr(cap, k)} "
                                                f"the engine was built with; that needs a restart")
            elif method == "set_batching" and m.batching.max_batch_size > getattr(eng, "batch_capacity", 0):
                raise InvalidParamError(f"batching.max_batch_size {m.batching.max_batch_size} is above the "
                                        f"{getattr(eng, 'batch_capacity', 0)} the engine was built with; that needs "
                                        f"a restart")
        except InvalidParamError as e:
            raise ConfigError(f"reconfigure: models.{m.name}: {getattr(e, 'detail', e)}") from None

    def _check_memory(self, new: ServeConfig) -> None:
        from devices.errors import InvalidParamError

        from .memory_pool import PoolPlan
        mm = getattr(self.service, "memory", None)
        if mm is None:
            raise ConfigError("reconfigure: memory: this server manages no memory pool (replicas, or no engine on a "
                              "device); it cannot change live")
        try:
            mm.check_size(PoolPlan.from_spec(new.memory).pool_bytes)
        except InvalidParamError as e:
            raise ConfigError(f"reconfigure: memory: {getattr(e, 'detail', e)}") from None

    # -------------------------------------------------------------- applying
    def apply(self, config_text: str | None = None, sets: list[str] | tuple[str, ...] = (), who: str = "operator",
              manual: bool = True) -> dict:
        """Validate, apply, health-check (rolled back when it fails); returns ``{"result", "changes",
        "event_id", ...}``.  ConfigError (nothing changed) for a bad or non-live config."""
        with self._lock:
            new, text = self.propose(config_text, sets)
            changes = self._changes(self.cfg, new)
            t0 = time.monotonic()
            old = (self.cfg, self.text)
            self._install(new, text)
            ok, why = self._check()
            result = "ok"
            if not ok:
                self._install(*old)
                result = f"failed: health check: {why}; rolled back"
            else:
                self.previous.append(old)
            took = time.monotonic() - t0
            eid = None
            if self.history is not None:
                eid = self.history.record_event(
                    "config", source=who, manual=manual, result=result, duration_s=took,
                    diagnosis=f"reconfigure: {'; '.join(changes) or 'no change'}",
                    detail={"changes": changes, "set": list(sets), "file": config_text is not None,
                            "health_check": why, "slo": dataclasses.asdict(self.cfg.slo)})
            return {"result": result, "changes": changes, "health_check": why, "event_id": eid, "seconds": took}

    def rollback(self, who: str = "operator") -> str:
        """Back to the config before the last change (the ``rollback`` action)."""
        with self._lock:
            if not self.previous:
                raise ConfigError("no previous config to roll back to")
            cfg, text = self.previous.pop()
            changes = self._changes(self.cfg, cfg)
            self._install(cfg, text)
        if self.history is not None:
            self.history.record_event("config", source=who, manual=not who.startswith("policy"), result="ok",
                                      diagnosis=f"rollback: {'; '.join(changes) or 'no change'}",
                                      detail={"changes": changes, "slo": dataclasses.asdict(cfg.slo)})
        return f"rolled back: {'; '.join(changes) or 'no change'}"

    def _install(self, cfg: ServeConfig, text: str) -> None:
        svc = self.service
        before = {m.name: m for m in self.cfg.models}
        for m in cfg.models:
            o = before.get(m.name)
            if o is not None and m.name in svc.engines:
                if m.kind == "generate" and o.engine.live_diff(m.engine)[0]:
                    svc.set_engine_limits(m.name, m.engine)     # from its next step; its mode is set below
                elif m.kind == "embed" and o.batching != m.batching:
                    svc.set_batching(m.name, m.batching)        # from its next batch
            if m.engine is not None and m.engine.mode.mode == "auto" and o is not None and o.engine.mode == m.engine.mode:
                continue                                 # auto keeps the target it picked from the history
            if m.kind == "generate" and m.name in svc.engines:
                cur = getattr(svc.engines[m.name], "config", None)
                if cur is None or getattr(cur, "mode", None) != m.engine.mode:
                    svc.set_mode(m.name, m.engine.mode)
        if cfg.tenants != self.cfg.tenants:
            svc.set_tenants(cfg.tenants)
        if cfg.tags != self.cfg.tags:
            svc.set_tags(cfg.tags)
        if self.healing is not None and cfg.self_healing != self.cfg.self_healing:
            self.healing.update(cfg.self_healing)
        if cfg.memory != self.cfg.memory and getattr(svc, "memory", None) is not None:
            from .memory_pool import PoolPlan
            svc.memory.update(PoolPlan.from_spec(cfg.memory))
        self.cfg, self.text = cfg, text

    def _check(self) -> tuple[bool, str]:
        st, body = self.service.health()
        if st != 200:
            return False, f"health {st} {body.get('status')}"
        if not self.health_check:
            return True, "health 200"
        ctx = Context(self.service)
        for name, e in list(self.service.engines.items()):
            if getattr(e, "kind", None) in PROBES:
                ok, why = probe(ctx, name)
                if not ok:
                    return False, why
        return True, "health 200, every model served a probe"

    @staticmethod
    def _changes(old: ServeConfig, new: ServeConfig) -> list[str]:
        out = []
        om = {m.name: m for m in old.models}
        for m in new.models:
            o = om.get(m.name)
            if o is not None and m.kind == "generate" and o.engine.mode != m.engine.mode:
                a, b = o.engine.mode, m.engine.mode
                diff = [f"{f.name} {getattr(a, f.name)!r} -> {getattr(b, f.name)!r}" for f in dataclasses.fields(a)
                        if getattr(a, f.name) != getattr(b, f.name)]
                out.append(f"{m.name} scheduler: {', '.join(diff)}")
            if o is not None and m.kind == "generate":
                live = o.engine.live_diff(m.engine)[0]
                if live:
                    out.append(f"{m.name} engine: " + ", ".join(f"{k} {getattr(o.engine, k)!r} -> "
                                                             f"{getattr(m.engine, k)!r}" for k in live))
            elif o is not None and o.batching != m.batching:
                out.append(f"{m.name} batching: " + ", ".join(
                    f"{f.name} {getattr(o.batching, f.name)!r} -> {getattr(m.batching, f.name)!r}"
                    for f in dataclasses.fields(m.batching) if getattr(o.batching, f.name) != getattr(m.batching, f.name)))
        if old.tenants != new.tenants:
            out.append(f"tenants: {', '.join(t.name for t in new.tenants) or 'none'}")
        if old.tags != new.tags:
            out.append(f"tags: {dict(new.tags)}")
        if old.slo != new.slo:
            out.append(f"slo: {dataclasses.asdict(new.slo)}")
        if old.memory != new.memory:
            a, b = dataclasses.asdict(old.memory), dataclasses.asdict(new.memory)
            out.append("memory: " + ", ".join(f"{k} {a[k]!r} -> {b[k]!r}" for k in a if a[k] != b[k]))
        if old.self_healing != new.self_healing:
            out.append(f"self_healing: {len(new.self_healing.triggers)} trigger(s), "
                       f"{'enabled' if new.self_healing.enabled else 'disabled'}")
        return out


def _set_path(doc, parts: list[str], value, key: str) -> None:
    node = doc
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            idx = _find(node, p, key)
            if last:
                node[idx] = value
                return
            node = node[idx]
        elif isinstance(node, dict):
            if last:
                node[p] = value
                return
            if p not in node or node[p] is None:
                node[p] = {}
            node = node[p]
        else:
            raise ConfigError(f"--set {key}: {'.'.join(parts[:i]) or 'the config'} is not a mapping or a list")


def _find(items: list, p: str, key: str) -> int:
    if p.isdigit():
        if int(p) >= len(items):
            raise ConfigError(f"--set {key}: index {p} is out of range ({len(items)} item(s))")
        return int(p)
    for k, it in enumerate(items):
        name = it.get("name", str(it.get("model", "")).partition("@")[0]) if isinstance(it, dict) else \
            str(it).partition("@")[0]
        if name == p:
            if not isinstance(it, dict):                # "smollm2@0" -> {model: smollm2@0}
                items[k] = {"model": it}
            return k
    raise ConfigError(f"--set {key}: no item named {p!r}")
