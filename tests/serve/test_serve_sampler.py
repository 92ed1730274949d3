"""The server's sampler and history routes on a live server (serve tier): SmolLM2 on device 0 served on
loopback, driven by the official ``openai`` client and plain HTTP; the sampler ticks on explicit times.

- Request outcomes: served requests count in qps and latency, a 400 and a 429 do not count as errors (the
  429 is shed), a failed task (fault ``task-fail``) is a 500 and an error -- and the engine keeps serving.
  The latency percentiles are bounded by what the client measured (an independent clock).
- Device metrics per device scope; a device that overheats or hangs is a ``fault`` event, and a ``recovery``
  event (with the time since its fault) once it is healthy again.
- ``/admin/history/*`` return what the History holds (admin only; unknown metric 400); ``POST /admin/events``
  records an operator's event; an admin throttle through the routes is a manual intervention.
- ``server.json``: mode 0600, names this process, a stale one (dead or zombie pid) reads as none, removal
  only by its owner; it holds url, pid and history, never a key.
"""
from __future__ import annotations

import asyncio
import os
import stat
import threading
import time
import urllib.parse
import urllib.request

import openai
import pytest

from devices import procstat
from devices.device import DeviceConfig
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.observe.metrics_store import History
from runtime.observe import serverfile
from runtime.serve.api.longpoll import LongPolls
from runtime.serve.api.longpoll import MAX_HISTORY_WAIT_S
from runtime.serve.config import model_spec
from runtime.serve.engine import EngineConfig
from runtime.serve.engine.placement import Placement
from runtime.serve.metrics_sampler import Sampler, percentile
from runtime.serve.server import Server, Service
from runtime.serve.tenants import Quota, Tenant, key_digest
from serve_http import call

pytestmark = pytest.mark.serve

ADMIN, USER, TINY = "sk-ops-0123456789", "sk-app-0123456789", "sk-tiny-0123456789"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    rt = Runtime(LocalBackend(2, DeviceConfig(arena_bytes=1 << 30)))
    spec = model_spec("smollm2", (0,), 1, EngineConfig(max_num_seqs=2, max_num_batched_tokens=32, max_model_len=64,
                                                       num_gpu_blocks_override=16),
                      fallback=(Placement((1,)),))
    tenants = (Tenant("ops", (key_digest(ADMIN),), admin=True), Tenant("app", (key_digest(USER),)),
               Tenant("tiny", (key_digest(TINY),), quota=Quota(tokens_per_minute=40)))
    svc = Service(rt, (spec,), tenants)
    hist = History(tmp_path_factory.mktemp("hist") / "history.sqlite")
    sampler = Sampler(svc, hist, rt)                  # no thread: the test ticks
    srv = Server(svc).start()
    try:
        svc.load()
        yield rt, srv, sampler, hist
    finally:
        srv.stop()
        hist.close()
        rt.close()


def http(srv, path, body=None, key=ADMIN, method=None, timeout=120.0):
    return call(srv.url, path, key, body, method, timeout)


def long_polls(srv) -> int:
    """The history long polls the server has parked (checked, no newer sample yet): ``/admin/state``."""
    return http(srv, "/admin/state")[1]["history_long_polls"]


def parked(srv, n: int, what: str) -> None:
    """Wait (the server's own wait: ``/admin/state?long_polls=N&wait_s=S``) until ``n`` polls are parked."""
    st, body = http(srv, f"/admin/state?long_polls={n}&wait_s=20")
    assert st == 200 and body["history_long_polls"] >= n, f"timed out waiting for {what}: {body}"


def start_poll(srv, query: str, got: dict, key) -> threading.Thread:
    th = threading.Thread(target=lambda: got.__setitem__(key, http(srv, f"/admin/history/latest?{query}")),
                          daemon=True)
    th.start()
    return th


def complete(srv, key=USER, max_tokens=4):
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0)
    t0 = time.monotonic()
    c.completions.create(model="smollm2", prompt="Hello there", max_tokens=max_tokens, temperature=0)
    return time.monotonic() - t0


def test_percentile_is_nearest_rank():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 99) != percentile([], 99)            # NaN


