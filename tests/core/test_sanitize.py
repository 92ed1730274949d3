"""``vnpu sanitize`` on real runtime programs: seeded hazards are each found exactly once with both call
sites, their correct twins report nothing; memcheck explains refused bad accesses with the allocation's
history; leakcheck lists what a program left alive; the report, the JSON, the CLI and the environment
variable.  The seeded hazards run on both backends (in-process devices, and a Ray cluster of device
actors over gRPC, where launches are batched: the call sites must still be the launch lines).

Sites are checked against the line numbers of this file: ``here()`` on the line of the call.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from conftest import TEST_ARENA
from devices.device import Device, DeviceConfig
from devices.errors import (ACL_ERROR_RT_MEMORY_FREE, ACL_ERROR_RT_PARAM_INVALID, AclError, InvalidParamError,
                            MemoryAccessError)
from runtime import hccl
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.sanitize import SanitizeOptions, Session
from runtime.sanitize.options import from_env, parse_options, parse_tools

#: the cluster's devices also hold SmolLM2 (a third of it each, tensor parallel)
CLUSTER_ARENA = 512 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THIS = os.path.relpath(os.path.abspath(__file__))


def here() -> int:
    return sys._getframe(1).f_lineno


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", params=["local", pytest.param("cluster", marks=pytest.mark.cluster)])
def backend(request):
    """A factory of backends with 3 devices: in-process, or connections to one shared Ray cluster."""
    if request.param == "local":
        yield lambda: LocalBackend(3, DeviceConfig(arena_bytes=TEST_ARENA))
        return
    from runtime.cluster import ClusterSpec, LocalCluster
    cluster = LocalCluster(ClusterSpec(devices=3, arena_bytes=CLUSTER_ARENA))
    try:
        yield cluster.backend
    finally:
        cluster.close()


@contextlib.contextmanager
def sanitized(make_backend, tools=("memcheck", "racecheck", "initcheck", "leakcheck")):
    """A runtime watched by a fresh session; the session is finished (leak check, summary) on exit."""
    out = io.StringIO()
    s = Session(SanitizeOptions(tools=tuple(tools)), out=out)
    rt = Runtime(make_backend(), sanitizer=s)
    try:
        yield rt, s
    finally:
        rt.close()
        s.finish()
        s.text = out.getvalue()


def local():
    return LocalBackend(2, DeviceConfig(arena_bytes=TEST_ARENA))


def lines_of(access: dict) -> tuple[str, int]:
    f = access["site"]["frames"][0]
    return f["file"], f["line"]


def only(s: Session, tool: str) -> dict:
    fs = [f.as_dict() for f in s.findings if f.tool == tool]
    assert len(fs) == 1, f"expected exactly one {tool} finding, got {len(fs)}: {[f['message'] for f in fs]}"
    return fs[0]


def tools(s: Session) -> list[str]:
    return [f.tool for f in s.findings]


# ---------------------------------------------------------------------------------------------- racecheck
def test_consumer_stream_without_wait(backend):
    with sanitized(backend) as (rt, s):
        d = rt.device(0)
        x = d.from_numpy(np.arange(256, dtype=np.float32))
        y, z = d.empty((256,)), d.empty((256,))
        prod, cons = d.stream(), d.stream()
        for _ in range(3):                                           # the same bug, three times
            prod.launch("mul_scalar", [x], [y], attrs={"value": 2.0}); w = here()
            cons.launch("relu", [y], [z]); r = here()
        d.synchronize()
        for t in (x, y, z):
            t.free()
        prod.destroy(), cons.destroy()
    f = only(s, "racecheck")
    assert tools(s) == ["racecheck"]
    a, b = f["accesses"]
    assert f["kind"] == "RAW" and (a["access"], b["access"]) == ("write", "read")
    assert lines_of(a) == (THIS, w) and lines_of(b) == (THIS, r)
    assert a["task"] == "kernel mul_scalar" and b["task"] == "kernel relu" and a["stream"] != b["stream"]
    assert f["range"]["bytes"] == 1024 and f["range"]["start"] == f["allocation"]["ptr"]
    assert f["count"] == 5          # found once, counted each time: RAW, then WAR + RAW on each later pass
    assert "Race reported between Write access by kernel mul_scalar" in s.text
    assert "ERROR SUMMARY: 1 error" in s.text


def test_consumer_stream_with_wait_is_clean(backend):
    with sanitized(backend) as (rt, s):
        d = rt.device(0)
        x = d.from_numpy(np.arange(256, dtype=np.float32))
        y, z = d.empty((256,)), d.empty((256,))
        prod, cons = d.stream(), d.stream()
        ev, back = d.event(), d.event()
        for _ in range(3):
            prod.launch("mul_scalar", [x], [y], attrs={"value": 2.0})
            ev.record(prod)
            cons.wait(ev)
            cons.launch("relu", [y], [z])
            back.record(cons)                                         # the producer must not overwrite y
            prod.wait(back)                                           # before the consumer read it
        np.testing.assert_array_equal(z.numpy(cons), 2 * np.arange(256, dtype=np.float32))
        for t in (x, y, z):
            t.free()
        prod.destroy(), cons.destroy()
        ev.destroy(), back.destroy()
    assert s.findings == [] and s.counts()["tasks"] >= 6 and "ERROR SUMMARY: 0 errors" in s.text


def test_d2h_copy_racing_a_kernel(backend):
    with sanitized(backend) as (rt, s):
        d = rt.device(0)
        x = d.from_numpy(np.ones(1024, np.float32))
        st = d.stream()
        st.launch("add_scalar", [x], [x], attrs={"value": 1.0}); w = here()
        d.memcpy_d2h(x.ptr, x.nbytes); r = here()                     # no synchronize
        st.synchronize()
        d.memcpy_d2h(x.ptr, x.nbytes)                                 # ordered now
        x.free()
        st.destroy()
    f = only(s, "racecheck")
    a, b = f["accesses"]
    assert lines_of(a) == (THIS, w) and lines_of(b) == (THIS, r)
    assert b["stream"] is None and b["task"] == "memcpy_d2h" and f["kind"] == "RAW"
    assert tools(s) == ["racecheck"]


def test_event_recorded_before_the_producers_launch(backend):
    with sanitized(backend) as (rt, s):
        d = rt.device(0)
        x = d.from_numpy(np.ones(64, np.float32))
        y, z = d.empty((64,)), d.empty((64,))
        prod, cons = d.stream(), d.stream()
        ev = d.event()
        ev.record(prod)                                               # too early: before the launch
        prod.launch("exp", [x], [y]); w = here()
        cons.wait(ev)
        cons.launch("relu", [y], [z]); r = here()
        d.synchronize()
        for t in (x, y, z):
            t.free()
        prod.destroy(), cons.destroy()
        ev.destroy()
    f = only(s, "racecheck")
    assert [lines_of(a) for a in f["accesses"]] == [(THIS, w), (THIS, r)]
    assert tools(s) == ["racecheck"]


def test_collective_overlapping_a_kernel_without_an_event(backend):
    with sanitized(backend) as (rt, s):
        devs = rt.devices()
        comms = hccl.comm_init_all(devs)
        bufs, streams = [], []
        for r, (c, d) in enumerate(zip(comms, devs)):
            buf = d.from_numpy(np.full(128, r + 1.0, np.float32))
            out = d.empty((128,))
            s_comm, s_comp = d.stream(), d.stream()
            c.all_reduce(buf, stream=s_comm); w = here()
            s_comp.launch("mul_scalar", [buf], [out], attrs={"value": 2.0}); rd = here()
            bufs += [buf, out]
            streams += [s_comm, s_comp]
        for d in devs:
            d.synchronize()
        for t in bufs:
            t.free()
        for st in streams:
            st.destroy()
        for c in comms:
            c.destroy()
    f = only(s, "racecheck")                                          # one pair of sites: reported once
    a, b = f["accesses"]
    assert a["task"] == "hccl allreduce" and a["argument"] == "recv" and b["task"] == "kernel mul_scalar"
    assert lines_of(a) == (THIS, w) and lines_of(b) == (THIS, rd)
    assert f["count"] == 3                                            # ... and it happened on every rank
    assert tools(s) == ["racecheck"]


def test_jobs_on_3_devices_over_grpc_report_nothing(backend, request):
    """MiniLM and SmolLM2 tensor parallel on 3 device actors (launches batched over gRPC, collectives
    between the actors, decode steps as graph replays): nothing to report, and the same results as in
    process (``test_sanitize_programs.py`` runs the in-process jobs)."""
    if "local" in request.node.name:
        pytest.skip("the in-process jobs: test_sanitize_programs.py")
    from runtime.models import EmbedJob, GenerateJob
    sentences = ["an NPU runs matrix kernels on cube units", "streams and events order the work"]
    with sanitized(backend) as (rt, s):
        job = EmbedJob(rt, "minilm-l6", devices=3, parallel="tp", batch_size=2)
        try:
            emb = job.embed(sentences)
        finally:
            job.close()
        gen = GenerateJob(rt, "smollm2", devices=3, parallel="tp", max_len=64)
        try:
            toks = gen.generate(["What is an NPU?"], max_new_tokens=3, stop_at_eos=False)[0].token_ids
        finally:
            gen.close()
    assert [f.message for f in s.findings] == []
    assert s.counts()["tasks"] >= 300 and s.counts()["replays"] >= 3
    with contextlib.closing(Runtime(LocalBackend(3, DeviceConfig(arena_bytes=1 << 30)))) as ref:
        job = EmbedJob(ref, "minilm-l6", devices=1, parallel="dp", batch_size=2)
        want = job.embed(sentences)
        job.close()
        gen = GenerateJob(ref, "smollm2", devices=1, parallel="none", max_len=64)
        want_toks = gen.generate(["What is an NPU?"], max_new_tokens=3, stop_at_eos=False)[0].token_ids
        gen.close()
    np.testing.assert_allclose(emb, want, rtol=2e-5, atol=2e-6)
    assert toks == want_toks


def test_allreduce_overlapped_with_compute_is_clean(backend):
    """The HCCL tests' overlap program (a held producer stream, an event ordering the all-reduce after it,
    an independent compute stream; host-signalled gates) under the sanitizer: nothing to report."""
    import test_hccl
    with sanitized(backend) as (rt, s):
        pool = test_hccl.Pool()
        try:
            test_hccl.test_all_reduce_overlapped_with_compute(rt, pool)
        finally:
            pool.free()
    assert s.findings == [] and s.counts()["tasks"] >= 3 * 12


# ---------------------------------------------------------------------------------------------- initcheck
def test_free_while_a_stream_still_reads(backend):
    """The host frees a buffer that a kernel queued on a stream still reads (only another stream was
    synchronized): a race between the free and the read."""
    with sanitized(backend) as (rt, s):
        d = rt.device(0)
        x = d.from_numpy(np.ones(512, np.float32))
        y = d.empty((512,))
        a, b = d.stream(), d.stream()
        a.launch("exp", [x], [y]); r = here()
        b.synchronize()                                               # the wrong stream
        d.flush()
        d.handle.inner.synchronize_stream(a.sid)    # (the test makes sure the read is over, unseen by the
        x.free(); fr = here()                       # sanitizer: the race must be found however it goes)
        a.synchronize()
        y.free()                                                      # after its writer: fine
        a.destroy(), b.destroy()
    f = only(s, "racecheck")
    first, second = f["accesses"]
    assert (first["access"], second["access"]) == ("read", "free") and f["kind"] == "WAR"
    assert lines_of(first) == (THIS, r) and lines_of(second) == (THIS, fr)
    assert "Free of the allocation by the host" in s.text and tools(s) == ["racecheck"]


def test_read_of_uninitialised_memory(backend):
    with sanitized(backend) as (rt, s):
        d = rt.device(0)
        x = d.empty((300,)); a = here()
        y = d.empty((300,))
        st = d.stream()
        st.launch("relu", [x], [y]); r = here()                      # x was never written
        st.launch("relu", [y], [y])                                   # y was: by the launch above
        st.synchronize()
        d.memset(x.ptr, 0, x.nbytes)
        st.launch("relu", [x], [y])                                   # now it is
        st.synchronize()
        x.free(), y.free()
        st.destroy()
    f = only(s, "initcheck")
    assert lines_of(f["accesses"][0]) == (THIS, r)
    al = f["allocation"]["allocated_at"]["frames"][0]
    assert (al["file"], al["line"]) == (THIS, a) and f["range"]["bytes"] == 1200
    assert tools(s) == ["initcheck"]


# ---------------------------------------------------------------------------------------------- leakcheck
def test_leaked_buffer(backend):
    with sanitized(backend) as (rt, s):
        d = rt.device(0)
        for _ in range(2):
            d.empty((100,)); a = here()                              # never freed
        kept = d.empty((10,))
        kept.free()
    f = only(s, "leakcheck")
    assert f["kind"] == "leak-allocation" and f["resources"] == 2 and f["bytes"] == 800
    frame = f["created_at"]["frames"][0]
    assert (frame["file"], frame["line"]) == (THIS, a)
    assert "LEAK SUMMARY: 800 bytes leaked in 2 allocations" in s.text


def test_leaked_stream_event_and_graph():
    with sanitized(local) as (rt, s):
        d = rt.device(0)
        x = d.from_numpy(np.ones(8, np.float32))
        st = d.stream(); ls = here()
        ev = d.event(); le = here()
        lg = here() + 1
        with st.capture() as cap:
            st.launch("relu", [x], [x])
        g = cap.graph
        g.execute_async(st)
        st.synchronize()
        x.free()
        del ev, g
    by = {f.kind: f.as_dict() for f in s.findings}
    assert sorted(by) == ["leak-event", "leak-graph", "leak-stream"]
    assert by["leak-stream"]["created_at"]["frames"][0]["line"] == ls
    assert by["leak-event"]["created_at"]["frames"][0]["line"] == le
    assert by["leak-graph"]["created_at"]["frames"][0]["line"] == lg     # the with block that captured it


# ---------------------------------------------------------------------------------------------- memcheck
def test_use_after_free_is_reported_with_the_allocation_history(backend):
    with sanitized(backend) as (rt, s):
        d = rt.device(0)
        x = d.from_numpy(np.ones(64, np.float32)); a = here()
        y = d.empty((64,))
        ptr = x.ptr
        x.free(); fr = here()
        st = d.stream()
        u = here() + 2
        with pytest.raises(AclError) as err:
            st.launch("relu", [x], [y])                              # the device refuses: freed memory
            d.synchronize()
        assert err.value.code == ACL_ERROR_RT_PARAM_INVALID, err.value
        y.free()
        st.destroy()
    f = only(s, "memcheck")
    assert f["site"]["frames"][0]["line"] in (u, u + 1)
    [p] = f["pointers"]
    assert p["ptr"] == ptr and p["relation"] == "freed"
    assert p["allocation"]["allocated_at"]["frames"][0]["line"] == a
    assert p["allocation"]["freed_at"]["frames"][0]["line"] == fr
    assert "use after free" in s.text and tools(s) == ["memcheck"]


def test_out_of_bounds_and_double_free():
    with sanitized(local) as (rt, s):
        d = rt.device(0)
        x = d.empty((16,)); a = here()
        st = d.stream()
        o = here() + 2
        with pytest.raises(MemoryAccessError):
            st.copy(x.ptr, x.ptr + 32, 64)                            # reads 32 bytes past the end
        x.free()
        df = here() + 2
        with pytest.raises(AclError) as err:
            d.free(x.ptr)
        assert err.value.code == ACL_ERROR_RT_MEMORY_FREE, err.value            # a double free
        st.destroy()
    fs = [f.as_dict() for f in s.findings]
    assert [f["tool"] for f in fs] == ["memcheck", "memcheck"]
    oob, dfree = fs
    assert oob["site"]["frames"][0]["line"] == o
    assert oob["pointers"][0]["relation"] == "overrun" and \
        oob["pointers"][0]["allocation"]["allocated_at"]["frames"][0]["line"] == a
    assert dfree["site"]["frames"][0]["line"] == df and dfree["pointers"][0]["relation"] == "freed"


def test_acl_program_host_and_device_pointers():
    """Through pyACL: an async D2H copy (a blocking host function) followed by a memset overwriting the
    source on the same stream is ordered (no race); freeing a malloc_host buffer twice is refused and
    reported with the buffer's history (the host-pointer table's refusals of other host ranges reach
    memcheck the same way); a device buffer left allocated leaks."""
    from runtime import acl
    from runtime.api import set_runtime
    from runtime import sanitize

    out = io.StringIO()
    s = Session(SanitizeOptions(), out=out)
    rt = Runtime(local(), sanitizer=s)
    old = set_runtime(rt)
    sanitize.install(s, at_exit=False)
    try:
        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        stream, _ = acl.rt.create_stream()
        n = 256 * 4
        dev, _ = acl.rt.malloc(n, 0)
        host, _ = acl.rt.malloc_host(n); hl = here()
        assert acl.rt.memset(dev, n, 1, n) == 0
        assert acl.rt.memcpy_async(host, n, dev, n, acl.ACL_MEMCPY_DEVICE_TO_HOST, stream) == 0
        assert acl.rt.memset_async(dev, n, 0, n, stream) == 0       # after the copy on the same stream
        assert acl.rt.synchronize_stream(stream) == 0
        assert acl.rt.free_host(host) == 0; hf = here()
        assert acl.rt.free_host(host) == acl.ACL_ERROR_RT_PARAM_INVALID; bad = here()   # a double free: refused
        assert acl.rt.synchronize_stream(0x5EED) == acl.ACL_ERROR_RT_INVALID_HANDLE      # a bad handle: no memory error
        leak, _ = acl.rt.malloc(64, 0); lk = here()
        assert acl.rt.destroy_stream(stream) == 0
        acl.rt.free(dev)
    finally:
        sanitize.install(None)
        rt.close()
        set_runtime(old)
        acl.finalize()
        s.finish()
    fs = [f.as_dict() for f in s.findings]
    assert [f["tool"] for f in fs] == ["memcheck", "leakcheck"], [f["message"] for f in fs]
    mem, lea = fs
    assert mem["api"] == "acl.rt.free_host" and mem["site"]["frames"][0]["line"] == bad
    p = mem["pointers"][0]
    assert p["relation"] == "freed" and p["allocation"]["kind"] == "malloc_host"
    assert p["allocation"]["allocated_at"]["frames"][0]["line"] == hl
    assert p["allocation"]["freed_at"]["frames"][0]["line"] == hf
    assert lea["created_at"]["frames"][0]["line"] == lk and lea["bytes"] == 64


# ---------------------------------------------------------------------------------------------- graphs
def test_graph_replays_are_checked_as_their_captured_ops():
    with sanitized(local) as (rt, s):
        d = rt.device(0)
        x = d.from_numpy(np.ones(128, np.float32))
        y, z = d.empty((128,)), d.empty((128,))
        cap_s, other = d.stream(), d.stream()
        with cap_s.capture() as cap:
            cap_s.launch("mul_scalar", [x], [y], attrs={"value": 3.0}); c = here()
            cap_s.launch("relu", [y], [y])
        g = cap.graph
        for _ in range(4):                                            # correct: replays on one stream
            g.execute_async(cap_s)
        cap_s.synchronize()
        assert s.findings == []
        g.execute_async(cap_s); rp = here()
        other.launch("exp", [y], [z]); r = here()                    # reads y while a replay writes it
        d.synchronize()
        for t in (x, y, z):
            t.free()
        g.destroy()
        cap_s.destroy(), other.destroy()
    f = only(s, "racecheck")
    a, b = f["accesses"]
    assert lines_of(a) == (THIS, rp) and a["captured_at"]["frames"][0]["line"] in (c, c + 1)
    assert "step" in a["task"] and lines_of(b) == (THIS, r)
    assert s.counts()["replays"] == 5 and tools(s) == ["racecheck"]


def test_graph_capture_replay_tests_are_clean(backend):
    """The graph module's capture/replay programs under the sanitizer report nothing (the first captures
    a read of a buffer that is written only before each replay)."""
    import test_graph
    for name in ("test_capture_does_not_run_and_replays_read_current_inputs", "test_one_replay_is_one_stream_op"):
        with sanitized(backend) as (rt, s):
            getattr(test_graph, name)(rt.device(0))
        assert s.findings == [], [f.message for f in s.findings]
        assert s.counts()["replays"] >= 1


# ---------------------------------------------------------------------------------------------- report, options
def test_report_json_and_summary():
    with sanitized(local) as (rt, s):
        d = rt.device(0)
        x = d.empty((8,))
        st = d.stream()
        st.launch("relu", [x], [x])
        st.synchronize()
        x.free()
        st.destroy()
    doc = s.report()
    assert doc["errors"] == 1 and doc["findings"][0]["tool"] == "initcheck"
    assert doc["summary"][-1] == "ERROR SUMMARY: 1 error" and doc["checked"]["tasks"] == 1
    json.dumps(doc)                                                   # serializable as is
    assert s.text.splitlines()[-1] == "========= ERROR SUMMARY: 1 error"


def test_options_parse_and_refuse_bad_values():
    assert parse_tools("racecheck, initcheck") == ("racecheck", "initcheck")
    assert parse_tools("all") == ("memcheck", "racecheck", "initcheck", "leakcheck")
    o = parse_options("error_exitcode=3:json=r.json:print_limit=5:summary=0", ("racecheck",))
    assert (o.error_exitcode, o.json, o.print_limit, o.summary, o.tools) == (3, "r.json", 5, False, ("racecheck",))
    assert from_env({}) is None and from_env({"VNPU_SANITIZE": "0"}) is None
    assert from_env({"VNPU_SANITIZE": "leakcheck"}).tools == ("leakcheck",)
    for bad in ("racechek", ""):
        with pytest.raises(InvalidParamError) as err:
            parse_tools(bad)
        assert err.value.code == ACL_ERROR_RT_PARAM_INVALID
    for bad in ("print_limit=-1", "nosuch=1", "stack_depth=x", "json"):
        with pytest.raises(InvalidParamError) as err:
            parse_options(bad)
        assert err.value.code == ACL_ERROR_RT_PARAM_INVALID


def test_off_means_no_layer():
    rt = Runtime(local())
    try:
        d = rt.device(0)
        assert rt.sanitizer is None and d.sanitizer is None and type(d.handle) is Device
    finally:
        rt.close()


# ---------------------------------------------------------------------------------------------- CLI, environment
RACY = textwrap.dedent("""
    import numpy as np
    from runtime.api import device
    d = device(0)
    x = d.from_numpy(np.ones(256, np.float32))
    y = d.empty((256,))
    a, b = d.stream(), d.stream()
    a.launch("exp", [x], [y])
    b.launch("relu", [y], [y])
    d.synchronize()
    x.free(); y.free(); a.destroy(); b.destroy()
