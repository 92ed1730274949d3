"""``vnpu chaos`` with node faults: a short ``node-kill`` campaign on a real multi-node Ray cluster (tier
``multinode``), and the refusal of node faults on a single-node cluster (exit 2, one line, no cluster)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runtime.cluster.procs import alive

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _chaos(*args, timeout=240, home=None):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", **({"HOME": str(home)} if home else {}))
    env.pop("VNPU_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "runtime.cli", "chaos", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.parametrize("args, says", [
    (["--faults", "node-kill"], "--nodes 2"),
    (["--faults", "kill,node-kill", "--nodes", "1"], "--nodes 2"),
    (["--faults", "kill", "--nodes", "0"], "argument --nodes: must be >= 1"),
    (["--faults", "node-kill", "--nodes", "4", "--devices", "2", "--spares", "1"], "without devices"),
])
def test_node_faults_refused_on_a_single_node_cluster(args, says):
    p = _chaos(*args, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vnpu chaos:") and says in lines[0], p.stderr
    assert "Traceback" not in p.stderr and not p.stdout.strip()


@pytest.mark.multinode
def test_node_kill_campaign(tmp_path):
    """Two worker nodes with two devices each (two logical devices + two spares): a node in service is
    killed, all its devices are detected, the work moves to the other node's spares, the requests that
    failed complete there exactly once with the fault-free results, and a replacement node's devices
    come back as spares; nothing is left behind.  Run as a user runs it on a fresh machine: an empty home
    (no Ray token yet) and no Ray default temp dir (tests/conftest.py)."""
    rep = tmp_path / "chaos.json"
    home = tmp_path / "home"
    home.mkdir()
    p = _chaos("--workload", "mlp", "--devices", "2", "--spares", "2", "--nodes", "2", "--duration", "5s",
               "--baseline", "1s", "--every", "3s", "--faults", "node-kill", "--seed", "3", "--report", str(rep),
               home=home)
    print(p.stdout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    r = json.loads(rep.read_text())
    kills = [f for f in r["faults"] if f["kind"] == "node-kill"]
    assert kills, "no node was killed"
    first = kills[0]
    assert len(first["devices"]) == 2 and first["devices"] == sorted(first["devices"])
    # every device of the node that was in service is detected (per device, by its broken health stream;
    # one the pool had already taken out -- a straggler on this busy machine -- is not "detected" again)
    assert first["in_service"] and set(first["in_service"]) <= set(first["devices"])
    assert set(first["detected_per_device_s"]) == {str(d) for d in first["in_service"]}
    assert all(v is not None for v in first["detected_per_device_s"].values()), first
    assert first["detected_after_s"] == max(first["detected_per_device_s"].values())
    events = r["pool_events"]
    for d in first["in_service"]:
        assert any(e["kind"] == "detected" and e["physical"] == d for e in events)
    # the logical ids bound to its devices moved elsewhere (the other node's spares, or the CPU fallback)
    lost_at = next(i for i, e in enumerate(events) if e["kind"] == "detected" and e["physical"] in first["in_service"]
                   and e["cause"] in ("stream", "call", "heartbeat"))    # in order: from the kill on
    moved = [e for e in events[lost_at:] if e["kind"] == "bound" and e.get("previous") in first["devices"]]
    assert {e["previous"] for e in moved} >= set(first["bound"])
    assert all(e["physical"] not in first["devices"] for e in moved)
    # the replacement node joined with the same devices, which came back
    assert r["nodes_replaced"] and r["nodes_replaced"][0].get("devices") == first["devices"], r["nodes_replaced"]
    assert {e["physical"] for e in events if e["kind"] == "recovered"} >= set(first["devices"])
    assert r["submitted"] == r["completed"] + r["failed"] + r["lost"]
    assert r["lost"] == 0 and r["duplicated"] == 0 and r["correct"] and r["submitted"] > 0
    assert r["hbm_back_to_baseline"] and r["clean"], r["leaks"]
    assert not [pid for pid in r["device_pids_seen"] if alive(pid)]
    assert not [a for a in r["arenas_seen"] if os.path.exists(os.path.join("/dev/shm", a))]
