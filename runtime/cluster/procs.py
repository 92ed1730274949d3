"""The processes of one local Ray cluster: found by its temp dir, stopped for good.

Every process a local vnpu cluster runs -- GCS, raylet, the dashboard's API server, the dashboard and
runtime-env agents, the workers hosting the device actors -- names the cluster's Ray temp dir
(``/tmp/vnpu-ray-*``) on its command line or holds a log file under it, even the ones that rename
themselves ``ray::...``.  That is how :func:`cluster_processes` finds them (never by a name pattern, so
another cluster on the machine is never touched), and :func:`stop` ends them: SIGTERM, a bounded wait on
a pidfd per process, then SIGKILL for what is left.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import time

from devices.procstat import alive      # (re-exported: whether a pid runs; a zombie does not)


def _names(pid: int, temp_dir: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if temp_dir.encode() in f.read():
                return True
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(temp_dir):
                    return True
    except OSError:
        pass
    return False


def cluster_processes(temp_dir: str) -> list[int]:
    """Live processes (never this one) that name ``temp_dir`` (see the module doc)."""
    if not temp_dir or not temp_dir.startswith("/tmp/vnpu-ray-"):
        return []
    me = os.getpid()
    return sorted(int(d) for d in os.listdir("/proc")
                  if d.isdigit() and int(d) != me and _names(int(d), temp_dir) and alive(int(d)))


def wait_gone(pids, timeout_s: float) -> list[int]:
    """Wait (bounded, on a pidfd per process) until each of ``pids`` has ended; returns those still alive."""
    end = time.monotonic() + timeout_s
    left = []
    for p in pids:
        try:
            fd = os.pidfd_open(p)
        except OSError:
            continue                                   # gone already
        try:
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not ready and alive(p):
                left.append(p)
        finally:
            os.close(fd)
    return left


def stop(pids, grace_s: float = 3.0) -> list[int]:
    """SIGTERM ``pids``, wait up to ``grace_s``, SIGKILL the rest and wait for them; returns any that
    survived even that (none expected)."""
    pids = [p for p in pids if p != os.getpid() and alive(p)]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)
        pids = wait_gone(pids, wait_s)
        if not pids:
            break
    return pids


__all__ = ["alive", "cluster_processes", "wait_gone", "stop"]
