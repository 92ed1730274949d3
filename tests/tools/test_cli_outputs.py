"""Every ``vnpu`` command that writes a file checks, before any work, that it can: an output it cannot
write -- on ``/proc`` (permission bits say yes to root there, creating a file does not), under a missing
directory, or where a directory is -- ends the command with exit status 2 and ONE line on stderr naming
the flag, never a traceback, and nothing has been done.  "Nothing done" is observed, per command: the
server a reporting command reads got no request, the command a wrapper (``sanitize``, ``prof``) runs did
not run, ``atc`` never read its model, and nothing that starts a cluster or a campaign was reached
(tripwires, tests/cli_checks.py); no command printed anything on stdout.

``vnpu chaos`` exits 1 when its report says the campaign failed: the verdict over each of its parts, and
one real campaign whose device process leaves a segment behind (``"clean": false``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cli_checks import cli
from cli_checks import tripwires  # noqa: F401 - a fixture
from devices import procstat, segments

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATC_START = "ATC start working now, please wait for a moment."


class _Witness(BaseHTTPRequestHandler):
    """A server that counts the requests it gets (and refuses them all: 401)."""
    hits = 0

    def _answer(self):
        type(self).hits += 1
        body = json.dumps({"error": {"message": "no", "type": "invalid_request_error"}}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *a):
        pass


@pytest.fixture
def server():
    """The URL of a witness server; the test reads ``_Witness.hits``."""
    _Witness.hits = 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Witness)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(timeout=10)


def _touch(marker) -> list[str]:
    """A command that leaves ``marker`` behind when it runs."""
    return [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]


#: (id, argv ({out} the output, {url} the witness server, {touch} a command that leaves {marker}, {junk}
#: a file that is no model), the flag, what the command writes as the file ("" = {out} itself; atc
#: appends .om), how "no work" is seen)
COMMANDS = [
    ("chaos --report", ["chaos", "--duration", "1s", "--report", "{out}.json"], "--report", "", "tripwire"),
    ("diagnose --output", ["diagnose", "--url", "{url}", "--api-key", "k", "--output", "{out}.html"], "--output", "",
     "server"),
    ("postmortem --output", ["postmortem", "--url", "{url}", "--api-key", "k", "--output", "{out}.md"], "--output",
     "", "server"),
    ("stress-test --report", ["stress-test", "--url", "{url}", "--api-key", "k", "--duration", "1s", "--rate", "5",
                              "--report", "{out}.json"], "--report", "", "server"),
    ("run embed --output", ["run", "embed", "a sentence", "--output", "{out}.npy"], "--output", "", "tripwire"),
    ("sanitize --json", ["sanitize", "--json", "{out}.json", "--", "{touch}"], "--json", "", "marker"),
    ("sanitize --log-file", ["sanitize", "--log-file", "{out}.log", "--", "{touch}"], "--log-file", "", "marker"),
    ("atc --output", ["atc", "--model", "{junk}", "--framework", "5", "--output", "{out}"], "--output", ".om", "atc"),
    ("atc --mode 1 --json", ["atc", "--mode", "1", "--om", "{junk}", "--json", "{out}.json"], "--json", "", "atc"),
]

#: where an output cannot go: base path -> (the {out} to pass, a directory to make at what is written)
BAD_PLACES = ["on /proc", "under a missing directory", "a directory in the way"]


def _argv(argv: list[str], **kw) -> list[str]:
    out = []
    for a in argv:
        if a == "{touch}":
            out += _touch(kw["marker"])
        else:
            out.append(a.format(**kw))
    return out


def _suffix(argv: list[str]) -> str:
    """The suffix the command line gives ``{out}`` (``{out}.json`` -> ``.json``)."""
    return next(a[len("{out}"):] for a in argv if a.startswith("{out}"))


def _assert_one_line(rc, out, err, says: str, atc: bool = False):
    """Exit 2, one line on stderr that ``says`` (a flag), nothing on stdout; ``atc``: as ATC -- its two
    console lines, one E10001 line naming the flag, exit 255."""
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    if atc:
        assert rc == 255, (rc, out, err)
        assert out.splitlines()[0] == ATC_START and len(out.splitlines()) == 2, out
        assert err.startswith("E10001: ") and f"parameter {says} " in err, err
    else:
        assert rc == 2, (rc, out, err)
        assert err.startswith("vnpu ") and says in err, err
        assert out == "", out


@pytest.mark.parametrize("place", BAD_PLACES)
@pytest.mark.parametrize("name,argv,flag,written,witness", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_unwritable_output_exits_2_before_any_work(name, argv, flag, written, witness, place, tmp_path, server,
                                                   tripwires, capsys):  # noqa: F811 - the fixture
    base = {"on /proc": "/proc/vnpu-out", "under a missing directory": str(tmp_path / "no-such-dir" / "out"),
            "a directory in the way": str(tmp_path / "out")}[place]
    if place == "a directory in the way":
        os.mkdir(base + (written or _suffix(argv)))
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a model\0" * 8)
    marker = tmp_path / "ran"
    rc, out, err = cli(_argv(argv, out=base, url=server, junk=junk, marker=marker), capsys)
    _assert_one_line(rc, out, err, flag if witness == "atc" else f"argument {flag}: ", atc=witness == "atc")
    assert base + (written or _suffix(argv)) in err, err
    # nothing was done
    assert _Witness.hits == 0, "the command read from the server before it checked its output"
    assert not marker.exists(), "the wrapped command ran before the output was checked"
    if witness == "atc":
        assert "--model" not in err and "--om" not in err, err


@pytest.mark.parametrize("place", ["on /proc", "a file in the way", "under a file"])
def test_prof_unwritable_output_folder_exits_2_before_the_command_runs(place, tmp_path, capsys):
    """``prof --output DIR`` makes DIR when missing; it cannot where a file is, under one, or on /proc."""
    f = tmp_path / "file"
    f.write_text("x")
    path = {"on /proc": "/proc/vnpu-prof", "a file in the way": str(f), "under a file": str(f / "sub")}[place]
    marker = tmp_path / "ran"
    rc, out, err = cli(["prof", "--output", path, "--", *_touch(marker)], capsys)
    _assert_one_line(rc, out, err, "argument --output: ")
    assert path in err and not marker.exists()
    assert f.read_text() == "x"


def test_prof_makes_a_missing_output_folder(tmp_path, capsys):
    """The folder check does not refuse what works: a missing folder is made, the command runs."""
    marker = tmp_path / "ran"
    rc, out, err = cli(["prof", "--output", tmp_path / "new" / "dir", "--", *_touch(marker)], capsys)
    assert rc == 0 and marker.exists(), (rc, out, err)
    assert (tmp_path / "new" / "dir").is_dir()


#: commands that write in $VNPU_HOME: (id, argv ({pkg} a kernel package whose code leaves {marker} behind when
#: it is imported), what the one line names, how "no work" is seen)
STATE_DIR_COMMANDS = [
    ("up", ["up"], "vnpu up: error: VNPU_HOME", "tripwire"),
    ("kernels install", ["kernels", "install", "{pkg}"], "vnpu kernels install: error: VNPU_HOME/kernels", "marker"),
    ("kernels remove", ["kernels", "remove", "mypkg"], "vnpu kernels remove: error: VNPU_HOME/kernels", "none"),
]


def _marking_package(path, marker) -> str:
    """A kernel package file whose module code leaves ``marker`` behind (the command ran it)."""
    path.write_text(f"open({str(marker)!r}, 'w').close()\nKERNELS = {{'mark_k': lambda ctx: None}}\n")
    return str(path)


@pytest.mark.parametrize("place", ["on /proc", "a file in the way", "under a file"])
@pytest.mark.parametrize("name,argv,says,witness", STATE_DIR_COMMANDS, ids=[c[0] for c in STATE_DIR_COMMANDS])
def test_an_unwritable_state_dir_exits_2_before_any_work(name, argv, says, witness, place, tmp_path, monkeypatch,
                                                         tripwires, capsys):  # noqa: F811 - the fixture
    """``vnpu up`` writes the cluster's state and token in $VNPU_HOME, ``vnpu kernels install | remove``
    the node's kernel packages in $VNPU_HOME/kernels: checked before a cluster starts or a package's code
    runs."""
    f = tmp_path / "file"
    f.write_text("x")
    home = {"on /proc": "/proc/vnpu-home", "a file in the way": str(f), "under a file": str(f / "sub")}[place]
    monkeypatch.setenv("VNPU_HOME", home)
    for var in ("VNPU_TOKEN", "VNPU_TENANT_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    marker = tmp_path / "ran"
    pkg = _marking_package(tmp_path / "mypkg.py", marker)
    rc, out, err = cli([a.format(pkg=pkg) for a in argv], capsys)
    _assert_one_line(rc, out, err, says)
    assert home in err
    assert not marker.exists(), "the package's code ran before the kernel directory was checked"
    assert f.read_text() == "x"


@pytest.mark.parametrize("cmd", ["install", "remove"])
def test_kernels_in_a_directory_it_cannot_change_exits_2_and_changes_nothing(cmd, tmp_path, monkeypatch, capsys):
    """An existing kernel directory this process cannot write (immutable for root, read-only otherwise):
    ``install`` does not run the package's code and copies nothing, ``remove`` leaves the package."""
    import shutil
    home = tmp_path / "home"
    kdir = home / "kernels"
    kdir.mkdir(parents=True, mode=0o700)
    installed = kdir / "mypkg.py"
    installed.write_text("KERNELS = {'old_k': lambda ctx: None}\n")
    monkeypatch.setenv("VNPU_HOME", str(home))
    for var in ("VNPU_TOKEN", "VNPU_TENANT_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    marker = tmp_path / "ran"
    src = _marking_package(tmp_path / "newpkg.py", marker)
    if os.geteuid() == 0:           # root writes whatever the mode says: the immutable attribute stops it
        if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(kdir)], capture_output=True).returncode:
            pytest.skip("no chattr +i here (root ignores permission bits)")
        undo = ["chattr", "-i", str(kdir)]
    else:
        kdir.chmod(0o500)
        undo = ["chmod", "700", str(kdir)]
    try:
        rc, out, err = cli(["kernels", cmd, src if cmd == "install" else "mypkg"], capsys)
        listing = sorted(os.listdir(kdir))
    finally:
        subprocess.run(undo, check=True)
    _assert_one_line(rc, out, err, f"vnpu kernels {cmd}: error: VNPU_HOME/kernels")
    assert str(kdir) in err
    assert listing == ["mypkg.py"] and installed.read_text().startswith("KERNELS = {'old_k'")
    assert not marker.exists(), "the package's code ran before the kernel directory was checked"