def test_outcomes_latency_and_shed_are_counted_apart(served):
    rt, srv, sampler, hist = served
    sampler.tick(1000.0)                                       # start a fresh window
    lat = [complete(srv) for _ in range(3)]
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key=USER, max_retries=0)
    with pytest.raises(openai.BadRequestError):                # a client error: not an error, not shed
        c.completions.create(model="smollm2", prompt="x", max_tokens=4, temperature=5)
    tiny = openai.OpenAI(base_url=srv.url + "/v1", api_key=TINY, max_retries=0)
    for _ in range(3):                                         # 40 tokens a minute; each asks for more: shed
        with pytest.raises(openai.RateLimitError):
            tiny.completions.create(model="smollm2", prompt="Hello there", max_tokens=60, temperature=0)
    server, devices = sampler.tick(1002.0)
    assert server["qps"] == pytest.approx(3 / 2.0)
    assert hist.samples("qps", 1002.0, 1002.0, "model:smollm2") == [(1002.0, pytest.approx(3 / 2.0))]  # per model
    assert server["error_rate"] == 0.0
    assert server["shed_rate"] == pytest.approx(3 / 7)
    assert 0 < server["p50_latency_ms"] <= server["p95_latency_ms"] <= server["p99_latency_ms"]
    assert server["p99_latency_ms"] <= max(lat) * 1e3                # the server's clock runs inside the client's
    assert server["ttft_p99_ms"] > 0
    assert (server["throttle"], server["replicas"], server["queue_depth"]) == (1.0, 1, 0)
    assert set(devices) == {0, 1} and devices[0]["device_health"] == 0
    assert devices[0]["hbm_used_bytes"] > devices[1]["hbm_used_bytes"]          # the model lives on device 0
    assert hist.samples("qps", since=1002, until=1002) == [(1002.0, server["qps"])]
    assert hist.latest("npu:0")["hbm_used_bytes"] == (1002.0, float(devices[0]["hbm_used_bytes"]))


def test_a_failed_task_is_a_server_error_and_the_engine_keeps_serving(served):
    rt, srv, sampler, hist = served
    sampler.tick(1010.0)
    rt.device(0).handle.inject_fault("task-fail", count=1)
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key=USER, max_retries=0)
    with pytest.raises(openai.InternalServerError):
        c.completions.create(model="smollm2", prompt="Hello there", max_tokens=4, temperature=0)
    complete(srv)                                              # the next one is served on the same placement
    server, _ = sampler.tick(1011.0)
    assert server["error_rate"] == pytest.approx(0.5)
    (ev,) = hist.events(since=1011, kinds=["fault"])
    assert ev.source == "engine" and ev.diagnosis == "smollm2: 1 step(s) failed on npu 0 (their requests failed)"
    eng = srv.service.engines["smollm2"]
    assert eng.failed_steps == 1 and eng.index == 0 and eng.error is None


def test_an_overheating_device_is_sampled_and_a_fault_event(served):
    rt, srv, sampler, hist = served
    sampler.tick(1020.0)
    n0 = len(hist.events(kinds=["fault"]))
    rt.device(1).handle.inject_fault("overheat", celsius=60)
    try:
        _, devices = sampler.tick(1021.0)
        assert devices[1]["device_temperature_c"] > 85 and devices[1]["device_health"] >= 2
        assert devices[0]["device_temperature_c"] < 85
        faults = hist.events(kinds=["fault"])[n0:]
        assert [e.source for e in faults] == ["npu:1"] and "temperature" in faults[0].diagnosis
        sampler.tick(1022.0)                                   # still hot: no second event
        assert len(hist.events(kinds=["fault"])) == n0 + 1
    finally:
        rt.device(1).handle.clear_fault("overheat")
    r0 = len(hist.events(kinds=["recovery"]))
    _, devices = sampler.tick(1023.0)
    assert devices[1]["device_health"] == 0
    rec = hist.events(kinds=["recovery"])[r0:]                 # cooled down: a recovery, 2 s after its fault
    assert [e.source for e in rec] == ["npu:1"] and rec[0].result == "ok"
    assert rec[0].duration_s == pytest.approx(2.0) and rec[0].detail["fault_event"] == faults[0].id
    assert "device 1 is OK again" in rec[0].diagnosis
    sampler.tick(1024.0)
    assert len(hist.events(kinds=["recovery"])) == r0 + 1       # healthy stays quiet


