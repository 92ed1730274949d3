"""The profiler (issue 16): device task records, host records, flows, msprof's layout, both breakdowns.

In-process devices for the format checks (the same records cross the wire as JSON); real gRPC on loopback
for the tenant check (two tenants' clients on one served device, only one profiling) and for the RPC
itself; a real child process for ``vnpu prof`` and for an ``acl.prof`` script.  Budget: < 40 s on 2 cores.
"""
from __future__ import annotations

import csv
import glob
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from devices.device import Device, DeviceConfig
from devices.errors import (ACL_ERROR_INVALID_PARAM, ACL_ERROR_PROF_ALREADY_RUN, ACL_ERROR_PROF_NOT_RUN,
                            ACL_ERROR_REPEAT_INITIALIZE, ACL_ERROR_RT_PARAM_INVALID, ACL_ERROR_UNINITIALIZE, AclError)
from devices.profiling import TaskProfiler, TaskRecord
from devices.tenancy import Owner
from driver import credentials
from driver.client import RemoteDevice
from driver.service import serve
from runtime import profiler
from runtime.api import Runtime, runtime_scope
from runtime.backend import LocalBackend
from runtime.profiler import hooks
from runtime.profiler.analysis import CATEGORIES, modeled_timeline, sweep
from runtime.profiler.collector import Collector, RawProfile
from runtime.profiler.hostcost import REFERENCE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARENA = 16 << 20
SECRET = "profiler-test-cluster-token-0123456789"


def _local_rt(n: int = 1) -> Runtime:
    return Runtime(LocalBackend(n, DeviceConfig(arena_bytes=ARENA, cores=2)))


def _workload(d, steps: int = 3) -> dict:
    """Kernels on two streams with an event between them, copies and a memset; returns what was issued."""
    s1, s2 = d.stream(), d.stream()
    ev = d.event()
    a = d.from_numpy(np.arange(32 * 32, dtype=np.float32).reshape(32, 32) / 1024)
    b = d.from_numpy(np.ones((32, 32), np.float32))
    issued = {"matmul": 0, "add": 0, "Memset": 0, "MemcpyAsync": 0}
    for _ in range(steps):
        c = d.empty((32, 32))
        e = d.empty((32, 32))
        s1.launch("matmul", [a, b], [c])
        issued["matmul"] += 1
        ev.record(s1)
        s2.wait(ev)
        s2.launch("add", [c, a], [e])
        issued["add"] += 1
        s2.memset(c.ptr, 0, c.nbytes)
        issued["Memset"] += 1
        s2.copy(c.ptr, e.ptr, e.nbytes)
        issued["MemcpyAsync"] += 1
        s2.write(e.ptr, np.zeros(32 * 32, np.float32).tobytes())
        issued["MemcpyAsync"] += 1
        s1.synchronize()
        s2.synchronize()
        c.free()
        e.free()
    return issued


def _read_csv(path: str) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def profiled(tmp_path):
    """One profiled in-process run of :func:`_workload`: (profile result, issued counts, tasks the device ran)."""
    rt = _local_rt()
    with runtime_scope(rt):
        d = rt.device(0)
        d.synchronize()
        before = d.handle.sched.stats()["tasks_run"]
        with profiler.profile(str(tmp_path)) as p:
            issued = _workload(d)
        ran = d.handle.sched.stats()["tasks_run"] - before
    return p, issued, ran


