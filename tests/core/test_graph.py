"""Stream capture and replay (aclmdlRI / "aclgraph") on both backends (``rt`` fixture): captured ops do
not run until replayed, replays read the current contents of device memory, one replay is one stream op,
and every misuse gets its CANN code while the stream and the device keep working."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from devices.arena import ptr_offset
from devices.errors import (ACL_ERROR_RT_AICORE_EXCEPTION, ACL_ERROR_RT_PARAM_INVALID, AclError, CaptureError,
                            InvalidHandleError, InvalidParamError, KernelError, MemoryAccessError)
from devices.kernel import TensorDesc, register_user_kernel
from devices.tasks import ExecGraph, Launch
from fp32 import assert_within, matmul_bound
from runtime.api import Runtime
from runtime.graph import CAPTURE_MODE_RELAXED, CAPTURE_STATUS_ACTIVE, CAPTURE_STATUS_INVALIDATED, CAPTURE_STATUS_NONE

SYNC_MS = 20_000


@pytest.fixture
def dev(rt):
    d = rt.device(0)
    yield d
    d.abort_captures()                    # a failed test leaves no open capture behind


def _mlp_graph(dev, s, a, w, b, h, out):
    s.begin_capture()
    s.launch("matmul", [a, w], [h])
    s.launch("add", [h, b], [out])
    s.launch("relu", [out], [out])
    return s.end_capture()


def test_capture_does_not_run_and_replays_read_current_inputs(dev):
    rng = np.random.default_rng(0)
    s = dev.stream()
    wn, bn = rng.standard_normal((8, 5), dtype=np.float32), rng.standard_normal((5,), dtype=np.float32)
    a, w, b = dev.empty((3, 8)), dev.from_numpy(wn), dev.from_numpy(bn)
    h, out = dev.empty((3, 5)), dev.empty((3, 5))
    out.copy_from(np.full((3, 5), 7.0, np.float32))
    g = _mlp_graph(dev, s, a, w, b, h, out)
    try:
        s.synchronize(SYNC_MS)
        assert np.all(out.numpy() == 7.0), "captured ops must not run at capture"
        assert g.num_tasks == 3
        for i in range(4):
            an = rng.standard_normal((3, 8), dtype=np.float32)
            a.copy_from(an)
            g.execute_async(s)
            s.synchronize(SYNC_MS)
            exact = np.maximum(an.astype(np.float64) @ wn + bn, 0)          # relu keeps the matmul's bound
            assert_within(out.numpy(), exact, matmul_bound(an, wn, bn))
        info = g.info()
        assert [st["name"] for st in info["steps"]] == ["matmul", "add", "relu"]
        assert info["replays"] == 4
        g.execute(SYNC_MS)                           # the blocking form, on the default stream
        assert g.info()["replays"] == 5
    finally:
        g.destroy()
        for t in (a, w, b, h, out):
            t.free()
        s.destroy()


def test_one_replay_is_one_stream_op(dev):
    s = dev.stream()
    x = dev.from_numpy(np.zeros(16, np.float32))
    s.begin_capture()
    for _ in range(100):
        s.launch("add", [x, x], [x])
    g = s.end_capture()
    try:
        x.copy_from(np.ones(16, np.float32))
        before = dev.queue.ops_sent
        g.execute_async(s)
        s.synchronize(SYNC_MS)
        assert dev.queue.ops_sent - before == 1
        np.testing.assert_array_equal(x.numpy(), np.full(16, 2.0 ** 100, np.float32))
    finally:
        g.destroy()
        x.free()
        s.destroy()


def test_capture_state_errors(dev):
    s = dev.stream()
    x = dev.from_numpy(np.arange(4, dtype=np.float32))
    try:
        assert s.capture_status() == CAPTURE_STATUS_NONE
        with pytest.raises(CaptureError) as e:
            s.end_capture()
        assert e.value.code == 107029
        s.begin_capture()
        assert s.capture_status() == CAPTURE_STATUS_ACTIVE
        with pytest.raises(CaptureError) as e:
            s.begin_capture()
        assert e.value.code == 107027
        for call in (lambda: s.synchronize(SYNC_MS), s.query, lambda: dev.synchronize(SYNC_MS)):
            with pytest.raises(CaptureError) as e:
                call()
            assert e.value.code == 107027
        other = dev.stream()                         # other streams work as usual
        other.launch("add", [x, x], [x])
        other.synchronize(SYNC_MS)
        np.testing.assert_array_equal(x.numpy(other), np.arange(4) * 2.0)   # a stream-ordered read
        other.destroy()
        g = s.end_capture()                          # an empty capture is a valid (empty) graph
        g.execute_async(s)
        s.synchronize(SYNC_MS)
        g.destroy()
        with pytest.raises(InvalidHandleError):
            g.execute_async(s)
    finally:
        x.free()
        s.destroy()


def test_failed_call_invalidates_capture(dev):
    s = dev.stream()
    x, y = dev.from_numpy(np.ones(4, np.float32)), dev.empty((5,))
    try:
        s.begin_capture()
        s.launch("add", [x, x], [x])
        with pytest.raises(InvalidParamError):
            s.launch("add", [x, x], [y])             # shape mismatch: raised now, capture invalidated
        assert s.capture_status() == CAPTURE_STATUS_INVALIDATED
        with pytest.raises(CaptureError) as e:
            s.end_capture()
        assert e.value.code == 507903
        s.begin_capture()
        with pytest.raises(CaptureError) as e:
            s.write(x.ptr, b"\0" * 16)               # pageable host data cannot be captured
        assert e.value.code == 107030
        with pytest.raises(CaptureError) as e:
            s.end_capture()
        assert e.value.code == 507903
        s.launch("add", [x, x], [x])                 # the stream is usable, nothing captured ran
        s.synchronize(SYNC_MS)
        np.testing.assert_array_equal(x.numpy(), np.full(4, 2.0, np.float32))
    finally:
        x.free()
        y.free()
        s.destroy()


def test_capture_block_and_a_block_that_raises(dev):
    s = dev.stream()
    x = dev.from_numpy(np.ones(4, np.float32))
    try:
        with s.capture() as cap:
            s.launch("add", [x, x], [x])
        with cap.graph as g:
            g.execute_async(s)
            g.execute_async(s)
            s.synchronize(SYNC_MS)
        np.testing.assert_array_equal(x.numpy(), np.full(4, 4.0, np.float32))
        with pytest.raises(InvalidHandleError):
            g.execute_async(s)                       # the with block destroyed it
        with pytest.raises(ZeroDivisionError):
            with s.capture():
                s.launch("add", [x, x], [x])
                1 / 0
        assert s.capture_status() == CAPTURE_STATUS_NONE   # closed, nothing kept
        s.synchronize(SYNC_MS)
        np.testing.assert_array_equal(x.numpy(), np.full(4, 4.0, np.float32))
    finally:
        x.free()
        s.destroy()


def test_thread_rules(dev):
    s = dev.stream()
    x = dev.from_numpy(np.ones(4, np.float32))
    box = {}

    def end_elsewhere():
        try:
            box["g"] = s.end_capture()
        except AclError as e:
            box["err"] = e

    try:
        s.begin_capture()
        s.launch("add", [x, x], [x])
        t = threading.Thread(target=end_elsewhere)
        t.start()
        t.join(SYNC_MS / 1000)
        assert box["err"].code == 107038
        s.end_capture().destroy()
        s.begin_capture(CAPTURE_MODE_RELAXED)
        s.launch("add", [x, x], [x])
        dev.synchronize(SYNC_MS)                     # relaxed: device-wide synchronize is allowed
        t = threading.Thread(target=end_elsewhere)
        t.start()
        t.join(SYNC_MS / 1000)
        g = box["g"]
        g.execute(SYNC_MS)
        np.testing.assert_array_equal(x.numpy(), np.full(4, 2.0, np.float32))
        g.destroy()
    finally:
        x.free()
        s.destroy()


def test_replay_errors_surface_at_synchronize_and_lose_nothing(dev):
    s = dev.stream()
    table = dev.from_numpy(np.arange(12, dtype=np.float32).reshape(6, 2))
    ids, out = dev.from_numpy(np.array([1, 4], np.int32)), dev.empty((2, 2))
    keep = dev.from_numpy(np.full(8, 3.0, np.float32))
    s.begin_capture()
    s.launch("embedding", [table, ids], [out])
    g = s.end_capture()
    try:
        g.execute_async(s)
        s.synchronize(SYNC_MS)
        np.testing.assert_array_equal(out.numpy(), np.arange(12, dtype=np.float32).reshape(6, 2)[[1, 4]])
        ids.copy_from(np.array([1, 9], np.int32))    # an id past the table: the replay fails on device
        g.execute_async(s)
        with pytest.raises(AclError) as ei:
            s.synchronize(SYNC_MS)
        assert ei.value.code == ACL_ERROR_RT_AICORE_EXCEPTION, ei.value
        ids.copy_from(np.array([5, 0], np.int32))
        g.execute_async(s)
        s.synchronize(SYNC_MS)
        np.testing.assert_array_equal(out.numpy()[:, 0], [10.0, 0.0])
        np.testing.assert_array_equal(keep.numpy(), np.full(8, 3.0, np.float32))
    finally:
        g.destroy()
        for t in (table, ids, out, keep):
            t.free()
        s.destroy()


# ---------------------------------------------------------------------------------------------- free after use
# Two layers revalidate a launch or a replay after memory was freed: the runtime on the host (its launch
# check cache and graph ranges, keyed on the allocation table's generation) and the device (its launch
# plans, bound views and graph bindings, keyed on the arena's generation).  Each is tested on its own: the
# host ones through the runtime, the device ones by sending past the host through the device handle.

def test_free_after_use_the_host_refuses_launch_and_replay_before_sending(rt):
    """The runtime's own checks: a launch whose cached check predates a free raises 107000 at the call, a
    replay of a graph that names freed memory is not sent and its 107000 surfaces at the next flush;
    nothing reaches the device.  (A runtime that
    batches launches: what the host accepts waits in its queue, so a refusal by the device would only
    show at the flush.)"""
    dev = Runtime(rt.backend, batch_size=64).device(0)
    s = dev.stream()
    x = dev.from_numpy(np.ones(64, np.float32))
    d = TensorDesc(x.ptr, (64,), "float32")
    s.launch("add", [d, d], [d])                   # checked on the host, and the check is cached
    s.begin_capture()
    s.launch("add", [d, d], [d])
    g = s.end_capture()
    try:
        g.execute_async(s)                         # a replay, then an eager launch: both ran
        s.synchronize(SYNC_MS)
        np.testing.assert_array_equal(x.numpy(), np.full(64, 4.0, np.float32))
        replays = g.info()["replays"]
        x.free()
        dev.flush()
        sent = dev.queue.ops_sent
        with pytest.raises(MemoryAccessError) as e:
            s.launch("add", [d, d], [d])           # the same launch: its cached check is stale now
        assert e.value.code == ACL_ERROR_RT_PARAM_INVALID and "freed" in e.value.detail
        g.execute_async(s)                         # refused on the host; like every replay error, it
        with pytest.raises(MemoryAccessError) as e:  # surfaces at the next flush / synchronize
            dev.flush()
        assert e.value.code == ACL_ERROR_RT_PARAM_INVALID and "freed" in e.value.detail
        dev.flush()
        assert dev.queue.ops_sent == sent          # nothing was sent
        assert g.info()["replays"] == replays      # and the device replayed nothing
        y = dev.from_numpy(np.ones(4, np.float32))   # the stream and device keep working
        s.launch("add", [y, y], [y])
        s.synchronize(SYNC_MS)
        np.testing.assert_array_equal(y.numpy(), np.full(4, 2.0, np.float32))
        y.free()
    finally:
        g.destroy()
        s.destroy()


def _raw(dev, arr: np.ndarray) -> int:
    """A raw driver allocation holding ``arr`` (tensors come from the caching pool, whose frees the device
    never sees: the device-side layers are tested on what the driver frees)."""
    ptr = dev.malloc(arr.nbytes)
    dev.memcpy_h2d(ptr, arr)
    return ptr


def test_free_after_use_the_device_refuses_a_launch_sent_past_the_host(dev):
    """The device's launch plans are cached per distinct launch: after a free, the same launch is
    validated again when it arrives and refused at submit (host-synchronous)."""
    h, s = dev.handle, dev.stream()
    ptr = _raw(dev, np.ones(64, np.float32))
    d = TensorDesc(ptr, (64,), "float32")
    op = Launch(s.sid, "add", (d, d), (d,))
    try:
        dev.flush()
        h.submit([op])                             # the device plans it and caches the plan
        h.synchronize_stream(s.sid, SYNC_MS)
        dev.free(ptr)
        with pytest.raises(AclError) as e:
            h.submit([op])
        assert e.value.code == ACL_ERROR_RT_PARAM_INVALID, e.value
        h.synchronize_stream(s.sid, SYNC_MS)       # nothing was queued: nothing fails
    finally:
        s.destroy()


def test_free_after_use_the_device_refuses_a_replay_sent_past_the_host(dev):
    """A replay after a free validates the whole graph again before its first step: a graph that names
    freed memory fails with 107000 and none of its steps runs (the live buffer it writes is untouched)."""
    h, s = dev.handle, dev.stream()
    keep = dev.from_numpy(np.full(64, 5.0, np.float32))
    ptr = _raw(dev, np.ones(64, np.float32))
    x = TensorDesc(ptr, (64,), "float32")
    s.begin_capture()
    s.launch("add", [keep, keep], [keep])          # step 1: a live buffer
    s.launch("add", [x, x], [x])                   # step 2: the one that will be freed
    g = s.end_capture()
    try:
        g.execute_async(s)
        s.synchronize(SYNC_MS)
        np.testing.assert_array_equal(keep.numpy(), np.full(64, 10.0, np.float32))
        dev.free(ptr)
        dev.flush()
        h.submit([ExecGraph(s.sid, g.gid)])        # past the host's own check
        with pytest.raises(AclError) as e:
            h.synchronize_stream(s.sid, SYNC_MS)
        assert e.value.code == ACL_ERROR_RT_PARAM_INVALID, e.value
        np.testing.assert_array_equal(keep.numpy(), np.full(64, 10.0, np.float32))   # step 1 did not run
    finally:
        g.destroy()
        keep.free()
        s.destroy()


def test_free_after_use_a_queued_launch_is_refused_when_it_runs(dev):
    """A launch accepted while its memory was live, then freed before it runs (it waits behind a gate):
    the bound views of its plan are checked again when it runs -- 107000, and the freed bytes keep what
    they held."""
    s = dev.stream()
    ptr = _raw(dev, np.ones(64, np.float32))
    x = TensorDesc(ptr, (64,), "float32")
    s.launch("add", [x, x], [x])
    s.synchronize(SYNC_MS)                         # planned, views bound: x = 2
    gate = threading.Event()
    s.launch_host_func(lambda: gate.wait(SYNC_MS / 1000), blocking=True)
    s.launch("add", [x, x], [x])                   # accepted: x is live
    dev.flush()
    dev.free(ptr)
    gate.set()
    with pytest.raises(AclError) as e:
        s.synchronize(SYNC_MS)
    assert e.value.code == ACL_ERROR_RT_PARAM_INVALID, e.value
    arena = getattr(dev.handle, "arena", None)     # in-process: look at the freed bytes themselves
    if arena is not None:
        off = ptr_offset(ptr)
        assert arena.buf[off:off + 256].view(np.float32).tolist() == [2.0] * 64
    y = dev.from_numpy(np.ones(4, np.float32))     # the stream keeps working
    s.launch("add", [y, y], [y])
    s.synchronize(SYNC_MS)
    np.testing.assert_array_equal(y.numpy(), np.full(4, 2.0, np.float32))
    y.free()
    s.destroy()


def test_graph_and_stream_of_different_devices(rt):
    d0, d1 = rt.device(0), rt.device(1)
    s0, s1 = d0.stream(), d1.stream()
    s0.begin_capture()
    g = s0.end_capture()
    try:
        with pytest.raises(AclError) as e:
            g.execute_async(s1)
        assert (e.value.code, e.value.detail) == (107003, "graph and stream belong to different devices")
    finally:
        g.destroy()
        s0.destroy()
        s1.destroy()


def test_device_rejects_uncapturable_ops(rt):
    """The device's own check (a client bypassing the runtime's capture rules)."""
    from devices.tasks import Launch, Record
    dev = rt.device(0)
    e0 = dev.event()
    with pytest.raises(CaptureError) as e:
        dev.handle.graph_create([Record(dev.default_stream.sid, e0.eid)])
    assert (e.value.code, e.value.detail) == (107030, "a Record cannot be part of a captured graph (capturable: "
                                                      "kernel launches, D2D copies, memsets, HCCL operators)")
    with pytest.raises(KernelError):
        dev.handle.graph_create([Launch(dev.default_stream.sid, "no_such_kernel")])
    e0.destroy()


# ---------------------------------------------------------------------------------------------- plans and steps
def tg_fill_one(ctx, out):
    out[0:out.size] = 1


def tg_fill_two(ctx, out):
    out[0:out.size] = 2


def tg_fill_from_attr(ctx, out, vals=None):
    out[0:out.size] = float(np.asarray(vals).sum())


def tg_write_input(ctx, src, out):
    out[0:out.size] = 3
    src[0:src.size] = 99                         # inputs are read-only to a kernel


def tg_block_info(ctx, out, tag=0):
    """out[3 * b: 3 * b + 3] = (block_dim, device_id, tag) of block b."""
    out[3 * ctx.block_idx:3 * ctx.block_idx + 3] = np.array([ctx.block_dim, ctx.device_id, tag], np.float32)


for _fn in (tg_fill_one, tg_write_input, tg_block_info, tg_fill_from_attr):
    register_user_kernel(_fn.__name__, _fn, replace=True)


def test_a_kernel_registered_again_under_its_name_is_planned_again(dev):
    """The device caches a plan per distinct launch; a kernel replaced under the same name (the same
    launch, another function) is looked up and planned again: the new code runs."""
    s = dev.stream()
    x = dev.from_numpy(np.zeros(8, np.float32))
    try:
        register_user_kernel("tg_versioned", tg_fill_one, replace=True)
        s.launch("tg_versioned", [], [x])
        s.synchronize(SYNC_MS)
        np.testing.assert_array_equal(x.numpy(), np.ones(8, np.float32))
        register_user_kernel("tg_versioned", tg_fill_two, replace=True)
        s.launch("tg_versioned", [], [x])
        s.synchronize(SYNC_MS)
        np.testing.assert_array_equal(x.numpy(), np.full(8, 2.0, np.float32))
    finally:
        x.free()
        s.destroy()


def test_launches_whose_attrs_cannot_be_keyed_each_run_with_their_own(dev):
    """A launch whose attribute values are unhashable (a numpy array) is never served a cached plan:
    two such launches that differ only in the array each see their own values."""
    s = dev.stream()
    x = dev.from_numpy(np.zeros(4, np.float32))
    try:
        for vals, want in ((np.array([1.0, 2.0]), 3.0), (np.array([5.0, 6.0]), 11.0), (np.array([1.0, 2.0]), 3.0)):
            s.launch("tg_fill_from_attr", [], [x], attrs={"vals": vals})
            s.synchronize(SYNC_MS)
            np.testing.assert_array_equal(x.numpy(), np.full(4, want, np.float32))
    finally:
        x.free()
        s.destroy()


def test_a_kernel_sees_its_block_dim_device_and_attrs_and_cannot_write_its_inputs(dev):
    """What the bound plan hands each block: its block_dim, the device id and the launch's attrs -- the
    same on the first run (plan built) and the second (plan and views reused); a kernel writing one of its
    inputs fails with an AI Core exception and the input keeps its bytes."""
    s = dev.stream()
    out = dev.from_numpy(np.zeros(12, np.float32))
    src = dev.from_numpy(np.full(4, 7.0, np.float32))
    o2 = dev.from_numpy(np.zeros(4, np.float32))
    try:
        for _ in range(2):
            out.copy_from(np.zeros(12, np.float32))
            s.launch("tg_block_info", [], [out], attrs={"tag": 5}, block_dim=4)
            s.synchronize(SYNC_MS)
            np.testing.assert_array_equal(out.numpy(), np.tile(np.array([4, dev.index, 5], np.float32), 4))
        for _ in range(2):
            s.launch("tg_write_input", [src], [o2])
            with pytest.raises(AclError) as e:
                s.synchronize(SYNC_MS)
            assert e.value.code == ACL_ERROR_RT_AICORE_EXCEPTION and "read-only" in e.value.detail, e.value
            np.testing.assert_array_equal(src.numpy(), np.full(4, 7.0, np.float32))
    finally:
        for t in (out, src, o2):
            t.free()
        s.destroy()


def _modeled_ms(dev, s, enqueue) -> float:
    e0, e1 = dev.event(), dev.event()
    try:
        s.record(e0)
        enqueue()
        s.record(e1)
        s.synchronize(SYNC_MS)
        return e0.elapsed(e1).modeled_ms
    finally:
        e0.destroy()
        e1.destroy()


def test_graph_info_is_the_bound_graph_and_its_modeled_time(dev):
    """aclmdlRIDebugPrint's content, exactly: the graph id, its tasks in order with their names and block
    counts, the replays so far (0 before the first), and the modeled time of one replay -- the time that
    events around a replay measure, and the sum of the same ops launched eagerly."""
    s = dev.stream()
    a = dev.from_numpy(np.ones(1 << 22, np.float32))                    # 16 MiB: the graph models > 1 ms
    b = dev.from_numpy(np.zeros(1 << 22, np.float32))
    ops = [lambda: s.launch("add", [a, a], [b], block_dim=3)] * 40 + [
        lambda: s.memset(b.ptr, 0, 1024), lambda: s.copy(a.ptr, b.ptr, 2048),
        lambda: s.launch("tg_block_info", [], [b], block_dim=2)]
    s.begin_capture()
    for op in ops:
        op()
    g = s.end_capture()
    try:
        assert (g.num_tasks, g.rebinds, g.info()["replays"]) == (43, 0, 0)
        eager_ms = sum(_modeled_ms(dev, s, op) for op in ops)
        replay_ms = _modeled_ms(dev, s, lambda: g.execute_async(s))
        info = g.info()
        assert info == {"graph": g.gid, "tasks": 43, "replays": 1, "modeled_us": info["modeled_us"],
                        "steps": [{"name": "add", "blocks": 3}] * 40 + [
                            {"name": "memset", "blocks": 1}, {"name": "memcpy_d2d", "blocks": 1},
                            {"name": "tg_block_info", "blocks": 2}]}
        assert info["modeled_us"] > 1000.0
        assert info["modeled_us"] == round(replay_ms * 1e3, 3)        # microseconds, to the nanosecond
        assert info["modeled_us"] == pytest.approx(eager_ms * 1e3, abs=1e-3)
        g2 = s.begin_capture() or s.end_capture()       # an empty graph: no steps, no time, no replays
        try:
            assert g2.info() == {"graph": g2.gid, "tasks": 0, "replays": 0, "modeled_us": 0.0, "steps": []}
            assert g2.gid == g.gid + 1
        finally:
            g2.destroy()
    finally:
        g.destroy()
        a.free()
        b.free()
        s.destroy()


def test_the_first_replay_after_a_free_is_checked(rt):
    """A graph whose memory was freed between its capture and its first replay (one free: the runtime's
    generation is 1 then) is refused on the host like any later replay; nothing is sent."""
    dev = Runtime(rt.backend, batch_size=64).device(0)
    assert dev.alloc_gen == 0
    s = dev.stream()
    x = dev.from_numpy(np.ones(64, np.float32))
    s.begin_capture()
    s.launch("add", [x, x], [x])
    g = s.end_capture()
    try:
        x.free()
        assert dev.alloc_gen == 1
        dev.flush()
        sent = dev.queue.ops_sent
        g.execute_async(s)
        with pytest.raises(MemoryAccessError) as e:
            dev.flush()
        assert e.value.code == ACL_ERROR_RT_PARAM_INVALID and e.value.detail.startswith(f"graph {g.gid} replay: ")
        assert dev.queue.ops_sent == sent and g.info()["replays"] == 0
    finally:
        g.destroy()
        s.destroy()


def test_device_graphs_belong_to_their_tenant():
    """On the device, a graph is its creator's tenant's: another tenant's calls name an unknown graph
    (107017, nothing changes), another client of the same tenant may use and destroy it.  Ids start at 1
    (0 is no graph)."""
    from devices.device import Device, local_config
    from devices.errors import ACL_ERROR_RT_INVALID_HANDLE
    from devices.tenancy import Owner
    alice, alice2, bob = Owner("alice", "a1"), Owner("alice", "a2"), Owner("bob", "b1")
    d = Device(local_config(90, arena_bytes=1 << 20))
    try:
        p = d.malloc(256, owner=alice)
        sid = d.create_stream(owner=alice)
        x = TensorDesc(p, (64,), "float32")
        gid = d.graph_create([Launch(sid, "add", (x, x), (x,))], owner=alice)
        assert gid == 1
        for call in (lambda: d.graph_info(gid, owner=bob), lambda: d.graph_destroy(gid, owner=bob)):
            with pytest.raises(InvalidHandleError) as e:
                call()
            assert (e.value.code, e.value.detail) == (ACL_ERROR_RT_INVALID_HANDLE,
                                                      f"unknown graph (model run instance) {gid}")
        assert d.graph_info(gid, owner=alice2)["tasks"] == 1          # still there, for alice's other client
        d.graph_destroy(gid, owner=alice2)
        with pytest.raises(InvalidHandleError):
            d.graph_info(gid, owner=alice)
    finally:
        d.close()


# ---------------------------------------------------------------------------------------------- device plans
def _device(dev_id: int, arena: int = 64 << 20):
    from devices.device import Device, local_config
    return Device(local_config(dev_id, arena_bytes=arena))


def _priced_ms(d, sid: int, op) -> float:
    """Modeled time of one op on device ``d``, between two events around it."""
    from devices.tasks import Record
    e0, e1 = d.create_event(), d.create_event()
    d.submit([Record(sid, e0), op, Record(sid, e1)])
    d.synchronize_stream(sid, SYNC_MS)
    return d.event_elapsed(e0, e1)[1]


def test_a_launch_is_priced_on_its_own_work_and_split_by_the_default_block_rule():
    """A launch's modeled time is the device's cost model applied to the kernel's work (a cube kernel's
    flops; a user kernel's bytes), with block_dim 0 meaning the default rule on this chip's cores and host
    threads -- the graph step shows the block count chosen."""
    from devices.chip import Work
    from devices.kernel import default_block_dim, lookup
    d = _device(92)
    try:
        sid = d.create_stream()
        a, b = d.malloc(512 * 512 * 4), d.malloc(512 * 512 * 4)
        ta, tb = TensorDesc(a, (512, 512), "float32"), TensorDesc(b, (512, 512), "float32")
        mm = Launch(sid, "matmul", (ta, ta), (tb,), block_dim=4)
        k = lookup("matmul")
        want = d.cost.kernel(k.work((ta, ta), (tb,), {}), 4) * 1e3
        assert _priced_ms(d, sid, mm) == pytest.approx(want, rel=1e-9)
        assert want > d.cost.kernel(Work(bytes=3 * 512 * 512 * 4), 4) * 1e3 * 1.5     # priced on flops, not bytes
        big = d.malloc(8 << 20)
        tbig = TensorDesc(big, (2 << 20,), "float32")
        user = Launch(sid, "tg_fill_one", (), (tbig,))
        assert _priced_ms(d, sid, user) == pytest.approx(d.cost.kernel(Work(bytes=8 << 20), 1) * 1e3, rel=1e-9)
        add = Launch(sid, "add", (tbig, tbig), (tbig,))                             # block_dim 0: the default
        expect = default_block_dim(lookup("add"), (tbig, tbig), (tbig,), {}, d.spec.ai_cores,
                                   d.config.host_threads)
        assert expect > 1
        gid = d.graph_create([add])
        assert d.graph_info(gid)["steps"] == [{"name": "add", "blocks": expect}]
        # a kernel whose work depends on its attrs (transposes): priced and split on them
        q = d.malloc(8 * 64 * 64 * 4)
        t3 = TensorDesc(q, (8, 64, 64), "float32")
        attrs = {"transpose_a": True, "transpose_b": False}
        bmm = Launch(sid, "batch_matmul", (t3, t3), (t3,), attrs)
        kb = lookup("batch_matmul")
        blocks = default_block_dim(kb, (t3, t3), (t3,), attrs, d.spec.ai_cores, d.config.host_threads)
        assert _priced_ms(d, sid, bmm) == pytest.approx(
            d.cost.kernel(kb.work((t3, t3), (t3,), attrs), blocks) * 1e3, rel=1e-9)
    finally:
        d.close()


def test_plans_check_the_callers_tenant_when_made_and_when_run():
    """A launch is planned for its caller: another tenant's memory is refused at submit (207006, nothing
    queued), a tenant's own kernel is found for it; a launch planned while its memory was its caller's
    and run after that memory went to another tenant fails when it runs and leaves those bytes alone."""
    from devices.errors import ACL_ERROR_RT_NO_PERMISSION
    from devices.tenancy import Owner
    alice, bob = Owner("alice", "a1"), Owner("bob", "b1")
    d = _device(93, 1 << 20)
    try:
        d.register_kernel("tg_alice_fill", tg_fill_two, owner=alice)
        pa = d.malloc(256, owner=alice)
        sa, sb = d.create_stream(owner=alice), d.create_stream(owner=bob)
        xa = TensorDesc(pa, (64,), "float32")
        with pytest.raises(AclError) as e:
            d.submit([Launch(sb, "add", (xa, xa), (xa,))], owner=bob)
        assert e.value.code == ACL_ERROR_RT_NO_PERMISSION
        d.synchronize_stream(sb, SYNC_MS, owner=bob)                 # nothing was queued
        d.submit([Launch(sa, "tg_alice_fill", (), (xa,))], owner=alice)
        d.synchronize_stream(sa, SYNC_MS, owner=alice)
        assert d.memcpy_d2h(pa, 256, owner=alice).view(np.float32).tolist() == [2.0] * 64
        # planned for alice, run after her memory became bob's
        d.inject_fault("hang")
        d.submit([Launch(sa, "tg_alice_fill", (), (xa,))], owner=alice)
        d.free(pa, owner=alice)
        pb = d.malloc(256, owner=bob)
        assert pb == pa
        d.memcpy_h2d(pb, np.full(64, 9.0, np.float32), owner=bob)
        d.clear_fault("hang")
        with pytest.raises(AclError) as e:
            d.synchronize_stream(sa, SYNC_MS, owner=alice)
        assert e.value.code == ACL_ERROR_RT_NO_PERMISSION, e.value
        assert d.memcpy_d2h(pb, 256, owner=bob).view(np.float32).tolist() == [9.0] * 64
    finally:
        d.close()


def test_a_split_matmul_runs_as_few_calls_priced_as_its_blocks():
    """A built-in kernel launched as 20 blocks is priced as 20 blocks (the modeled clock: exactly the
    roofline of the chip's constants, as before the split was decoupled) but runs as one call per host
    thread (eager: the profiler records min(20, host threads) blocks of a block_dim 20 task) and as one call
    in a graph replay; the results are the matmul's, within float32 accumulation error, either way."""
    from devices.chip import ASCEND_910B3 as C
    from devices.kernel import TensorDesc
    from devices.tasks import ExecGraph, Launch
    d = _device(93)
    try:
        sid = d.create_stream()
        m, k, n = 48, 576, 1728
        rng = np.random.default_rng(3)
        a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((n, k), np.float32)
        pa, pb, po, pg = d.malloc(a.nbytes), d.malloc(b.nbytes), d.malloc(m * n * 4), d.malloc(m * n * 4)
        d.memcpy_h2d(pa, a)
        d.memcpy_h2d(pb, b)
        ta, tb = TensorDesc(pa, (m, k)), TensorDesc(pb, (n, k))
        mm = Launch(sid, "matmul", (ta, tb), (TensorDesc(po, (m, n)),), {"transpose_b": True}, block_dim=20)
        # the roofline written out from the chip's constants: all 20 cores, fp32 cube rate, HBM traffic
        flops, nbytes = 2.0 * m * n * k, 4.0 * (m * k + n * k + m * n)
        want_s = C.launch_cost_s + max(flops / C.cube_flops_fp32, nbytes / C.hbm_bandwidth)
        d.profile("start")
        assert _priced_ms(d, sid, mm) == pytest.approx(want_s * 1e3, rel=1e-9)
        tasks = [t for t in d.profile("stop")["tasks"] if t["name"] == "matmul"]
        assert len(tasks) == 1 and tasks[0]["block_dim"] == 20
        assert len(tasks[0]["blocks"]) == min(20, d.config.host_threads)
        ref = a.astype(np.float64) @ b.T.astype(np.float64)
        tol = dict(rtol=1e-5, atol=4 * float(np.finfo(np.float32).eps) * k * float(np.abs(ref).max()))
        np.testing.assert_allclose(d.memcpy_d2h(po, m * n * 4).view(np.float32).reshape(m, n), ref, **tol)
        # captured: the graph lists the launch's 20 blocks and prices the replay as eager, runs it as one call
        gid = d.graph_create([Launch(sid, "matmul", (ta, tb), (TensorDesc(pg, (m, n)),), {"transpose_b": True},
                                     block_dim=20)])
        assert d.graph_info(gid)["steps"] == [{"name": "matmul", "blocks": 20}]
        assert _priced_ms(d, sid, ExecGraph(sid, gid)) == pytest.approx(want_s * 1e3, rel=1e-9)
        np.testing.assert_allclose(d.memcpy_d2h(pg, m * n * 4).view(np.float32).reshape(m, n), ref, **tol)
    finally:
        d.close()


def test_a_replayed_built_in_kernel_that_raises_is_the_launch_s_ai_core_exception():
    """A graph replay calls built-in kernels bare (bound to their views once, no per-call wrapper); a
    Python exception out of one is still that launch's AI Core exception naming the kernel (507015 at
    the synchronize), the steps after it do not run, and the next replay with good data runs whole."""
    from devices.kernel import TensorDesc
    from devices.registry import builtin, registered
    from devices.tasks import ExecGraph, Launch
    name = "test_graph_copy_unless_negative"
    if registered(name) is None:
        @builtin(name)
        def _copy_unless_negative(ctx, inputs, outputs, attrs):
            if (inputs[0] < 0).any():
                raise ValueError("a negative input")
            np.copyto(outputs[0], inputs[0])
    d = _device(94)
    try:
        sid = d.create_stream()
        px, py, pz = d.malloc(16), d.malloc(16), d.malloc(16)
        x, y, z = (TensorDesc(p, (4,)) for p in (px, py, pz))
        gid = d.graph_create([Launch(sid, name, (x,), (y,)), Launch(sid, "add", (y, y), (z,))])
        d.memcpy_h2d(px, np.arange(4, dtype=np.float32))
        d.submit([ExecGraph(sid, gid)])
        d.synchronize_stream(sid, SYNC_MS)
        np.testing.assert_array_equal(d.memcpy_d2h(pz, 16).view(np.float32), [0, 2, 4, 6])
        d.memcpy_h2d(px, np.array([5, -1, 5, 5], np.float32))
        d.submit([ExecGraph(sid, gid)])
        with pytest.raises(KernelError, match=f"kernel '{name}' block 0/1 failed: ValueError: a negative") as ei:
            d.synchronize_stream(sid, SYNC_MS)
        assert ei.value.code == ACL_ERROR_RT_AICORE_EXCEPTION
        np.testing.assert_array_equal(d.memcpy_d2h(pz, 16).view(np.float32), [0, 2, 4, 6])   # add did not run
        d.memcpy_h2d(px, np.full(4, 3, np.float32))
        d.submit([ExecGraph(sid, gid)])
        d.synchronize_stream(sid, SYNC_MS)
        np.testing.assert_array_equal(d.memcpy_d2h(pz, 16).view(np.float32), [6, 6, 6, 6])
    finally:
        d.close()
