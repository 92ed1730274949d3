"""``vnpu chaos`` end to end, from a subprocess: a short seeded campaign whose report carries the full
request history, passes the independent checker (also run again as ``vnpu chaos check``), loses and
duplicates nothing, matches the fault-free results, and leaves no actors, processes, shared-memory
segments or HBM behind -- while another user's dead segment on the machine is reported, not removed."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from devices import procstat
from runtime.cluster.procs import alive

pytestmark = pytest.mark.cluster


def _foreign_dead_segment():
    """A segment of a dead process of ANOTHER user (root only: it needs chown), or None.  Its owner is
    "this pid with another start time": a process that is gone although its pid runs again."""
    if os.getuid() != 0:
        return None
    start = procstat.start_time(os.getpid())
    assert start is not None
    path = f"/dev/shm/vnpu_{os.getpid()}_{start + 7}_0_f0e1d2c3"
    with open(path, "wb") as f:
        f.write(b"x")
    os.chown(path, os.getuid() + 4242, -1)
    return path


def test_chaos_cli_report(tmp_path):
    rep = tmp_path / "chaos.json"
    foreign = _foreign_dead_segment()
    cmd = [sys.executable, "-m", "runtime.cli", "chaos", "--workload", "mlp", "--devices", "2", "--spares", "1",
           "--duration", "6s", "--baseline", "2s", "--every", "1500ms", "--faults", "kill,hang,ecc,task-fail",
           "--seed", "7", "--report", str(rep)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    env.pop("VNPU_TOKEN", None)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=root)
        print(p.stdout)
        if foreign:
            assert os.path.exists(foreign), "the campaign removed another user's segment"
    finally:
        if foreign and os.path.exists(foreign):
            os.unlink(foreign)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "throughput:" in p.stdout
    r = json.loads(rep.read_text())
    for k in ("submitted", "completed", "failed", "lost", "duplicated"):
        assert isinstance(r[k], int)
    assert r["submitted"] == r["completed"] + r["failed"] + r["lost"]
    assert r["lost"] == 0 and r["duplicated"] == 0
    assert r["submitted"] > 0 and r["correct"]
    assert r["faults"], "no fault was injected"
    # every fault was detected, and its live line says after how long (never "detected after -")
    lines = [ln for ln in p.stdout.splitlines() if " detected after " in ln]
    assert len(lines) == len(r["faults"]), p.stdout
    for f, ln in zip(r["faults"], lines):
        assert f["detected_after_s"] is not None and f["cause"], f
        assert re.search(rf"{re.escape(f['kind'])}\s+device {f['device']}\s+detected after \d+ ms \(", ln), ln
    assert {"detection_latency_s", "recovery_latency_s", "availability_pct", "throughput"} <= set(r)
    # one detection line per fault: Ray's worker-death paragraphs and the driver's lost-device warnings (one
    # per client of a device) are captured, matched to the faults and summarised in one line
    both = p.stdout + p.stderr
    assert "\x1b[" not in both and "A worker died" not in both and "(raylet)" not in both, both[-3000:]
    assert " lost: " not in both, both[-3000:]
    noise = r["noise"]
    assert noise["worker_deaths_unexplained"] == [] and noise["lost_unexplained"] == [], noise
    assert noise["lost_warnings"] >= 1                  # a hang or a kill was detected: the driver warned
    assert sum(1 for ln in p.stdout.splitlines() if ln.startswith("expected noise: ")) == 1, p.stdout
    # the end state reads as a sentence, not a Python dict
    end = next(ln for ln in p.stdout.splitlines() if ln.startswith("end state: "))
    assert end.startswith("end state: HBM back to baseline on all 3 devices (") and end.endswith("; leaks: none")
    assert "{" not in end, end
    # back to baseline, checked here as well as by the campaign itself
    assert r["hbm_back_to_baseline"] and r["clean"], r["leaks"]
    assert not [pid for pid in r["device_pids_seen"] if alive(pid)]
    assert not [a for a in r["arenas_seen"] if os.path.exists(os.path.join("/dev/shm", a))]
    if foreign:
        assert os.path.basename(foreign) in r["other_dead_pid_segments"]
    # the history is in the report, the counts are the checker's, and the checker passes it
    ops = {e["op"] for e in r["history"]}
    assert {"submit", "attempt", "complete", "ack"} <= ops, ops
    assert r["check"]["ok"], r["check"]
    assert r["executions"] == r["completed"] + r["attempt_failures"]
    assert r["deliveries"] == r["completed"] == r["submitted"]
    assert r["checked_against_reference"] == r["completed"] and r["reference"]
    assert r["hang_detection"]["deadline_s"] == 0.5
    chk = subprocess.run([sys.executable, "-m", "runtime.cli", "chaos", "check", str(rep), "--json"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=root)
    assert chk.returncode == 0, chk.stdout + chk.stderr
    assert json.loads(chk.stdout)["counts"] == {k: r[k] for k in json.loads(chk.stdout)["counts"]}