# ---------------------------------------------------------------------------------------------- format
def test_trace_is_well_formed_and_every_launch_has_its_task(profiled):
    p, issued, _ = profiled
    with open(p.result.trace, encoding="utf-8") as f:
        trace = json.load(f)                                        # valid JSON
    ev = trace["traceEvents"]
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert starts and set(starts) == set(ends)                      # every flow has both ends
    # every launch the host made has a flow to a device task, and that task is on the flow's device row
    launches = [f for f in p.raw.flows if f[6] in ("matmul", "add")]
    assert len(launches) == issued["matmul"] + issued["add"]
    tasks = {(d["device"], t["stream"], t["seq"]): t for d in p.raw.devices for t in d["tasks"]}
    task_flows = [f for f in p.raw.flows if f[3] >= 0]
    assert {f[6] for f in p.raw.flows if f[3] < 0} == {"Record", "Wait"}
    for f in task_flows:
        t = tasks[(f[1], f[2], f[3])]                               # the flow's task exists ...
        assert t["name"] == f[6] or t["op_type"] in ("Memset", "MemcpyAsync")
        assert t["start"] >= f[5]                                   # ... and ran after it was launched
    assert len(starts) == len(task_flows) == len(tasks)
    for fid, s in starts.items():
        f = ends[fid]
        assert f["ts"] >= s["ts"] and f["bp"] == "e"
        # the end binds to a task slice that starts there on that row
        assert any(e["ph"] == "X" and e["pid"] == f["pid"] and e["tid"] == f["tid"] and e["ts"] == f["ts"] for e in ev)
    # per stream, tasks are in submission order and do not overlap
    by_stream: dict = {}
    for (dev, sid, seq), t in sorted(tasks.items()):
        by_stream.setdefault((dev, sid), []).append(t)
    assert len(by_stream) == 2
    for ts in by_stream.values():
        assert [t["seq"] for t in ts] == list(range(len(ts)))
        for prev, nxt in zip(ts, ts[1:]):
            assert nxt["start"] >= prev["end"]
            assert nxt["model_start"] >= prev["model_end"] - 1e-12
    # both clocks are there, and AI Core rows hold every block
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert any("[wall]" in n for n in names) and any("[modeled]" in n for n in names)
    blocks = sum(len(t["blocks"]) for t in tasks.values())
    assert blocks == sum(1 for e in ev if e.get("cat") == "block")
    # host API calls carry their thread
    api = [e for e in ev if e["ph"] == "X" and e.get("cat") == "Runtime"]
    assert api and all(isinstance(e["tid"], int) for e in api)


def test_op_summary_rows_are_the_tasks_run(profiled):
    p, issued, ran = profiled
    out = os.path.dirname(p.result.op_summary)
    assert os.path.basename(os.path.dirname(out)).startswith("PROF_")
    assert os.path.basename(out) == "mindstudio_profiler_output"
    rows = _read_csv(p.result.op_summary)
    assert len(rows) == ran == sum(issued.values())                 # the device's own count
    counts: dict = {}
    for r in rows:
        counts[r["OP Type"]] = counts.get(r["OP Type"], 0) + 1
    assert counts == issued
    for r in rows:
        assert r["Task Type"] == {"matmul": "AI_CORE", "add": "AI_VECTOR_CORE"}.get(r["OP Type"], "MEMCPY")
        assert float(r["Task Duration(us)"]) >= 0 and float(r["Task Wait Time(us)"]) >= 0
        assert float(r["Modeled Duration(us)"]) > 0
    mm = [r for r in rows if r["OP Type"] == "matmul"]
    assert all(r["Input Shapes"] == "32,32;32,32" and r["Input Data Types"] == "FLOAT;FLOAT"
               and r["Output Shapes"] == "32,32" and int(r["Block Dim"]) >= 1 for r in mm)
    api = _read_csv(p.result.api_statistic)
    assert api[0].keys() >= {"Device_id", "Level", "API Name", "Time(us)", "Count", "Avg(us)", "Min(us)", "Max(us)"}
    launch = next(r for r in api if r["API Name"] == "Stream.launch")
    assert int(launch["Count"]) == issued["matmul"] + issued["add"]
    assert float(launch["Min(us)"]) <= float(launch["Avg(us)"]) <= float(launch["Max(us)"])
    stat = _read_csv(p.result.op_statistic)
    assert sum(int(r["Count"]) for r in stat) == len(rows)


