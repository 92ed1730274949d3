"""The compiled models a server serves, behind the Open Inference Protocol's
:class:`~runtime.serve.v2.repository.ModelRepositoryView`: a model repository (or single ``.om`` files)
scanned at start, every READY version loaded as an :class:`.instances.InstanceSet` on the placements of
:mod:`.placement`, and Triton's model control and statistics.

- **Versions.**  A request without a version runs on the newest loaded version; one naming a version of the
  repository that is not loaded is refused (503), one naming no version of it is a 404.
- **Load (hot).**  ``load(m)`` scans the model's directory again (Triton's explicit model control: its
  ``config.yaml`` and version directories as they are now), loads every READY version beside what serves,
  then moves the traffic in one step: requests from then on go to the new instances, requests already
  queued on the old ones are answered there, then the old instances are shut down.  No request is dropped.
  A model that fails to load keeps serving what it served (the refusal says why: 400).  A model directory
  that appeared after the start can be loaded too (its instances take the next free device).
- **Unload.**  ``unload(m)``: no new request is taken (503), those in flight are answered, then the
  instances are shut down; the index says ``UNAVAILABLE`` / ``unloaded``.
- **Statistics** are per version and survive reloads (:mod:`.stats`).

Blocking: ``load``/``unload``/``close`` block for model loads and drains (one at a time); ``submit``
returns at once; the rest answers from host state (``index`` lists the repository's directories).
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..config import ConfigError, ModelSpec
from ..engine.errors import ModelNotFound, QueueFull, Unavailable
from ..engine.placement import DeviceBinder, RebindResult
from ..modelrepo import UNAVAILABLE, ModelConfigError, Repository, RepoModel, scan_model, single_model
from ..v2 import repository as v2
from . import records
from .instances import InstanceSet
from .placement import InstancePlacement, place_compiled
from .stats import VersionStats

log = logging.getLogger("vnpu.serve")

#: how long an unload or a reload waits for the requests in flight on the instances it retires
DRAIN_S = 120.0


@dataclass
class _Model:
    repo: RepoModel                              #: the latest scan
    root: Path | None                            #: its repository (None: a single .om, rescanned by its path)
    placements: tuple[InstancePlacement, ...] = ()
    sets: dict[int, InstanceSet] = field(default_factory=dict)      #: loaded versions
    state: str = UNAVAILABLE                     #: READY, LOADING, UNLOADING or UNAVAILABLE
    reason: str = "not loaded"


def _version(text: str | None) -> int | None:
    if text is None:
        return None
    return int(text) if text.isdigit() and str(int(text)) == text else -1


class CompiledModels:
    """The compiled models of ``repositories`` on runtime ``rt`` beside ``specs`` (the generation and
    embedding models, placed), their instances bound through ``binder``; engine events go to ``on_event``.
    ConfigError when two repositories name the same model or a placement is impossible."""

    def __init__(self, rt, repositories: Sequence[Repository], specs: Sequence[ModelSpec] = (),
                 binder: DeviceBinder | None = None, on_event: Sequence[Callable[[dict], None]] = (),
                 clock: Callable[[], float] = time.monotonic):
        self.rt, self.specs, self.clock = rt, tuple(specs), clock
        self.binder = binder or DeviceBinder(rt)
        self.on_event = list(on_event)
        self.roots = tuple(r.root for r in repositories if r.root is not None)
        self._models: dict[str, _Model] = {}
        for r in repositories:
            for m in r.models:
                if m.name in self._models or any(s.name == m.name for s in self.specs):
                    raise ConfigError(f"model {m.name} is given twice")
                self._models[m.name] = _Model(m, r.root)
        placed = place_compiled([m.repo for m in self._models.values()], self.specs, rt.device_count())
        for name, p in placed.items():
            self._models[name].placements = p
        self._stats: dict[tuple[str, str], VersionStats] = {}
        self._lock = threading.RLock()             #: the models' state and routing
        self._control = threading.Lock()           #: one load / unload / close at a time

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._models)

    # ------------------------------------------------------------------ loading
    def load_all(self) -> None:
        """Load every model of the repositories (blocking); the first failure is raised."""
        for name in list(self._models):
            self._load(name, rescan=False)

    def load(self, name: str) -> None:
        self._load(name, rescan=True)

    def _load(self, name: str, rescan: bool) -> None:
        with self._control:
            m = self._models.get(name) or self._discover(name)
            repo = self._scan(name, m) if rescan else m.repo
            ready = repo.ready_versions
            if repo.config is None or not ready:
                why = repo.error or "; ".join(f"version {v.version}: {v.reason}" for v in repo.versions)
                raise ModelConfigError(f"model {name}: nothing to load: {why}")
            placements = self._placements(m, repo)
            with self._lock:
                before, m.state = m.state, "LOADING"
            try:
                new = self._build(repo, ready, placements)
            except BaseException:
                with self._lock:
                    m.state = before
                raise
            with self._lock:
                old, m.sets, m.repo, m.placements, m.state, m.reason = m.sets, new, repo, placements, "READY", ""
            self._retire(old)
            log.info("model %s: version(s) %s loaded on %s", name, ", ".join(map(str, new)),
                     "; ".join(map(str, placements)))

    def _discover(self, name: str) -> _Model:
        """A model directory that appeared in a repository after the start (ModelNotFound if none)."""
        for root in self.roots:
            if (root / name).is_dir():
                m = _Model(scan_model(root, name), root)
                with self._lock:
                    self._models[name] = m
                return m
        raise ModelNotFound(f"model {name!r} is not in the model repository", "model", "model_not_found")

    def _scan(self, name: str, m: _Model) -> RepoModel:
        if m.root is not None:
            return scan_model(m.root, name)
        return single_model(m.repo.versions[0].path, name)

    def _placements(self, m: _Model, repo: RepoModel) -> tuple[InstancePlacement, ...]:
        """The model's instances as they were unless its groups or chain changed (then placed again)."""
        old = m.repo.config
        if m.placements and old is not None and (old.instance_group, old.fallback) == \
                (repo.config.instance_group, repo.config.fallback):
            return m.placements
        taken = {d for o in self._models.values() if o is not m for p in o.placements
                 for pl in (p.first, *p.fallback) for d in pl.devices}
        return place_compiled([repo], self.specs, self.rt.device_count(), taken)[repo.name]

    def _build(self, repo: RepoModel, versions, placements) -> dict[int, InstanceSet]:
        """Every version's instances, started; all freed again when one fails."""
        out: dict[int, InstanceSet] = {}
        try:
            for v in versions:
                stats = self._stats.setdefault((repo.name, str(v.version)), VersionStats(repo.name, str(v.version)))
                out[v.version] = InstanceSet(self.rt, repo.config, v, placements, stats, self.binder, self.on_event,
                                             self.clock)
        except BaseException:
            self._retire(out, 0)
            raise
        for s in out.values():
            s.start()
        return out

    @staticmethod
    def _retire(sets: dict[int, InstanceSet], timeout: float = DRAIN_S) -> None:
        """Instances no request is routed to any more: answer what they hold, then shut them down."""
        for s in sets.values():
            s.drain(timeout)
            try:
                s.shutdown()
            except Exception:  # noqa: BLE001 - a lost device's share is gone; nothing else to free
                log.exception("model %s version %s: shutdown", s.name, s.version)

    def unload(self, name: str) -> None:
        with self._control:
            m = self._get(name)
            with self._lock:
                old, m.sets, m.state, m.reason = m.sets, {}, "UNLOADING", "unloading"
            self._retire(old)
            with self._lock:
                m.state, m.reason = UNAVAILABLE, "unloaded"

    def close(self) -> None:
        """Shut every instance down (what is left is refused) and free its device memory."""
        with self._control:
            with self._lock:
                sets = [s for m in self._models.values() for s in m.sets.values()]
                for m in self._models.values():
                    m.sets, m.state, m.reason = {}, UNAVAILABLE, "the server stopped"
            self._retire({i: s for i, s in enumerate(sets)}, 0)

    # ------------------------------------------------------------------ routing
    def _get(self, name: str) -> _Model:
        m = self._models.get(name)
        if m is None:
            raise ModelNotFound(f"model {name!r} is not served here", "model", "model_not_found")
        return m

    def _loaded(self, name: str, version: str | None) -> tuple[_Model, int]:
        """The model and the loaded version a request for (``name``, ``version``) runs on (under the lock)."""
        m = self._get(name)
        v = _version(version)
        if v is not None and m.repo.version(v) is None:
            raise ModelNotFound(f"model {name!r} has no version {version}", "model_version", "model_not_found")
        if v is None:
            if not m.sets:
                raise Unavailable(f"model {name!r} is not loaded ({m.reason})")
            return m, max(m.sets)
        if v not in m.sets:
            raise Unavailable(f"model {name!r} version {v} is not loaded "
                              f"({m.reason or 'the version policy does not serve it'})")
        return m, v

    def submit(self, request: v2.InferRequest) -> Future:
        with self._lock:
            m, v = self._loaded(request.model, request.version)
            try:
                return m.sets[v].submit(request)
            except (QueueFull, Unavailable):
                self._stats[(m.repo.name, str(v))].failed()
                raise

    # ------------------------------------------------------------------ what the protocol asks
    def metadata(self, name: str, version: str | None) -> v2.ModelMetadata:
        with self._lock:
            m, _ = self._loaded(name, version)
            return records.metadata(m.repo.config, [str(v) for v in sorted(m.sets)])

    def config(self, name: str, version: str | None) -> v2.ModelConfig:
        with self._lock:
            m, _ = self._loaded(name, version)
            return records.model_config(m.repo.config, [str(v) for v in sorted(m.sets)])

    def ready(self, name: str, version: str | None) -> bool:
        with self._lock:
            try:
                m, v = self._loaded(name, version)
            except Unavailable:
                return False
            return m.sets[v].ready

    def index(self) -> list[v2.IndexEntry]:
        with self._lock:
            out = [e for name in sorted(self._models) for e in self._entries(self._models[name])]
            known = set(self._models)
        for root in self.roots:
            for p in sorted(_dirs(root)):
                if p.name not in known:
                    out.append(v2.IndexEntry(p.name, "", UNAVAILABLE, "not loaded"))
        return out

    def _entries(self, m: _Model) -> list[v2.IndexEntry]:
        if not m.repo.versions:
            return [v2.IndexEntry(m.repo.name, "", UNAVAILABLE, m.repo.error)]
        out = []
        for v in m.repo.versions:
            if v.version in m.sets:
                out.append(v2.IndexEntry(m.repo.name, str(v.version), "READY"))
            elif m.state in ("LOADING", "UNLOADING"):
                out.append(v2.IndexEntry(m.repo.name, str(v.version), m.state, m.reason))
            else:
                out.append(v2.IndexEntry(m.repo.name, str(v.version), UNAVAILABLE, v.reason or m.reason))
        return out

    def stats(self, name: str | None, version: str | None) -> list[v2.ModelStats]:
        with self._lock:
            if name is not None:
                m = self._get(name)
                if version is not None and m.repo.version(_version(version)) is None:
                    raise ModelNotFound(f"model {name!r} has no version {version}", "model_version",
                                        "model_not_found")
            keys = [k for k in sorted(self._stats, key=lambda k: (k[0], int(k[1])))
                    if (name is None or k[0] == name) and (version is None or k[1] == version)]
            return [self._stats[k].record() for k in keys]

    # ------------------------------------------------------------------ the server's lifecycle and admin
    def _sets(self) -> list[InstanceSet]:
        with self._lock:
            return [s for m in self._models.values() for s in m.sets.values()]

    def waiting(self) -> int:
        """Requests queued on every instance."""
        return sum(s.waiting for s in self._sets())

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is in flight on any instance (False after ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return all(s.wait_idle(None if deadline is None else max(0.0, deadline - time.monotonic()))
                   for s in self._sets())

    def rebind(self, name: str, kind: str, reason: str = "requested", timeout: float | None = None,
               away_from: int | None = None) -> RebindResult:
        """``fallback`` / ``restore`` every instance of every loaded version of ``name`` (blocks); one result
        for them all: moved if any moved, the placements they are on now."""
        with self._lock:
            sets = list(self._get(name).sets.values())
        res = [r for s in sets for r in s.rebind(kind, reason, timeout, away_from)]
        if not res:
            raise Unavailable(f"model {name!r} is not loaded")
        where = "; ".join(dict.fromkeys(r.placement for r in res))
        return RebindResult(any(r.moved for r in res), res[0].from_index, res[0].to_index, where, reason,
                            sum(r.replayed for r in res), max(r.seconds for r in res))

    def scale(self, name: str, n: int) -> list[str]:
        """``n`` > 0: add ``n`` instances to every loaded version of ``name``; ``n`` < 0: retire as many
        added ones (see :meth:`InstanceSet.grow` / :meth:`InstanceSet.shrink`; blocks).  The instances'
        names."""
        with self._lock:
            sets = list(self._get(name).sets.values())
        if not sets:
            raise Unavailable(f"model {name!r} is not loaded")
        return [x for s in sets for x in (s.grow(n) if n > 0 else s.shrink(-n))]

    def instances(self, name: str, version: str | None = None) -> list:
        """The instances (:class:`~runtime.serve.engine.om_engine.OmEngine`) of ``name``'s loaded version
        (the newest when None), e.g. to hold one with ``paused()``."""
        with self._lock:
            m, v = self._loaded(name, version)
            return list(m.sets[v].engines)

    def all_instances(self) -> list:
        """Every instance of every loaded version (a defragmentation holds them all)."""
        return [e for s in self._sets() for e in s.engines]

    def describe(self) -> dict:
        """Every model's versions and instances, for operators (``/admin/state``)."""
        with self._lock:
            return {name: {"state": m.state, "versions": {str(v): s.describe() for v, s in sorted(m.sets.items())}}
                    for name, m in sorted(self._models.items())}


def _dirs(root: Path) -> list[Path]:
    try:
        return [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


__all__ = ["CompiledModels", "DRAIN_S"]
