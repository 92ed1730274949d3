"""``devices.procstat``, the one ``/proc/<pid>/stat`` parser: checked against independent sources (``os``,
``resource``, a child's own view of itself), with a command name made to break naive parsing, a zombie,
and a pid that cannot exist."""
from __future__ import annotations

import os
import resource
import select
import subprocess
import sys
import textwrap

import pytest

from devices import procstat

#: a command name with spaces and parentheses: "pid (a) b (c) state ..." must still parse
WEIRD = "a) b (c"

CHILD = textwrap.dedent(f"""
    import os, subprocess, sys
    with open("/proc/self/comm", "w") as f:
        f.write({WEIRD!r})
    g = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    print(os.getpid(), os.getppid(), g.pid, flush=True)
    sys.stdin.readline()
    g.stdin.close()
    g.wait()
""")


@pytest.fixture
def family():
    """(child pid, grandchild pid) of a child whose comm is :data:`WEIRD`; both end with the test."""
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid, ppid, grand = map(int, p.stdout.readline().split())
        assert pid == p.pid and ppid == os.getpid()
        yield pid, grand
    finally:
        p.stdin.close()
        p.wait(timeout=30)


def _no_such_pid() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1


def test_fields_parse_past_a_command_name_with_parentheses(family):
    child, grand = family
    with open(f"/proc/{child}/comm") as f:
        assert f.read().strip() == WEIRD                          # the name really is the hard one
    assert procstat.state(child) in ("S", "R")
    assert procstat.alive(child) and procstat.alive(grand)
    assert procstat.parent(child) == os.getpid()                  # (what the child's os.getppid() said)
    assert procstat.parent(grand) == child
    assert child in procstat.children(os.getpid()) and procstat.children(child) == {grand}
    assert procstat.descendants({child}) == {child, grand}
    assert os.getpid() not in procstat.descendants({os.getppid(), os.getpid()})  # never this process
    assert procstat.start_time(child) is not None and procstat.start_time(child) >= procstat.start_time(os.getpid())


def test_cpu_seconds_match_the_kernels_own_account():
    me = os.getpid()
    sum(i * i for i in range(300_000))                            # spend some CPU
    before = resource.getrusage(resource.RUSAGE_SELF)
    got = procstat.cpu_seconds(me)
    after = resource.getrusage(resource.RUSAGE_SELF)
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    lo = before.ru_utime + before.ru_stime - 2 * tick             # /proc counts whole clock ticks
    hi = after.ru_utime + after.ru_stime + 2 * tick
    assert got is not None and lo <= got <= hi, (lo, got, hi)


def test_a_zombie_is_not_alive_and_a_missing_pid_is_nothing():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    fd = os.pidfd_open(p.pid)
    try:
        assert select.select([fd], [], [], 60)[0], "the child did not exit"   # exited, not reaped yet
        assert procstat.state(p.pid) == "Z" and not procstat.alive(p.pid)
        assert procstat.parent(p.pid) == os.getpid()             # a zombie still has its entry
    finally:
        os.close(fd)
        p.wait()
    gone = _no_such_pid()
    assert procstat.fields(gone) == [] and procstat.state(gone) is None and not procstat.alive(gone)
    assert procstat.parent(gone) is None and procstat.start_time(gone) is None
    assert procstat.cpu_seconds(gone) is None and procstat.children(gone) == set()
