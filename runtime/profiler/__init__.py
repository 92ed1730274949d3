"""The profiler: where a runtime program's time goes, in msprof's layout (``vnpu prof``, ``acl.prof``).

What it records, for the profiling process only: every runtime API call (``runtime.api`` entry points at
msprof's Runtime level, ``runtime.acl`` calls at the AscendCL level) with its thread; every stream op
handed to a device (the flow from a launch to its task); and, on the devices, the task records of *this
client's* tasks -- never another tenant's (:mod:`devices.profiling`; fetched over the driver's RMS
``Profile`` call).  :mod:`.analysis` turns them into the launch / alloc / copy / sync / compute / idle
breakdown on the wall clock and on the modeled clock (:mod:`.hostcost` prices the host side of the stack);
:mod:`.export` writes the ``PROF_*`` folder.

Turning it on:

- ``with runtime.profiler.profile("out") as p: ...`` -- profiles the block; afterwards ``p.result`` holds
  the paths, the summary text and both breakdowns;
- pyACL's ``acl.prof.*`` (:mod:`runtime.acl.prof`) over the same machinery;
- ``vnpu prof [--output DIR] -- <command>``: every runtime client the command starts reads
  ``VNPU_PROF`` (a ``PROF_*`` folder) when it creates its runtime, profiles until it exits, and leaves its
  records there; the command then writes ``mindstudio_profiler_output/`` and prints the summary.

Off (the default) the runtime's only cost is a ``None`` check per API call and per enqueued op
(:mod:`.hooks`).  Starting and stopping are host-synchronous (one round trip per device used).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from dataclasses import dataclass

from . import hooks
from .analysis import Breakdown, modeled_breakdown, modeled_timeline, wall_breakdown
from .collector import Collector, RawProfile
from .export import Exported, export, new_prof_dir, read_raws, write_raw
from .hostcost import REFERENCE, HostCostSpec

__all__ = ["ENV", "Breakdown", "Collector", "Exported", "HostCostSpec", "Profile", "RawProfile", "REFERENCE",
           "active", "export", "from_environment", "modeled_breakdown", "modeled_timeline", "new_prof_dir",
           "profile", "read_raws", "recording", "start", "stop", "wall_breakdown", "write_raw"]

#: set by ``vnpu prof``: the PROF_* folder where each runtime client leaves its records
ENV = "VNPU_PROF"

_lock = threading.Lock()


def active() -> Collector | None:
    """The running profile's collector, else None."""
    return hooks.ACTIVE


def start(record_api: bool = True, record_tasks: bool = True, devices: set[int] | None = None,
          runtime=None) -> Collector:
    """Start profiling this process (host-synchronous: opens a session on every runtime device alive --
    only those with user ids in ``devices`` / of ``runtime`` when given; devices made later join when
    they are made).  Raises RuntimeError when a profile already runs."""
    with _lock:
        if hooks.ACTIVE is not None:
            raise RuntimeError("a profile is already running in this process")
        c = Collector(record_api, record_tasks, devices, runtime)
        hooks.set_active(c)
    for dev in hooks.live_devices():
        c.attach(dev)
    return c


def stop() -> RawProfile:
    """Stop the running profile and return its records (host-synchronous).  RuntimeError when none runs."""
    with _lock:
        c = hooks.set_active(None)
    if c is None:
        raise RuntimeError("no profile is running")
    return c.stop()


def runtime_closing(devices) -> None:
    """A runtime is closing: close its devices' sessions first, keeping their records."""
    c = hooks.ACTIVE
    if c is not None:
        c.detach(devices)


@dataclass
class Profile:
    """What ``with profile(...) as p`` gives: after the block, ``raw`` and ``result`` are set."""
    output: str
    raw: RawProfile | None = None
    result: Exported | None = None


@contextlib.contextmanager
def profile(output: str = ".", record_api: bool = True, record_tasks: bool = True, runtime=None):
    """Profile the block and write a ``PROF_*`` folder under ``output`` (msprof's layout, see
    :mod:`.export`); the summary is in ``p.result.summary``.  ``runtime``: profile only that runtime's
    devices (default: every runtime of the process).  The block's exceptions pass through (the profile
    is still written)."""
    p = Profile(output)
    start(record_api, record_tasks, runtime=runtime)
    try:
        yield p
    finally:
        p.raw = stop()
        prof_dir = new_prof_dir(output)
        write_raw(prof_dir, p.raw)
        p.result = export(prof_dir, [p.raw])


@contextlib.contextmanager
def recording(record_api: bool = True, record_tasks: bool = True, runtime=None):
    """Profile the block in memory only: yields a :class:`Profile` whose ``raw`` is set afterwards (no
    files; the exporters and :mod:`.analysis` take it).  ``runtime``: only that runtime's devices."""
    p = Profile("")
    start(record_api, record_tasks, runtime=runtime)
    try:
        yield p
    finally:
        p.raw = stop()


def from_environment() -> Collector | None:
    """Start profiling when ``VNPU_PROF`` names a folder (a runtime client under ``vnpu prof``); the
    records are written there when the process exits.  Called when a runtime is made; once per process."""
    global _env_started
    target = os.environ.get(ENV)
    if not target or _env_started:
        return hooks.ACTIVE
    with _lock:
        if _env_started:
            return hooks.ACTIVE
        _env_started = True
    try:
        c = start()
    except RuntimeError:
        return hooks.ACTIVE
    atexit.register(_finish_env, target)
    return c


_env_started = False


def _finish_env(target: str) -> None:
    try:
        raw = stop()
    except RuntimeError:
        return
    try:
        write_raw(target, raw)
    except OSError as e:
        print(f"vnpu prof: cannot write the profile of pid {os.getpid()} to {target}: {e}", file=sys.stderr)