def test_breakdowns_add_up_to_the_total(profiled):
    p, _, _ = profiled
    for b in (p.result.wall, p.result.modeled):
        assert set(b.seconds) == set(CATEGORIES)
        assert sum(b.seconds.values()) == pytest.approx(b.total, rel=1e-9, abs=1e-12)
        assert sum(b.shares().values()) == pytest.approx(1.0, rel=1e-9)
        assert b.seconds["compute"] > 0 and b.seconds["launch"] > 0 and b.seconds["sync"] > 0
    assert p.result.wall.total == pytest.approx(p.raw.t_stop - p.raw.t_start, rel=1e-9)
    assert "verdict" in p.result.summary and "launch" in p.result.summary


def test_modeled_replay_charges_the_sourced_costs():
    """One launch (its doorbell inside), a 20 us task, a synchronize: the breakdown follows hostcost."""
    task = {"stream": 1, "seq": 0, "name": "k", "op_type": "k", "task_type": "AI_CORE", "block_dim": 1, "inputs": [],
            "outputs": [], "enqueued": 0.0, "start": 0.0, "end": 0.0, "model_start": 0.0, "model_end": 20e-6,
            "error": "", "blocks": []}
    raw = RawProfile(1, [], 0.0, 1.0,
                     api=[("Stream.launch", "launch", "Runtime", 1, 0.1, 0.2, 0, None),
                          ("rtSubmit", "launch", "Runtime", 1, 0.18, 0.19, 1, {"ops": 1, "device": 0}),
                          ("Device.synchronize", "sync", "Runtime", 1, 0.3, 0.4, 0, None),
                          ("Device.memcpy_h2d", "copy", "Runtime", 1, 0.5, 0.6, 0, {"bytes": 1 << 20, "pinned": False})],
                     flows=[(0, 0, 1, 0, 1, 0.17, "k", -1)],
                     devices=[{"index": 0, "device": 0, "tasks": [task], "dropped": 0}])
    m = modeled_timeline(raw)
    launch = REFERENCE.launch_pack_s + REFERENCE.submit_s
    copy = REFERENCE.copy_call_s + (1 << 20) / REFERENCE.pageable_bandwidth
    b = m.breakdown
    assert b.seconds["launch"] == pytest.approx(launch)
    assert b.seconds["compute"] == pytest.approx(20e-6)
    assert b.seconds["sync"] == pytest.approx(REFERENCE.sync_s)
    assert b.seconds["copy"] == pytest.approx(copy)
    assert b.total == pytest.approx(launch + 20e-6 + REFERENCE.sync_s + copy)
    assert m.tasks[(0, 1, 0)] == pytest.approx((launch, launch + 20e-6))


def _task(stream: int, seq: int, dur: float, task_type: str = "AI_CORE") -> dict:
    return {"stream": stream, "seq": seq, "name": "k", "op_type": "k", "task_type": task_type, "block_dim": 1,
            "inputs": [], "outputs": [], "enqueued": 0.0, "start": 0.0, "end": 0.0, "model_start": 0.0,
            "model_end": dur, "error": "", "blocks": []}


