"""Nothing is left in /dev/shm: an in-process runtime.acl program leaves no arena segment after
``reset_device`` + ``finalize`` (nor after a plain exit, nor when SIGTERM, SIGINT or SIGHUP ends it -- dying by
the signal as it would have, or running its own handler), and a SIGKILLed process's segments are removed by
the next vnpu process (a device start or a runtime) -- only those of dead owners of this user, never a live
process's or another user's.

Segment names carry the owner's pid and start time (:mod:`devices.segments`), so a reused pid is not
mistaken for the owner.  The programs run in subprocesses: their pids name their segments.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from devices import segments

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def _sigkilled_acl_program() -> tuple[int, list[str]]:
    """Run the acl program until its 4 devices' arenas exist, SIGKILL it: (its pid, the segments it had)."""
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
    return p.pid, left


def test_segments_of_a_sigkilled_process_are_removed_by_the_next_start():
    pid, left = _sigkilled_acl_program()
    # SIGKILL: nothing could run in it.  (Another process of this user -- a parallel test session on a
    # shared machine -- may start a device and sweep them first: what is left is a subset.)
    assert set(_mine(pid)) <= set(left)
    # the next start of any device (here: a plain acl run in another process) removes them
    q = _run("exit")
    assert q.returncode == 0, q.stderr[-3000:]
    assert _mine(pid) == []


_SIGNAL_PROGRAM = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from runtime import acl

    mode, sig = sys.argv[1], getattr(signal, sys.argv[2])

    def mine():
        return len([n for n in os.listdir("/dev/shm") if n.startswith(f"vnpu_{os.getpid()}_")])

    def own(signum, frame):
        print("OWN HANDLER", signal.Signals(signum).name, flush=True)
        if mode != "own-returns":
            sys.exit(3)

    if mode == "dfl":
        signal.signal(sig, signal.SIG_DFL)       # Python's own SIGINT handler raises KeyboardInterrupt
    if mode in ("own-before", "own-returns"):
        signal.signal(sig, own)
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    x = np.arange(256, dtype=np.float32)
    d, ret = acl.rt.malloc(x.nbytes); assert ret == 0
    assert acl.rt.memcpy(d, x.nbytes, acl.util.numpy_to_ptr(x), x.nbytes, acl.ACL_MEMCPY_HOST_TO_DEVICE) == 0
    if mode == "own-after":
        signal.signal(sig, own)                  # replaces whatever vnpu installed
    print("READY", mine(), flush=True)
    sys.stdin.readline()                         # the signal comes here
    y = np.zeros_like(x)                         # only after a handler that returned: the device still works
    assert acl.rt.memcpy(acl.util.numpy_to_ptr(y), y.nbytes, d, y.nbytes, acl.ACL_MEMCPY_DEVICE_TO_HOST) == 0
    print("STILL RUNNING", mine(), bool((y == x).all()), flush=True)
