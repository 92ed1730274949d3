"""Arena segments in ``/dev/shm``: their names, their owners, and removing what dead owners left.

A device's HBM is a ``/dev/shm`` file (:mod:`devices.arena`) that other processes of the node map by
name (the driver's same-node fast path, HCCL's same-node transport), so it cannot be unlinked as soon as
it is mapped.  Instead every segment is named after the process that created it,
``vnpu_<pid>_<start>_<device>_<random>``, ``<start>`` being the process's start time (clock ticks after
boot, ``/proc/<pid>/stat`` field 22) so that a reused pid is never taken for the owner, and:

- the owner unlinks its segments when it closes its devices, and at interpreter exit for devices
  still open (:func:`track`; the mapping stays until the process ends);
- an owner ended by a signal whose default action is to terminate it (SIGTERM from a supervisor, a CI
  timeout or ``kill``; SIGINT; SIGHUP), with that default in place, unlinks them in a handler and then dies
  by the signal as it would have (same exit status).  The handler is installed when the first segment is
  tracked, from the main thread, once per process, and only where the default action is in place: a
  handler the program installed before stays and runs (exits through it run the interpreter's exit, which
  unlinks), as does Python's SIGINT handler (KeyboardInterrupt); an ignored signal stays ignored; a handler
  the program installs later simply replaces vnpu's;
- a SIGKILLed owner can do none of this: the next vnpu process of this user on the node -- a device
  start, or a runtime (``runtime.api.Runtime``) -- removes the segments whose owner is gone (:func:`sweep`).
  Only this user's files are touched, and only those whose owner is dead (or a zombie) or whose pid now
  belongs to another process.

Plain Python, no Ray or driver code: used by the arena, the local cluster's teardown and chaos reports.
"""
from __future__ import annotations

import atexit
import os
import secrets
import signal
import threading

from . import procstat

SHM_DIR = "/dev/shm"
PREFIX = "vnpu_"

_open: set[str] = set()            # this process's segments not unlinked yet (unlinked at exit)
_open_lock = threading.RLock()     # re-entrant: the signal handler may run while the main thread holds it
_my_start: tuple[int, int] | None = None     #: (pid, start time) of the process that named segments


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks after boot), None when there is no such process."""
    return procstat.start_time(pid)


def new_name(device_id: int) -> str:
    """A fresh segment name owned by this process.  The start time is looked up once per process: a
    forked child has its own (with its parent's, its segments would look like a dead process's and the
    next sweep would unlink them)."""
    global _my_start
    pid = os.getpid()
    if _my_start is None or _my_start[0] != pid:
        _my_start = (pid, process_start(pid) or 0)
    return f"{PREFIX}{pid}_{_my_start[1]}_{device_id}_{secrets.token_hex(4)}"


def owner(name: str) -> tuple[int, int | None] | None:
    """``(pid, start)`` of a segment name (``start`` None for names without it, from older versions);
    None for a name that is not a vnpu segment."""
    if not name.startswith(PREFIX):
        return None
    parts = name[len(PREFIX):].split("_")
    if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit():
        return int(parts[0]), int(parts[1])
    if len(parts) == 3 and parts[0].isdigit():
        return int(parts[0]), None
    return None


def owner_alive(pid: int, start: int | None) -> bool:
    """Whether the process that created a segment still runs (not a zombie, same start time)."""
    if not procstat.alive(pid):
        return False
    return start is None or process_start(pid) == start


def list_segments(uid: int | None = None) -> list[str]:
    """Names of the vnpu segments in ``/dev/shm`` (of user ``uid`` when given)."""
    out = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return out
    for n in names:
        if owner(n) is None:
            continue
        if uid is not None:
            try:
                if os.stat(os.path.join(SHM_DIR, n)).st_uid != uid:
                    continue
            except OSError:
                continue
        out.append(n)
    return sorted(out)


def orphaned(uid: int | None = None) -> list[str]:
    """This user's (``uid``'s) segments whose owner is gone."""
    uid = os.getuid() if uid is None else uid
    return [n for n in list_segments(uid) if not owner_alive(*owner(n))]   # type: ignore[misc]


def unlink(names) -> list[str]:
    """Unlink the given segments (missing ones are skipped); returns those removed here."""
    done = []
    for n in names:
        if owner(n) is None:
            continue                                        # never anything but a vnpu segment
        try:
            os.unlink(os.path.join(SHM_DIR, n))
            done.append(n)
        except FileNotFoundError:
            pass
    return done


def sweep(uid: int | None = None) -> list[str]:
    """Remove this user's segments whose owner is gone (a SIGKILLed process's); returns their names."""
    return unlink(orphaned(uid))


def track(name: str) -> None:
    """Unlink segment ``name`` at interpreter exit, or when a terminating signal ends the process (see the
    module doc), unless :func:`untrack` came first (its owner closed it).  Either way the name is only
    unlinked, not unmapped: threads of the process may still use it."""
    with _open_lock:
        _open.add(name)
    install_signal_cleanup()


def untrack(name: str) -> None:
    with _open_lock:
        _open.discard(name)


def _unlink_at_exit() -> None:
    with _open_lock:
        names = [n for n in _open if (owner(n) or (0, None))[0] == os.getpid()]   # not a fork's parent's
        _open.clear()
    unlink(names)


atexit.register(_unlink_at_exit)

#: signals whose default action ends the process without the interpreter's exit (no atexit)
CLEANUP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, n))
_installed_in: int | None = None        #: the pid that installed the handlers (a fork installs its own)


def cleanup_then_die(signum, frame) -> None:
    """The handler of :data:`CLEANUP_SIGNALS` whose default action was in place: the process is about to die,
    so its tracked segments are unlinked (not unmapped: other threads may still use them), then it dies by
    the signal -- the default restored and the signal raised again: the exit status its parent expects."""
    _unlink_at_exit()
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)
    os._exit(128 + signum)                # only if the signal is blocked in every thread


def install_signal_cleanup() -> bool:
    """Install :func:`cleanup_then_die` for each of :data:`CLEANUP_SIGNALS` whose handler is the default
    action (SIG_DFL), once per process, from the main thread only (elsewhere it is left for a later call
    there).  Any other handler stays as it is: the program's own (exits through it run the interpreter's
    exit, which unlinks), Python's SIGINT handler (KeyboardInterrupt, likewise), an ignored signal.  Returns
    whether this process has done it.  Host-synchronous, never blocks."""
    global _installed_in
    if _installed_in == os.getpid():
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    _installed_in = os.getpid()
    for sig in CLEANUP_SIGNALS:
        try:
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, cleanup_then_die)
        except (ValueError, OSError):
            continue                      # not settable here (an embedded interpreter): nothing changes
    return True


__all__ = ["SHM_DIR", "PREFIX", "CLEANUP_SIGNALS", "cleanup_then_die", "process_start", "new_name", "owner",
           "owner_alive", "list_segments", "orphaned", "unlink", "sweep", "track", "untrack", "install_signal_cleanup"]