def test_modeled_replay_orders_streams_by_events_and_overlaps_copies():
    """A 50 us copy on stream 2, an event, a wait on stream 1 and a 100 us kernel there, one batch: the
    kernel starts when the copy ends; a second kernel of stream 1 overlapping the next copy hides it."""
    raw = RawProfile(1, [], 0.0, 1.0,
                     api=[("Stream.write", "copy", "Runtime", 1, 0.10, 0.11, 0, {"bytes": 8, "pinned": True, "async": True}),
                          ("Stream.launch", "launch", "Runtime", 1, 0.20, 0.21, 0, None),
                          ("Stream.write", "copy", "Runtime", 1, 0.30, 0.31, 0, {"bytes": 8, "pinned": True, "async": True}),
                          ("rtSubmit", "launch", "Runtime", 1, 0.40, 0.41, 0, {"ops": 5, "device": 0})],
                     flows=[(0, 0, 2, 0, 1, 0.105, "WriteH2D", -1), (0, 0, 2, -1, 1, 0.106, "Record", 9),
                            (0, 0, 1, -1, 1, 0.107, "Wait", 9), (0, 0, 1, 0, 1, 0.205, "matmul", -1),
                            (0, 0, 2, 1, 1, 0.305, "WriteH2D", -1)],
                     devices=[{"index": 0, "device": 0, "dropped": 0,
                               "tasks": [_task(2, 0, 50e-6, "MEMCPY"), _task(1, 0, 100e-6), _task(2, 1, 50e-6, "MEMCPY")]}])
    m = modeled_timeline(raw)
    host = 3 * REFERENCE.copy_call_s - REFERENCE.copy_call_s + REFERENCE.launch_pack_s + REFERENCE.submit_s
    c0 = m.tasks[(0, 2, 0)]
    k = m.tasks[(0, 1, 0)]
    c1 = m.tasks[(0, 2, 1)]
    assert c0[0] == pytest.approx(host) and k[0] == pytest.approx(c0[1])       # the wait held the kernel
    assert c1[0] == pytest.approx(c0[1]) and c1[1] < k[1]                     # the next copy hides under it
    b = m.breakdown
    assert b.seconds["compute"] == pytest.approx(100e-6)
    assert b.seconds["copy"] == pytest.approx(2 * REFERENCE.copy_call_s + 50e-6)   # calls + the exposed copy
    assert sum(b.seconds.values()) == pytest.approx(b.total)


def test_sweep_gives_overlaps_to_compute_first():
    b = sweep([(0.0, 4.0, "launch"), (1.0, 3.0, "compute"), (5.0, 6.0, "sync")], 0.0, 10.0, "wall")
    assert b.seconds["compute"] == 2.0 and b.seconds["launch"] == 2.0 and b.seconds["sync"] == 1.0
    assert b.seconds["idle"] == 5.0 and b.total == 10.0
    assert "runtime-bound" in b.verdict()


def test_collectives_are_hccl_tasks_on_their_own_rows(tmp_path):
    from runtime import hccl
    rt = _local_rt(2)
    with runtime_scope(rt):
        devs = rt.devices()
        xs = [d.from_numpy(np.full(256, i + 1, np.float32)) for i, d in enumerate(devs)]
        comms = hccl.comm_init_all(devs, hccl.CommOptions(exec_timeout_s=30))
        try:
            with profiler.profile(str(tmp_path)) as p:
                for c, x in zip(comms, xs):
                    c.all_reduce(x)
                for d in devs:
                    d.synchronize()
            np.testing.assert_array_equal(xs[0].numpy(), np.full(256, 3, np.float32))
        finally:
            for c in comms:
                c.destroy()
    rows = [r for r in _read_csv(p.result.op_summary) if r["Task Type"] == "HCCL"]
    assert sorted(int(r["Device_id"]) for r in rows) == [0, 1]
    assert all(r["OP Type"] == "hcom_allreduce" and r["Task ID"] == "N/A" and r["Stream ID"] == "N/A" for r in rows)
    with open(p.result.trace, encoding="utf-8") as f:
        ev = json.load(f)["traceEvents"]
    lanes = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"
             and e["args"]["name"] == "Collectives (HCCL)"}
    assert len(lanes) == 2                                   # one collectives row per device
    assert sum(1 for e in ev if e["ph"] == "X" and (e["pid"], e["tid"]) in lanes) == 2


