"""Cluster tier: real Ray actors, real gRPC over loopback.

- `vnpu up` / `smi --json` / `down` from a subprocess leave no process, segment or temp file behind;
- cluster.yaml passes Ray's own schema validation;
- a Ray task that asks for `{"NPU": 2}` sees exactly two virtual devices through the runtime;
- 1000 launches + one synchronize cost a handful of RPCs;
- a dead device gives its CANN error while the other devices keep working;
- device processes run at the configured niceness, not Ray's worker niceness 15.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from devices import procstat
from devices.errors import DeviceLostError, InvalidParamError
from runtime.api import Runtime
from runtime.cluster import ClusterSpec, LocalCluster, spec_from_yaml

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
VNPU = [sys.executable, "-m", "runtime.cli"]


def _segments() -> set[str]:
    return set(glob.glob("/dev/shm/vnpu_*"))


def _owner(path: str) -> int:
    """The pid that made a ``/dev/shm/vnpu_<pid>_...`` segment."""
    return int(os.path.basename(path).split("_")[1])


def _leaked(before: set[str], pids: set[int]) -> set[str]:
    """Segments made since ``before`` by one of ``pids`` (a cluster's processes) that has died: what its
    processes left behind.  Other programs' segments are not the test's (other test runs may share the machine)."""
    return {p for p in _segments() - before if _owner(p) in pids and not _pid_alive(_owner(p))}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _procs_with(text: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if text.encode() in Path(f"/proc/{d}/cmdline").read_bytes():
                    out.append(int(d))
            except OSError:
                pass
    return out


#: the devices' configured niceness: a few steps above this process's own (what a cluster can set unprivileged)
NICE = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 3)


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster(ClusterSpec(devices=4, arena_bytes=64 << 20, device_niceness=NICE))
    try:
        yield c
    finally:
        c.close()


def test_device_processes_run_at_the_configured_niceness(cluster):
    # every device actor's process -- every one of its threads, the AI Core workers included -- runs at the
    # configured niceness (Ray would start it at 15), as /proc says and as the device reports it
    assert len(cluster.where) == 4
    for w in cluster.where:
        assert w["niceness"] == NICE
        threads = procstat.thread_niceness(w["pid"])
        assert len(threads) > 20                    # the 20 AI Core threads and Ray's and gRPC's
        assert set(threads.values()) == {NICE}, threads
    # the Ray setting alone (what works unprivileged): a device host told nothing about its priority, started
    # in the cluster's Ray, runs at NICE too -- Ray's worker niceness is what the cluster configured
    import ray
    from driver.host import remote_class
    h = remote_class().options(namespace="vnpu-test-nice").remote(90, cluster.token, 16 << 20)
    try:
        w = ray.get(h.where.remote(), timeout=120)
        nice = list(procstat.thread_niceness(w["pid"]).values())
        # the threads Ray starts before it applies the setting (its GCS client, gRPC and io threads) keep the
        # raylet's priority; the host's own -- its main thread, the AI Core workers, its gRPC server -- run at NICE
        assert w["niceness"] == NICE and nice.count(NICE) > 20
        assert set(nice) <= {NICE, os.getpriority(os.PRIO_PROCESS, 0)}
    finally:
        ray.get(h.shutdown.remote(), timeout=60)
        ray.kill(h)


def test_device_niceness_config_and_bad_values(tmp_path, monkeypatch):
    from runtime.cluster import priority
    text = (ROOT / "cluster.yaml").read_text()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text + "metadata: {vnpu: {device_niceness: 7}}\n")
    assert spec_from_yaml(cfg).device_niceness == 7
    assert spec_from_yaml(ROOT / "cluster.yaml").device_niceness is None
    monkeypatch.setenv(priority.ENV, "5")
    assert priority.resolve(None) == 5 and priority.resolve(2) == 2
    monkeypatch.delenv(priority.ENV)
    assert priority.resolve(None) == priority.DEFAULT_NICENESS == 0
    for bad in (-1, 20, "x"):
        cfg.write_text(text + f"metadata: {{vnpu: {{device_niceness: {bad}}}}}\n")
        with pytest.raises(InvalidParamError, match="device_niceness"):
            spec_from_yaml(cfg)
    monkeypatch.setenv(priority.ENV, "high")
    with pytest.raises(InvalidParamError, match=priority.ENV):
        priority.resolve(None)


def test_cluster_yaml_passes_rays_validator():
    import yaml
    from ray.autoscaler._private.util import validate_config
    cfg = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    validate_config(cfg)
    head = cfg["available_node_types"][cfg["head_node_type"]]
    assert head["resources"]["NPU"] == 4
    assert head["labels"]["vnpu.chip"].startswith("Ascend")
    from jsonschema.exceptions import ValidationError
    bad = dict(cfg, npu_devices=4)          # an unknown top-level key is rejected by the schema
    with pytest.raises(ValidationError) as ei:
        validate_config(bad)
    assert "'npu_devices' was unexpected" in str(ei.value)


def test_npu_resource_task_sees_exactly_its_devices(cluster):
    import ray

    @ray.remote(resources={"NPU": 2}, num_cpus=0)
    def visible():
        from runtime.api import Runtime
        from runtime.cluster.remote import RemoteBackend
        rt = Runtime(RemoteBackend.connect())
        try:
            ids = [d.physical_id for d in rt.devices()]
            dev = rt.device(1)
            t = dev.from_numpy(np.arange(8, dtype=np.float32))
            back = t.numpy()
            t.free()
            return os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), rt.device_count(), ids, back.tolist()
        finally:
            rt.close()

    env, count, ids, back = ray.get(visible.remote(), timeout=120)
    assert count == 2
    assert ids == [int(x) for x in env.split(",")]
    assert back == list(range(8))


def test_thousand_launches_cost_a_handful_of_rpcs(cluster):
    rt = Runtime(cluster.backend())
    try:
        dev = rt.device(0)
        a = dev.from_numpy(np.ones(16, np.float32))
        out = dev.empty((16,))
        s = dev.stream()
        s.synchronize()
        before = (dev.handle.rpc_count, dev.handle.wait_continuations)
        for _ in range(1000):
            s.launch("add", [a, a], [out], block_dim=1)
        s.synchronize()
        # a synchronize that outlasts its first bounded wait continues with another wait: how many depends on
        # how long the device takes (a busy machine), not on what the host batched, so those are not counted
        rpcs = (dev.handle.rpc_count - before[0]) - (dev.handle.wait_continuations - before[1])
        assert rpcs == 1, f"1000 launches + synchronize took {rpcs} RPCs"      # the launches ride on the wait
        np.testing.assert_array_equal(out.numpy(), np.full(16, 2, np.float32))
        a.free()
        out.free()
        s.destroy()
    finally:
        rt.close()


def test_the_clusters_ray_token_is_owner_only(cluster):
    """The cluster's Ray token (``~/.ray/auth_token``: the session's fresh HOME, tests/conftest.py, so this
    cluster's start made it) is readable by its owner only -- Ray would have written it 0644."""
    tok = os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    assert os.stat(tok).st_mode & 0o777 == 0o600


def test_dead_device_gives_its_error_and_others_keep_working(cluster):
    """Kill one device process for real; its calls fail with the device-lost code, the rest work."""
    rt = Runtime(cluster.backend())
    try:
        victim = rt.device(3)
        pid = cluster.where[3]["pid"]
        lost = victim.handle.watch_health(50)
        os.kill(pid, signal.SIGKILL)
        assert lost.wait(30), "the health watch did not notice the dead device"
        with pytest.raises(DeviceLostError) as ei:
            victim.malloc(64)
        assert ei.value.code in (107022, 207004, 507010)
        for i in range(3):
            d = rt.device(i)
            t = d.from_numpy(np.arange(4, dtype=np.float32))
            np.testing.assert_array_equal(t.numpy(), np.arange(4, dtype=np.float32))
            t.free()
    finally:
        rt.close()


def test_up_smi_down_leave_nothing_behind(tmp_path):
    env = dict(os.environ, VNPU_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    env.pop("VNPU_TOKEN", None)
    seg0 = _segments()
    temp_dir = None
    run = lambda *a: subprocess.run(VNPU + list(a), cwd=ROOT, env=env, capture_output=True, text=True,  # noqa: E731
                                    timeout=240)
    try:
        up = run("up", "--devices", "2", "--hbm-mb", "64")
        assert up.returncode == 0, up.stderr
        said = [ln for ln in up.stderr.splitlines() if ln.startswith("vnpu up: ")]     # piped: its stage, plainly
        assert len(said) == 1 and said[0].startswith("vnpu up: starting devices: Ray head and 2 x "), up.stderr
        assert "\x1b" not in up.stderr + up.stdout
        temp_dir = json.loads((tmp_path / "home" / "cluster.json").read_text())["temp_dir"]
        cluster_pids = procstat.descendants(set(_procs_with(temp_dir)))     # Ray and its workers, devices too
        assert cluster_pids, "no Ray process runs for the cluster"
        arenas = [ln.split("arena ")[1].split()[0] for ln in up.stdout.splitlines() if "/dev/shm/" in ln]
        assert len(arenas) == 2 and all(_owner(a) in cluster_pids for a in arenas), (arenas, cluster_pids)
        token = tmp_path / "home" / "token"
        assert token.exists() and (token.stat().st_mode & 0o777) == 0o600
        again = run("up", "--devices", "2")
        assert again.returncode == 0 and "already up" in again.stdout
        assert "starting devices" not in again.stderr                  # nothing started
        smi = run("smi", "--json")
        assert smi.returncode == 0, smi.stderr
        rows = json.loads(smi.stdout)["devices"]
        assert [r["npu"] for r in rows] == [0, 1]
        assert all(r["health"] == "OK" and r["hbm_total_mb"] == 64 for r in rows)
        assert all(r["address"].startswith("127.") for r in rows)
    finally:
        down = run("down")
    assert down.returncode == 0, down.stderr
    assert not _leaked(seg0, cluster_pids), "segments of dead device processes left"
    for line in up.stdout.splitlines():
        if "/dev/shm/" in line:
            assert not os.path.exists(line.split("arena ")[1].split()[0]), line
    assert temp_dir and not _procs_with(temp_dir), "processes of the cluster still running"
    assert not os.path.exists(temp_dir)
    assert not (tmp_path / "home" / "cluster.json").exists()
    assert not (tmp_path / "home" / "token").exists()


RESTART_SCRIPT = r"""
import json, threading
from runtime.api import Runtime
from runtime.cluster.remote import RemoteBackend
from runtime.cluster.failover import wait_polled
from runtime.serve.heal.actions import warm
rt = Runtime(RemoteBackend.connect())
old = rt.device(1)
pid = rt.backend.where[1]["pid"]
old.handle.inject_fault("kill")
assert wait_polled(threading.Condition(), lambda: old.is_lost, 60)
lost_after_kill = old.is_lost
new = rt.restart_device(1)
out = {"lost_after_kill": lost_after_kill, "old_still_lost": old.is_lost, "pid_before": pid,
       "pid_after": rt.backend.where[1]["pid"], "health": new.health()[0], "warm_s": warm(new, 3),
       "other_ok": not rt.device(0).is_lost and warm(rt.device(0), 1) >= 0,
       "hbm_total": new.telemetry()["hbm_total"]}
rt.close()
print(json.dumps(out))
"""


def test_up_with_device_restarts_lets_a_killed_device_come_back(tmp_path):
    """``vnpu up --device-restarts -1``: Ray starts a killed device actor again (same id and HBM size, a new
    process); the runtime that saw it lost keeps its old handle lost, and ``Runtime.restart_device`` (what
    the self-healing ``restart_device`` action calls) takes the new one back, healthy and warm (checked
    kernel results).  ``down`` leaves nothing behind, the killed process's segment included."""
    env = dict(os.environ, VNPU_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    env.pop("VNPU_TOKEN", None)
    seg0 = _segments()
    run = lambda *a: subprocess.run(VNPU + list(a), cwd=ROOT, env=env, capture_output=True, text=True,  # noqa: E731
                                    timeout=240)
    temp_dir = None
    try:
        up = run("up", "--devices", "2", "--hbm-mb", "64", "--device-restarts", "-1")
        assert up.returncode == 0, up.stderr
        assert "device actors restarted by Ray" in up.stdout
        st = json.loads((tmp_path / "home" / "cluster.json").read_text())
        temp_dir = st["temp_dir"]
        cluster_pids = procstat.descendants(set(_procs_with(temp_dir)))     # Ray and its workers, devices too
        assert st["device_restarts"] == -1
        other = run("up", "--devices", "2", "--device-restarts", "2")          # not what is up: refused
        assert other.returncode == 2 and "device restarts -1" in other.stderr
        p = subprocess.run([sys.executable, "-c", RESTART_SCRIPT], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=240)
        assert p.returncode == 0, p.stderr[-3000:]
        r = json.loads(p.stdout.strip().splitlines()[-1])
        assert r["lost_after_kill"] and r["old_still_lost"]
        assert r["pid_after"] != r["pid_before"] and r["health"] == "OK" and r["other_ok"]
        assert r["hbm_total"] == 64 << 20
        assert r["pid_before"] in cluster_pids, "the killed device was not among the cluster's processes"
        cluster_pids.add(r["pid_after"])
    finally:
        down = run("down")
    assert down.returncode == 0, down.stderr
    assert not _leaked(seg0, cluster_pids), "segments of dead device processes left"
    assert temp_dir and not _procs_with(temp_dir), "processes of the cluster still running"