""")


def _signalled(mode: str, sig: signal.Signals) -> tuple[subprocess.Popen, str]:
    """Run the signal program in ``mode``, send ``sig`` once it is ready; (the process, its stdout)."""
    # the program starts with the signal's default action whatever the test runner inherited (``nohup`` makes
    # SIGHUP ignored, and an ignored disposition is inherited through exec: vnpu rightly leaves it alone)
    p = subprocess.Popen([sys.executable, "-c", _SIGNAL_PROGRAM, mode, sig.name], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV,
                         preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    try:
        ready = p.stdout.readline().strip()
        assert ready == "READY 4", (ready, p.stderr.read()[-3000:] if p.poll() is not None else "")
        assert len(_mine(p.pid)) == 4
        os.kill(p.pid, sig)
        if mode == "own-returns":
            assert p.stdout.readline().strip() == f"OWN HANDLER {sig.name}"
            p.stdin.write("go on\n")
            p.stdin.flush()
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p, out + err


@pytest.mark.parametrize("sig, mode", [(signal.SIGTERM, "default"), (signal.SIGHUP, "default"),
                                       (signal.SIGINT, "dfl")], ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_program_ended_by_a_signal_leaves_no_segment_and_dies_by_it(sig, mode):
    """SIGTERM (a supervisor, a CI timeout, ``kill``), SIGHUP or SIGINT with its default action in place ends
    an in-process acl program without the interpreter's exit: its arena segments are unlinked first, and it
    still dies by the signal (the exit status its parent expects)."""
    p, out = _signalled(mode, sig)
    assert p.returncode == -sig, out[-3000:]
    assert _mine(p.pid) == [], "the arenas of a program ended by a signal stay in /dev/shm"


@pytest.mark.parametrize("mode", ["own-before", "own-after"])
def test_a_programs_own_signal_handler_still_runs(mode):
    """A SIGTERM handler the program installed before its devices started (vnpu leaves it alone) or after
    (it replaces vnpu's) is the one that runs; it exits, and nothing is left."""
    p, out = _signalled(mode, signal.SIGTERM)
    assert "OWN HANDLER SIGTERM" in out and p.returncode == 3, out[-3000:]
    assert _mine(p.pid) == []


def test_a_handler_that_returns_keeps_the_devices():
    """A SIGTERM handler that returns (the program goes on, e.g. to drain): nothing is unlinked under the
    program -- its devices and their segments stay, the next copy works -- and a normal exit then cleans up."""
    p, out = _signalled("own-returns", signal.SIGTERM)
    assert p.returncode == 0, out[-3000:]
    assert "STILL RUNNING 4 True" in out
    assert _mine(p.pid) == []


def test_signal_cleanup_is_installed_from_the_main_thread_over_defaults_only():
    """An arena started in another thread installs nothing (only the main thread may set handlers); the first
    one the main thread starts installs the cleanup where the default action is in place (SIGTERM; SIGINT
    set back to it by the program) and nowhere else: an ignored SIGHUP stays ignored, and a later arena
    changes nothing.  (Python's own SIGINT handler stays too: see the SIGINT case above.)"""
    q = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import signal, threading
        from devices.arena import HbmArena
        from devices.segments import cleanup_then_die
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        def kinds():
            names = {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored", cleanup_then_die: "cleanup"}
            return " ".join(names.get(signal.getsignal(s), "?") for s in (signal.SIGTERM, signal.SIGINT,
                                                                           signal.SIGHUP))
        t = threading.Thread(target=lambda: HbmArena(9201, 1 << 16).close())
        t.start(); t.join()
        print("THREAD", kinds())
        a = HbmArena(9202, 1 << 16)
        print("MAIN", kinds())
        signal.signal(signal.SIGTERM, signal.SIG_DFL)      # the program's choice: a later arena keeps it
        b = HbmArena(9203, 1 << 16)
        print("LATER", kinds())
        a.close(); b.close()
    """)], capture_output=True, text=True, timeout=60, cwd=ROOT, env=ENV)
    assert q.returncode == 0, q.stderr[-3000:]
    assert q.stdout.splitlines() == ["THREAD default default ignored", "MAIN cleanup cleanup ignored",
                                     "LATER default cleanup ignored"]


def test_a_runtime_without_arenas_sweeps_what_a_sigkilled_process_left():
    """Any later vnpu process removes a SIGKILLed owner's segments (SIGKILL runs nothing in its victim),
    also one that starts no arena of its own: a runtime over devices with anonymous HBM sweeps at start."""
    pid, left = _sigkilled_acl_program()
    assert set(_mine(pid)) <= set(left)            # (a parallel session's device start may sweep them first)
    q = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os
        from devices.device import DeviceConfig
        from runtime.api import Runtime
        from runtime.backend import LocalBackend
        r = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 20, shm=False)))
        print("NAMED", len([n for n in os.listdir("/dev/shm") if n.startswith(f"vnpu_{os.getpid()}_")]))
        r.close()
    """)], capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)
    assert q.returncode == 0 and "NAMED 0" in q.stdout, q.stderr[-3000:]     # it made no segment of its own
    assert _mine(pid) == []


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