def test_a_hang_that_clears_is_a_fault_then_a_recovery(served):
    """A hang detected by the sampler (the device's heartbeats stop) and cleared by itself later is a
    ``fault`` then a ``recovery`` event with the time between them -- what ``vnpu stress-test`` reports as
    the fault's detection and recovery."""
    rt, srv, sampler, hist = served
    sampler.tick(1025.0)
    f0, r0 = len(hist.events(kinds=["fault"])), len(hist.events(kinds=["recovery"]))
    rt.device(1).handle.inject_fault("hang")
    try:
        _, devices = sampler.tick(1026.0)
        assert devices[1]["device_health"] >= 2
        faults = hist.events(kinds=["fault"])[f0:]
        assert [e.source for e in faults] == ["npu:1"] and "hang" in faults[0].diagnosis
        sampler.tick(1027.5)
        assert len(hist.events(kinds=["recovery"])) == r0
    finally:
        rt.device(1).handle.clear_fault("hang")
    _, devices = sampler.tick(1029.0)
    assert devices[1]["device_health"] == 0
    rec = hist.events(kinds=["recovery"])[r0:]
    assert [e.source for e in rec] == ["npu:1"] and rec[0].detail["fault_event"] == faults[0].id
    assert rec[0].duration_s == pytest.approx(3.0) and rec[0].detail["previous"] != "OK"


def test_history_routes_read_what_the_history_holds(served):
    rt, srv, sampler, hist = served
    sampler.tick(1030.0)
    st, body = http(srv, "/admin/history/samples?metric=qps&since=1000&until=1030")
    assert st == 200 and body["metric"] == "qps" and body["scope"] == ""
    assert [tuple(p) for p in body["points"]] == hist.samples("qps", 1000, 1030)
    st, body = http(srv, "/admin/history/samples?" + urllib.parse.urlencode(
        {"metric": "device_temperature_c", "scope": "npu:1", "since": 1020, "until": 1023}))
    assert st == 200 and [tuple(p) for p in body["points"]] == hist.samples("device_temperature_c", 1020, 1023,
                                                                             "npu:1")
    assert http(srv, "/admin/history/samples?metric=qpz")[0] == 400
    assert http(srv, "/admin/history/samples?metric=qps", key=USER)[0] == 403
    assert http(srv, "/admin/history/latest", key="sk-nobody-000000000")[0] == 401
    st, latest = http(srv, "/admin/history/latest")
    assert st == 200 and latest["server"]["qps"] == list(hist.latest()["qps"])
    assert set(latest["devices"]) == {"npu:0", "npu:1"}
    assert latest["devices"]["npu:1"]["device_health"] == list(hist.latest("npu:1")["device_health"])
    st, body = http(srv, "/admin/events", {"kind": "manual", "diagnosis": "stress-test started",
                                           "detail": {"profile": "burst"}})
    assert st == 200
    ev = hist.event(body["id"])
    assert (ev.kind, ev.manual, ev.diagnosis, ev.detail, ev.source) == \
        ("manual", True, "stress-test started", {"profile": "burst"}, "admin ops")
    assert http(srv, "/admin/events", {"kind": "gossip"})[0] == 400
    assert http(srv, "/admin/events", {"kind": "manual"}, key=USER)[0] == 403
    assert http(srv, "/admin/throttle", {"factor": 0.5})[0] == 200
    assert http(srv, "/admin/throttle", {"factor": 1.0})[0] == 200
    st, body = http(srv, "/admin/history/events?kinds=manual,fault&limit=3")
    evs = body["events"]
    assert st == 200 and len(evs) == 3 and [e["diagnosis"] for e in evs[-2:]] == ["throttle to 0.5",
                                                                                  "throttle to 1"]
    assert all(e["manual"] for e in evs[-2:]) and evs == [e.to_dict() for e in hist.events(kinds=["manual", "fault"],
                                                                                          limit=3)]
    assert http(srv, "/admin/history/events?limit=0")[0] == 400


