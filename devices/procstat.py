"""``/proc/<pid>/stat``: the one parser of a process's state, parent, start time and CPU time.

The file is ``pid (comm) state ppid ...`` (proc(5)); ``comm`` may hold spaces and parentheses, so the
fields are taken after the LAST ``)``.  :func:`fields` returns them from field 3 (the state) onwards, and
the helpers below name the ones vnpu reads: the state (``Z`` = a zombie and ``X`` = dead, which count as gone), the parent
pid (field 4), the CPU time (fields 14 + 15, clock ticks), the niceness (field 19, per thread: ``task/<tid>/stat``)
and the start time (field 22, clock ticks after boot: with the pid, it names one process even after the pid
is reused).

Every call is one read of a small file in ``/proc`` (it never blocks on another process).  A process that
does not exist (or vanished while read) gives an empty / None / False answer, never an exception.
Plain Python, no Ray or driver code: used by the arena's segment names, the cluster's process lists,
the server file's liveness rule and the benchmarks' CPU accounting.
"""
from __future__ import annotations

import os

#: indices into :func:`fields` (field number in proc(5) minus 3)
_STATE, _PPID, _UTIME, _STIME, _NICE, _STARTTIME = 0, 1, 11, 12, 16, 19


def fields(pid: int, tid: int | None = None) -> list[bytes]:
    """``/proc/<pid>/stat`` (``tid``: that thread's ``/proc/<pid>/task/<tid>/stat``) from field 3 (the state)
    onwards -- after "pid (comm) ", whatever the command name holds; empty when there is no such process."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, "rb") as f:
            stat = f.read()
    except OSError:
        return []
    return stat[stat.rfind(b")") + 2:].split()


def _int(pid: int, i: int) -> int | None:
    fs = fields(pid)
    try:
        return int(fs[i])
    except (IndexError, ValueError):
        return None


def state(pid: int) -> str | None:
    """The state letter (``R``, ``S``, ``D``, ``Z``, ...), None when there is no such process."""
    fs = fields(pid)
    return fs[_STATE].decode() if fs else None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and has not exited -- neither a zombie (``Z``: its parent has not
    reaped it) nor dead (``X``: being reaped; under load a Ray worker was seen in it for over 15 s)."""
    st = state(pid)
    return st is not None and st not in ("Z", "X")


def parent(pid: int) -> int | None:
    """The parent pid, None when there is no such process."""
    return _int(pid, _PPID)


def start_time(pid: int) -> int | None:
    """The start time (clock ticks after boot), None when there is no such process."""
    return _int(pid, _STARTTIME)


def niceness(pid: int) -> int | None:
    """The niceness of the process's main thread, None when there is no such process."""
    return _int(pid, _NICE)


def thread_niceness(pid: int) -> dict[int, int]:
    """tid -> niceness of every thread of the process (niceness is per thread on Linux: a thread started
    before a priority change keeps its own); empty when there is no such process."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return {}
    out = {}
    for t in tids:
        fs = fields(pid, t)
        if len(fs) > _NICE:
            out[t] = int(fs[_NICE])
    return out


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) the process has used so far, None when there is no such process."""
    fs = fields(pid)
    try:
        return (int(fs[_UTIME]) + int(fs[_STIME])) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError):
        return None


def parents() -> dict[int, int]:
    """pid -> parent pid of every process of the machine (those that vanish while listed are left out)."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            pp = parent(int(d))
            if pp is not None:
                out[int(d)] = pp
    return out


def children(pid: int) -> set[int]:
    """Direct children of process ``pid``."""
    return {p for p, pp in parents().items() if pp == pid}


def descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process below them (this process never included)."""
    below: dict[int, list[int]] = {}
    for p, pp in parents().items():
        below.setdefault(pp, []).append(p)
    out: set[int] = set()
    todo, me = list(roots), os.getpid()
    while todo:
        p = todo.pop()
        if p in out or p == me:
            continue
        out.add(p)
        todo += below.get(p, [])
    return out


__all__ = ["fields", "state", "alive", "parent", "start_time", "niceness", "thread_niceness", "cpu_seconds", "parents", "children",
           "descendants"]