# ---------------------------------------------------------------------------------------------- off
def test_profiler_off_takes_no_profiling_path(monkeypatch):
    """Count calls of every recording hook (host and device): none while off; some while on."""
    counts = {"host": 0, "device": 0}

    def counting(cls, name, key):
        orig = getattr(cls, name)

        def wrapper(*a, **k):
            counts[key] += 1
            return orig(*a, **k)
        monkeypatch.setattr(cls, name, wrapper)

    for name in ("call", "op", "submit", "attach"):
        counting(Collector, name, "host")
    for name in ("attach", "session"):
        counting(TaskProfiler, name, "device")
    for name in ("block", "finish"):
        counting(TaskRecord, name, "device")
    assert hooks.ACTIVE is None
    rt = _local_rt()
    with runtime_scope(rt):
        d = rt.device(0)
        _workload(d, steps=2)
        assert counts == {"host": 0, "device": 0}
        with profiler.recording():
            _workload(d, steps=1)
        on = dict(counts)
        _workload(d, steps=2)
    assert on["host"] > 0 and on["device"] > 0
    assert counts == on                      # off again: nothing more


# ---------------------------------------------------------------------------------------------- tenants
class _Backend:
    """A runtime backend of one gRPC client (what RemoteBackend hands out, without Ray)."""
    name = "remote"

    def __init__(self, client: RemoteDevice):
        self.client = client

    def device_ids(self) -> list[int]:
        return [self.client.id]

    def device(self, physical_id: int):
        return self.client

    def close(self) -> None:
        pass


def test_another_tenants_work_does_not_appear(tmp_path):
    dev = Device(DeviceConfig(device_id=7, arena_bytes=ARENA, cores=2, shm=False))
    srv = serve(dev, host="127.0.0.1", token=SECRET, port=0, lease_grace_s=0.2)
    clients = []
    try:
        def client(tenant: str) -> RemoteDevice:
            c = RemoteDevice(srv.address, credentials.mint(SECRET, tenant), dev.id, timeout_s=10.0)
            clients.append(c)
            c.open_lease()
            return c
        alice, bob = client("alice"), client("bob")
        rt_a = Runtime(_Backend(alice), batch_size=4)
        rt_b = Runtime(_Backend(bob), batch_size=4)
        da, db = rt_a.device(0), rt_b.device(0)
        xa = da.from_numpy(np.ones((16, 16), np.float32))
        xb = db.from_numpy(np.ones((16, 16), np.float32))
        with runtime_scope(rt_a):
            # both clients live in this process (a test); profile alice's runtime only, as `vnpu prof`
            # profiles its own processes only -- the device must keep bob's tasks out of her records
            with profiler.profile(str(tmp_path), runtime=rt_a) as p:
                for _ in range(5):
                    da.launch("add", [xa, xa], [xa])
                    db.launch("mul", [xb, xb], [xb])     # bob's work, same device, same time
                    db.launch("mul", [xb, xb], [xb])
                da.synchronize()
                db.synchronize()
        rt_b.close()
        tasks = [t for d in p.raw.devices for t in d["tasks"]]
        assert [t["op_type"] for t in tasks] == ["add"] * 5
        assert {t["stream"] for t in tasks} == {da.default_stream.sid}
        rows = _read_csv(p.result.op_summary)
        assert len(rows) == 5 and {r["OP Type"] for r in rows} == {"add"}
        assert dev.sched.stats()["tasks_run"] >= 15             # bob's 10 did run
        assert not dev.prof.active                              # the session is closed
        with pytest.raises(AclError) as e:                      # a bad action over the wire: its code
            alice.profile("rewind")
        assert e.value.code == ACL_ERROR_RT_PARAM_INVALID
        assert bob.profile("stop")["tasks"] == []               # bob never profiled: nothing of alice's
    finally:
        for c in clients:
            c.close()
        srv.stop(grace=None)
        dev.close()