def test_latest_is_a_long_poll_for_the_next_sample(served):
    """``GET /admin/history/latest?after=T&wait_s=S``: a request waiting for a sample newer than T answers with
    the one the next tick records; with a newer one already there it answers at once (a client deadline far
    below S), and when S passes without one it answers with the newest samples as they are.  A wait_s out of
    (0, 20] or ``after`` without ``wait_s``: 400."""
    rt, srv, sampler, hist = served
    sampler.tick(1040.0)
    t = hist.latest()["qps"][0]
    assert t == 1040.0
    got: dict = {}
    waiter = start_poll(srv, f"after={t}&wait_s=20", got, "r")
    parked(srv, 1, "the parked long poll")                      # the tick comes once the poll waits
    sampler.tick(1041.0)
    waiter.join(10.0)            # far below wait_s (20 s): answered because the tick woke it, not at its deadline
    assert not waiter.is_alive() and long_polls(srv) == 0
    st, body = got["r"]
    assert st == 200 and body["server"]["qps"] == list(hist.latest()["qps"]) and body["server"]["qps"][0] == 1041.0
    assert body["devices"]["npu:1"]["device_health"][0] == 1041.0
    st, body = http(srv, f"/admin/history/latest?after={t}&wait_s=20", timeout=15.0)        # 1041 > t: at once
    assert st == 200 and body["server"]["qps"][0] == 1041.0
    st, body = http(srv, "/admin/history/latest?after=1041&wait_s=0.05")                    # none newer
    assert st == 200 and body["server"]["qps"][0] == 1041.0
    for q in ("wait_s=0", "wait_s=-1", "wait_s=21", "after=1041", "wait_s=nan"):
        st, body = http(srv, f"/admin/history/latest?{q}")
        assert st == 400, (q, st, body)
    for q in ("long_polls=1", "wait_s=1", "long_polls=-1&wait_s=1", "long_polls=1&wait_s=0",
              "long_polls=1&wait_s=21", "long_polls=1&wait_s=nan"):          # the state's wait for parked polls
        st, body = http(srv, f"/admin/state?{q}")
        assert st == 400, (q, st, body)
    st, body = http(srv, "/admin/state?long_polls=1&wait_s=0.05")         # none parked: answers after S
    assert st == 200 and body["history_long_polls"] == 0
    for after in ("nan", "inf", "-inf", "Infinity"):        # a time no sample is newer than: refused, not a silent wait
        st, body = http(srv, f"/admin/history/latest?after={after}&wait_s=20", timeout=15.0)
        assert st == 400 and body["error"]["param"] == "after", (after, st, body)
        msg = body["error"]["message"]
        assert msg.startswith("after must be a finite time") and "\n" not in msg
    assert http(srv, "/admin/history/latest?wait_s=1", key=USER)[0] == 403


def test_long_polls_hold_no_executor_thread(served):
    """More long polls in flight than the event loop's default executor has threads (ThreadPoolExecutor's
    default size, min(32, cpus + 4)): ``/metrics`` and an admin action (both run on that executor) still
    answer -- while every poll is still parked -- and the next tick answers all the polls."""
    rt, srv, sampler, hist = served
    sampler.tick(1050.0)
    n = min(32, (os.cpu_count() or 1) + 4) + 2
    got: dict = {}
    polls = [start_poll(srv, f"after=1050&wait_s={MAX_HISTORY_WAIT_S:g}", got, i) for i in range(n)]
    try:
        parked(srv, n, f"{n} parked long polls")
        req = urllib.request.Request(srv.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"})
        with urllib.request.urlopen(req, timeout=120.0) as r:
            assert r.status == 200 and b"vnpu:" in r.read()
        assert http(srv, "/admin/throttle", {"factor": 1.0})[0] == 200
        # both answered before any poll did: no sample newer than 1050 exists yet, so no poll can have ended
        assert all(p.is_alive() for p in polls) and not got and long_polls(srv) == n
    finally:
        sampler.tick(1051.0)
        for p in polls:
            p.join(60.0)
    assert not any(p.is_alive() for p in polls)
    assert sorted(got) == list(range(n)) and all(st == 200 and b["server"]["qps"][0] == 1051.0
                                                 for st, b in got.values())


def test_long_polls_end_on_a_tick_on_close_and_on_a_closed_history():
    """``LongPolls`` on its own event loop: a parked poll (``waiting``) returns True on a newer tick, False
    when the polls are closed or the history is; once closed, a new poll returns at once.  Every wait here
    would take 20 s unless something ended it; the 10 s bound only has to be far below that."""
    async def parked(polls, h, after):
        task = asyncio.ensure_future(polls.wait_newer(h, after, 20.0))
        assert await polls.parked(1, 30.0) and not task.done(), "the poll never parked"
        return task

    async def main():
        h = History(":memory:")
        polls = LongPolls()
        t = await parked(polls, h, None)
        h.record_samples(5.0, {"qps": 1.0})                       # from this thread: the loop is woken all the same
        woken_by_tick = await asyncio.wait_for(t, 10.0)
        t = await parked(polls, h, 5.0)
        h.close()
        ended_by_history_close = await asyncio.wait_for(t, 10.0)
        h2 = History(":memory:")
        t = await parked(polls, h2, None)
        polls.close()
        ended_by_close = await asyncio.wait_for(t, 10.0)
        after_close = await asyncio.wait_for(polls.wait_newer(h2, None, 20.0), 10.0)
        return woken_by_tick, ended_by_history_close, ended_by_close, after_close, polls.waiting(), h2.waiters()
    assert asyncio.run(main()) == (True, False, False, False, 0, 0)


def test_a_stop_ends_the_long_polls_in_flight(tmp_path):
    """``Server.stop`` with a long poll in flight (``wait_s`` = the maximum, 20 s) returns at once: the poll
    answers (200, the newest samples -- none here) instead of holding uvicorn's graceful shutdown for its
    wait.  The bound below (10 s) is no speed claim: it only has to be far below the poll's 20 s, which a
    stop that waited for the poll would take; a stop that ends it takes well under a second."""
    rt = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 26)))
    spec = model_spec("smollm2", (0,), 1, EngineConfig(max_num_seqs=1, max_num_batched_tokens=32, max_model_len=64,
                                                       num_gpu_blocks_override=8))
    svc = Service(rt, (spec,), (Tenant("ops", (key_digest(ADMIN),), admin=True),))
    hist = History(":memory:")
    Sampler(svc, hist, rt)                           # no thread, no tick: no sample will come
    srv = Server(svc).start()
    got: dict = {}
    stopped = threading.Event()
    try:
        poll = start_poll(srv, f"wait_s={MAX_HISTORY_WAIT_S:g}", got, "r")
        parked(srv, 1, "the parked long poll")
        stopper = threading.Thread(target=lambda: (srv.stop(), stopped.set()), daemon=True)
        stopper.start()
        assert stopped.wait(10.0), "Server.stop waited for the long poll"
        poll.join(10.0)
        assert not poll.is_alive() and got["r"] == (200, {"server": {}, "devices": {}})
    finally:
        if not stopped.is_set():
            stopped.wait(60.0)
        hist.close()
        rt.close()


