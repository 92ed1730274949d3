"""Ops that ride on a wait are not overtaken (devices.submit_order, runtime.api.LaunchQueue).

A stream or event wait takes the ops queued so far and sends them with the wait (one round trip).  While
that message is on its way, another thread's submission or wait must not overtake it: the runtime sends the
riding ops again in front (numbered), and the device queues each number once.  The race is made certain
here by holding the wait's message before it reaches the device (a handle that delays one wait, as a slow
network would) -- over the in-process device and over a real gRPC server and client -- and what is
checked is device memory: the order the ops ran in, and that none ran twice.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from devices.device import Device, DeviceConfig
from devices.errors import InvalidParamError
from devices.submit_order import OpOrder, OrderFilter
from devices.tasks import Memset
from driver.client import RemoteDevice
from driver.service import serve
from runtime.cluster.failover import wrap_handle

TOKEN = "wait-order-token"
WAIT_S = 30.0


# ------------------------------------------------------------------------------------------ the filter
def test_order_parts_cut_runs_at_message_bounds():
    o = OpOrder(7, ((1, 3), (10, 2)))
    assert o.count == 5
    assert [p.runs for p in o.parts([2, 2, 1])] == [((1, 2),), ((3, 1), (10, 1)), ((11, 1),)]
    assert all(p.session == 7 for p in o.parts([5]))


@pytest.mark.parametrize("runs", [((0, 1),), ((3, 0),), ((5, 2), (6, 1)), ((5, 2), (2, 1))])
def test_order_runs_must_ascend_and_hold_ops(runs):
    with pytest.raises(InvalidParamError):
        OpOrder(1, runs)


def test_filter_queues_each_number_once_per_caller_and_session():
    f = OrderFilter(sessions=2)
    got: list = []
    assert f.queue("a", ["x1", "x2"], OpOrder(1, ((1, 2),)), got.extend) == 2
    assert f.queue("a", ["x1", "x2", "y3"], OpOrder(1, ((1, 2), (3, 1))), got.extend) == 1     # a resend + one new
    assert f.queue("a", ["x1", "x2"], OpOrder(1, ((1, 2),)), got.extend) == 0                # late copy
    assert f.queue("a", ["z2", "z3", "z4"], OpOrder(1, ((2, 3),)), got.extend) == 1          # overlaps: the tail
    assert got == ["x1", "x2", "y3", "z4"]
    assert f.queue("b", ["b1"], OpOrder(1, ((1, 1),)), got.extend) == 1       # another caller: its own numbers
    assert f.queue("a", ["s1"], OpOrder(2, ((1, 1),)), got.extend) == 1       # another session too
    with pytest.raises(InvalidParamError):
        f.queue("a", ["x"], OpOrder(1, ((9, 2),)), got.extend)                 # numbers 2 ops, holds 1


def test_filter_counts_a_failed_message_as_queued():
    f = OrderFilter()

    def refuse(ops):
        raise InvalidParamError("bad op")
    with pytest.raises(InvalidParamError):
        f.queue(None, ["a", "b"], OpOrder(1, ((1, 2),)), refuse)
    assert f.queue(None, ["a", "b"], OpOrder(1, ((1, 2),)), refuse) == 0       # its late copy: not again


# ------------------------------------------------------------------------------------------ the race
class _HeldWait:
    """A device handle whose next wait carrying ops is held before it reaches the device, until released."""

    def __init__(self, inner):
        self.inner = inner
        self.armed = False
        self.taken = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _hold(self, ops) -> None:
        if self.armed and ops:
            self.armed = False
            self.taken.set()
            if not self.release.wait(WAIT_S):
                raise TimeoutError("the held wait was never released")

    def synchronize_stream(self, sid, timeout_ms=-1, *, ops=(), order=None):
        self._hold(ops)
        self.inner.synchronize_stream(sid, timeout_ms, ops=ops, order=order)

    def synchronize_event(self, eid, timeout_ms=-1, *, ops=(), order=None):
        self._hold(ops)
        self.inner.synchronize_event(eid, timeout_ms, ops=ops, order=order)


@pytest.fixture(params=["in-process", "grpc"])
def held(request):
    """(runtime device with launches batched, the held handle) over an in-process device or a served one."""
    dev = Device(DeviceConfig(device_id=0, arena_bytes=64 << 20, shm=False))
    server = client = None
    try:
        inner = dev
        if request.param == "grpc":
            server = serve(dev, host="127.0.0.1", token=TOKEN, port=0)
            client = inner = RemoteDevice(server.address, TOKEN, 0, timeout_s=10.0)
            client.open_lease()
        h = _HeldWait(inner)
        d = wrap_handle(h)                           # a runtime over this one handle, launches batched
        assert d.rt.batch_size > 1
        try:
            yield d, h
        finally:
            h.release.set()
            d.rt.close()
    finally:
        if client is not None:
            client.close()
        if server is not None:
            server.stop(grace=None)
        dev.close()


def _tensors(dev):
    return dev.from_numpy(np.zeros(4, np.float32)), dev.from_numpy(np.ones(4, np.float32))


def _wait_held(h, target) -> threading.Thread:
    """Start ``target`` (a wait) on a thread and return once its ops are taken but not yet delivered."""
    t = threading.Thread(target=target)
    h.armed = True
    t.start()
    assert h.taken.wait(WAIT_S), "the wait did not take the queued ops"
    return t


def test_a_launch_queued_after_a_waits_ops_runs_after_them(held):
    dev, h = held
    x, one = _tensors(dev)
    s = dev.stream()
    s.launch("add", [x, one], [x])                 # queued: rides on the wait below
    t = _wait_held(h, s.synchronize)
    s.memset(x.ptr, 0, 16)                         # after the add in program order (this thread saw it queued)
    dev.flush()                                    # delivered now, with the riding add in front
    h.release.set()
    t.join(WAIT_S)
    s.synchronize()
    # add, then memset: 0; the memset overtaking the add, or the add's late copy run again: 1
    np.testing.assert_array_equal(x.numpy(), np.zeros(4, np.float32))


def test_an_event_wait_sees_a_record_riding_on_another_threads_wait(held):
    dev, h = held
    x, one = _tensors(dev)
    s, e = dev.stream(), dev.event()
    for _ in range(3):
        s.launch("add", [x, one], [x])
    e.record(s)
    t = _wait_held(h, s.synchronize)
    e.synchronize()                                # carries the riding ops: the record is there to wait for
    np.testing.assert_array_equal(x.numpy(s), np.full(4, 3, np.float32))
    assert e.query()
    h.release.set()
    t.join(WAIT_S)
    s.synchronize()
    np.testing.assert_array_equal(x.numpy(), np.full(4, 3, np.float32))   # three adds, each once


def test_numbered_ops_sent_twice_over_grpc_run_once():
    dev = Device(DeviceConfig(device_id=1, arena_bytes=16 << 20, shm=False))
    server = serve(dev, host="127.0.0.1", token=TOKEN, port=0)
    c = RemoteDevice(server.address, TOKEN, 1, timeout_s=10.0)
    try:
        c.open_lease()
        p = c.malloc(64)
        s = c.create_stream()
        c.memset(p, 0, 64)
        order = OpOrder(99, ((1, 1), (2, 1)))
        c.submit([Memset(s, p, 1, 8), Memset(s, p + 8, 2, 8)], order=order)
        c.synchronize_stream(s, ops=[Memset(s, p, 7, 8)], order=OpOrder(99, ((1, 1),)))      # a late copy of #1
        c.submit([Memset(s, p + 8, 5, 8), Memset(s, p + 16, 3, 8)], order=OpOrder(99, ((2, 2),)))   # #2 again, #3
        c.synchronize_stream(s)
        got = c.memcpy_d2h(p, 24)
        np.testing.assert_array_equal(np.frombuffer(bytes(got), np.uint8), np.repeat([1, 2, 3], 8).astype(np.uint8))
        with pytest.raises(InvalidParamError):
            c.submit([Memset(s, p, 0, 8)], order=OpOrder(99, ((4, 2),)))         # numbers 2 ops, sends 1
        c.synchronize_stream(s)                                                   # the device keeps working
    finally:
        c.close()
        server.stop(grace=None)
        dev.close()
