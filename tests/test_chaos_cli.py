"""``vnpu chaos`` end to end, from a subprocess: a short seeded campaign whose report adds up, loses and
duplicates nothing, matches the fault-free results, and leaves no actors, processes, shared-memory
segments or HBM behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_chaos_cli_report(tmp_path):
    rep = tmp_path / "chaos.json"
    cmd = [sys.executable, "-m", "runtime.cli", "chaos", "--workload", "mlp", "--devices", "2", "--spares", "1",
           "--duration", "6s", "--baseline", "2s", "--every", "1500ms", "--faults", "kill,hang,ecc,task-fail",
           "--seed", "7", "--report", str(rep)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    env.pop("VNPU_TOKEN", None)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(p.stdout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "detected after" in p.stdout and "throughput:" in p.stdout
    r = json.loads(rep.read_text())
    for k in ("submitted", "completed", "failed", "lost", "duplicated"):
        assert isinstance(r[k], int)
    assert r["submitted"] == r["completed"] + r["failed"] + r["lost"]
    assert r["lost"] == 0 and r["duplicated"] == 0
    assert r["submitted"] > 0 and r["correct"]
    assert r["faults"], "no fault was injected"
    assert {"detection_latency_s", "recovery_latency_s", "availability_pct", "throughput"} <= set(r)
    # back to baseline, checked here as well as by the campaign itself
    assert r["hbm_back_to_baseline"] and r["clean"], r["leaks"]
    assert not [pid for pid in r["device_pids_seen"] if _alive(pid)]
    assert not [a for a in r["arenas_seen"] if os.path.exists(os.path.join("/dev/shm", a))]
