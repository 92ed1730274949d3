"""``$VNPU_HOME/serve/server.json``: how commands (``vnpu monitor``, ``diagnose``, ``serve reconfigure``, ...)
find the running server -- its URL, pid, and the History file it records into.

Written (mode 0600, atomically) by ``vnpu serve`` once its socket is bound; removed on a clean stop.  A file
left behind by a server that died is recognised by its pid (:func:`read` returns None for it).  It holds no
credential: commands still need an admin key (``--api-key`` / ``VNPU_API_KEY``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path


def path(state_dir: Path) -> Path:
    return Path(state_dir) / "serve" / "server.json"


def write(state_dir: Path, url: str, history: str | None, pid: int | None = None) -> Path:
    """Record the server at ``url`` (this process unless ``pid``) and its History file."""
    p = path(state_dir)
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = p.with_name(f".server.json.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "pid": pid or os.getpid(), "history": history}, f)
    os.chmod(tmp, 0o600)
    os.replace(tmp, p)
    return p


def read(state_dir: Path) -> dict | None:
    """``{"url", "pid", "history"}`` of the running server, or None (no file, unreadable, or its process is
    gone)."""
    from runtime.cluster.procs import alive          # (the cluster package imports gRPC: only when asked)
    try:
        info = json.loads(path(state_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not isinstance(info.get("pid"), int) or not alive(info["pid"]):
        return None
    return info


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
