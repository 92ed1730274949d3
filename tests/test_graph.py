"""Stream capture and replay (aclmdlRI / "aclgraph") on both backends (``rt`` fixture): captured ops do
not run until replayed, replays read the current contents of device memory, one replay is one stream op,
and every misuse gets its CANN code while the stream and the device keep working."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from devices.errors import AclError, CaptureError, InvalidHandleError, InvalidParamError, KernelError
from fp32 import assert_within, matmul_bound
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
        with pytest.raises(AclError):
            s.synchronize(SYNC_MS)
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


def test_replay_of_freed_memory_fails_instead_of_writing(dev):
    s = dev.stream()
    x = dev.from_numpy(np.ones(64, np.float32))
    keep = dev.from_numpy(np.full(64, 5.0, np.float32))
    s.begin_capture()
    s.launch("add", [x, x], [x])
    g = s.end_capture()
    x.free()
    try:
        g.execute_async(s)
        with pytest.raises(AclError) as e:
            s.synchronize(SYNC_MS)
        assert e.value.code == 107000
        np.testing.assert_array_equal(keep.numpy(), np.full(64, 5.0, np.float32))
        y = dev.from_numpy(np.ones(4, np.float32))   # the stream and device keep working
        s.launch("add", [y, y], [y])
        s.synchronize(SYNC_MS)
        np.testing.assert_array_equal(y.numpy(), np.full(4, 2.0, np.float32))
        y.free()
    finally:
        g.destroy()
        keep.free()
        s.destroy()


def test_graph_and_stream_of_different_devices(rt):
    d0, d1 = rt.device(0), rt.device(1)
    s0, s1 = d0.stream(), d1.stream()
    s0.begin_capture()
    g = s0.end_capture()
    try:
        with pytest.raises(AclError) as e:
            g.execute_async(s1)
        assert e.value.code == 107003
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
    assert e.value.code == 107030
    with pytest.raises(KernelError):
        dev.handle.graph_create([Launch(dev.default_stream.sid, "no_such_kernel")])
    e0.destroy()
