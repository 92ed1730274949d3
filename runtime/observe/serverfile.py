"""``$VNPU_HOME/serve/server.json``: how commands (``vnpu monitor``, ``diagnose``, ``serve reconfigure``, ...)
find the running server -- its URL, pid, and the History file it records into.

Written (mode 0600, atomically) by ``vnpu serve`` once its socket is bound; removed on a clean stop.  A file
left behind by a server that died is recognised by its pid and that process's start time: :func:`read`
returns None when the process is gone or a zombie (:func:`devices.procstat.alive`), or when the pid now
belongs to another process (pids are reused: the start time differs).  This module is the file's only reader and writer; it
lives with the operator's commands that read it (:mod:`runtime.observe.source`), below the server that
writes it.  It holds no credential (:func:`write` takes none): commands still need an admin key
(``--api-key`` / ``VNPU_API_KEY``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from devices import procstat

#: the fields of the file (and nothing else: no key, no token)
FIELDS = ("url", "pid", "history", "start_time")


def path(state_dir: Path) -> Path:
    """``<state dir>/serve/server.json``."""
    return Path(state_dir) / "serve" / "server.json"


def write(state_dir: Path, url: str, history: str | None, pid: int | None = None) -> Path:
    """Record the server at ``url`` (this process unless ``pid``) and its History file."""
    p = path(state_dir)
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = p.with_name(f".server.json.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        pid = pid or os.getpid()
        json.dump(dict(zip(FIELDS, (url, pid, history, procstat.start_time(pid)))), f)
    os.chmod(tmp, 0o600)
    os.replace(tmp, p)
    return p


def read(state_dir: Path) -> dict | None:
    """``{"url", "pid", "history", "start_time"}`` of the running server, or None (no file, unreadable, not
    a server file, its process is gone or a zombie, or the pid is another process's now).  One small file
    read, plus ``/proc/<pid>/stat``."""
    try:
        info = json.loads(path(state_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    pid = info.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not procstat.alive(pid):
        return None
    if info.get("start_time") != procstat.start_time(pid):
        return None                          # the server died and its pid was given to another process
    return {k: info.get(k) for k in FIELDS}


def remove(state_dir: Path, pid: int | None = None) -> None:
    """Remove the file if it names this process (or ``pid``): a second server's file is left alone."""
    p = path(state_dir)
    try:
        info = json.loads(p.read_text())
    except (OSError, ValueError):
        return
    if isinstance(info, dict) and info.get("pid") == (pid or os.getpid()):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


__all__ = ["FIELDS", "path", "write", "read", "remove"]
