"""Nothing is left in /dev/shm: an in-process runtime.acl program leaves no arena segment after
``reset_device`` + ``finalize`` (nor after a plain exit), and a SIGKILLed process's segments are removed by
the next start -- only those of dead owners of this user, never a live process's or another user's.

Segment names carry the owner's pid and start time (:mod:`devices.segments`), so a reused pid is not
mistaken for the owner.  The programs run in subprocesses: their pids name their segments.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from devices import segments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, VNPU_DEVICES="4", VNPU_HBM_BYTES=str(32 << 20), OPENBLAS_NUM_THREADS="1")
ENV.pop("VNPU_BACKEND", None)

_ACL_PROGRAM = textwrap.dedent("""
    import os, sys
    import numpy as np
    from runtime import acl

    def mine():
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"vnpu_{os.getpid()}_"))

    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    x = np.arange(256, dtype=np.float32)
    d, ret = acl.rt.malloc(x.nbytes); assert ret == 0
    assert acl.rt.memcpy(d, x.nbytes, acl.util.numpy_to_ptr(x), x.nbytes, acl.ACL_MEMCPY_HOST_TO_DEVICE) == 0
    print("WHILE RUNNING", len(mine()), flush=True)
    if sys.argv[1] == "finalize":
        assert acl.rt.free(d) == 0 and acl.rt.reset_device(0) == 0 and acl.finalize() == 0
        print("AFTER FINALIZE", " ".join(mine()) or "-", flush=True)
    elif sys.argv[1] == "wait":
        print("READY", flush=True)
        sys.stdin.readline()                    # killed here
""")


def _mine(pid: int) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"vnpu_{pid}_"))


def _run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _ACL_PROGRAM, mode], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=ENV)


def test_acl_program_leaves_no_segment_after_finalize():
    p = subprocess.Popen([sys.executable, "-c", _ACL_PROGRAM, "finalize"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    assert "WHILE RUNNING 4" in out.splitlines()                 # the 4 in-process devices' arenas
    assert "AFTER FINALIZE -" in out.splitlines(), out            # gone with finalize, not only at exit
    assert _mine(p.pid) == []


def test_acl_program_without_finalize_leaves_no_segment_at_exit():
    p = subprocess.Popen([sys.executable, "-c", _ACL_PROGRAM, "exit"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    assert "WHILE RUNNING 4" in out
    assert _mine(p.pid) == []


def test_segments_of_a_sigkilled_process_are_removed_by_the_next_start():
    p = subprocess.Popen([sys.executable, "-c", _ACL_PROGRAM, "wait"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    try:
        assert p.stdout.readline().strip() == "WHILE RUNNING 4"
        assert p.stdout.readline().strip() == "READY"
        left = _mine(p.pid)
        assert len(left) == 4
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # SIGKILL: nothing could run in it.  (Another process of this user -- a parallel test session on a
    # shared machine -- may start a device and sweep them first: what is left is a subset.)
    assert set(_mine(p.pid)) <= set(left)
    # the next start of any device (here: a plain acl run in another process) removes them
    q = _run("exit")
    assert q.returncode == 0, q.stderr[-3000:]
    assert _mine(p.pid) == []


def _fake(name: str, uid: int | None = None) -> str:
    path = os.path.join(segments.SHM_DIR, name)
    with open(path, "wb") as f:
        f.write(b"\0" * 16)
    if uid is not None:
        os.chown(path, uid, -1)
    return path


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_sweep_removes_only_dead_owners_segments_of_this_user():
    dead = _dead_pid()
    me_start = segments.process_start(os.getpid())
    made = {
        "dead owner": _fake(f"vnpu_{dead}_{segments.process_start(os.getpid())}_0_aaaa0001"),
        "dead owner (old name form)": _fake(f"vnpu_{dead}_0_aaaa0002"),
        "reused pid (start time differs)": _fake(f"vnpu_{os.getpid()}_{me_start + 12345}_0_aaaa0003"),
        "live owner": _fake(f"vnpu_{os.getpid()}_{me_start}_0_aaaa0004"),
    }
    other_uid = os.getuid() + 4242
    can_chown = os.getuid() == 0
    if can_chown:
        made["another user's dead owner"] = _fake(f"vnpu_{dead}_{me_start}_0_aaaa0005", uid=other_uid)
    try:
        removed = set(segments.sweep())
        gone = {k for k, path in made.items() if not os.path.exists(path)}
        assert gone == {"dead owner", "dead owner (old name form)", "reused pid (start time differs)"}, gone
        assert {os.path.basename(made[k]) for k in gone} <= removed
    finally:
        for path in made.values():
            if os.path.exists(path):
                os.unlink(path)


def test_segment_names_carry_owner_pid_and_start_time():
    name = segments.new_name(3)
    pid, start = segments.owner(name)
    assert pid == os.getpid() and start == segments.process_start(os.getpid())
    assert segments.owner_alive(pid, start)
    assert not segments.owner_alive(pid, start + 1)
    assert segments.owner("vnpu_12_0_abcd") == (12, None)
    assert segments.owner("something-else") is None


def test_runtime_installed_by_the_caller_is_not_closed_by_finalize():
    """acl.finalize closes only a runtime acl itself created (a caller's runtime stays usable)."""
    from conftest import installed, make_local_runtime
    from runtime import acl
    with installed(make_local_runtime(count=1, arena=1 << 20)) as r:
        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0
        ptr = r.device(0).malloc(64)                           # still open
        r.device(0).free(ptr)
        assert r.device(0).handle.arena.name in _mine(os.getpid())   # its arena is still there


def test_a_forked_child_names_its_segments_as_itself():
    """A forked child (multiprocessing's default start method, mutmut's test runner) names its arena
    segments with its own pid AND start time: with its parent's start time they would look like a dead
    process's, and its own next arena's sweep would unlink the first one under it."""
    from devices.arena import HbmArena
    segments.new_name(0)                               # the parent has looked its own start time up
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # the child: report through the pipe, never return
        ok = b"0"
        try:
            a = HbmArena(9101, 1 << 16, shared=True)
            b = HbmArena(9102, 1 << 16, shared=True)   # its creation sweeps dead processes' segments
            me = (os.getpid(), segments.process_start(os.getpid()))
            ok = b"1" if os.path.exists(a.path) and segments.owner(a.name) == me else b"2"
            a.close()
            b.close()
        finally:
            os.write(w, ok)
            os._exit(0)
    os.close(w)
    try:
        got = os.read(r, 1)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert got == b"1", "the child's first arena was swept by its second" if got == b"2" else got
