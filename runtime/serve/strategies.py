"""Shared strategies (``vnpu share-strategy`` / ``vnpu strategy``): a named bundle of a tuned config
fragment, its metadata and the evidence it was tuned on, kept in a local strategy directory
(``$VNPU_HOME/strategies/NAME/``, default ``~/.vnpu/strategies``).

A bundle is a folder::

    NAME/
      strategy.yaml      version: 1, name, description, tags, license, created (UTC ISO), source (the config
                         file it came from), config (the fragment: the tuning sections of the config in
                         vnpu's canonical names), evidence (the files below, with their sha256)
      evidence/FILE      copies of the stress/postmortem reports it was tuned on

The fragment holds only tuning sections (:data:`SECTIONS`: ``slo``, ``defaults``, ``tags``, ``memory``,
``self_healing``, ``devices``) -- never ``server``, ``models`` or ``tenants`` (their API keys stay home).
Applying a bundle sets each of its sections over the running config through the server's reconfigure path
(validated, health-checked, rolled back on failure); :func:`merged` puts it over a given config instead.
Blocks the host on file I/O only.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

VERSION = 1
SECTIONS = ("slo", "defaults", "tags", "memory", "self_healing", "devices")
#: SPDX identifiers a bundle may carry (lower case)
LICENSES = ("apache-2.0", "mit", "bsd-2-clause", "bsd-3-clause", "mpl-2.0", "gpl-3.0-only", "lgpl-3.0-only",
            "cc-by-4.0", "cc0-1.0", "unlicense", "proprietary")
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_TAG = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}")


class StrategyError(ValueError):
    """A bad name, license, tag, path or bundle; one line."""


@dataclass(frozen=True)
class Strategy:
    name: str
    description: str
    tags: tuple[str, ...]
    license: str
    created: str
    source: str
    config: dict
    evidence: tuple[dict, ...]
    path: Path


def home(state_dir: Path) -> Path:
    return state_dir / "strategies"


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name or ""):
        raise StrategyError(f"bad strategy name {name!r}: lower-case letters, digits and _.- (at most 64), "
                            f"starting with a letter or digit")
    return name


def check_license(lic: str) -> str:
    k = (lic or "").strip().lower()
    if k not in LICENSES:
        raise StrategyError(f"unknown license {lic!r} (known: {', '.join(LICENSES)})")
    return k


def check_tags(tags) -> tuple[str, ...]:
    out = tuple(dict.fromkeys(t.strip().lower() for t in tags if t.strip()))
    for t in out:
        if not _TAG.fullmatch(t):
            raise StrategyError(f"bad tag {t!r}: lower-case letters, digits and _.- (at most 32)")
    return out


def fragment(cfg) -> dict:
    """The tuning sections of a loaded :class:`runtime.serve.config.ServeConfig`, canonical names."""
    from .canonical import canonical
    doc = canonical(cfg)
    return {k: doc[k] for k in SECTIONS if k in doc}


def write(root: Path, name: str, config_path: str, *, description: str = "", tags=(), license: str = "apache-2.0",
          evidence=(), force: bool = False, now: float | None = None) -> Strategy:
    """Load ``config_path`` (either dialect), and write the bundle ``root/NAME``; an existing bundle is kept
    unless ``force``.  :class:`StrategyError` (one line) for bad input; nothing is written then."""
    import yaml

    from devices.errors import AclError

    from .config import load_config
    check_name(name)
    lic = check_license(license)
    tg = check_tags(tags)
    ev = [Path(p) for p in evidence]
    for p in ev:
        if not p.is_file():
            raise StrategyError(f"evidence {p}: no such file")
    if len({p.name for p in ev}) != len(ev):
        raise StrategyError("two evidence files have the same name")
    try:
        cfg = load_config(config_path)
    except AclError as e:
        raise StrategyError(str(getattr(e, "detail", e))) from None
    frag = fragment(cfg)
    if not frag:
        raise StrategyError(f"{config_path}: has none of the tuning sections ({', '.join(SECTIONS)})")
    dest = root / name
    if dest.exists() and not force:
        raise StrategyError(f"strategy {name} exists in {root} (give --force to replace it)")
    when = _dt.datetime.fromtimestamp(now, _dt.timezone.utc) if now is not None else _dt.datetime.now(_dt.timezone.utc)
    doc = {"version": VERSION, "name": name, "description": description, "tags": list(tg), "license": lic,
           "created": when.strftime("%Y-%m-%dT%H:%M:%SZ"), "source": str(config_path), "config": frag,
           "evidence": [{"file": f"evidence/{p.name}", "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                        for p in ev]}
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "evidence").mkdir(parents=True)
    for p in ev:
        shutil.copyfile(p, tmp / "evidence" / p.name)
    (tmp / "strategy.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return read(root, name)


def read(root: Path, name: str) -> Strategy:
    """The bundle ``root/NAME``, checked (version, sections, evidence hashes)."""
    import yaml
    check_name(name)
    f = root / name / "strategy.yaml"
    if not f.is_file():
        raise StrategyError(f"no strategy {name} in {root}")
    try:
        doc = yaml.safe_load(f.read_text())
    except yaml.YAMLError as e:
        raise StrategyError(f"{f}: {' '.join(str(e).split())}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise StrategyError(f"{f}: not a version {VERSION} strategy bundle")
    cfg = doc.get("config")
    if not isinstance(cfg, dict) or not cfg or set(cfg) - set(SECTIONS):
        raise StrategyError(f"{f}: config must hold only {', '.join(SECTIONS)}")
    ev = tuple(doc.get("evidence") or ())
    for e in ev:
        p = root / name / str(e.get("file", ""))
        if not p.is_file() or hashlib.sha256(p.read_bytes()).hexdigest() != e.get("sha256"):
            raise StrategyError(f"{f}: evidence {e.get('file')} is missing or changed")
    return Strategy(doc["name"], str(doc.get("description", "")), tuple(doc.get("tags") or ()),
                    str(doc.get("license", "")), str(doc.get("created", "")), str(doc.get("source", "")), cfg, ev,
                    root / name)


def listing(root: Path) -> list[Strategy]:
    """Every readable bundle under ``root``, by name (unreadable ones are skipped: ``read`` names why)."""
    out = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if d.is_dir() and not d.name.startswith("."):
            try:
                out.append(read(root, d.name))
            except StrategyError:
                continue
    return out


def merged(base: dict, frag: dict) -> dict:
    """``base`` (a config document) with each of ``frag``'s sections set over it (mappings merged key by key,
    anything else replaced)."""
    out = dict(base)
    for k, v in frag.items():
        out[k] = _merge(out.get(k), v)
    return out


def _merge(a, b):
    if isinstance(a, dict) and isinstance(b, dict):
        r = dict(a)
        for k, v in b.items():
            r[k] = _merge(r.get(k), v)
        return r
    return b


def settings(frag: dict) -> list[str]:
    """The reconfigure ``KEY=VALUE`` settings (values are YAML; JSON is YAML) that set ``frag`` live."""
    import json
    return [f"{k}={json.dumps(v)}" for k, v in frag.items()]
