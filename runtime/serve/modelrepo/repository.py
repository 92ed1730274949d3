"""A model repository in Triton's layout, scanned into what can be served::

    DIR/
      resnet/
        config.yaml          # optional (:mod:`.config`); what it leaves out comes from the .om
        1/model.om
        3/model.om           # versions: positive integers; other entries are ignored
      minilm/
        1/model.om

:func:`scan_repository` reads every model directory (hidden entries and files are skipped),
:func:`scan_model` one of them (Triton's per-model load re-reads it), :func:`single_model` makes a
one-model repository of a bare ``.om`` (``vnpu serve --model path/x.om``: the model is named after the
file, version 1, its configuration derived from the file).

Each model's configuration is its ``config.yaml`` completed from the newest readable version the
``version_policy`` selects (:func:`.omfile.complete`), and every version is checked against it.  The scan
is a snapshot (:class:`Repository`), not live state: a version is READY when it is selected and its .om
agrees with the configuration, UNAVAILABLE with the reason otherwise (a missing or corrupt .om, a
disagreement with the configuration, a bad ``config.yaml``, or not selected by the version policy).  The
server owns loading; its own index reports what it loaded.

Blocking: scanning reads every version's .om in full (the digest check); nothing touches a device.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .config import CONFIG_FILE, ParsedConfig, load_model_config
from .omfile import OmInfo, batch_gears, complete, read_om_info
from .spec import NAME_RE, ModelConfig, ModelConfigError, VersionPolicy

MODEL_FILE = "model.om"
READY, UNAVAILABLE = "READY", "UNAVAILABLE"
VERSION_RE = re.compile(r"[1-9][0-9]{0,17}")


@dataclass(frozen=True)
class ModelVersion:
    """One version directory: READY (selected, agrees with the configuration) or UNAVAILABLE (why);
    ``gears``: the batch sizes an execution of this version pads to (:func:`.omfile.batch_gears`)."""
    version: int
    path: Path
    state: str
    reason: str = ""
    om: OmInfo | None = None
    gears: tuple[int, ...] = ()

    @property
    def ready(self) -> bool:
        return self.state == READY


@dataclass(frozen=True)
class RepoModel:
    """One model: its configuration (None with ``error`` when there is none to serve) and every version
    directory, ascending."""
    name: str
    path: Path
    config: ModelConfig | None
    versions: tuple[ModelVersion, ...] = ()
    error: str = ""

    @property
    def ready_versions(self) -> tuple[ModelVersion, ...]:
        return tuple(v for v in self.versions if v.ready)

    def version(self, v: int) -> ModelVersion | None:
        return next((x for x in self.versions if x.version == v), None)

    @property
    def latest(self) -> ModelVersion | None:
        """The newest READY version (what a request without a version runs on)."""
        ready = self.ready_versions
        return ready[-1] if ready else None


@dataclass(frozen=True)
class IndexEntry:
    """A row of the repository index (Triton's ``/v2/repository/index``); ``version`` is "" for a model
    that has no version to list."""
    name: str
    version: str
    state: str
    reason: str = ""


@dataclass(frozen=True)
class Repository:
    root: Path | None
    models: tuple[RepoModel, ...] = ()

    def model(self, name: str) -> RepoModel | None:
        return next((m for m in self.models if m.name == name), None)

    def index(self) -> tuple[IndexEntry, ...]:
        out = []
        for m in self.models:
            if not m.versions:
                out.append(IndexEntry(m.name, "", UNAVAILABLE, m.error))
            out += [IndexEntry(m.name, str(v.version), v.state, v.reason) for v in m.versions]
        return tuple(out)

    def check(self) -> None:
        """:class:`ModelConfigError` for the first model with no READY version (a server that must serve
        the whole repository refuses to start on it, as Triton's ``--exit-on-error`` does)."""
        for m in self.models:
            if m.latest is None:
                why = m.error or "; ".join(f"version {v.version}: {v.reason}" for v in m.versions)
                raise ModelConfigError(f"model {m.name}: nothing to serve: {why}")


def scan_repository(root: str | Path) -> Repository:
    """Every model of the repository at ``root``, by name; :class:`ModelConfigError` when ``root`` is not
    a readable directory.  Blocks on reading the files."""
    r = Path(root)
    try:
        entries = sorted(p for p in r.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError as e:
        raise ModelConfigError(f"model repository {r}: {e.strerror or e}") from None
    return Repository(r, tuple(scan_model(r, p.name) for p in entries))


def scan_model(root: str | Path, name: str) -> RepoModel:
    """Model ``name`` of the repository at ``root`` (never raises for what is inside the directory: a bad
    model is a :class:`RepoModel` with ``error``)."""
    path = Path(root) / name
    if not NAME_RE.fullmatch(name):
        return RepoModel(name, path, None, error=f"{name!r} is not a model name (letters, digits, '_', '.', '-')")
    try:
        dirs = [p for p in path.iterdir() if p.is_dir() and VERSION_RE.fullmatch(p.name)]
    except OSError as e:
        return RepoModel(name, path, None, error=f"{path}: {e.strerror or e}")
    found = {int(p.name): p / MODEL_FILE for p in dirs}
    if not found:
        return RepoModel(name, path, None, error=f"no version directories ({path}/<version>/{MODEL_FILE})")
    cfg_file = path / CONFIG_FILE
    try:
        parsed = load_model_config(cfg_file, name) if cfg_file.exists() else ParsedConfig(name)
    except ModelConfigError as e:
        return _unavailable(name, path, found, e.detail)
    return _model(name, path, parsed, found)


def single_model(om_path: str | Path, name: str | None = None, config: str | Path | None = None) -> Repository:
    """A one-model repository of the ``.om`` at ``om_path`` (version 1), named ``name`` or after the file,
    configured by the ``config`` file (a ``config.yaml``) or from the .om alone."""
    p = Path(om_path)
    name = p.stem if name is None else name
    if not NAME_RE.fullmatch(name):
        raise ModelConfigError(f"{p}: {name!r} is not a model name (letters, digits, '_', '.', '-'); name it "
                               "with --model-name")
    parsed = load_model_config(config, name) if config is not None else ParsedConfig(name)
    return Repository(None, (_model(name, p.parent, parsed, {1: p}),))


def _unavailable(name: str, path: Path, found: dict, why: str) -> RepoModel:
    versions = tuple(ModelVersion(v, found[v], UNAVAILABLE, why) for v in sorted(found))
    return RepoModel(name, path, None, versions, why)


def _read(found: dict) -> tuple[dict, dict]:
    """version -> OmInfo of those that read, version -> why of those that do not."""
    infos, bad = {}, {}
    for v in sorted(found):
        try:
            infos[v] = read_om_info(found[v])
        except ModelConfigError as e:
            bad[v] = e.detail
    return infos, bad


def _model(name: str, path: Path, parsed: ParsedConfig, found: dict) -> RepoModel:
    """The model's configuration (completed from the newest selected readable .om) and its versions."""
    policy = parsed.get("version_policy") or VersionPolicy()
    selected = set(policy.select(found))
    infos, bad = _read(found)
    base = max((v for v in infos if v in selected), default=None)
    if base is None:
        why = (f"no version that version_policy selects ({', '.join(map(str, sorted(selected))) or 'none'}) "
               f"has a readable {MODEL_FILE}")
        return RepoModel(name, path, None, _versions(found, selected, infos, bad, None), why)
    try:
        config = complete(parsed, infos[base])
    except ModelConfigError as e:
        return _unavailable(name, path, found, e.detail)
    return RepoModel(name, path, config, _versions(found, selected, infos, bad, config, infos[base]))


def _versions(found: dict, selected: set, infos: dict, bad: dict, config: ModelConfig | None,
              base: OmInfo | None = None) -> tuple:
    out = []
    for v in sorted(found):
        if v in bad:
            out.append(ModelVersion(v, found[v], UNAVAILABLE, bad[v]))
        elif v not in selected:
            out.append(ModelVersion(v, found[v], UNAVAILABLE, "not selected by the version_policy", infos[v]))
        else:
            why = _disagrees(config, infos[v], base) if config is not None else "no configuration"
            gears = batch_gears(config, infos[v]) if not why else ()
            out.append(ModelVersion(v, found[v], UNAVAILABLE if why else READY, why, infos[v], gears))
    return tuple(out)


def _disagrees(config: ModelConfig, om: OmInfo, base: OmInfo | None = None) -> str:
    """Why the .om of another version cannot serve ``config`` (completed from ``base``'s) ("" when it can):
    also when one of the two has image-size gears and the other not (the model's -1 on H and W would be
    a lie for one of them)."""
    if base is not None and bool(om.hw_gears) != bool(base.hw_gears):
        has, lacks = (om, base) if om.hw_gears else (base, om)
        return (f"its .om disagrees with the model's configuration: version {Path(has.path).parent.name} has "
                f"image-size gears, version {Path(lacks.path).parent.name} has none (one model serves one kind)")
    parsed = ParsedConfig(config.name, "", tuple((k, getattr(config, k)) for k in (
        "max_batch_size", "inputs", "outputs", "dynamic_batching")))
    try:
        complete(parsed, om)
    except ModelConfigError as e:
        return f"its .om disagrees with the model's configuration: {e.detail}"
    return ""


__all__ = ["IndexEntry", "MODEL_FILE", "ModelVersion", "READY", "Repository", "RepoModel", "UNAVAILABLE",
           "scan_model", "scan_repository", "single_model"]