""")
CLEAN = RACY.replace('b.launch("relu", [y], [y])', 'a.synchronize(); b.launch("relu", [y], [y])')


def _run(args, env=None, script=None, tmp_path=None):
    e = dict(os.environ, VNPU_BACKEND="local", VNPU_DEVICES="1", VNPU_HBM_BYTES=str(TEST_ARENA), PYTHONPATH=ROOT)
    e.pop("VNPU_SANITIZE", None)
    e.update(env or {})
    return subprocess.run(args, env=e, capture_output=True, text=True, timeout=240, cwd=str(tmp_path or ROOT))


def test_cli_finds_the_race_and_sets_the_exit_code(tmp_path):
    prog = tmp_path / "racy.py"
    prog.write_text(RACY)
    rep = tmp_path / "r.json"
    p = _run([sys.executable, "-m", "runtime.cli", "sanitize", "--tool", "racecheck,leakcheck", "--error-exitcode",
              "9", "--json", str(rep), "--", sys.executable, str(prog)], tmp_path=tmp_path)
    assert p.returncode == 9, p.stderr
    assert "Race reported between Write access by kernel exp" in p.stderr
    assert "========= ERROR SUMMARY: 1 error" in p.stderr
    doc = json.loads(rep.read_text())
    assert doc["errors"] == 1 and doc["exit_status"] == 0 and len(doc["processes"]) == 1
    a, b = doc["findings"][0]["accesses"]
    assert (a["site"]["frames"][0]["line"], b["site"]["frames"][0]["line"]) == (8, 9)


def test_cli_clean_program_keeps_its_exit_status(tmp_path):
    prog = tmp_path / "clean.py"
    prog.write_text(CLEAN + "\nraise SystemExit(3)\n")
    p = _run([sys.executable, "-m", "runtime.cli", "sanitize", "--error-exitcode", "9", "--", sys.executable,
              str(prog)], tmp_path=tmp_path)
    assert p.returncode == 3, p.stderr
    assert "========= ERROR SUMMARY: 0 errors" in p.stderr and "Race" not in p.stderr


@pytest.mark.parametrize("args", [["--tool", "racechek"], ["--error-exitcode", "-1"], ["--stack-depth", "0"], []])
def test_cli_bad_flags_exit_2(args):
    p = _run([sys.executable, "-m", "runtime.cli", "sanitize"] + args + (["--", "true"] if args else []))
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith("vnpu sanitize: error:")
    assert "Traceback" not in p.stderr


def test_environment_variable_alone(tmp_path):
    """Any runtime client: VNPU_SANITIZE turns it on; the process reports at exit, writes its JSON and
    exits with error_exitcode."""
    prog = tmp_path / "racy.py"
    prog.write_text(RACY)
    rep = tmp_path / "env.json"
    p = _run([sys.executable, str(prog)], tmp_path=tmp_path,
             env={"VNPU_SANITIZE": "racecheck", "VNPU_SANITIZE_OPTIONS": f"error_exitcode=5:json={rep}"})
    assert p.returncode == 5, p.stderr
    assert "Race reported between" in p.stderr and "ERROR SUMMARY: 1 error" in p.stderr
    assert json.loads(rep.read_text())["errors"] == 1
    bad = _run([sys.executable, "-c", "from runtime.api import device; device(0)"],
               env={"VNPU_SANITIZE": "nonsense"})
    assert bad.returncode != 0 and "unknown sanitizer tool" in bad.stderr


def test_threads_share_the_host_clock():
    """Two host threads issuing on their own streams, each synchronizing its own stream before reading:
    nothing races (the host is one agent)."""
    with sanitized(local, tools=("racecheck",)) as (rt, s):
        d = rt.device(0)
        errs = []

        def work(k):
            try:
                st = d.stream()
                x = d.from_numpy(np.full(64, k, np.float32))
                for _ in range(5):
                    st.launch("add_scalar", [x], [x], attrs={"value": 1.0})
                    x.numpy(st)
                x.free()
                st.destroy()
            except Exception as e:  # noqa: BLE001
                errs.append(e)
        ts = [threading.Thread(target=work, args=(k,)) for k in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert not errs
    assert s.findings == []
