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
from devices.errors import ACL_ERROR_RT_PARAM_INVALID, AclError, InvalidParamError
from devices.submit_order import OpOrder, OrderFilter
from devices.kernel import TensorDesc
from devices.tasks import Launch, Memset
from driver.client import RemoteDevice
from driver.service import serve
from driver.wire import LaunchTemplates, submit_request
from runtime.cluster.failover import wrap_handle

TOKEN = "wait-order-token"
WAIT_S = 30.0


# ------------------------------------------------------------------------------------------ the filter
def test_order_parts_cut_runs_at_message_bounds():
    o = OpOrder(7, ((1, 3), (10, 2)))
    assert o.count == 5
    assert [p.runs for p in o.parts([2, 2, 1])] == [((1, 2),), ((3, 1), (10, 1)), ((11, 1),)]
    assert all(p.session == 7 for p in o.parts([5]))


@pytest.mark.parametrize("runs", [(), ((0, 1),), ((3, 0),), ((5, 2), (6, 1)), ((5, 2), (2, 1))])
def test_order_runs_must_ascend_and_hold_ops(runs):
    with pytest.raises(InvalidParamError):
        OpOrder(1, runs)


def test_carried_ops_are_the_ones_numbered_below_own_from():
    assert OpOrder(1, ((1, 2), (5, 3)), own_from=5).carried == 2
    assert OpOrder(1, ((1, 2), (5, 3))).carried == 5                      # own_from 0: all carried
    assert [p.carried for p in OpOrder(1, ((1, 2), (5, 3)), 5).parts([3, 2])] == [2, 0]


def test_filter_queues_each_number_once_per_caller_and_session():
    f = OrderFilter(sessions=2)
    got: list = []
    assert f.queue("a", ["x1", "x2"], OpOrder(1, ((1, 2),), 1), got.extend) == 2
    assert f.queue("a", ["x1", "x2", "y3"], OpOrder(1, ((1, 2), (3, 1)), 3), got.extend) == 1   # a resend + one new
    assert f.queue("a", ["x1", "x2"], OpOrder(1, ((1, 2),), 1), got.extend) == 0              # late copy
    assert f.queue("a", ["z2", "z3", "z4"], OpOrder(1, ((2, 3),)), got.extend) == 1           # overlaps: the tail
    assert got == ["x1", "x2", "y3", "z4"]
    assert f.queue("b", ["b1"], OpOrder(1, ((1, 1),), 1), got.extend) == 1    # another caller: its own numbers
    assert f.queue("a", ["s1"], OpOrder(2, ((1, 1),), 1), got.extend) == 1    # another session too
    with pytest.raises(InvalidParamError):
        f.queue("a", ["x"], OpOrder(1, ((9, 2),)), got.extend)                  # numbers 2 ops, holds 1


def test_a_callers_sessions_never_push_out_another_callers():
    f = OrderFilter(sessions=2)
    got: list = []
    f.queue("victim", ["v1"], OpOrder(1, ((1, 1),), 1), got.extend)
    for session in range(2, 50):                                               # a tenant's many sessions
        f.queue("other", ["o"], OpOrder(session, ((1, 1),), 1), got.extend)
    assert f.queue("victim", ["v1"], OpOrder(1, ((1, 1),), 1), got.extend) == 0   # still remembered: once
    f.drop("victim")                                                           # the client departed
    assert f.queue("victim", ["v1"], OpOrder(1, ((1, 1),), 1), got.extend) == 1


def test_a_carried_runs_error_goes_to_its_sender_and_the_carriers_ops_still_queue():
    f = OrderFilter()
    queued: list = []

    def enqueue(ops):
        if "bad" in ops:
            queued.extend(ops[:ops.index("bad")])
            raise InvalidParamError("bad op")
        queued.extend(ops)
    # B's flush carries A's run (1-2, failing at its second op) in front of B's own op 3
    assert f.queue(None, ["a1", "bad", "b3"], OpOrder(1, ((1, 2), (3, 1)), 3), enqueue) == 1
    assert queued == ["a1", "b3"]                              # A's op before the failure, and B's own
    with pytest.raises(InvalidParamError):                      # A's own copy arrives: A gets its error
        f.queue(None, ["a1", "bad"], OpOrder(1, ((1, 2),), 1), enqueue)
    assert f.queue(None, ["a1", "bad"], OpOrder(1, ((1, 2),), 1), enqueue) == 0   # once
    with pytest.raises(InvalidParamError):                      # a sender's own failing run: raised at once
        f.queue(None, ["c4", "bad"], OpOrder(1, ((4, 2),), 4), enqueue)
    assert queued == ["a1", "b3", "c4"]
    assert f.queue(None, ["c4", "bad"], OpOrder(1, ((4, 2),), 4), enqueue) == 0   # its late copy: not again


def test_template_ids_are_never_reused_and_carried_ops_travel_in_full():
    t = LaunchTemplates()
    op = Launch(0, "add", (TensorDesc(1 << 40, (4,)),), (TensorDesc(1 << 40, (4,)),))
    first = t.encode(op)["launch"]["tid"]
    assert t.encode(op) == {"stream": 0, "launch_ref": {"tid": first}}
    t.reset()
    assert t.encode(op)["launch"]["tid"] > first                # after a reset: a new id, never an old one
    req = submit_request([op, op], t, plain=1)
    assert [m.WhichOneof("op") for m in req.ops] == ["launch", "launch_ref"]
    assert not req.ops[0].launch.tid                            # in full, defining nothing


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
        order = OpOrder(99, ((1, 1), (2, 1)), 1)
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


def test_a_riding_ops_error_goes_to_its_wait_not_to_the_thread_that_carried_it(held):
    dev, h = held
    x, _ = _tensors(dev)
    s = dev.stream()
    s.enqueue(Memset(s.sid, x.ptr + (32 << 20), 0, 16))     # past every allocation: the device refuses it
    errors: list = []

    def wait():
        try:
            s.synchronize()
        except AclError as e:
            errors.append(e)
    t = _wait_held(h, wait)
    s.memset(x.ptr, 7, 16)                         # this thread's own, valid op
    dev.flush()                                    # carries the bad memset in front: no error of its own
    h.release.set()
    t.join(WAIT_S)
    assert len(errors) == 1 and errors[0].code == ACL_ERROR_RT_PARAM_INVALID, errors   # the wait got it
    s.synchronize()
    assert (x.numpy().view(np.uint8) == 7).all()   # the carrier's own op ran