def test_server_file_is_private_names_its_process_and_goes_away(tmp_path):
    p = serverfile.write(tmp_path, "http://127.0.0.1:1234", str(tmp_path / "h.sqlite"))
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert serverfile.read(tmp_path) == {"url": "http://127.0.0.1:1234", "pid": os.getpid(),
                                         "history": str(tmp_path / "h.sqlite"),
                                         "start_time": procstat.start_time(os.getpid())}
    serverfile.remove(tmp_path, pid=os.getpid() + 1)           # not its owner: left alone
    assert p.exists()
    serverfile.remove(tmp_path)
    assert not p.exists() and serverfile.read(tmp_path) is None
    import subprocess
    import sys
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    serverfile.write(tmp_path, "http://127.0.0.1:1", None, pid=int(dead.stdout))
    assert serverfile.read(tmp_path) is None                  # its process is gone
    p.write_text("{not json")
    assert serverfile.read(tmp_path) is None


def test_server_file_holds_no_key_and_a_zombie_server_is_gone(tmp_path):
    """The file has the url, pid and history and nothing else (no credential is ever written, and a key
    put there by hand is not handed on); a server process that exited but is not reaped yet (a zombie)
    counts as gone, as a dead one does."""
    import json
    import select
    import subprocess
    import sys
    p = serverfile.write(tmp_path, "http://127.0.0.1:1234", None)
    assert set(json.loads(p.read_text())) == {"url", "pid", "history", "start_time"} == set(serverfile.FIELDS)
    me = procstat.start_time(os.getpid())
    p.write_text(json.dumps({"url": "http://127.0.0.1:1234", "pid": os.getpid(), "history": None,
                             "start_time": me, "admin_key": "sk-planted-0123456789"}))
    assert serverfile.read(tmp_path) == {"url": "http://127.0.0.1:1234", "pid": os.getpid(), "history": None,
                                         "start_time": me}
    for bad in (True, 0, -1, "1", None):
        p.write_text(json.dumps({"url": "http://127.0.0.1:1234", "pid": bad, "history": None}))
        assert serverfile.read(tmp_path) is None, bad
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    fd = os.pidfd_open(child.pid)
    try:
        serverfile.write(tmp_path, "http://127.0.0.1:1", None, pid=child.pid)
        assert select.select([fd], [], [], 60)[0], "the child did not exit"     # exited, not reaped yet
        assert procstat.state(child.pid) == "Z"                                  # a zombie indeed
        assert serverfile.read(tmp_path) is None
    finally:
        os.close(fd)
        child.wait()