def test_device_sessions_are_per_owner_and_bad_actions_are_refused():
    dev = Device(DeviceConfig(device_id=3, arena_bytes=ARENA, cores=2, shm=False))
    try:
        a, b = Owner("alice", "c1"), Owner("bob", "c2")
        sa, sb = dev.create_stream(owner=a), dev.create_stream(owner=b)
        pa = dev.malloc(256, owner=a)
        pb = dev.malloc(256, owner=b)
        from devices.tasks import Memset
        dev.profile("start", owner=a)
        dev.submit([Memset(sa, pa, 1, 256)], owner=a)
        dev.submit([Memset(sb, pb, 2, 256)], owner=b)
        dev.synchronize_device(owner=a)
        dev.synchronize_device(owner=b)
        assert dev.profile("stop", owner=b)["tasks"] == []     # bob never started: nothing of alice's
        got = dev.profile("stop", owner=a)
        assert [(t["stream"], t["op_type"]) for t in got["tasks"]] == [(sa, "Memset")]
        with pytest.raises(AclError) as e:
            dev.profile("rewind", owner=a)
        assert e.value.code == ACL_ERROR_RT_PARAM_INVALID
    finally:
        dev.close()


# ---------------------------------------------------------------------------------------------- end to end
def _env(tmp_path) -> dict:
    return dict(os.environ, VNPU_HOME=str(tmp_path / "home"), OPENBLAS_NUM_THREADS="1", VNPU_BACKEND="local",
                VNPU_DEVICES="1", VNPU_HBM_BYTES=str(ARENA), PYTHONPATH=ROOT)