def test_a_writable_output_is_left_as_it_was(tmp_path):
    """Checking writes nothing: an existing output keeps its bytes until the command writes it, and a new
    one does not exist after the check (a refused command leaves neither)."""
    from runtime.cliargs import output_problem
    old = tmp_path / "old.json"
    old.write_text("keep")
    assert output_problem(str(old)) is None and old.read_text() == "keep"
    new = tmp_path / "new.json"
    assert output_problem(str(new)) is None and not new.exists()
    assert os.listdir(tmp_path) == ["old.json"]


# ------------------------------------------------------------------------------------------- chaos verdict
def _passing_report() -> dict:
    return {"check": {"ok": True, "by_kind": {}}, "correct": True, "wrong_result_ids": [],
            "hbm_back_to_baseline": True, "hbm_not_back": {}, "clean": True,
            "leaks": {"actors": [], "processes": [], "segments": [], "segments_of_dead_processes": []}}


@pytest.mark.parametrize("broken,word", [
    ({"check": {"ok": False, "by_kind": {"lost": 1}}}, "history check"),
    ({"correct": False, "wrong_result_ids": [3]}, "results differ"),
    ({"hbm_back_to_baseline": False, "hbm_not_back": {1: {"start": 0, "end": 4096}}}, "HBM"),
    ({"clean": False, "leaks": {"actors": [], "processes": [4242], "segments": [], "segments_of_dead_processes": []}},
     "left behind"),
])
def test_chaos_verdict_fails_on_each_part_of_the_report(broken, word):
    from runtime.cluster.chaos import failures
    assert failures(_passing_report()) == []
    got = failures(dict(_passing_report(), **broken))
    assert len(got) == 1 and word in got[0], got


