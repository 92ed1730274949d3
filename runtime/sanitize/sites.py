"""Call sites: where on the host a runtime call was issued, kept as a small integer.

A site is the API entry point the program called (``Stream.launch``, ``acl.rt.memcpy`` ...: the
outermost frame of the runtime's own code) plus up to ``depth`` frames of the caller above it.  Frames
inside the runtime (``runtime.api``, ``runtime.acl``, ``runtime.graph``, ``runtime.hccl``,
``runtime.offline``, this package, ``devices``, ``driver``, the cluster's device handles) are skipped;
models, jobs and the serving engine are callers like any program.  Identical stacks intern to the same
site id, so "once per pair of call sites" is a comparison of two ints.

Capturing walks frame objects (no source lines are read); text is made only for findings.
"""
from __future__ import annotations

import functools
import os
import sys
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

_RUNTIME = Path(__file__).resolve().parent.parent
_ROOT = _RUNTIME.parent
#: directories and files whose frames are the runtime's own (skipped, the outermost names the API entry)
INTERNAL = tuple(str(p) for p in (
    _RUNTIME / "sanitize", _RUNTIME / "acl", _RUNTIME / "offline", _RUNTIME / "api.py", _RUNTIME / "graph.py",
    _RUNTIME / "memory", _RUNTIME / "hostmem.py",
    _RUNTIME / "hccl.py", _RUNTIME / "backend.py", _RUNTIME / "cluster" / "remote.py",
    _RUNTIME / "cluster" / "failover.py", _RUNTIME / "profiler", _ROOT / "devices", _ROOT / "driver"))
#: frames skipped on the way out that never name the API entry: the acl calling convention's wrapper (the
#: acl function it wraps is the entry) and the standard library (``with stream.capture():`` ends the
#: capture from contextlib's ``__exit__``; the caller is the program's ``with`` line), and the profiler's hook
#: wrapper around runtime entry points (the function it wraps is the entry)
TRANSPARENT = (str(_RUNTIME / "acl" / "_calls.py"), str(_RUNTIME / "profiler" / "hooks.py"),
               sysconfig.get_paths()["stdlib"] + os.sep)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.function} at {self.file}:{self.line}"


@dataclass(frozen=True)
class Site:
    """A call site: the API entry (``""`` when the call came from outside any runtime frame) and the
    caller's frames, innermost first."""
    api: str
    frames: tuple[Frame, ...]

    def lines(self) -> list[str]:
        out = [f"API call: {self.api}"] if self.api else []
        return out + [f"Host Frame: {f}" for f in self.frames]

    def as_dict(self) -> dict:
        return {"api": self.api, "frames": [{"file": f.file, "line": f.line, "function": f.function}
                                            for f in self.frames]}

    @property
    def where(self) -> str:
        """The innermost caller frame as ``file:line`` (what a one-line report shows)."""
        return f"{self.frames[0].file}:{self.frames[0].line}" if self.frames else self.api


def _rel(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _api_name(code) -> str:
    """``Stream.launch`` for runtime.api, ``acl.rt.memcpy`` for runtime.acl (``acl.rt.*`` is implemented
    in ``_rt.py``), ``acl.init`` for its ``__init__``, ``hccl.Communicator...``."""
    mod = code.co_filename
    name = getattr(code, "co_qualname", code.co_name)
    if f"{os.sep}acl{os.sep}" in mod:
        return f"{_acl_namespace(mod)}.{name}"
    stem = Path(mod).stem
    return name if stem == "api" else f"{stem}.{name}"


@functools.lru_cache(maxsize=None)
def _acl_namespace(path: str) -> str:
    """The acl namespace a file of runtime/acl implements: ``acl.<x>`` for ``_<x>.py`` when the public
    module ``<x>.py`` exists beside it (``_rt.py`` -> ``acl.rt``), else ``acl`` (``__init__.py``,
    ``_buffers.py`` ...)."""
    p = Path(path)
    ns = p.stem.lstrip("_")
    return f"acl.{ns}" if p.stem.startswith("_") and ns and (p.parent / f"{ns}.py").is_file() else "acl"


class SiteTable:
    """Interned call sites (thread-safe).  :meth:`capture` returns the id of the calling stack."""

    def __init__(self, depth: int = 8):
        self.depth = depth
        self._ids: dict[tuple, int] = {}
        self._sites: list[Site | tuple] = []
        self._internal: dict = {}            # code object -> is it the runtime's own?
        self._lock = threading.Lock()

    def _is_internal(self, code) -> int:
        """0: the program's frame; 1: the runtime's; 2: the runtime's, but never the API entry."""
        v = self._internal.get(code)
        if v is None:
            path = os.path.abspath(code.co_filename)
            if path.startswith(TRANSPARENT) and "site-packages" not in path:
                v = 2
            else:
                v = 1 if path.startswith(INTERNAL) else 0
            self._internal[code] = v
        return v

    def capture(self, skip: int = 1) -> int:
        """The site id of the stack that called the caller of this function (``skip`` more frames up)."""
        f: FrameType | None = sys._getframe(skip + 1)
        internal = self._internal
        entry = None
        while f is not None:
            code = f.f_code
            v = internal.get(code)
            if v is None:
                v = self._is_internal(code)
            if not v:
                break
            if v == 1:
                entry = code
            f = f.f_back
        key: list = [entry]
        n = self.depth
        while f is not None and n:
            key.append((f.f_code, f.f_lineno))
            f = f.f_back
            n -= 1
        k = tuple(key)
        sid = self._ids.get(k)
        if sid is None:
            with self._lock:
                sid = self._ids.get(k)
                if sid is None:
                    sid = self._ids[k] = len(self._sites)
                    self._sites.append(k)
        return sid

    def site(self, sid: int) -> Site:
        """The site of id ``sid`` (text made on first use)."""
        s = self._sites[sid]
        if isinstance(s, Site):
            return s
        entry, *frames = s
        site = Site(_api_name(entry) if entry is not None else "",
                    tuple(Frame(_rel(c.co_filename), line, getattr(c, "co_qualname", c.co_name)) for c, line in frames))
        self._sites[sid] = site
        return site

    def __len__(self) -> int:
        return len(self._sites)