def test_vnpu_prof_on_a_user_script(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        from runtime import api
        d = api.device(0)
        a = d.from_numpy(np.ones((64, 64), np.float32))
        for _ in range(6):
            c = d.empty((64, 64))
            d.launch("matmul", [a, a], [c])
            d.launch("gelu", [c], [c])
            d.synchronize()
            assert c.numpy().reshape(-1)[0] > 0
            c.free()
        import subprocess, sys                   # a second runtime client, started by this one
        subprocess.run([sys.executable, "-c", "import numpy as np; from runtime import api; d = api.device(0); "
                        "x = d.from_numpy(np.ones(8, np.float32)); d.launch('add', [x, x], [x]); d.synchronize()"],
                       check=True)
        print("user script done")
    """))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "prof", "--output", str(out), "--", sys.executable,
                        str(script)], env=_env(tmp_path), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "user script done" in r.stdout
    assert "verdict:" in r.stdout and "launch" in r.stdout and "compute" in r.stdout
    assert "2 runtime client(s)" in r.stdout                    # the script and the process it started
    dirs = glob.glob(str(out / "PROF_*"))
    trace = glob.glob(os.path.join(dirs[0], "mindstudio_profiler_output", "msprof_*.json"))[0]
    assert f"timeline: open {trace} in https://ui.perfetto.dev" in r.stdout and "chrome://tracing" in r.stdout
    assert len(dirs) == 1 and os.path.basename(dirs[0]).count("_") == 3
    msout = os.path.join(dirs[0], "mindstudio_profiler_output")
    rows = _read_csv(glob.glob(os.path.join(msout, "op_summary_*.csv"))[0])
    assert sorted(r["OP Type"] for r in rows) == sorted(["matmul", "gelu"] * 6 + ["add"])
    with open(glob.glob(os.path.join(msout, "msprof_*.json"))[0], encoding="utf-8") as f:
        assert json.load(f)["traceEvents"]
    assert glob.glob(os.path.join(msout, "api_statistic_*.csv"))
    assert len(glob.glob(os.path.join(dirs[0], "host", "data", "vnpu_prof_*.json"))) == 2


def test_vnpu_prof_exits_with_the_commands_status_and_refuses_bad_flags(tmp_path):
    env = _env(tmp_path)
    base = [sys.executable, "-m", "runtime.cli", "prof"]
    r = subprocess.run(base + ["--output", str(tmp_path / "o"), "--", sys.executable, "-c", "raise SystemExit(3)"],
                       env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 3 and "no runtime client reported" in r.stderr
    assert os.listdir(tmp_path / "o") == []                     # no empty PROF_* folder left behind
    r = subprocess.run(base, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "no command" in r.stderr
    f = tmp_path / "file"
    f.write_text("x")
    r = subprocess.run(base + ["--output", str(f), "--", "true"], env=env, capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--output" in r.stderr
    r = subprocess.run(base + ["--", str(tmp_path / "no-such-program")], env=env, capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)                # the default --output: the working directory
    assert r.returncode == 2 and "cannot run" in r.stderr
    assert not glob.glob(str(tmp_path / "PROF_*"))              # nothing ran: no PROF_* folder either


ACL_SCRIPT = """
import glob, os, sys
import numpy as np
from runtime import acl
out = sys.argv[1]
codes = {}
codes["init_before_acl_init"] = acl.prof.init(out)
assert acl.init() == 0 and acl.rt.set_device(0) == 0
codes["start_before_prof_init"] = acl.prof.start(1)
codes["init"] = acl.prof.init(out)
codes["init_again"] = acl.prof.init(out)
cfg = acl.prof.create_config([0], acl.ACL_AICORE_PIPE_UTILIZATION, 0, acl.ACL_PROF_ACL_API | acl.ACL_PROF_TASK_TIME)
codes["cfg_ok"] = int(cfg != 0)
codes["cfg_bad_device"] = acl.prof.create_config([5], 1, 0, acl.ACL_PROF_ACL_API)
codes["cfg_bad_events"] = acl.prof.create_config([0], 1, 3, acl.ACL_PROF_ACL_API)
codes["start"] = acl.prof.start(cfg)
codes["start_again"] = acl.prof.start(cfg)
stream, _ = acl.rt.create_stream()
n = 1024
ptr, _ = acl.rt.malloc(n * 4, acl.ACL_MEM_MALLOC_HUGE_FIRST)
host = np.ones(n, np.float32)
acl.rt.memcpy(ptr, n * 4, acl.util.numpy_to_ptr(host), n * 4, acl.ACL_MEMCPY_HOST_TO_DEVICE)
hp = acl.rt.malloc_host(n * 4)[0]
acl.rt.memcpy_async(ptr, n * 4, hp, n * 4, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream)
acl.rt.memset_async(ptr, n * 4, 0, n * 4, stream)
acl.rt.synchronize_stream(stream)
codes["stop"] = acl.prof.stop(cfg)
codes["stop_again"] = acl.prof.stop(cfg)
codes["destroy"] = acl.prof.destroy_config(cfg)
codes["destroy_again"] = acl.prof.destroy_config(cfg)
codes["finalize"] = acl.prof.finalize()
codes["finalize_again"] = acl.prof.finalize()
d = acl.prof.last_output()
rows = list(open(glob.glob(d + "/mindstudio_profiler_output/op_summary_*.csv")[0]))[1:]
api = open(glob.glob(d + "/mindstudio_profiler_output/api_statistic_*.csv")[0]).read()
codes["tasks"] = len(rows)
codes["api_has_memcpy"] = int("AscendCL,acl.rt.memcpy," in api)
acl.rt.free_host(hp); acl.rt.free(ptr); acl.rt.destroy_stream(stream); acl.rt.reset_device(0); acl.finalize()
print("CODES", repr(codes))
"""


def _acl_script_codes(tmp_path, text: str) -> dict:
    """Run an acl script in a child process (its own acl state) with ``<tmp>/prof`` as its argument; the
    dict of return codes it printed after ``CODES``."""
    script = tmp_path / "acl_script.py"
    script.write_text(text)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "prof")], env=_env(tmp_path), capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return eval(r.stdout.split("CODES", 1)[1].strip())        # noqa: S307 - our own script's dict


ACL_FINALIZE_SCRIPT = """
import glob, sys
from runtime import acl, profiler
out = sys.argv[1]
codes = {}
def work():
    stream, _ = acl.rt.create_stream()
    ptr, _ = acl.rt.malloc(4096, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    acl.rt.memset_async(ptr, 4096, 0, 4096, stream)
    acl.rt.synchronize_stream(stream)
def tasks(d):
    return len(list(open(glob.glob(d + "/mindstudio_profiler_output/op_summary_*.csv")[0]))[1:])
assert acl.init() == 0 and acl.rt.set_device(0) == 0
assert acl.prof.init(out + "/a") == 0
cfg = acl.prof.create_config([0], acl.ACL_AICORE_PIPE_UTILIZATION, 0, acl.ACL_PROF_ACL_API | acl.ACL_PROF_TASK_TIME)
assert acl.prof.start(cfg) == 0
work()
codes["finalize"] = acl.finalize()                    # with a profile running, never stopped
codes["running_after"] = int(profiler.active() is not None)
codes["written_a"] = tasks(acl.prof.last_output()) if (acl.prof.last_output() or "").startswith(out + "/a/") else -1
codes["stop_after"] = acl.prof.stop(cfg)
codes["prof_finalize_after"] = acl.prof.finalize()
assert acl.init() == 0 and acl.rt.set_device(0) == 0
codes["start_old_cfg"] = acl.prof.start(cfg)           # the old session is gone: prof.init first
codes["prof_init_again"] = acl.prof.init(out + "/b")
codes["old_cfg_gone"] = acl.prof.destroy_config(cfg)
cfg2 = acl.prof.create_config([0], acl.ACL_AICORE_PIPE_UTILIZATION, 0, acl.ACL_PROF_TASK_TIME)
codes["start_new"] = acl.prof.start(cfg2)
work()
assert acl.init() == 0                                 # count 2: the first finalize_reference keeps it
codes["ref_1"] = acl.finalize_reference()
codes["running_at_1"] = int(profiler.active() is not None)
codes["ref_0"] = acl.finalize_reference()
codes["running_at_0"] = int(profiler.active() is not None)
codes["written_b"] = tasks(acl.prof.last_output()) if (acl.prof.last_output() or "").startswith(out + "/b/") else -1
print("CODES", repr(codes))
"""


def test_acl_finalize_ends_the_profiling_session(tmp_path):
    """aclFinalize calls MsprofFinalize: a profile left running is stopped and written, the session (init
    path, configs) is gone -- an acl.prof call after it is ACL_ERROR_UNINITIALIZE, and after acl.init again
    acl.prof.init succeeds (not ACL_ERROR_REPEAT_INITIALIZE) and a new profile starts (not
    ACL_ERROR_PROF_ALREADY_RUN).  acl.finalize_reference ends it at 0 only."""
    codes = _acl_script_codes(tmp_path, ACL_FINALIZE_SCRIPT)
    assert codes == {"finalize": 0, "running_after": 0, "written_a": 1, "stop_after": ACL_ERROR_UNINITIALIZE,
                     "prof_finalize_after": ACL_ERROR_UNINITIALIZE, "start_old_cfg": ACL_ERROR_UNINITIALIZE,
                     "prof_init_again": 0, "old_cfg_gone": ACL_ERROR_INVALID_PARAM, "start_new": 0, "ref_1": (1, 0),
                     "running_at_1": 1, "ref_0": (0, 0), "running_at_0": 0, "written_b": 1}


def test_acl_prof_script_and_its_return_codes(tmp_path):
    codes = _acl_script_codes(tmp_path, ACL_SCRIPT)
    assert codes == {"init_before_acl_init": ACL_ERROR_UNINITIALIZE, "start_before_prof_init": ACL_ERROR_UNINITIALIZE,
                     "init": 0, "init_again": ACL_ERROR_REPEAT_INITIALIZE, "cfg_ok": 1, "cfg_bad_device": 0,
                     "cfg_bad_events": 0, "start": 0, "start_again": ACL_ERROR_PROF_ALREADY_RUN, "stop": 0,
                     "stop_again": ACL_ERROR_PROF_NOT_RUN, "destroy": 0, "destroy_again": ACL_ERROR_INVALID_PARAM,
                     "finalize": 0, "finalize_again": ACL_ERROR_UNINITIALIZE, "tasks": 2, "api_has_memcpy": 1}