@pytest.mark.cluster
def test_chaos_exits_1_when_a_device_leaves_a_segment_behind(tmp_path):
    """A real campaign (one device, no faults) during which its device process holds one more /dev/shm
    segment than its arena, which its graceful teardown does not remove: the report is not clean, the
    command says so on stderr and exits 1, and the campaign's forced cleanup still removes the segment."""
    rep = tmp_path / "chaos.json"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    env.pop("VNPU_TOKEN", None)
    cmd = [sys.executable, "-m", "runtime.cli", "chaos", "--workload", "mlp", "--devices", "1", "--spares", "0",
           "--duration", "2s", "--baseline", "2s", "--every", "30s", "--faults", "slow", "--report", str(rep)]
    errf = tmp_path / "stderr"
    with open(errf, "w") as e:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=e, text=True, env=env, cwd=ROOT)
    planted = None
    try:
        first = p.stdout.readline()          # printed once the devices serve, before the fault-free run
        assert first.startswith("chaos: "), first
        mine = procstat.descendants({p.pid}) - {p.pid}        # the device actor's process (not the driver's)
        arenas = [n for n in segments.list_segments() if (segments.owner(n) or (0, None))[0] in mine]
        assert len(arenas) == 1, arenas
        pid, start = segments.owner(arenas[0])
        planted = os.path.join(segments.SHM_DIR, f"{segments.PREFIX}{pid}_{start}_9_0dd5e9ed")
        with open(planted, "wb") as f:
            f.write(b"\0")
        out, _ = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = errf.read_text()
    try:
        assert p.returncode == 1, first + out + err
        r = json.loads(rep.read_text())
        assert r["clean"] is False and os.path.basename(planted) in r["leaks"]["segments"], r["leaks"]
        assert r["check"]["ok"] and r["correct"] and r["hbm_back_to_baseline"]       # only the leak failed
        lines = err.strip().splitlines()
        assert lines[-1].startswith("vnpu chaos: FAILED: left behind") and "Traceback" not in err, err
        assert not os.path.exists(planted), "the forced cleanup did not remove the device's segment"
    finally:
        if planted and os.path.exists(planted):
            os.unlink(planted)
